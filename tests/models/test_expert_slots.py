"""The slot table and its replacement policies on hand-made traces whose hits and misses are worked out by hand,
and the policy study (`expert_study`): replaying a recorded trace counts exactly what the live cache counted."""

import pytest
import torch

from speclane.stages.models.expert_slots import POLICIES, Decay, Lfu, Lru, Schedule, SlotTable
from speclane.stages.models.expert_study import Belady, compare, keys, recording, replay
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts, prompt  # noqa: F401  (fixtures)

A, B, C = 0, 1, 2


def single(*experts: int) -> list[tuple[int, tuple[int, ...]]]:
    """One lookup of one expert each, all in layer 0: the textbook paging setting."""
    return [(0, (e,)) for e in experts]


# (trace, slots, {policy: (hits, misses)}), each worked out by hand:
CASES = [
    # A B A C B A, 2 slots. LRU: only the second A hits. LFU: C evicts B (1 lookup to A's 2), then B evicts C
    # (1 to A's 2), so both As after the first hit. Belady: C evicts A (used again later than B), B then hits.
    (single(A, B, A, C, B, A), 2, {"lru": (1, 5), "lfu": (2, 4), "belady": (2, 4)}),
    # A B C A B C, 2 slots: a loop one longer than the slots; LRU and LFU miss every time, Belady keeps A and C.
    (single(A, B, C, A, B, C), 2, {"lru": (0, 6), "lfu": (0, 6), "belady": (2, 4)}),
    # A A B C A, 2 slots: a frequent expert and a scan; LRU lets the scan push A out, LFU and Belady keep A.
    (single(A, A, B, C, A), 2, {"lru": (1, 4), "lfu": (2, 3), "belady": (2, 3)}),
]


@pytest.mark.parametrize("trace, slots, want", CASES)
def test_hand_traces(trace, slots, want):
    got = compare(trace, slots)
    for name, counts in want.items():
        assert got[name] == counts, name
    # decay 1 never forgets (LFU); a decay of 0.01 forgets all but the last lookup (LRU)
    assert replay(trace, slots, Decay(1.0)) == want["lfu"]
    assert replay(trace, slots, Decay(0.01)) == want["lru"]


def test_a_layer_that_chooses_more_than_the_slots_streams_in_groups():
    table = SlotTable(2, Lru())
    plan = table.schedule(0, [0, 1, 2, 3, 4])
    # groups of 2 in expert order; each group evicts the least recent keys outside itself
    assert plan == Schedule(resident=(), loads=(((0, 0), (1, 1)), ((2, 0), (3, 1)), ((4, 0),)))
    assert table.schedule(0, [3, 4]) == Schedule(resident=((3, 1), (4, 0)), loads=())
    assert (table.hits, table.misses) == (2, 5)


def test_a_lookup_that_fits_never_evicts_its_own_keys():
    # LFU would rather evict (0, 2), looked up twice, than (1, 0) and (1, 1), looked up three times; but (0, 2) is
    # part of the lookup being brought in, so the table protects it.
    table = SlotTable(3, Lfu())
    for _ in range(3):
        table.schedule(1, [0, 1])
    table.schedule(0, [2])
    plan = table.schedule(0, [1, 2])
    assert plan.resident == ((2, 2),) and plan.loads == (((1, 0),),)
    assert table.slot_of((0, 2)) == 2 and table.slot_of((1, 0)) is None


def test_belady_is_a_lower_bound_on_misses_of_a_random_grouped_trace():
    gen = torch.Generator().manual_seed(0)
    trace = [
        (layer, tuple(sorted(set(torch.randint(0, 8, (3,), generator=gen).tolist()))))
        for _ in range(60)
        for layer in range(3)
    ]
    for slots in (3, 5, 9):
        got = compare(trace, slots)
        assert all(got["belady"][1] <= misses for _, misses in got.values()), (slots, got)
        assert all(h + m == len(keys(trace)) for h, m in got.values())


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"SlotTable: slots must be >= 1, got 0"):
        SlotTable(0, Lru())
    with pytest.raises(ValueError, match=r"Decay: decay must be in \(0, 1\], got 1.5"):
        Decay(1.5)
    assert isinstance(Belady([]), Belady)


def test_a_recorded_trace_replays_to_the_live_counts(artifacts):
    one = 3 * 48 * 24 * 4
    target = Target.load(artifacts["qwen3_next"][0], dtype=torch.float32, expert_cache_bytes=6 * one)
    state = target.new_state(1, 64)
    with recording(target) as trace:
        target.forward(RowBatch.build([(0, 0, prompt(9, seed=1))]), state)
        for pos in range(9, 15):
            target.forward(RowBatch.build([(0, pos, [pos])]), state)
    assert target.experts.trace is None and len(trace) == 4 * 7  # 4 MoE layers, 7 passes
    live = target.expert_stats()
    assert replay(trace, 6, POLICIES[target.experts.policy]()) == (live.hits, live.misses)  # the live policy
    plain = Target.load(artifacts["qwen3_next"][0], dtype=torch.float32)
    with pytest.raises(ValueError, match="recording: the target has no expert cache"), recording(plain):
        pass
