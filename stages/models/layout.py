"""PassLayout: the ragged row layout of one pass, turned once into the index tensors every layer shares.

Owns: where each flat row sits in a `[lanes, width]` padded grid, where its key and value are written, and the
causal mask over each lane's keys. Built from the batch's host copies (`lane_rows`, `lane_start`), so no layer ever
syncs to learn the layout. Not here: any arithmetic on activations.
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.contract.errors import ContractError
from speclane.stages.models.state import KEY_BLOCK, RowBatch

Tensor = torch.Tensor

QUERY_BUCKET = 8  # attention pads each lane's queries to a multiple of this (see attention.py)


@attrs.frozen
class PassLayout:
    lanes: int
    lane_rows: tuple[int, ...]
    lane_start: tuple[int, ...]  # host: each lane's first row's position
    rows: int
    steps: int  # the most rows any lane has
    width: int  # padded rows per lane: max(8, steps rounded up to 8)
    keys: int  # key positions attention reads: the furthest row, rounded up to KEY_BLOCK
    slots: Tensor  # [lanes]
    pad_index: Tensor  # [rows]: lane * width + j
    row_lane: Tensor  # [rows]: the lane of each row
    row_j: Tensor  # [rows]: the row's index within its lane
    last_row: Tensor  # [lanes]: rows - 1
    lane_ids: Tensor  # [lanes]: 0 .. lanes - 1
    write_slot: Tensor  # [rows]: the slot of each row's lane
    write_pos: Tensor  # [rows]: lane_start + j, where the row's key and value go
    row_keys: Tensor  # [rows]: write_pos + 1, the keys each row attends to
    mask: Tensor  # [lanes, width, keys] bool: True where a (padded) row may not look

    @classmethod
    def build(cls, batch: RowBatch, max_len: int, capacity: int, keys: int | None = None) -> PassLayout:
        """`keys`: read this many key positions whatever the rows reach (a CUDA graph captured once per row
        bucket needs every shape fixed); None: the furthest row's, rounded up to KEY_BLOCK."""
        lane_rows, lane_start = batch.lane_rows, batch.lane_start
        lanes, device = len(lane_rows), batch.tokens.device
        if lanes == 0 or min(lane_rows) < 1:
            raise ContractError(f"RowBatch: every lane needs at least one row, got lane_rows={lane_rows}")
        end = max(s + r for s, r in zip(lane_start, lane_rows))
        if end > max_len:
            raise ContractError(f"RowBatch: a lane reaches position {end}, past the state's max_len {max_len}")
        steps = max(lane_rows)
        width = max(QUERY_BUCKET, -(-steps // QUERY_BUCKET) * QUERY_BUCKET)
        if keys is None:
            keys = min(capacity, -(-end // KEY_BLOCK) * KEY_BLOCK)
        elif not end <= keys <= capacity:
            raise ContractError(
                f"PassLayout: keys={keys} must cover the furthest row ({end}) and fit the cache ({capacity})"
            )
        pad, wslot, wpos, qpos = [], [], [], []
        for lane, (s, r) in enumerate(zip(lane_start, lane_rows)):
            pad += [lane * width + j for j in range(r)]
            wpos += [s + j for j in range(r)]
            # Padded rows look at the lane's last real row's keys: finite scores, outputs discarded.
            qpos.append([s + min(j, r - 1) for j in range(width)])
        as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
        row_lane = as_t([lane for lane, r in enumerate(lane_rows) for _ in range(r)])
        row_j = as_t([j for r in lane_rows for j in range(r)])
        wslot = torch.repeat_interleave(batch.slots, as_t(list(lane_rows)), output_size=sum(lane_rows))
        mask = torch.arange(keys, device=device)[None, None, :] > as_t(qpos)[:, :, None]
        return cls(
            lanes=lanes,
            lane_rows=tuple(lane_rows),
            lane_start=tuple(lane_start),
            rows=sum(lane_rows),
            steps=steps,
            width=width,
            keys=keys,
            slots=batch.slots,
            pad_index=as_t(pad),
            row_lane=row_lane,
            row_j=row_j,
            last_row=as_t([r - 1 for r in lane_rows]),
            lane_ids=as_t(list(range(lanes))),
            write_slot=wslot,
            write_pos=as_t(wpos),
            row_keys=as_t([p + 1 for p in wpos]),
            mask=mask,
        )

    def refill_(self, new: PassLayout) -> None:
        """Take `new`'s index tensors into this layout's own storage, in place: a captured graph reads the same
        tensors every replay, so a pass of other positions (same lanes, rows and keys) is copied into them."""
        if (new.lane_rows, new.keys, new.width) != (self.lane_rows, self.keys, self.width):  # lane_start may differ
            raise ContractError(
                f"PassLayout.refill_: lane_rows {new.lane_rows}, keys {new.keys} do not match the "
                f"captured {self.lane_rows}, {self.keys}"
            )
        for f in attrs.fields(PassLayout):
            mine = getattr(self, f.name)
            if isinstance(mine, Tensor) and mine is not getattr(new, f.name):
                mine.copy_(getattr(new, f.name))

    def to_grid(self, x: Tensor) -> Tensor:
        """[rows, ...] -> [lanes, width, ...], padded rows zero."""
        grid = x.new_zeros(self.lanes * self.width, *x.shape[1:])
        grid[self.pad_index] = x
        return grid.view(self.lanes, self.width, *x.shape[1:])

    def from_grid(self, grid: Tensor) -> Tensor:
        """[lanes, >= steps, ...] -> [rows, ...]."""
        return grid[self.row_lane, self.row_j]

    def last(self, grid: Tensor) -> Tensor:
        """[lanes, >= steps, ...] -> [lanes, ...]: each lane's entry at its last real row."""
        return grid[self.lane_ids, self.last_row]
