"""The sparse MoE feed-forward of Qwen3-Next layers: top-k softmax routing plus a sigmoid-gated shared expert.

Owns: the router (softmax in float32, top-k, optional renormalisation of the top-k weights), running each hit
expert over the rows routed to it, and the shared expert. Not here: the dense MLP (ops.mlp).

Exactness: each expert's rows go through `linear` (the decode route), and a row's expert outputs are added in
increasing expert index whichever other rows share the pass, so a row's result does not depend on its neighbours.
Cost: learning which experts a pass hits is one device-to-host copy of the top-k indices per MoE layer (free on a
CPU; on a GPU a grouped-expert kernel should replace `experts_ref`).
"""
from __future__ import annotations

import torch

from stages.models.config import ModelConfig
from stages.models.ops import linear, mlp, sigmoid, silu
from stages.models.weights import MoeWeights

Tensor = torch.Tensor


def moe(x: Tensor, w: MoeWeights, cfg: ModelConfig) -> Tensor:
    """x [rows, hidden] (already normed) -> [rows, hidden]."""
    probs = linear(x, w.router).float().softmax(dim=-1)              # [rows, experts]
    top_w, top_i = probs.topk(cfg.experts_per_token, dim=-1)        # [rows, k]
    if cfg.norm_topk_prob:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    routed = experts_ref(x, w.gate_up, w.down, top_i, top_w.to(x.dtype))
    shared = mlp(x, w.shared) * sigmoid(linear(x, w.shared_gate))
    return routed + shared


def experts_ref(x: Tensor, gate_up: Tensor, down: Tensor, top_i: Tensor, top_w: Tensor) -> Tensor:
    """sum_j top_w[r, j] * expert_{top_i[r, j]}(x[r]), experts visited in increasing index.

    x [rows, hidden]; gate_up [experts, 2 * inter, hidden]; down [experts, hidden, inter]; top_i, top_w [rows, k].
    """
    out = torch.zeros_like(x)
    hits: dict[int, tuple[list[int], list[int]]] = {}
    for r, choice in enumerate(top_i.tolist()):   # the one host copy: which experts this pass needs
        for j, e in enumerate(choice):
            rows, cols = hits.setdefault(e, ([], []))
            rows.append(r)
            cols.append(j)
    for e in sorted(hits):
        rows = torch.tensor(hits[e][0], device=x.device)
        cols = torch.tensor(hits[e][1], device=x.device)
        gate, up = linear(x[rows], gate_up[e]).chunk(2, dim=-1)
        y = linear(silu(gate) * up, down[e]) * top_w[rows, cols, None]
        out.index_add_(0, rows, y)
    return out
