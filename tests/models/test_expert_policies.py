"""Next use over the cycle of layers, the prefetch of a slot table, and the study's trained policies and replays, on
hand-made traces whose outcome is worked out by hand (or bounded by Belady's optimum)."""

from __future__ import annotations

import random

import pytest

from speclane.stages.models.expert_policies import DEFAULT_POLICY, POLICIES, Decay, Lfu, Lru, NextUse
from speclane.stages.models.expert_slots import SlotTable
from speclane.stages.models.expert_study import Belady, PerLayer, Static, compare, keys, replay, replay_counts, tune


def test_next_use_keeps_the_layer_a_pass_needs_next_where_lru_drops_it():
    # layers 0, 1, 2 each choose one expert; 2 slots. At layer 2's miss, (0, 0) is needed 1 layer on and (1, 0) 2
    # on, with the same odds: next use evicts (1, 0); LRU evicts (0, 0), the older, which the next lookup wants.
    for policy, kept in ((NextUse(), (0, 0)), (Lru(), (1, 0))):
        table = SlotTable(2, policy)
        for layer in (0, 1, 2):
            table.schedule(layer, [0])
        assert table.slot_of(kept) is not None and table.slot_of((2, 0)) is not None
    # the whole cycle three times: LRU (and LFU, whose counts tie) misses every lookup, next use hits as Belady does
    cycle = [(layer, (0,)) for _ in range(3) for layer in range(3)]
    got = compare(cycle, 2)
    assert got["lru"] == got["lfu"] == (0, 9) and got["next_use"] == got["belady"] == (3, 6)


def test_next_use_keeps_the_expert_its_layer_chooses_more_often():
    # layer 0 chose expert 0 twice and expert 1 once; a key of layer 1 needs one of their 2 slots. Both are a
    # layer away, so the likelier one stays: (0, 0), which LRU evicts as the older lookup.
    trace = [(0, (0,)), (0, (0,)), (0, (1,)), (1, (5,))]
    for policy, kept, dropped in ((NextUse(), (0, 0), (0, 1)), (Lru(), (0, 1), (0, 0))):
        table = SlotTable(2, policy)
        for layer, experts in trace:
            table.schedule(layer, list(experts))
        assert table.slot_of(kept) is not None and table.slot_of(dropped) is None


def test_next_use_is_the_live_default_and_refuses_a_bad_fade():
    assert DEFAULT_POLICY == "next_use" and POLICIES["next_use"] is NextUse
    with pytest.raises(ValueError, match=r"NextUse: fade must be in \(0, 1\], got 0"):
        NextUse(0)


def test_a_prefetched_expert_is_a_hit_only_when_asked_for_after_it_came():
    table = SlotTable(3, Lru())
    table.schedule(0, [1])  # miss
    assert table.prefetch(1, [2, 3]) == ((2, 1), (3, 2))  # both brought in, into the free slots
    assert table.prefetch(1, [2]) == ()  # already there: nothing to copy
    table.schedule(1, [2, 4])  # 2 was prefetched: a hit; 4 a miss that evicts outside {2, 4}
    assert (table.hits, table.misses, table.prefetched, table.prefetch_hits) == (1, 2, 2, 1)
    table.schedule(1, [2])  # a second lookup of a prefetched expert is a plain hit
    assert (table.hits, table.prefetch_hits) == (2, 1)
    assert table.prefetch(0, [5, 6, 7]) == ()  # a guess the slots cannot hold is dropped whole
    assert table.prefetched == 2


def test_replay_counts_every_copy_including_useless_prefetches():
    trace = [(0, (0,)), (1, (1,)), (0, (0,)), (1, (2,))]
    ahead = [((1, 3),), (), ((2, 3),), ()]  # before each layer-1 lookup, a look-ahead of 2 experts a row
    got = replay_counts(trace, 4, Lru(), start=2, ahead=ahead, prefetch=2)
    # counted from lookup 2: (0, 0) hit; (1, 2) prefetched after lookup 2, then a hit. Copies: the prefetch of
    # (1, 2) and the useless (1, 3) ((1, 3) was already brought by lookup 0's guess, so only 2 is new).
    assert (got["hits"], got["misses"], got["prefetched"], got["prefetch_hits"]) == (2, 0, 1, 1)
    assert got["hit_rate"] == 1.0 and got["copies"] == 0.5
    plain = replay_counts(trace, 4, Lru(), start=2)
    assert (plain["hits"], plain["misses"], plain["prefetched"]) == (1, 1, 0) and plain["copies"] == 0.5


