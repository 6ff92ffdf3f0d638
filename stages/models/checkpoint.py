"""Slot snapshots: a copy of one slot's target state at a token position, and putting it back into a slot.

A snapshot taken when a slot's committed length is `length` holds each attention layer's keys and values for
positions 0..length-1 and each Gated DeltaNet layer's conv and recurrent state as they stand at `length`: what a
fresh prefill of those tokens leaves. A Gated DeltaNet state exists only at the position it was kept at, so a
snapshot is valid for exactly its length (the caller takes it right after a commit). Restored into any slot, it
continues as if the prefix had just been prefilled there.
The keys and values are held as segments of positions (`KeySegment`), which snapshots of one slot's history share:
a snapshot that extends an earlier one (`base`) copies only the positions past it. A conversation's snapshots
(every so many tokens of a long prompt, each prompt's and each answer's end) then cost what each added, and dropping
an earlier one frees its recurrent states while its keys live on in the later ones. The base must be a snapshot of
the very slot history it extends (taken from or restored into that slot, with nothing since but appends): keys once
committed never change, so the segments are exactly the slot's keys. Not here: which prefixes are kept and matched
(pipeline/runtime/checkpoints.py, keeper.py) or the drafter's part (each backend's `snapshot` / `restore`).
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.models.state import AttnCache, TargetState

Tensor = torch.Tensor


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@attrs.define(eq=False)
class KeySegment:
    """Positions start..end-1 of every attention layer: (k, v) [kv_heads, end - start, head_dim] per layer. Shared
    by the snapshots of one slot history; `move_` moves it for all of them (the checkpoint store's host tier)."""

    start: int
    end: int
    kv: tuple[tuple[Tensor, Tensor], ...]

    def move_(self, move) -> None:
        self.kv = tuple((move(k), move(v)) for k, v in self.kv)

    @property
    def nbytes(self) -> int:
        return _bytes(t for pair in self.kv for t in pair)


@attrs.frozen(eq=False)
class SlotSnapshot:
    length: int
    segments: tuple[KeySegment, ...]  # consecutive, covering 0..length-1 (shared between snapshots)
    states: tuple[tuple[Tensor, Tensor] | None, ...]  # per layer: GDN (conv, recurrent); None for attention

    @classmethod
    def from_layers(cls, length: int, layers) -> SlotSnapshot:
        """From one (k, v) or (conv, recurrent) pair per layer (a file): keys are [kv_heads, length, head_dim]."""
        attention = [a.dim() == 3 and a.shape == b.shape and a.shape[1] == length for a, b in layers]
        kv = tuple(pair for pair, att in zip(layers, attention) if att)
        return cls(
            length,
            (KeySegment(0, length, kv),) if length else (),
            tuple(None if att else pair for pair, att in zip(layers, attention)),
        )

    @property
    def layers(self) -> tuple[tuple[Tensor, Tensor], ...]:
        """One pair per layer: attention (k, v) over all positions (segments joined), GDN (conv, recurrent)."""
        out, j = [], 0
        for pair in self.states:
            if pair is not None:
                out.append(pair)
                continue
            ks = [s.kv[j] for s in self.segments]
            out.append(ks[0] if len(ks) == 1 else (torch.cat([k for k, _ in ks], 1), torch.cat([v for _, v in ks], 1)))
            j += 1
        return tuple(out)

    @property
    def own_bytes(self) -> int:
        """Bytes of what is this snapshot's alone: its recurrent states (segments may be shared)."""
        return _bytes(t for pair in self.states if pair is not None for t in pair)

    @property
    def nbytes(self) -> int:
        return self.own_bytes + sum(s.nbytes for s in self.segments)

    def moved(self, move) -> SlotSnapshot:
        """The same snapshot with its own tensors (the recurrent states) passed through `move`; the segments are
        the same objects."""
        return attrs.evolve(self, states=tuple(None if p is None else (move(p[0]), move(p[1])) for p in self.states))

    def flat(self) -> SlotSnapshot:
        """The same state with its keys in one segment (a file stands alone)."""
        if len(self.segments) <= 1:
            return self
        return SlotSnapshot.from_layers(self.length, self.layers)


def snapshot_slot(state: TargetState, slot: int, length: int, base: SlotSnapshot | None = None) -> SlotSnapshot:
    """The slot at committed length `length`; with `base` (an earlier snapshot of this slot's own history, no
    longer than `length`), only the positions past it are copied and the base's segments are shared."""
    start = 0 if base is None else base.length
    if not 0 <= start <= length:
        raise ValueError(f"a base snapshot of {start} positions cannot start a snapshot of {length}")
    kv, states = [], []
    for c in state.layers:
        if isinstance(c, AttnCache):
            kv.append((c.k[slot, :, start:length].clone(), c.v[slot, :, start:length].clone()))
            states.append(None)
        else:
            states.append((c.conv[slot].clone(), c.recurrent[slot].clone()))
    segments = base.segments if base is not None else ()
    if length > start:
        segments += (KeySegment(start, length, tuple(kv)),)
    return SlotSnapshot(length, segments, tuple(states))


def restore_slot(state: TargetState, slot: int, snap: SlotSnapshot) -> None:
    if snap.length > state.max_len:
        raise ValueError(f"a snapshot of {snap.length} positions does not fit a state of max_len {state.max_len}")
    if len(snap.states) != len(state.layers):
        raise ValueError(f"a snapshot of {len(snap.states)} layers does not fit a model of {len(state.layers)}")
    j = 0
    for c, pair in zip(state.layers, snap.states):
        if isinstance(c, AttnCache):
            for seg in snap.segments:  # each segment at its positions
                k, v = seg.kv[j]
                c.k[slot, :, seg.start : seg.end].copy_(k)
                c.v[slot, :, seg.start : seg.end].copy_(v)
            j += 1
        else:
            c.conv[slot].copy_(pair[0])
            c.recurrent[slot].copy_(pair[1])
