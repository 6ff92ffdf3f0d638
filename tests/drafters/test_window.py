"""The drafter window: a per-slot ring of the last `size` committed positions, emptied for a new lane.

Every key written here encodes its (slot, position), so the test can read back exactly which positions a slot
holds; the ring's order is free (attention does not care), so holdings are compared as sets.
"""

import pytest
import torch

from speclane.stages.models.drafter_window import Window


class Lane:
    def __init__(self, slot):
        self.slot = slot


def rows_for(spans, layers, dim):
    """spans [(slot, start, n)] -> flat k [rows, layers, dim] encoding slot * 1e6 + position, and lane_rows."""
    vals = [slot * 1_000_000 + start + j for slot, start, n in spans for j in range(n)]
    k = torch.tensor(vals, dtype=torch.float64)[:, None, None].expand(-1, layers, dim).clone()
    return k, tuple(n for _, _, n in spans)


def held(w: Window, slot: int) -> set[int]:
    k, v, valid = w.read(torch.tensor([slot]), w.size)
    assert torch.equal(k, v)
    assert torch.all(k[0, 0] == k[0, -1])  # every layer the same row
    return {int(x) % 1_000_000 for x in k[0, 0, :, 0][valid[0]].tolist()}


def append(w, spans, keep=None):
    k, lane_rows = rows_for(spans, w.k.shape[1], w.kv_dim)
    slots = torch.tensor([s for s, _, _ in spans])
    w.append(slots, k, k.clone(), lane_rows, None if keep is None else torch.tensor(keep))


@pytest.fixture
def window():
    w = Window(slots=3, size=8, layers=2, kv_dim=3, dtype=torch.float64, device="cpu")
    w.claim([Lane(0), Lane(1), Lane(2)])
    return w


def test_prefill_keeps_only_the_last_size_positions(window):
    append(window, [(0, 0, 5), (1, 0, 20), (2, 0, 8)])
    assert held(window, 0) == set(range(5))
    assert held(window, 1) == set(range(12, 20))
    assert held(window, 2) == set(range(8))
    assert window.count.tolist() == [5, 20, 8]


def test_verify_rounds_keep_only_committed_rows_and_slide(window):
    append(window, [(0, 0, 6), (1, 0, 3)])
    # A verify round: lane 0 ran 4 rows (positions 6..9) and committed 2; lane 1 ran 8, committed all 8.
    append(window, [(0, 6, 4), (1, 3, 8)], keep=[2, 8])
    assert held(window, 0) == set(range(8))
    assert held(window, 1) == set(range(3, 11))
    # The next round of lane 0 starts at position 8: the uncommitted rows 8, 9 were never kept.
    append(window, [(0, 8, 3)], keep=[1])
    assert held(window, 0) == set(range(1, 9))
    for step in range(30):  # slide far past the size, one committed position a round, rows rejected each time
        start = 9 + step
        append(window, [(0, start, 5)], keep=[1])
        assert held(window, 0) == set(range(start - 7, start + 1))


def test_a_new_lane_in_a_slot_starts_empty(window):
    append(window, [(1, 0, 6)])
    fresh = window.claim([Lane(1)])
    assert fresh == [1]
    assert held(window, 1) == set()
    append(window, [(1, 0, 2)])
    assert held(window, 1) == {0, 1}
    same = [Lane(2)]
    window.claim(same)
    assert window.claim(same) == []  # the same lane again: nothing is emptied


def test_the_full_size_window_slides_past_2048_positions():
    w = Window(slots=2, size=2048, layers=1, kv_dim=1, dtype=torch.float64, device="cpu")
    w.claim([Lane(0), Lane(1)])
    append(w, [(0, 0, 512), (1, 0, 100)])
    append(w, [(0, 512, 512)])
    append(w, [(0, 1024, 1000)])
    assert held(w, 0) == set(range(2024))
    pos = 2024
    rounds = [(8, 8), (8, 3), (5, 5), (8, 8), (8, 1), (8, 8)]
    for i, (n, keep) in enumerate(rounds):  # verify rounds across the 2048 mark, beside a short lane
        append(w, [(0, pos, n), (1, 100 + i, 1)], keep=[keep, 1])
        pos += keep
        assert held(w, 0) == set(range(max(0, pos - 2048), pos))
    assert pos > 2048
    assert held(w, 1) == set(range(106))
    append(w, [(0, pos, 4000)])  # one prefill chunk longer than the window
    assert held(w, 0) == set(range(pos + 4000 - 2048, pos + 4000))


