"""A model drafter's observed rows that are not yet in its window: the queue, per slot, and taking rows out of it.

A pass's rows are kept as they come (`raw`: what the backend's `project` turns into keys and values), not copied:
the queue holds, per slot, its entries (one lane's rows of one pass: the pass and the rows' place in it) oldest
first. So a slot's rows can be taken out without touching the others': a proposal projects only its drafting
lanes' rows, a slot that changes hands drops its old lane's rows (host bookkeeping alone, no tensor op), and a
prompt checkpoint copies its slot's committed rows as they are (stages/drafters/model_backend.py). A pass is held
while any of its entries is queued; `held_rows` counts the rows so held, which the backend bounds. The rows are
held by reference: a target whose outputs were static buffers (a replayed CUDA graph) would have to hand out
copies. Not here: the
projection and the window (the backends, `stages/models/drafter_window.py`).
"""

from __future__ import annotations

import attrs
import torch

Tensor = torch.Tensor


@attrs.define(eq=False)
class Observed:
    """One observed pass: its rows' raw form and positions, and each lane's committed rows."""

    keep: Tensor  # [lanes] device: rows each lane committed (every row of a prefill chunk)
    positions: Tensor  # [rows]
    raw: Tensor  # [rows, ...]
    queued: int  # its entries still queued


@attrs.frozen
class Rows:
    """Entries taken out of the queue, flat: grouped by slot, each slot's oldest first (the only order appends
    depend on). Per entry its slot (device and host), rows and committed rows; per row its position and raw form."""

    slots: Tensor  # [entries] device
    slot_ids: tuple[int, ...]
    lane_rows: tuple[int, ...]
    keep: Tensor  # [entries] device
    positions: Tensor  # [rows]
    raw: Tensor  # [rows, ...]

    @property
    def rows(self) -> int:
        return self.raw.shape[0]


class Queue:
    def __init__(self, slots: int):
        self.entries: list[list[tuple[Observed, int, int, int]]] = [[] for _ in range(slots)]  # (pass, lane, row, n)
        self.rows = [0] * slots  # rows queued per slot (read every planning round: kept, not summed)
        self.held_rows = 0

    def __bool__(self) -> bool:
        return any(self.entries)

    def queued_rows(self, slot: int) -> int:
        return self.rows[slot]

    def add(self, slot_ids, lane_rows, keep: Tensor, positions: Tensor, raw: Tensor) -> None:
        """One pass's rows (flat, lane after lane; `slot_ids`, `lane_rows` on the host)."""
        seen = Observed(keep, positions, raw, 0)
        row = 0
        for lane, (slot, n) in enumerate(zip(slot_ids, lane_rows)):
            if n:
                self.entries[slot].append((seen, lane, row, n))
                self.rows[slot] += n
                seen.queued += 1
            row += n
        if seen.queued:
            self.held_rows += raw.shape[0]

    def _release(self, taken) -> None:
        for seen, _, _, _ in taken:
            seen.queued -= 1
            if not seen.queued:
                self.held_rows -= seen.raw.shape[0]

    def drop(self, slots) -> None:
        """Forget the queued rows of `slots`."""
        for slot in slots:
            self._clear(slot)

    def _clear(self, slot: int) -> None:
        self._release(self.entries[slot])
        self.entries[slot] = []
        self.rows[slot] = 0

    def take(self, slots=None) -> Rows | None:
        """The queued rows of `slots` (None: every slot), out of the queue; None when there are none."""
        slots = range(len(self.entries)) if slots is None else sorted(slots)
        picked = [(slot, e) for slot in slots for e in self.entries[slot]]
        if not picked:
            return None
        for slot in slots:
            self._clear(slot)
        return _gather(picked)

    def committed(self, slot: int) -> tuple[Tensor, Tensor] | None:
        """The raw rows and positions [n] of the rows `slot` committed, in order, left queued (None when it has
        none). Reads how many rows each entry committed: one host sync, for a prompt checkpoint, not a round."""
        entries = self.entries[slot]
        if not entries:
            return None
        keep = _keep(entries).tolist()
        parts = [(seen, row, min(int(k), n)) for (seen, _, row, n), k in zip(entries, keep)]
        parts = [part for part in parts if part[2]]
        if not parts:
            return None
        return (
            torch.cat([seen.raw[row : row + n] for seen, row, n in parts]),
            torch.cat([seen.positions[row : row + n] for seen, row, n in parts]),
        )


def _starts(counts):
    out, row = [], 0
    for n in counts:
        out.append(row)
        row += n
    return out


def _keep(entries) -> Tensor:
    """[entries] the committed rows of each (pass, lane, row, n) entry: a few ops whatever their number."""
    passes = list({id(seen): seen for seen, _, _, _ in entries}.values())
    base = {id(seen): at for seen, at in zip(passes, _starts([len(p.keep) for p in passes]))}
    dev = passes[0].keep.device
    lanes = torch.tensor([base[id(seen)] + lane for seen, lane, _, _ in entries], dtype=torch.int64).to(dev)
    return (torch.cat([p.keep for p in passes]) if len(passes) > 1 else passes[0].keep).index_select(0, lanes)


def _gather(picked) -> Rows:
    """Rows of the (slot, entry) list `picked`, in its order: one copy of the rows, a few ops for the rest."""
    slot_ids = tuple(slot for slot, _ in picked)
    keep = _keep([e for _, e in picked])
    return Rows(
        slots=torch.tensor(slot_ids, dtype=torch.int64).to(keep.device),
        slot_ids=slot_ids,
        lane_rows=tuple(n for _, (_, _, _, n) in picked),
        keep=keep,
        positions=torch.cat([seen.positions[row : row + n] for _, (seen, _, row, n) in picked]),
        raw=torch.cat([seen.raw[row : row + n] for _, (seen, _, row, n) in picked]),
    )
