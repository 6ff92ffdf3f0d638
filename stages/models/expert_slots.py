"""Which routed expert sits in which fast-tier slot, and which one leaves: the bookkeeping of an expert cache.

Owns: the replacement policies (`POLICIES`, keyed by kind; each sees every lookup, every admission, and picks a
victim), `SlotTable`, which turns one layer's lookups into a schedule: the experts already in a slot (hits), then
the missing ones in groups that fit the slots (misses), each given its slot, and the counters record
(`ExpertCounts`) a pass reports. Pure Python, no tensors: the live
cache (`expert_cache.py`) and the policy study (`expert_study.py`) run the same table, so a replayed trace counts
exactly what the live cache counted.
Not here: the slot buffers and the copies (`expert_cache.py`), the expert math (`speclane.kernels.moe`).

A key is (layer, expert). Lookups of one layer come as the sorted union of the experts its rows chose. When the
union fits the slots, none of its keys is evicted while it is being brought in; when it does not, the missing
experts stream through the slots a group at a time, and a group protects only itself (the caller computes each
group before the next one is brought in).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable
from typing import Protocol

import attrs

Key = Hashable


class Policy(Protocol):
    """A replacement policy. `access` hears every lookup in order (hit or miss, before a miss is admitted),
    `admit` a key that now holds a slot, `evict` must choose a resident key outside `protected` and forget it."""

    def access(self, key: Key) -> None: ...

    def admit(self, key: Key) -> None: ...

    def evict(self, protected: Collection[Key]) -> Key: ...


class Lru:
    """Least recently used: the resident key whose last lookup is oldest leaves."""

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()  # resident keys, oldest lookup first

    def access(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def admit(self, key: Key) -> None:
        self._order[key] = None

    def evict(self, protected: Collection[Key]) -> Key:
        victim = next(k for k in self._order if k not in protected)
        del self._order[victim]
        return victim


class Lfu:
    """Least frequently used: the resident key with the fewest lookups since the start leaves (counts survive an
    eviction, so an expert that is often chosen comes back with its history); ties go to the older last lookup."""

    def __init__(self) -> None:
        self._count: dict[Key, int] = {}
        self._last: dict[Key, int] = {}
        self._resident: set[Key] = set()
        self._clock = 0

    def access(self, key: Key) -> None:
        self._count[key] = self._count.get(key, 0) + 1
        self._last[key] = self._clock
        self._clock += 1

    def admit(self, key: Key) -> None:
        self._resident.add(key)

    def evict(self, protected: Collection[Key]) -> Key:
        victim = min((k for k in self._resident if k not in protected), key=lambda k: (self._count[k], self._last[k]))
        self._resident.discard(victim)
        return victim


class Decay:
    """Frequency with decay: each lookup adds 1 to a key's score, and every score is multiplied by `decay` per
    lookup that passes (any key's), so old popularity fades; the resident key with the lowest score now leaves,
    ties to the older last lookup. decay = 1 is `Lfu`; a small decay approaches `Lru`."""

    def __init__(self, decay: float = 0.99) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"Decay: decay must be in (0, 1], got {decay}")
        self.decay = decay
        self._score: dict[Key, float] = {}
        self._last: dict[Key, int] = {}
        self._resident: set[Key] = set()
        self._clock = 0

    def _now(self, key: Key) -> float:
        return self._score[key] * self.decay ** (self._clock - self._last[key])

    def access(self, key: Key) -> None:
        self._score[key] = (self._now(key) if key in self._score else 0.0) + 1.0
        self._last[key] = self._clock
        self._clock += 1

    def admit(self, key: Key) -> None:
        self._resident.add(key)

    def evict(self, protected: Collection[Key]) -> Key:
        victim = min((k for k in self._resident if k not in protected), key=lambda k: (self._now(k), self._last[k]))
        self._resident.discard(victim)
        return victim


@attrs.frozen
class ExpertCounts:
    """Counters of an expert cache: lookups that found their expert in a slot (hits) or copied it in (misses),
    bytes those copies wrote, the number of slots and the bytes the slots hold (slots x one expert's bytes)."""

    hits: int
    misses: int
    bytes_copied: int
    slots: int
    resident_bytes: int

    def since(self, start: ExpertCounts) -> ExpertCounts:
        """What happened after `start` was read: hits, misses and bytes as differences; slots and bytes held now."""
        return attrs.evolve(
            self,
            hits=self.hits - start.hits,
            misses=self.misses - start.misses,
            bytes_copied=self.bytes_copied - start.bytes_copied,
        )

    def as_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


# The policies a live cache can run (a policy that needs the future, Belady's, is the study's alone).
POLICIES: dict[str, type] = {"lru": Lru, "lfu": Lfu, "decay": Decay}


@attrs.frozen
class Schedule:
    """One layer's lookups: `resident` (expert, slot) pairs already in place, then `loads`, groups of (expert,
    slot) pairs to copy in, each group to be computed before the next is brought in (it may reuse their slots)."""

    resident: tuple[tuple[int, int], ...]
    loads: tuple[tuple[tuple[int, int], ...], ...]


class SlotTable:
    """`slots` fast-tier slots shared by every layer's experts, filled lowest first, then by `policy`'s victims."""

    def __init__(self, slots: int, policy: Policy):
        if slots < 1:
            raise ValueError(f"SlotTable: slots must be >= 1, got {slots}")
        self.slots, self.policy = slots, policy
        self.hits = self.misses = 0
        self._where: dict[Key, int] = {}
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first

    def slot_of(self, key: Key) -> int | None:
        return self._where.get(key)

    def schedule(self, layer: int, experts: list[int]) -> Schedule:
        """The schedule for one layer's distinct chosen `experts` (sorted); counts a hit per resident one and a
        miss per missing one, so hits + misses grows by len(experts)."""
        keys = [(layer, e) for e in experts]
        for k in keys:
            self.policy.access(k)
        resident = tuple((k[1], self._where[k]) for k in keys if k in self._where)
        missing = [k for k in keys if k not in self._where]
        self.hits += len(resident)
        self.misses += len(missing)
        protected = set(keys) if len(keys) <= self.slots else set()
        loads = []
        for at in range(0, len(missing), self.slots):
            group = missing[at : at + self.slots]
            keep = protected | set(group)
            loads.append(tuple((k[1], self._place(k, keep)) for k in group))
        return Schedule(resident=resident, loads=tuple(loads))

    def _place(self, key: Key, protected: set[Key]) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            victim = self.policy.evict(protected)
            slot = self._where.pop(victim)
        self._where[key] = slot
        self.policy.admit(key)
        return slot