def _grouped_trace(seed: int, layers: int = 4, experts: int = 8, passes: int = 60) -> list:
    rng = random.Random(seed)
    favourite = {layer: rng.sample(range(experts), 3) for layer in range(layers)}
    out = []
    for _ in range(passes):
        for layer in range(layers):
            pick = {rng.choice(favourite[layer]) if rng.random() < 0.7 else rng.randrange(experts) for _ in range(2)}
            out.append((layer, tuple(sorted(pick))))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_belady_bounds_the_copies_of_every_policy_even_with_prefetch(seed):
    trace, train = _grouped_trace(seed), _grouped_trace(seed + 100)
    rng = random.Random(seed)
    ahead = [tuple(tuple(rng.sample(range(8), 2)) for _ in range(2)) for _ in trace]
    for slots in (4, 9, 16):
        bound = replay_counts(trace, slots, Belady(keys(trace)))
        policies = [Lru(), Lfu(), NextUse(), Static(train), PerLayer.trained(train, slots)]
        policies.append(PerLayer.equal(range(4), slots))
        for policy in policies:
            got = replay_counts(trace, slots, policy)
            assert got["hits"] + got["misses"] == len(keys(trace))
            assert got["copies"] >= bound["copies"], (slots, type(policy).__name__)
        for prefetch in (1, 2):
            got = replay_counts(trace, slots, NextUse(), ahead=ahead, prefetch=prefetch)
            assert got["copies"] >= bound["copies"], (slots, prefetch)


def test_static_pins_the_training_traces_frequent_experts():
    train = [(0, (0,))] * 5 + [(0, (1,))] * 3 + [(0, (2,))]
    table = SlotTable(2, Static(train))
    # 2 evicts 1 (rarer than 0 in training); 0 hits; 1 comes back in place of 2. LRU would hit nothing here.
    for e in (0, 1, 2, 0, 1):
        table.schedule(0, [e])
    assert (table.hits, table.misses) == (1, 4)
    assert table.slot_of((0, 0)) is not None and table.slot_of((0, 1)) is not None


def test_per_layer_shares_follow_the_training_trace():
    train = [(0, (0, 1, 2)), (1, (0,))] * 4  # layer 0 holds 3 of the 4 most frequent keys
    policy = PerLayer.trained(train, 4)
    assert policy.share == {0: 3, 1: 1}
    table = SlotTable(4, policy)
    for _ in range(3):
        table.schedule(1, [0, 1])  # layer 1's keys are looked up more often than layer 0's ...
    table.schedule(0, [0, 1])
    table.schedule(1, [2])  # ... but layer 1 is over its share: its own least used key leaves, where LFU's
    assert table.slot_of((1, 0)) is None  # victim would be a layer-0 key (1 lookup against 3)
    assert all(table.slot_of(k) is not None for k in ((0, 0), (0, 1), (1, 1), (1, 2)))
    table.schedule(0, [2])  # layer 0 below its share: the layer most over its share gives up its least used
    assert table.slot_of((1, 2)) is None and table.slot_of((0, 2)) is not None


def test_tune_chooses_on_the_training_trace_the_value_that_misses_least():
    rng = random.Random(3)
    trace = [
        (layer, tuple(sorted({rng.choice((0, 1, 2)) if rng.random() < 0.6 else rng.randrange(6) for _ in range(2)})))
        for _ in range(40)
        for layer in range(3)
    ]
    values = (0.5, 0.9, 1.0, 0.99)
    misses = {v: replay(trace, 4, Decay(v))[1] for v in values}
    assert len(set(misses.values())) > 1  # the choice matters on this trace
    assert tune(trace, 4, Decay, values) == min(values, key=misses.get)
    cycle = [(layer, (0,)) for _ in range(4) for layer in range(3)]
    assert tune(cycle, 1, Decay, (0.9, 1.0)) == 0.9  # a tie (one slot misses everything): the first value


def test_next_use_evicts_the_farthest_expected_next_use_of_every_resident_key():
    """The victim is the rule applied to every resident key outside the protected set, found by brute force before
    each eviction, through a slot table's schedules (streamed and fitting) and prefetches on random lookups."""

    class Checked(NextUse):
        def evict(self, protected):
            n = len(self._layers)

            def score(k):
                p, d = self._p(k), self._dist.get(k[0], n)
                return (d + n * (1.0 - p) / p if p > 0 else float("inf"), d, k)

            # a layer's candidate: its least chosen key outside `protected` (the smaller key on a tie); the victim:
            # the candidate of the largest score, then distance, then key
            layers = [[k for k in keys if k not in protected] for keys in self._resident.values()]
            want = max((min(free, key=lambda k: (self._p(k), k)) for free in layers if free), key=score)
            got = super().evict(protected)
            assert got == want
            self.checked += 1
            return got

    rng = random.Random(3)
    for slots in (3, 8, 20):
        policy = Checked()
        policy.checked = 0
        table = SlotTable(slots, policy)
        for _ in range(300):
            for layer in (0, 2, 3, 5):
                chosen = sorted(rng.sample(range(12), rng.choice((1, 2, 4))) if rng.random() < 0.9 else range(9))
                table.schedule(layer, chosen)
                if rng.random() < 0.2:
                    table.prefetch((layer + 1) % 6, sorted(rng.sample(range(12), 2)))
        assert policy.checked > 200
