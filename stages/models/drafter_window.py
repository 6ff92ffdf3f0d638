"""The model drafters' window: per slot, the keys and values of the last `size` committed positions.

Owns: a ring buffer per slot (`Window`) that each pass appends the committed rows to (all rows of a prefill chunk,
the committed run of a verify round) and that a proposal reads as attention context. Keys carry RoPE at their
absolute positions, so the ring's order never matters: attention is the same whatever order its keys come in,
and a full ring is simply every slot valid. Appends are device-side (a lane's uncommitted rows are written back
as the values they replace), so a round's variable accepted lengths need no host sync. A slot taken over by a new
lane starts empty (`claim`): the owner is the lane object, as PITFALLS' stale-state bug asks.
A prompt checkpoint keeps a slot's window as segments of window positions (`WindowSnapshot`), as the target's keys
are kept (stages/models/checkpoint.py): a snapshot that extends an earlier one of the same slot history copies only
the positions past it and shares the earlier segments that are still inside the window, so a conversation's
checkpoints cost what each turn added instead of a whole window each.
Not here: what the keys are (the nets), who calls (the backends in `stages/drafters`), which checkpoints are kept
(pipeline/runtime).
"""
from __future__ import annotations

import attrs
import torch

Tensor = torch.Tensor


def _nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@attrs.define(eq=False)
class WindowSegment:
    """Window positions start..end-1 of one slot (positions counted from the slot's first append): k, v
    [layers, end - start, kv]. Shared by snapshots; `move_` moves it for all of them."""
    start: int
    end: int
    k: Tensor
    v: Tensor

    def move_(self, move) -> None:
        self.k, self.v = move(self.k), move(self.v)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.k, self.v)


@attrs.frozen(eq=False)
class WindowSnapshot:
    """A slot's window of `size` when `count` positions had been appended: consecutive segments covering at least
    the last min(count, size) positions (the first may start earlier: it is shared with an older snapshot), and
    the backend's carried vector."""
    count: int
    size: int
    segments: tuple[WindowSegment, ...]
    carry: Tensor

    @property
    def own_bytes(self) -> int:
        """Bytes that are this snapshot's alone (segments may be shared)."""
        return _nbytes(self.carry)

    @property
    def nbytes(self) -> int:
        return self.own_bytes + sum(s.nbytes for s in self.segments)

    def moved(self, move) -> WindowSnapshot:
        """The same snapshot with its carried vector passed through `move`; the segments are the same objects."""
        return attrs.evolve(self, carry=move(self.carry))

    def ring(self) -> tuple[Tensor, Tensor]:
        """k, v [layers, min(count, size), kv] laid out as the window's ring holds them (position p at p mod size):
        the form of a checkpoint file."""
        if not self.segments:
            raise ValueError("a window snapshot of no positions has no ring")
        first = self.segments[0].k
        k = first.new_empty(first.shape[0], min(self.count, self.size), first.shape[2])
        v = torch.empty_like(k)
        for seg, pos in self._inside(self.size):
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
        """(segment, positions [m] of it still inside the window of `size`)."""
        low = max(0, self.count - size)
        for seg in self.segments:
            if seg.end > low:
                yield seg, torch.arange(max(seg.start, low), seg.end, device=seg.k.device)


