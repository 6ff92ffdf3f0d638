"""The replacement-policy study: record a target's routing trace, replay it under each policy and Belady's optimum.

Owns: `recording` (a target's expert cache appends each lookup, (layer, sorted distinct experts), to a list while
the block runs, and optionally its router look-ahead), `Belady` (the policy that knows the future: the resident key
used again farthest ahead leaves), the policies that need a training trace or a fixed split (`Static`: a training
trace's frequencies frozen; `PerLayer`: a fixed share of the slots per layer), `replay` (a trace through a
`SlotTable` of so many slots, the live cache's own bookkeeping, so a replay under the policy the cache ran counts
exactly its hits and misses), `replay_counts` (the same from a start index, with the look-ahead prefetch the live
cache can run), `compare` (every live policy and Belady's on one trace) and `tune` (a policy's parameter chosen on a
training trace). Belady's optimum bounds the misses of demand paging, where an expert is copied when a row asks for
it: with a prefetch, copies made ahead of the demand can turn lookups into hits beyond Belady's, at the price of more
copies (a guess nobody uses); `replay_counts` reports both. Pure Python apart from `recording`. Not here: the live
cache (`expert_cache.py`), the policies a cache can run (`expert_policies.py`).
"""

from __future__ import annotations

import bisect
import contextlib
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence

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


class Static:
    """The training trace's frequencies frozen: the resident key looked up least often in it leaves (ties to the
    least recently used). With a training trace like the one replayed this keeps each layer's most frequent experts
    pinned, as many per layer as their frequencies earn."""

    def __init__(self, train: Trace):
        self._freq = Counter(keys(train))
        self._order: dict[Key, None] = {}  # resident keys, oldest lookup first

    def access(self, key: Key) -> None:
        if key in self._order:
            del self._order[key]
            self._order[key] = None

    def admit(self, key: Key) -> None:
        self._order[key] = None

    def evict(self, protected: Collection[Key]) -> Key:
        victim = min((k for k in self._order if k not in protected), key=lambda k: self._freq.get(k, 0))
        del self._order[victim]
        return victim


class PerLayer:
    """A per-layer split of the slots: layer l keeps at most `share[l]` of them; inside a layer, least frequently
    used (`recency` False: the fewest lookups since the start leave, ties to the older) or least recently used
    (`recency` True). A key of a layer at its share evicts its own layer's; below it, the layer most over its share
    gives one up. `trained` sizes the shares on a training trace, `equal` splits the slots evenly (a per-layer LRU
    cache, as a GPU expert cache that gives each layer its own slots does)."""

    def __init__(self, share: dict[int, int], recency: bool = False):
        self.share, self.recency = dict(share), recency
        self._count: Counter = Counter()
        self._last: dict[Key, int] = {}
        self._resident: dict[int, set[Key]] = {}
        self._layer, self._clock = None, 0

    @classmethod
    def trained(cls, train: Trace, slots: int) -> PerLayer:
        """Layer l's share: its keys among the training trace's `slots` most frequent (a layer whose experts are
        chosen often gets more, as a miss there is likelier); LFU inside."""
        return cls(Counter(k[0] for k, _ in Counter(keys(train)).most_common(slots)))

    @classmethod
    def equal(cls, layers: Sequence[int], slots: int) -> PerLayer:
        """`slots` split evenly over `layers` (the first ones take the remainder); LRU inside."""
        n = len(layers)
        return cls({layer: slots // n + (i < slots % n) for i, layer in enumerate(layers)}, recency=True)

    def access(self, key: Key) -> None:
        self._layer = key[0]
        self._count[key] += 1
        self._last[key], self._clock = self._clock, self._clock + 1

    def admit(self, key: Key) -> None:
        self._resident.setdefault(key[0], set()).add(key)

    def evict(self, protected: Collection[Key]) -> Key:
        free = {layer: [k for k in held if k not in protected] for layer, held in self._resident.items()}
        free = {layer: ks for layer, ks in free.items() if ks}
        layer = self._layer
        if layer not in free or len(self._resident[layer]) < self.share.get(layer, 0):
            layer = max(free, key=lambda n: (len(self._resident[n]) - self.share.get(n, 0), n))
        last = self._last.get
        order = (lambda k: (last(k, -1), k)) if self.recency else (lambda k: (self._count[k], last(k, -1), k))
        victim = min(free[layer], key=order)
        self._resident[layer].discard(victim)
        return victim


def replay_counts(
    trace: Trace,
    slots: int,
    policy: Policy,
    start: int = 0,
    ahead: Sequence[Sequence[Sequence[int]]] | None = None,
    prefetch: int = 0,
) -> dict[str, float]:
    """`trace` through `slots` slots under `policy`, counting the lookups from index `start` (those before warm the
    slots): hits, misses, prefetched (copies made ahead: after lookup i, the union of the `prefetch` best experts per
    row of `ahead[i]`, the recorded look-ahead for the next lookup's layer, as the live cache does) and
    prefetch_hits; `hit_rate` = hits / lookups (an expert in its slot when asked for), `copies` = (misses +
    prefetched) / lookups (the bytes moved, in experts a lookup: what Belady's optimum minimizes)."""
    table, warm = SlotTable(slots, policy), (0, 0, 0, 0)
    for i, (layer, experts) in enumerate(trace):
        if i == start:
            warm = (table.hits, table.misses, table.prefetched, table.prefetch_hits)
        table.schedule(layer, sorted(experts))
        if prefetch and ahead is not None and i + 1 < len(trace) and ahead[i]:
            table.prefetch(trace[i + 1][0], sorted({e for row in ahead[i] for e in row[:prefetch]}))
    if start >= len(trace):
        warm = (table.hits, table.misses, table.prefetched, table.prefetch_hits)
    hits, misses, fetched, used = (
        n - w for n, w in zip((table.hits, table.misses, table.prefetched, table.prefetch_hits), warm)
    )
    lookups = max(1, hits + misses)
    return {
        "hits": hits,
        "misses": misses,
        "prefetched": fetched,
        "prefetch_hits": used,
        "hit_rate": hits / lookups,
        "copies": (misses + fetched) / lookups,
    }


def tune(train: Trace, slots: int, make: Callable[[float], Policy], values: Sequence[float]) -> float:
    """The value of `values` whose policy `make(value)` misses least on the training trace `train` (the first on a
    tie): a parameter chosen without looking at the traces it is then measured on."""
    return min(values, key=lambda v: (replay(train, slots, make(v))[1], values.index(v)))


@contextlib.contextmanager
def recording(target, ahead: list | None = None) -> Iterator[list[tuple[int, tuple[int, ...]]]]:
    """The routing trace of the passes `target` runs inside the block; the target needs an expert cache (its
    lookups are what is recorded; a cache of every expert records the routing with no copies after the first).
    `ahead`, when a list, receives the router look-ahead of each lookup (`ExpertCache.ahead`)."""
    if target.experts is None:
        raise ValueError("recording: the target has no expert cache; load it with expert_cache_bytes")
    trace: list[tuple[int, tuple[int, ...]]] = []
    target.experts.trace, target.experts.ahead = trace, ahead
    try:
        yield trace
    finally:
        target.experts.trace = target.experts.ahead = None
