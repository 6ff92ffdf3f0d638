"""Copying one routed expert from the slow tier into a fast-tier slot: the one data movement of an expert cache.

Owns: `copy_expert` and the checks before it. The expert's gate, up and down matrices may be held apart and in
another dtype (as a safetensors file holds them); the slot holds them as the routed-expert kernels read them,
gate_up [2 * inter, hidden] (gate rows then up rows) and down [hidden, inter], in the compute dtype.
Not here: which expert goes to which slot (`stages/models/expert_cache.py`), the expert math (`moe.py`).
A copy has no arithmetic to get wrong, so torch's `copy_` is both the kernel and its twin; a dtype conversion on
the way is a plain cast, the same one loading the weights does.
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import check

Tensor = torch.Tensor


def copy_expert(
    slot_gate_up: Tensor, slot_down: Tensor, gate: Tensor, up: Tensor, down: Tensor, non_blocking: bool = False
) -> int:
    """Write gate [inter, hidden], up [inter, hidden] and down [hidden, inter] into one slot's slot_gate_up
    [2 * inter, hidden] and slot_down [hidden, inter], converting to the slot's dtype. Returns the bytes written.
    `non_blocking`: from pinned host memory into a GPU slot, the copy is queued on the current stream and the call
    returns at once (the caller orders its readers after it)."""
    inter, hidden = slot_down.shape[1], slot_down.shape[0]
    ok = (
        tuple(slot_gate_up.shape) == (2 * inter, hidden)
        and tuple(gate.shape) == tuple(up.shape) == (inter, hidden)
        and tuple(down.shape) == (hidden, inter)
        and slot_gate_up.dtype == slot_down.dtype
    )
    if not ok:
        check(
            tuple(slot_gate_up.shape) == (2 * inter, hidden),
            f"copy_expert: slot_gate_up must be [{2 * inter}, {hidden}], got {tuple(slot_gate_up.shape)}",
        )
        check(
            tuple(gate.shape) == tuple(up.shape) == (inter, hidden),
            f"copy_expert: gate and up must be [{inter}, {hidden}], got {tuple(gate.shape)} and {tuple(up.shape)}",
        )
        check(
            tuple(down.shape) == (hidden, inter),
            f"copy_expert: down must be [{hidden}, {inter}], got {tuple(down.shape)}",
        )
        check(
            False,
            f"copy_expert: the slot's two buffers must share a dtype, got {slot_gate_up.dtype} and {slot_down.dtype}",
        )
    slot_gate_up[:inter].copy_(gate, non_blocking=non_blocking)
    slot_gate_up[inter:].copy_(up, non_blocking=non_blocking)
    slot_down.copy_(down, non_blocking=non_blocking)
    return slot_gate_up.numel() * slot_gate_up.element_size() + slot_down.numel() * slot_down.element_size()
