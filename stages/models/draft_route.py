"""A model drafter's layers in one C call each, reading and writing the drafter's window in place.

Owns: `layer_form` (a `DraftLayer`'s weights as the one-call dense layer reads them, `kernels/dense_layer.py`) and
`WindowRoute` (one proposal's addressing of the window: which slot, layer and positions each row writes its own key
and value to, and how many keys it attends over). The one-call layer is the target's: RMSNorm, the fused q|k|v
projection, RoPE, attention over a run of positions of one (slot, layer), o projection, RMSNorm, SwiGLU, each
linear's output rounded to the rows' dtype as the per-op route rounds it. A draft row attends over its slot's valid
window positions and the proposal's own rows, which the layer writes right after them (`Window.draft_base`): the
same keys, values and mask as `DraftLayer.forward` with the window read out, without reading it out. Queries stay
float32 between RoPE and attention here (the per-op route rounds them to bf16 first), so bf16 proposals may differ
in the last bit of a score: a proposal is verified by the target, never compared bit for bit.
Not here: the layer's math for fitting (`draft_layer.py`), the window's bookkeeping (`drafter_window.py`).
"""

from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels.dense_layer import DenseLayer, dense_layer
from speclane.kernels.packed import PackedWeight
from speclane.stages.models.drafter_window import Window
from speclane.stages.models.ops import DECODE_ROUTE_MAX_ROWS

Tensor = torch.Tensor


def layer_form(layer) -> DenseLayer | None:
    """`layer`'s (a fused `DraftLayer`) weights for the one-call layer, or None where that layer cannot run it
    (not a CPU, no C kernels, a dtype they do not take, weights of mixed forms)."""
    a, m = layer.self_attn, layer.mlp
    weights = (layer.qkv, a.o_proj.packed, m.gate_up, m.down_proj.packed)
    if any(w is None for w in (layer.qkv, m.gate_up)):
        return None
    if a.o_proj.packed is None or m.down_proj.packed is None:  # row-major: every weight the plain tensor
        weights = (layer.qkv, a.o_proj.weight, m.gate_up, m.down_proj.weight)
    data = [w.data if isinstance(w, PackedWeight) else w for w in weights]
    if (
        cpu_build.library() is None
        or any(t.device.type != "cpu" or t.dtype not in (torch.float32, torch.bfloat16) for t in data)
        or len({(isinstance(w, PackedWeight), t.dtype) for w, t in zip(weights, data)}) != 1
        or a.head_dim % 8
        or a.head_dim > 256
    ):
        return None
    return DenseLayer(
        in_norm=layer.input_layernorm.weight.detach().float().contiguous(),
        post_norm=layer.post_attention_layernorm.weight.detach().float().contiguous(),
        qkv=weights[0],
        qkv_bias=None,
        o=weights[1],
        o_bias=None,
        gate_up=weights[2],
        gate_up_bias=None,
        down=weights[3],
        down_bias=None,
        q_norm=None,
        k_norm=None,
        heads=(a.heads, a.kv_heads, a.head_dim),
        rot=a.head_dim,
        eps=layer.input_layernorm.eps,
    )


class WindowRoute:
    """One proposal of `lanes` lanes of `rows` rows each over `window`, drafted in `steps` calls per layer (mtp:
    one row a step, each step's row seeing the earlier steps'; dflash2: all rows in one step, non-causal)."""

    def __init__(self, window: Window, slots: Tensor, rows: int):
        self.window, self.rows = window, rows
        layers, heads, cap, hd = window.k.shape[1:]
        self.k = window.k.view(-1, heads, cap, hd)  # slot index slot * layers + layer
        self.v = window.v.view(-1, heads, cap, hd)
        self.layers = layers
        self.slot = (slots * layers).repeat_interleave(rows)  # [lanes * rows], layer 0
        self.base = window.draft_base(slots).repeat_interleave(rows)  # [lanes * rows]
        self.within = torch.arange(rows, device=slots.device).repeat(slots.shape[0])  # row index in its lane

    @staticmethod
    def serves(window: Window, lanes: int, rows: int, steps: int, layer: DenseLayer | None) -> bool:
        """Whether a proposal of `steps` steps of `rows` rows a lane can take the one-call route."""
        return (
            layer is not None
            and lanes * rows <= DECODE_ROUTE_MAX_ROWS
            and rows * steps <= window.scratch
            and window.k.device.type == "cpu"
        )

    def run(self, layer: DenseLayer, index: int, x: Tensor, cos: Tensor, sin: Tensor, step: int = 0) -> None:
        """x [lanes * rows, hidden] (this step's rows, contiguous) += window layer `index`'s layer, in place, its
        keys and values written after the `step` steps before it; cos, sin [lanes * rows, head_dim] float32."""
        at = self.base + step * self.rows + self.within
        seen = self.base + (step + 1) * self.rows
        dense_layer(layer, x, cos, sin, self.k, self.v, self.slot + index, at, seen)
