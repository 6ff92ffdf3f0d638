"""Checkpoints of a model drafter's window: a slot's window kept as segments of window positions.

Owns: `WindowSnapshot` (a slot's window when `count` positions had been appended, as consecutive segments plus the
backend's carried vector, and its file form, the ring), `WindowSegment` (window positions start..end-1 of one slot,
shared by the snapshots that cover them) and `Unprojected` (a slot's rows as its drafter's window queue holds them,
projected the first time a snapshot that holds them is read). Segments are shared as the target's keys are
(stages/models/checkpoint.py), so a conversation's checkpoints cost what each turn added instead of a whole window
each. Not here: the live ring buffer and taking or restoring a snapshot of it (`Window`, drafter_window.py), which
checkpoints are kept (pipeline/runtime).
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch

Tensor = torch.Tensor


def _nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@attrs.define(eq=False)
class WindowSegment:
    """Window positions start..end-1 of one slot (positions counted from the slot's first append): k, v
    [layers, end - start, kv]. Shared by snapshots; `move_` moves it for all of them.
    A segment may be taken unprojected (`Unprojected`: the drafter's raw rows, as its window queue held them):
    its keys and values are made the first time they are read (`resolve`), so a checkpoint that is never
    restored never pays the projection. Its byte count stays what it was taken at (the raw rows, the larger),
    so a store's sums stay balanced."""

    start: int
    end: int
    k: Tensor | None
    v: Tensor | None
    unprojected: Unprojected | None = None
    carry: Tensor | None = None  # an unprojected segment's carried vector after its last row, once resolved
    held: int = attrs.field(default=0)

    def __attrs_post_init__(self):
        if not self.held:
            self.held = self.unprojected.nbytes if self.unprojected is not None else _nbytes(self.k, self.v)

    def resolve(self) -> None:
        """Project the raw rows (where the segment lives: a host-tier segment stays on the host)."""
        rows = self.unprojected
        if rows is None:
            return
        k, v, carry = rows.project(rows.raw, rows.positions)  # [rows, layers, kv]
        home = rows.raw.device
        self.k, self.v = k.transpose(0, 1).contiguous().to(home), v.transpose(0, 1).contiguous().to(home)
        self.carry = carry[-1].to(home).clone() if carry is not None else None
        self.unprojected = None

    def fill(self, k: Tensor, v: Tensor) -> None:
        """Resolve with keys and values [layers, end - start, kv] projected elsewhere (a window's ring that appended
        the same rows): where the segment lives, its carried vector left unset (for a drafter that carries none)."""
        home = self.unprojected.raw.device
        self.k, self.v = k.to(home), v.to(home)
        self.unprojected = None

    def move_(self, move) -> None:
        if self.unprojected is not None:
            self.unprojected = attrs.evolve(
                self.unprojected, raw=move(self.unprojected.raw), positions=move(self.unprojected.positions)
            )
        else:
            self.k, self.v = move(self.k), move(self.v)
        if self.carry is not None:
            self.carry = move(self.carry)

    @property
    def nbytes(self) -> int:
        return self.held


@attrs.frozen(eq=False)
class Unprojected:
    """Rows of a slot as a drafter's window queue keeps them, and the drafter's way to project them:
    `project(raw, positions)` -> (keys, values [rows, layers, kv], carried vectors [rows, hidden] or None), on
    the drafter's device whatever device `raw` is on."""

    raw: Tensor  # [rows, ...]
    positions: Tensor  # [rows]
    project: Callable

    @property
    def nbytes(self) -> int:
        return _nbytes(self.raw, self.positions)


@attrs.frozen(eq=False)
class WindowSnapshot:
    """A slot's window of `size` when `count` positions had been appended: consecutive segments covering at least
    the last min(count, size) positions (the first may start earlier: it is shared with an older snapshot), and
    the backend's carried vector: held, or (`carry_from`) the one an unprojected segment gives once resolved."""

    count: int
    size: int
    segments: tuple[WindowSegment, ...]
    _carry: Tensor | None
    carry_from: WindowSegment | None = None

    @property
    def carry(self) -> Tensor:
        if self.carry_from is None:
            return self._carry
        self.carry_from.resolve()
        return self.carry_from.carry

    @property
    def own_bytes(self) -> int:
        """Bytes that are this snapshot's alone (segments may be shared)."""
        return _nbytes(self._carry) if self._carry is not None else 0

    @property
    def nbytes(self) -> int:
        return self.own_bytes + sum(s.nbytes for s in self.segments)

    def moved(self, move) -> WindowSnapshot:
        """The same snapshot with its carried vector passed through `move`; the segments are the same objects."""
        return self if self._carry is None else attrs.evolve(self, carry=move(self._carry))

    def ring(self) -> tuple[Tensor, Tensor]:
        """k, v [layers, min(count, size), kv] laid out as the window's ring holds them (position p at p mod size):
        the form of a checkpoint file."""
        if not self.segments:
            raise ValueError("a window snapshot of no positions has no ring")
        inside = list(self._inside(self.size))
        first = inside[0][0].k
        k = first.new_empty(first.shape[0], min(self.count, self.size), first.shape[2])
        v = torch.empty_like(k)
        for seg, pos in inside:
            k[:, pos % self.size] = seg.k[:, pos - seg.start]
            v[:, pos % self.size] = seg.v[:, pos - seg.start]
        return k, v

    @classmethod
    def from_ring(cls, k: Tensor, v: Tensor, count: int, carry: Tensor) -> WindowSnapshot:
        """From a file's ring (`ring`): its n entries are the positions count - n .. count - 1, p at p mod size,
        which is p mod n for n = min(count, size): the size of a full ring, and enough for one not yet full."""
        n = k.shape[1]
        if not 0 < n <= count:
            raise ValueError(f"a window ring of {n} entries cannot hold the last positions of {count}")
        pos = torch.arange(count - n, count, device=k.device) % n
        return cls(count, n, (WindowSegment(count - n, count, k[:, pos].clone(), v[:, pos].clone()),), carry)

    def _inside(self, size: int):
        """(segment, positions [m] of it still inside the window of `size`), unprojected ones resolved."""
        low = max(0, self.count - size)
        for seg in self.segments:
            if seg.end > low:
                seg.resolve()
                yield seg, torch.arange(max(seg.start, low), seg.end, device=seg.k.device)
