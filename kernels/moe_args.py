"""The argument contract of the routed experts, checked alike by both routes (`moe_experts_ref` and
`moe_experts_triton`): x [rows, hidden], gate_up [experts, 2 * inter, hidden], down [experts, hidden, inter], top_i
and top_w [rows, k], one dtype for x, the weights and top_w. One cheap test on the hot path; the messages are built
only on failure.

Owns: `check_moe_args`. Not here: the expert math (kernels/moe.py for the dispatcher and the torch twin,
kernels/moe_triton.py for the kernels).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import check

Tensor = torch.Tensor


def check_moe_args(x: Tensor, gate_up: Tensor, down: Tensor, top_i: Tensor, top_w: Tensor) -> None:
    e, two_i, h = gate_up.shape if gate_up.dim() == 3 else (0, 0, -1)
    # one cheap test on the hot path; the messages are built only on failure
    if (
        x.dim() == 2
        and h == x.shape[1]
        and two_i % 2 == 0
        and tuple(down.shape) == (e, h, two_i // 2)
        and top_i.dim() == 2
        and top_i.shape == top_w.shape
        and top_i.shape[0] == x.shape[0]
        and gate_up.dtype == down.dtype == x.dtype == top_w.dtype
    ):
        return
    check(x.dim() == 2, f"moe_experts: x must be [rows, hidden], got {tuple(x.shape)}")
    check(
        h == x.shape[1] and two_i % 2 == 0,
        f"moe_experts: gate_up must be [experts, 2 * inter, {x.shape[1]}], got {tuple(gate_up.shape)}",
    )
    check(
        tuple(down.shape) == (e, h, two_i // 2),
        f"moe_experts: down must be [{e}, {h}, {two_i // 2}], got {tuple(down.shape)}",
    )
    check(
        top_i.shape == top_w.shape and top_i.dim() == 2 and top_i.shape[0] == x.shape[0],
        f"moe_experts: top_i and top_w must both be [{x.shape[0]}, k], got {tuple(top_i.shape)} and "
        f"{tuple(top_w.shape)}",
    )
    check(
        False,
        f"moe_experts: x, gate_up, down and top_w must share a dtype, got {x.dtype}, {gate_up.dtype}, "
        f"{down.dtype}, {top_w.dtype}",
    )
