"""The drafter window: a per-slot ring of the last `size` committed positions, emptied for a new lane.

Every key written here encodes its (slot, position), so the test can read back exactly which positions a slot
holds; the ring's order is free (attention does not care), so holdings are compared as sets.
"""
import pytest
import torch

from stages.models.drafter_window import Window


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
    k, lane_rows = rows_for(spans, w.k.shape[1], w.k.shape[3])
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
