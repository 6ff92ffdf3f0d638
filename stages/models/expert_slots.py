"""Which routed expert sits in which fast-tier slot, and which one leaves: the bookkeeping of an expert cache.

Owns: `SlotTable`, which turns one layer's lookups into a schedule: the experts already in a slot (hits), then
the missing ones in groups that fit the slots (misses), each given its slot; a prefetch (experts brought in before
any row asks for them, counted apart); and the counters record (`ExpertCounts`) a pass reports. Pure Python, no
tensors: the live cache (`expert_cache.py`) and the policy study (`expert_study.py`) run the same table, so a
replayed trace counts exactly what the live cache counted. The replacement policies it runs are
`expert_policies.py`'s (re-exported here). Not here: the slot buffers and the copies (`expert_cache.py`), the expert
math (`speclane.kernels.moe`).

A key is (layer, expert). Lookups of one layer come as the sorted union of the experts its rows chose. When the
union fits the slots, none of its keys is evicted while it is being brought in; when it does not, the missing
experts stream through the slots a group at a time, and a group protects only itself (the caller computes each
group before the next one is brought in).
"""

from __future__ import annotations

import attrs

from speclane.stages.models.expert_policies import POLICIES, Decay, Key, Lfu, Lru, NextUse, Policy

__all__ = ["POLICIES", "Decay", "ExpertCounts", "Key", "Lfu", "Lru", "NextUse", "Policy", "Schedule", "SlotTable"]


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
        self.prefetched = self.prefetch_hits = 0  # copies made ahead of a lookup; lookups they turned into hits
        self._begin = getattr(policy, "begin", None)
        self._where: dict[Key, int] = {}
        self._ahead: set[Key] = set()  # prefetched keys no lookup has asked for yet
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first

    def slot_of(self, key: Key) -> int | None:
        return self._where.get(key)

    def schedule(self, layer: int, experts: list[int]) -> Schedule:
        """The schedule for one layer's distinct chosen `experts` (sorted); counts a hit per resident one and a
        miss per missing one, so hits + misses grows by len(experts)."""
        keys = [(layer, e) for e in experts]
        if self._begin is not None:
            self._begin(layer)
        for k in keys:
            self.policy.access(k)
        resident = tuple((k[1], self._where[k]) for k in keys if k in self._where)
        missing = [k for k in keys if k not in self._where]
        self.hits += len(resident)
        self.misses += len(missing)
        if self._ahead:
            used = self._ahead.intersection(keys)
            self.prefetch_hits += len(used)
            self._ahead -= used
        protected = set(keys) if len(keys) <= self.slots else set()
        loads = []
        for at in range(0, len(missing), self.slots):
            group = missing[at : at + self.slots]
            keep = protected | set(group)
            loads.append(tuple((k[1], self._place(k, keep)) for k in group))
        return Schedule(resident=resident, loads=tuple(loads))

    def prefetch(self, layer: int, experts: list[int]) -> tuple[tuple[int, int], ...]:
        """Bring layer `layer`'s `experts` (sorted, distinct) into slots before any row asks for them (a
        look-ahead's guess): (expert, slot) pairs to copy in, for those not resident. Counted in `prefetched`, not
        as lookups; a later lookup that finds one counts a hit (and a `prefetch_hits`); a guess that would not fit
        the slots is dropped whole."""
        missing = [(layer, e) for e in experts if (layer, e) not in self._where]
        if not missing or len(missing) >= self.slots:
            return ()
        self.prefetched += len(missing)
        self._ahead.update(missing)
        keep = set(missing)
        return tuple((k[1], self._place(k, keep)) for k in missing)

    def _place(self, key: Key, protected: set[Key]) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            victim = self.policy.evict(protected)
            slot = self._where.pop(victim)
            self._ahead.discard(victim)
        self._where[key] = slot
        self.policy.admit(key)
        return slot