class Window:
    def __init__(self, slots: int, size: int, layers: int, kv_dim: int, dtype: torch.dtype, device):
        if size < 8:
            raise ValueError(f"a drafter window holds at least 8 positions (one verify round), got {size}")
        self.size = size
        self.k = torch.zeros(slots, layers, size, kv_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.count = torch.zeros(slots, dtype=torch.int64, device=device)  # positions ever appended
        self.owners: list[object | None] = [None] * slots

    def claim(self, lanes) -> list[int]:
        """Slots whose lane changed since they were last written: emptied here; returned for the caller's state."""
        fresh = []
        for lane in lanes:
            if self.owners[lane.slot] is not lane:
                self.owners[lane.slot] = lane
                self.count[lane.slot] = 0
                fresh.append(lane.slot)
        return fresh

    def append(self, slots: Tensor, k: Tensor, v: Tensor, lane_rows: tuple[int, ...], keep: Tensor | None) -> None:
        """k, v [rows, layers, kv]: the pass's rows, flat, lane after lane (`lane_rows` on the host). Each lane
        keeps its first `keep[lane]` rows (device [lanes]; None = all rows); only the last `size` of them stay."""
        width = min(max(lane_rows, default=0), self.size)
        if width == 0:
            return
        dev = k.device
        # Per lane the last `width` rows of the pass, right-aligned (host layout, no sync).
        starts, idx = 0, []
        for n in lane_rows:
            first = starts + n - width
            idx.append([min(max(first + j, starts), starts + n - 1) if n else 0 for j in range(width)])
            starts += n
        rows = torch.tensor(idx, dtype=torch.int64).to(dev)                        # [lanes, width]
        n_rows = torch.tensor(lane_rows, dtype=torch.int64).to(dev)
        keep = n_rows if keep is None else keep
        skip = (keep - width).clamp(min=0)       # committed rows that fall out of the window at once
        j = torch.arange(width, device=dev)[None]
        row_of_j = (n_rows[:, None] - width + j)                                     # lane-local row index
        take = (row_of_j >= 0) & (row_of_j < keep[:, None]) & (row_of_j >= skip[:, None])
        # Local row r goes to (count + r) mod size. The `width` entries of a lane cover consecutive r, so their
        # positions are distinct (width <= size); padding (r < 0) and uncommitted rows write back what is there.
        pos = (self.count.index_select(0, slots)[:, None] + row_of_j) % self.size
        for store, new in ((self.k, k), (self.v, v)):
            old = store[slots[:, None], :, pos]                                      # [lanes, width, layers, kv]
            store[slots[:, None], :, pos] = torch.where(take[..., None, None], new[rows].to(store.dtype), old)
        self.count.index_add_(0, slots, keep)

    def snapshot(self, slot: int, carry: Tensor, base: WindowSnapshot | None = None) -> WindowSnapshot:
        """The slot's window as it stands; with `base` (an earlier snapshot of this slot's own history: taken from
        or restored into it, nothing since but appends), only the positions past it are copied and its segments
        still inside the window are shared."""
        count = int(self.count[slot])
        low = max(0, count - self.size)
        start = low if base is None else max(base.count, low)
        if not low <= start <= count:
            raise ValueError(f"a base window snapshot of {base.count} positions cannot start one of {count}")
        shared = tuple(s for s in base.segments if s.end > low) if base is not None else ()
        if count > start:
            ring = torch.arange(start, count, device=self.k.device) % self.size
            shared += (WindowSegment(start, count, self.k[slot][:, ring].clone(), self.v[slot][:, ring].clone()),)
        return WindowSnapshot(count, self.size, shared, carry.clone())

    def restore(self, slot: int, snap: WindowSnapshot, owner) -> None:
        """Put `snap`'s positions back into the slot's ring, owned by `owner` (its lane)."""
        dev = self.k.device
        for seg, pos in snap._inside(self.size):   # a segment may be in host memory (the store's host tier)
            ring = (pos % self.size).to(dev)
            self.k[slot][:, ring] = seg.k[:, pos - seg.start].to(dev)
            self.v[slot][:, ring] = seg.v[:, pos - seg.start].to(dev)
        self.count[slot] = snap.count
        self.owners[slot] = owner

    def read(self, slots: Tensor, upto: int) -> tuple[Tensor, Tensor, Tensor]:
        """Keys, values [lanes, layers, M, kv] and valid [lanes, M] with M = min(size, upto), `upto` a host bound
        on the slots' committed lengths (their lanes' kv_len)."""
        m = max(1, min(self.size, upto))
        valid = torch.arange(m, device=self.count.device)[None] < self.count.index_select(0, slots)[:, None]
        return (self.k[:, :, :m].index_select(0, slots), self.v[:, :, :m].index_select(0, slots), valid)
