"""The sparse MoE feed-forward (Qwen3-Next, Qwen3-MoE, Mixtral): top-k softmax routing, and a sigmoid-gated shared
expert where the model has one (Qwen3-Next).

Owns: the router (softmax in float32, top-k, optional renormalisation of the top-k weights), running each hit
expert over the rows routed to it, and the shared expert. Not here: the dense MLP (ops.mlp).

Exactness: each expert's rows go through `linear` (the decode route), and a row's expert outputs are added in
increasing expert index whichever other rows share the pass, so a row's result does not depend on its neighbours.
The routed experts are `speclane.kernels.moe.moe_experts`: on a CPU the torch twin (one host copy of the top-k indices a
layer, free there); on CUDA grouped-expert triton kernels that need no host value, so a captured round can hold them.
With an expert cache (`expert_cache.py`) the routed experts run from its slots instead, bit-identical to the twin.
A bench may replay a recorded routing trace in place of the router's choice (`routing_trace.py`).
"""

from __future__ import annotations

import torch

from speclane.kernels.moe import moe_experts
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_cache import ExpertCache
from speclane.stages.models.ops import linear, mlp, sigmoid
from speclane.stages.models.routing_trace import steer
from speclane.stages.models.weights import MoeWeights

Tensor = torch.Tensor


def moe(x: Tensor, w: MoeWeights, cfg: ModelConfig, experts: ExpertCache | None = None, layer: int = -1) -> Tensor:
    """x [rows, hidden] (already normed) -> [rows, hidden]. `experts`: the target's expert cache, which runs the
    routed experts of decoder layer `layer` from its slots; None: every expert resident in `w`."""
    probs = linear(x, w.router).float().softmax(dim=-1)  # [rows, experts]
    top_w, top_i = probs.topk(cfg.experts_per_token, dim=-1)  # [rows, k]
    if cfg.norm_topk_prob:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    top_i, top_w = steer(layer, top_i, top_w)  # a routing trace's replay or recording (benches), else as chosen
    if experts is None:
        routed = moe_experts(x, w.gate_up, w.down, top_i, top_w.to(x.dtype), linear)
    else:
        routed = experts.run(layer, x, top_i, top_w.to(x.dtype), linear)
    if w.shared is None:
        return routed
    return routed + mlp(x, w.shared) * sigmoid(linear(x, w.shared_gate))
