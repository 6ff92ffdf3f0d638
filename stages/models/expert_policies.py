"""Replacement policies of an expert cache: which resident (layer, expert) leaves a fast-tier slot for a new one.

Owns: the `Policy` protocol, the policies a live cache can run (`POLICIES`, keyed by kind: `lru`, `lfu`, `decay`,
`next_use`) and `DEFAULT_POLICY`, the one it runs unless told otherwise. Pure Python, no tensors. Not here: the
slots and their schedule (`expert_slots.py`), Belady's optimum and the policies that need a training trace
(`expert_study.py`). Why `next_use` is the default, with the measurements: docs/decisions/0012-expert-cache.md.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Collection, Hashable
from typing import Protocol

Key = Hashable  # (layer, expert)


class Policy(Protocol):
    """A replacement policy. `access` hears every lookup in order (hit or miss, before a miss is admitted),
    `admit` a key that now holds a slot, `evict` must choose a resident key outside `protected` and forget it.
    A policy may also define `begin(layer)`, which the slot table calls before each layer's lookups."""

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
    eviction, so an expert that is often chosen comes back with its history); ties go to the older last lookup.
    A key admitted without a lookup (a prefetch) counts 0 lookups."""

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

    def _rank(self, key: Key) -> tuple:
        return (self._count.get(key, 0), self._last.get(key, -1))

    def evict(self, protected: Collection[Key]) -> Key:
        """The unprotected resident key of the lowest `_rank` leaves."""
        victim = min((k for k in self._resident if k not in protected), key=self._rank)
        self._resident.discard(victim)
        return victim


class Decay(Lfu):
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
        if key not in self._score:
            return 0.0
        return self._score[key] * self.decay ** (self._clock - self._last[key])

    def access(self, key: Key) -> None:
        self._score[key] = self._now(key) + 1.0
        self._last[key] = self._clock
        self._clock += 1

    def _rank(self, key: Key) -> tuple:
        return (self._now(key), self._last.get(key, -1))


# NextUse's fade per visit of a layer, chosen on a training trace of the benchmark's MoE target (never on the
# traces it is evaluated on): docs/decisions/0012-expert-cache.md.
FADE = 0.9


class NextUse:
    """Expected next use over the cycle of MoE layers. A pass looks its MoE layers up in order, so a resident key
    (layer, expert) is next needed when a pass comes back to its layer, d layer lookups ahead (1 for the next layer,
    a whole cycle for the one just looked up), if that visit chooses the expert (probability p), else a cycle later
    with the same odds: d + cycle * (1 - p) / p ahead on average. The key whose expected next use is farthest
    leaves: Belady's rule with the future replaced by its expectation. LRU evicts the opposite end of that cycle
    (the next layer's experts, idle for longest), which is why it misses every time on a cycle longer than the slots.
    p is the faded share of the layer's visits that chose the expert: a visit multiplies the layer's counts by
    `fade` before it counts, so p follows the text being decoded; an unvisited prior visit keeps p below 1. The cycle
    is learned from the layers heard (in increasing index, as a pass runs them); `begin(layer)` marks each visit."""

    def __init__(self, fade: float = FADE) -> None:
        if not 0.0 < fade <= 1.0:
            raise ValueError(f"NextUse: fade must be in (0, 1], got {fade}")
        self.fade = fade
        self._layers: list[int] = []  # the cycle: MoE layers heard, increasing
        self._visits: dict[int, int] = {}  # layer -> visits so far
        self._weight: dict[int, float] = {}  # layer -> faded visits
        self._count: dict[Key, tuple[float, int]] = {}  # key -> (faded choices, its layer's visits then)
        self._resident: dict[int, set[Key]] = {}  # layer -> resident keys
        self._ranked: dict[int, list[tuple[float, Key]]] = {}  # layer -> (p, key) of its resident keys, lowest first
        self._layer: int | None = None
        self._dist: dict[int, int] = {}  # layer -> layer lookups until a pass next looks it up

    def begin(self, layer: int) -> None:
        if layer not in self._visits:
            bisect.insort(self._layers, layer)
            self._visits[layer], self._weight[layer] = 0, 0.0
        if layer != self._layer:  # layer lookups until a pass next looks each layer up: 1 to a whole cycle
            n, here = len(self._layers), self._layers.index(layer)
            self._dist = {m: (i - here) % n or n for i, m in enumerate(self._layers)}
        self._layer = layer
        self._visits[layer] += 1
        self._weight[layer] = self._weight[layer] * self.fade + 1.0
        self._ranked.pop(layer, None)

    def access(self, key: Key) -> None:
        layer = key[0]
        if layer not in self._visits:  # a caller that does not mark visits: each lookup of a new layer is one
            self.begin(layer)
        self._count[key] = (self._choices(key) + 1.0, self._visits[layer])

    def admit(self, key: Key) -> None:
        self._resident.setdefault(key[0], set()).add(key)
        ranked = self._ranked.get(key[0])
        if ranked is not None:
            bisect.insort(ranked, (self._p(key), key))

    def evict(self, protected: Collection[Key]) -> Key:
        """The resident key outside `protected` whose expected next use is farthest, forgotten: each layer's least
        chosen key (the smaller key on a tie) against the others' by score, then distance, then the larger key."""
        best, where, n, dist = None, None, len(self._layers), self._dist
        for layer, keys in self._resident.items():
            ranked = self._ranked.get(layer)
            if ranked is None:
                ranked = self._ranked[layer] = sorted((self._p(k), k) for k in keys)
            i = 0
            while i < len(ranked) and ranked[i][1] in protected:
                i += 1
            if i == len(ranked):
                continue
            p, key = ranked[i]
            d = dist.get(layer, n)
            score = (d + n * (1.0 - p) / p if p > 0 else float("inf"), d, key)
            if best is None or score > best:
                best, where = score, (ranked, i)
        if where is None:
            raise ValueError("NextUse.evict: every resident key is protected")
        ranked, i = where
        victim = ranked.pop(i)[1]
        self._resident[victim[0]].discard(victim)
        return victim

    def _p(self, key: Key) -> float:
        """The faded share of its layer's visits (plus one prior visit) that chose `key`'s expert. Changes only at a
        visit of the layer, so a layer's ranking (`_ranked`) is kept until then."""
        count, at = self._count.get(key, (0.0, 0))
        visits = self._visits.get(key[0], 0)
        return count * self.fade ** (visits - at) / (self._weight.get(key[0], 0.0) + 1.0) if count else 0.0

    def _choices(self, key: Key) -> float:
        count, at = self._count.get(key, (0.0, 0))
        return count * self.fade ** (self._visits.get(key[0], 0) - at) if count else 0.0


# The policies a live cache can run (a policy that needs the future, Belady's, is the study's alone).
POLICIES: dict[str, type] = {"lru": Lru, "lfu": Lfu, "decay": Decay, "next_use": NextUse}
DEFAULT_POLICY = "next_use"
