"""The model drafters' window: per slot, the keys and values of the last `size` committed positions.

Owns: a ring buffer per slot (`Window`) that each pass appends the committed rows to (all rows of a prefill chunk,
the committed run of a verify round) and that a proposal reads as attention context. Keys carry RoPE at their
absolute positions, so the ring's order never matters: attention is the same whatever order its keys come in,
and a full ring is simply every slot valid. Appends are device-side (a lane's uncommitted rows are written back
as the values they replace), so a round's variable accepted lengths need no host sync. A slot taken over by a new
lane starts empty (`claim`): the owner is the lane object, as PITFALLS' stale-state bug asks.
Not here: what the keys are (the nets), who calls (the backends in `stages/drafters`).
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


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

    def read(self, slots: Tensor, upto: int) -> tuple[Tensor, Tensor, Tensor]:
        """Keys, values [lanes, layers, M, kv] and valid [lanes, M] with M = min(size, upto), `upto` a host bound
        on the slots' committed lengths (their lanes' kv_len)."""
        m = max(1, min(self.size, upto))
        valid = torch.arange(m, device=self.count.device)[None] < self.count.index_select(0, slots)[:, None]
        return (self.k[:, :, :m].index_select(0, slots), self.v[:, :, :m].index_select(0, slots), valid)
