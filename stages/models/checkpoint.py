"""Slot snapshots: a copy of one slot's target state at a token position, and putting it back into a slot.

A snapshot taken when a slot's committed length is `length` holds each attention layer's keys and values for
positions 0..length-1 and each Gated DeltaNet layer's conv and recurrent state as they stand at `length`: what a
fresh prefill of those tokens leaves. A Gated DeltaNet state exists only at the position it was kept at, so a
snapshot is valid for exactly its length (the caller takes it right after a commit). Restored into any slot, it
continues as if the prefix had just been prefilled there. Not here: which prefixes are kept and matched
(pipeline/runtime/checkpoints.py) or the drafter's part (each backend's `snapshot` / `restore`).
"""
from __future__ import annotations

import attrs
import torch

from stages.models.state import AttnCache, TargetState

Tensor = torch.Tensor


@attrs.frozen
class SlotSnapshot:
    length: int
    layers: tuple[tuple[Tensor, Tensor], ...]   # attention: (k, v) [kv_heads, length, head_dim]; GDN: (conv, recurrent)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.layers for t in pair)


def snapshot_slot(state: TargetState, slot: int, length: int) -> SlotSnapshot:
    layers = []
    for c in state.layers:
        if isinstance(c, AttnCache):
            layers.append((c.k[slot, :, :length].clone(), c.v[slot, :, :length].clone()))
        else:
            layers.append((c.conv[slot].clone(), c.recurrent[slot].clone()))
    return SlotSnapshot(length, tuple(layers))


def restore_slot(state: TargetState, slot: int, snap: SlotSnapshot) -> None:
    if snap.length > state.max_len:
        raise ValueError(f"a snapshot of {snap.length} positions does not fit a state of max_len {state.max_len}")
    for c, (a, b) in zip(state.layers, snap.layers, strict=True):
        if isinstance(c, AttnCache):
            c.k[slot, :, :snap.length].copy_(a)
            c.v[slot, :, :snap.length].copy_(b)
        else:
            c.conv[slot].copy_(a)
            c.recurrent[slot].copy_(b)