@pytest.mark.parametrize("seed", range(4))
def test_many_passes_at_once_leave_what_pass_after_pass_leaves(seed):
    """`append_rows` (a flush's queued passes in one go) against `append` one pass at a time: random passes over
    a few slots, each slot in several of them, prefill chunks longer than the ring, lanes that keep no row or
    run none, so positions wrap and a later pass overwrites an earlier one's; the rings, counts and the carried
    vectors must be equal exactly."""
    from speclane.stages.drafters.model_backend import SlotState
    from speclane.stages.drafters.pending import Queue
    from speclane.stages.models.drafter_window import PassRows

    gen = torch.Generator().manual_seed(seed)
    slots, size = 4, 8
    one, many, queued = (Window(slots, size, 2, 3, torch.float64, "cpu") for _ in range(3))
    lanes = [Lane(s) for s in range(slots)]
    one.claim(lanes), many.claim(lanes), queued.claim(lanes)
    carry_one, carry_many, carry_queued = (
        SlotState(w, torch.zeros(slots, 3, dtype=torch.float64), Queue(slots)) for w in (one, many, queued)
    )
    passes, ks, vectors = [], [], []
    for _ in range(9):
        lane_slots = torch.randperm(slots, generator=gen)[: int(torch.randint(1, slots + 1, (1,), generator=gen))]
        lane_rows = tuple(int(n) for n in torch.randint(0, 13, (len(lane_slots),), generator=gen))
        keep = torch.tensor([int(torch.randint(0, n + 1, (1,), generator=gen)) for n in lane_rows])
        keep = None if torch.rand(1, generator=gen) < 0.3 else keep  # a prefill chunk: every row kept
        k = torch.randn(sum(lane_rows), 2, 3, generator=gen, dtype=torch.float64)
        vec = torch.randn(sum(lane_rows), 3, generator=gen, dtype=torch.float64)
        one.append(lane_slots, k, k * 2, lane_rows, keep)
        cu = torch.tensor((0,) + lane_rows).cumsum(0)
        carry_one.carry_last(lane_slots, cu, vec, torch.tensor(lane_rows) if keep is None else keep)
        passes.append((lane_slots, lane_rows, keep)), ks.append(k), vectors.append(vec)
        positions = torch.arange(k.shape[0])  # the queue's rows: [k | vec] flat, as a backend's raw rows
        carry_queued.queue.add(
            lane_slots.tolist(),
            lane_rows,
            torch.tensor(lane_rows) if keep is None else keep,
            positions,
            torch.cat([k.flatten(1), vec], dim=1),
        )
    rows = PassRows.of(passes, slots)
    k = torch.cat(ks)
    many.append_rows(rows, k, k * 2)
    carry_many.carry_rows(rows, torch.cat(vectors))
    assert torch.equal(one.count, many.count)
    assert torch.equal(one.k, many.k) and torch.equal(one.v, many.v)
    assert torch.equal(carry_one.carry, carry_many.carry)
    assert int(one.count.max()) > size  # the ring wrapped somewhere
    per_slot = [0] * slots
    for lane_slots, lane_rows, _ in passes:
        for slot, n in zip(lane_slots.tolist(), lane_rows):
            per_slot[slot] += n
    assert [carry_queued.queue.queued_rows(s) for s in range(slots)] == per_slot  # the plan's backlog count
    taken = carry_queued.queue.take()  # the queue hands them out grouped by slot: the same result
    assert not carry_queued.queue and carry_queued.queue.held_rows == 0
    assert [carry_queued.queue.queued_rows(s) for s in range(slots)] == [0] * slots
    rows = PassRows.of([(taken.slots, taken.lane_rows, taken.keep)], slots)
    k = taken.raw[:, :6].reshape(-1, 2, 3)
    queued.append_rows(rows, k, k * 2)
    carry_queued.carry_rows(rows, taken.raw[:, 6:])
    assert torch.equal(queued.count, one.count) and torch.equal(queued.k, one.k) and torch.equal(queued.v, one.v)
    assert torch.equal(carry_queued.carry, carry_one.carry)
