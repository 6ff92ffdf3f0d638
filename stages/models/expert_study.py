"""The replacement-policy study: record a target's routing trace, replay it under each policy and Belady's optimum.

Owns: `recording` (a target's expert cache appends each lookup, (layer, sorted distinct experts), to a list while
the block runs), `Belady` (the policy that knows the future: the resident key used again farthest ahead leaves),
`replay` (a trace through a `SlotTable` of so many slots, the live cache's own bookkeeping, so a replay under the
policy the cache ran counts exactly its hits and misses) and `compare` (every policy on one trace).
Pure Python apart from `recording`. Not here: the live cache (`expert_cache.py`), the policies a cache can run
(`expert_slots.py`).
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Collection, Iterator, Sequence

from speclane.stages.models.expert_slots import POLICIES, Decay, Key, Policy, SlotTable

Trace = Sequence[tuple[int, Sequence[int]]]  # (layer, the sorted distinct experts its rows chose), lookup by lookup


def keys(trace: Trace) -> list[Key]:
    """The trace's keys in the order a SlotTable hears them."""
    return [(layer, e) for layer, experts in trace for e in experts]


class Belady:
    """Belady's optimum: on a miss with every slot taken, the resident key whose next lookup is farthest ahead
    (or never comes) leaves; ties go to the smaller key. Needs the whole trace, `future`, heard in that order."""

    def __init__(self, future: Sequence[Key]):
        self._at: dict[Key, list[int]] = {}
        for i, k in enumerate(future):
            self._at.setdefault(k, []).append(i)
        self._resident: set[Key] = set()
        self._clock = 0  # lookups heard so far

    def access(self, key: Key) -> None:
        self._clock += 1

    def admit(self, key: Key) -> None:
        self._resident.add(key)

    def _next(self, key: Key) -> float:
        uses = self._at.get(key, [])
        i = bisect.bisect_left(uses, self._clock)
        return uses[i] if i < len(uses) else float("inf")

    def evict(self, protected: Collection[Key]) -> Key:
        victim = max(sorted(k for k in self._resident if k not in protected), key=self._next)
        self._resident.discard(victim)
        return victim


def replay(trace: Trace, slots: int, policy: Policy) -> tuple[int, int]:
    """(hits, misses) of `trace` through `slots` slots under `policy` (a fresh one: policies keep state)."""
    table = SlotTable(slots, policy)
    for layer, experts in trace:
        table.schedule(layer, sorted(experts))
    return table.hits, table.misses


def compare(trace: Trace, slots: int, decay: float = 0.99) -> dict[str, tuple[int, int]]:
    """(hits, misses) per policy on one trace: every live policy (decay's factor `decay`) and "belady", the
    lower bound on misses the live ones are measured against."""
    out = {name: replay(trace, slots, Decay(decay) if name == "decay" else cls()) for name, cls in POLICIES.items()}
    out["belady"] = replay(trace, slots, Belady(keys(trace)))
    return out


@contextlib.contextmanager
def recording(target) -> Iterator[list[tuple[int, tuple[int, ...]]]]:
    """The routing trace of the passes `target` runs inside the block; the target needs an expert cache (its
    lookups are what is recorded; a cache of every expert records the routing with no copies after the first)."""
    if target.experts is None:
        raise ValueError("recording: the target has no expert cache; load it with expert_cache_bytes")
    trace: list[tuple[int, tuple[int, ...]]] = []
    target.experts.trace = trace
    try:
        yield trace
    finally:
        target.experts.trace = None
