"""The model drafters' window: per slot, the keys and values of the last `size` committed positions.

Owns: a ring buffer per slot (`Window`) that each pass appends the committed rows to (all rows of a prefill chunk,
the committed run of a verify round) and that a proposal reads as attention context, and where several passes'
rows go (`PassRows`). Keys carry RoPE at their absolute positions, so the ring's order never matters: attention is
the same whatever order its keys come in, and a full ring is simply every slot valid. Appends are device-side (a
row not kept rewrites a position with the value it gets anyway: `append_rows`), so a round's variable accepted
lengths need no host sync. A slot taken over by a new lane starts empty (`claim`): the owner is the lane object, so
a reused slot never restores a previous lane's rows. `Window.snapshot` and `Window.restore` take a slot's window
into a prompt checkpoint and put it back: a snapshot that extends an earlier one of the same slot history copies
only the positions past it and shares the earlier segments that are still inside the window; the slot's rows its
drafter has not yet projected go in as they are.
Not here: the checkpoint types themselves (`WindowSnapshot`, `WindowSegment`, `Unprojected`:
stages/models/window_snapshot.py), what the keys are (the nets), who calls (the backends in `stages/drafters`),
which checkpoints are kept (pipeline/runtime).
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.models.window_snapshot import Unprojected, WindowSegment, WindowSnapshot

Tensor = torch.Tensor


@attrs.frozen
class PassRows:
    """Where the rows of several passes go, flat in the order they ran (pass after pass, lane after lane): per
    entry (a lane of a pass) its slot and the rows it keeps ahead of it in its slot, per row its entry, its
    index within the entry and whether it was committed; per slot the rows appended in all. Built from host
    row counts and device slots and keeps: no host sync."""

    count: int  # rows
    entry_slot: Tensor  # [entries]
    before: Tensor  # [entries] committed rows of the same slot in earlier entries
    added: Tensor  # [slots] committed rows in all
    entry: Tensor  # [rows]
    slot: Tensor  # [rows]
    local: Tensor  # [rows] index within its entry
    committed: Tensor  # [rows] bool

    @classmethod
    def of(cls, passes, slots: int) -> PassRows:
        """passes [(slots [lanes] device, lane_rows host tuple, keep [lanes] device or None: all rows)]."""
        counts = [n for _, lane_rows, _ in passes for n in lane_rows]
        dev = passes[0][0].device
        entry_slot = torch.cat([s.to(torch.int64) for s, _, _ in passes])
        keep = torch.cat(
            [
                torch.tensor(lane_rows, dtype=torch.int64, device=dev) if k is None else k.to(torch.int64)
                for _, lane_rows, k in passes
            ]
        )
        host_counts = torch.tensor(counts, dtype=torch.int64)
        entry = torch.repeat_interleave(torch.arange(len(counts)), host_counts)
        local = torch.arange(int(host_counts.sum())) - (torch.cumsum(host_counts, 0) - host_counts)[entry]
        mine = (entry_slot[:, None] == torch.arange(slots, device=dev)[None]).to(torch.int64) * keep[:, None]
        ahead = torch.cumsum(mine, 0) - mine  # [entries, slots]
        entry, local = entry.to(dev), local.to(dev)
        return cls(
            count=len(local),
            entry_slot=entry_slot,
            before=ahead.gather(1, entry_slot[:, None])[:, 0],
            added=mine.sum(0),
            entry=entry,
            slot=entry_slot.index_select(0, entry),
            local=local,
            committed=local < keep.index_select(0, entry),
        )


class Window:
    """Keys and values live as `k`, `v` [slots, layers, heads, size + scratch, head_dim]: per (slot, layer, KV head)
    a contiguous run of positions, the layout of the target's KV cache (`kernels/dense_layer.py` reads a layer of a
    slot with slot index `slot * layers + layer`). Ring position p holds the absolute position a with a % size == p;
    the `scratch` positions past `size` are never committed: a proposal's own rows go right after the slot's valid
    ones (`draft_base`), in the ring's not yet valid part or in the scratch, so the one-call layer attends over one
    run. Everything outside reads and writes rows as [..., kv_dim] (heads * head_dim)."""

    def __init__(
        self,
        slots: int,
        size: int,
        layers: int,
        kv_dim: int,
        dtype: torch.dtype,
        device,
        heads: int = 1,
        scratch: int = 0,
    ):
        if size < 8:
            raise ValueError(f"a drafter window holds at least 8 positions (one verify round), got {size}")
        if kv_dim % heads:
            raise ValueError(f"a drafter window's kv_dim {kv_dim} is not a multiple of its {heads} KV heads")
        self.size, self.scratch, self.heads, self.kv_dim = size, scratch, heads, kv_dim
        self.k = torch.zeros(slots, layers, heads, size + scratch, kv_dim // heads, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.count = torch.zeros(slots, dtype=torch.int64, device=device)  # positions ever appended
        self.owners: list[object | None] = [None] * slots

    def _rows(self, store: Tensor, slot, ring: Tensor) -> Tensor:
        """store's positions `ring` of `slot` (an int: [layers, n, kv_dim]; a tensor [n]: [n, layers, kv_dim])."""
        if isinstance(slot, int):
            t = store[slot][:, :, ring]  # [layers, heads, n, hd]
            return t.permute(0, 2, 1, 3).reshape(t.shape[0], -1, self.kv_dim)
        t = store[slot, :, :, ring]  # [n, layers, heads, hd]
        return t.reshape(t.shape[0], t.shape[1], self.kv_dim)

    def _put(self, store: Tensor, slot, ring: Tensor, rows: Tensor) -> None:
        """`_rows`' inverse: rows [layers, n, kv_dim] (int slot) or [n, layers, kv_dim] (tensor slot)."""
        hd = self.kv_dim // self.heads
        if isinstance(slot, int):
            store[slot][:, :, ring] = rows.reshape(rows.shape[0], rows.shape[1], self.heads, hd).permute(0, 2, 1, 3)
        else:
            store[slot, :, :, ring] = rows.reshape(rows.shape[0], rows.shape[1], self.heads, hd)

    def positions(self, slot: int, n: int) -> tuple[Tensor, Tensor]:
        """Keys, values [layers, n, kv_dim] at ring positions 0 .. n - 1 of `slot` (tests, inspection)."""
        ring = torch.arange(n, device=self.k.device)
        return self._rows(self.k, slot, ring), self._rows(self.v, slot, ring)

    def draft_base(self, slots: Tensor) -> Tensor:
        """[lanes] where a proposal's first own row goes: right after the slot's valid positions."""
        return self.count.index_select(0, slots).clamp(max=self.size)

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
        """k, v [rows, layers, kv]: one pass's rows, flat, lane after lane (`lane_rows` on the host). Each lane
        keeps its first `keep[lane]` rows (device [lanes]; None = all rows); only the last `size` of them stay."""
        self.append_rows(PassRows.of([(slots, lane_rows, keep)], len(self.owners)), k, v)

    def append_rows(self, rows: PassRows, k: Tensor, v: Tensor) -> None:
        """Several passes' rows at once (`rows`; k, v [rows, layers, kv] flat in the same order), leaving what
        appending them pass after pass leaves, in a fixed number of ops whatever the number of passes: each
        committed row goes to position (its absolute index) mod size when it is among its slot's last `size`;
        every other row rewrites one position with the value that position gets anyway (the slot's last kept
        row's, or what is there when the slot keeps none), so duplicate indices carry equal values and the
        result does not depend on their order. Device-side: no host sync."""
        if rows.count == 0:
            return
        before = self.count.index_select(0, rows.entry_slot) + rows.before  # [entries] first absolute index
        final = self.count + rows.added  # [slots]
        at = before.index_select(0, rows.entry) + rows.local  # [rows] absolute index
        slot = rows.slot
        take = rows.committed & (at >= final.index_select(0, slot) - self.size)
        flat = torch.arange(rows.count, device=at.device)
        last = torch.full_like(final, -1).scatter_reduce_(0, slot, torch.where(take, flat, -1), "amax")
        src = torch.where(take, flat, last.index_select(0, slot))  # the row whose value each row writes
        has = src >= 0
        src = src.clamp(min=0)
        pos = at % self.size
        dest = torch.where(has, pos.index_select(0, src), pos)
        for store, new in ((self.k, k), (self.v, v)):
            old = self._rows(store, slot, dest)  # [rows, layers, kv]
            self._put(store, slot, dest, torch.where(has[:, None, None], new.index_select(0, src).to(store.dtype), old))
        self.count.copy_(final)

    def snapshot(
        self,
        slot: int,
        carry: Tensor,
        base: WindowSnapshot | None = None,
        tail: Unprojected | None = None,
        tail_carries: bool = False,
    ) -> WindowSnapshot:
        """The slot's window as it stands, followed by `tail` (the slot's committed rows not yet appended, kept
        unprojected); with `base` (an earlier snapshot of this slot's own history: taken from or restored into it,
        nothing since but appends), only the positions past it are copied and its segments still inside the
        window are shared (a shared segment still unprojected whose rows the ring now holds, appended since, takes
        their keys from the ring: copied, not projected again). `tail_carries`: the carried vector is the one
        projecting the tail's last row gives (`carry` is then what the slot carried before the tail)."""
        appended = int(self.count[slot])
        count = appended + (tail.raw.shape[0] if tail is not None else 0)
        low = max(0, count - self.size)
        start = low if base is None else max(base.count, low)
        if not low <= start <= count:
            raise ValueError(f"a base window snapshot of {base.count} positions cannot start one of {count}")
        shared = tuple(s for s in base.segments if s.end > low) if base is not None else ()
        for seg in shared if not tail_carries else ():
            if seg.unprojected is not None and low <= seg.start and seg.end <= appended:
                ring = torch.arange(seg.start, seg.end, device=self.k.device) % self.size
                seg.fill(self._rows(self.k, slot, ring), self._rows(self.v, slot, ring))
        if appended > start:
            ring = torch.arange(start, appended, device=self.k.device) % self.size
            shared += (WindowSegment(start, appended, self._rows(self.k, slot, ring), self._rows(self.v, slot, ring)),)
        if tail is None or not tail_carries:
            held, carry_from = carry.clone(), None
        elif count > max(start, appended):
            held, carry_from = None, None
        else:  # nothing past `base`, which already ends at the tail's last row
            held, carry_from = base._carry, base.carry_from
        if tail is not None and count > max(start, appended):
            cut = max(start, appended) - appended
            rows = (
                tail
                if not cut
                else attrs.evolve(tail, raw=tail.raw[cut:].clone(), positions=tail.positions[cut:].clone())
            )
            shared += (WindowSegment(max(start, appended), count, None, None, rows),)
            carry_from = shared[-1] if tail_carries else None
        return WindowSnapshot(count, self.size, shared, held, carry_from)

    def restore(self, slot: int, snap: WindowSnapshot, owner) -> None:
        """Put `snap`'s positions back into the slot's ring, owned by `owner` (its lane)."""
        dev = self.k.device
        for seg, pos in snap._inside(self.size):  # a segment may be in host memory (the store's host tier)
            ring = (pos % self.size).to(dev)
            self._put(self.k, slot, ring, seg.k[:, pos - seg.start].to(dev))
            self._put(self.v, slot, ring, seg.v[:, pos - seg.start].to(dev))
        self.count[slot] = snap.count
        self.owners[slot] = owner

    def read(self, slots: Tensor, upto: int) -> tuple[Tensor, Tensor, Tensor]:
        """Keys, values [lanes, layers, M, kv] and valid [lanes, M] with M = min(size, upto), `upto` a host bound
        on the slots' committed lengths (their lanes' kv_len)."""
        m = max(1, min(self.size, upto))
        valid = torch.arange(m, device=self.count.device)[None] < self.count.index_select(0, slots)[:, None]
        k, v = (t[:, :, :, :m].index_select(0, slots).transpose(2, 3).flatten(3) for t in (self.k, self.v))
        return k, v, valid
