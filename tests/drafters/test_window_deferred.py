"""A model drafter's window restored from a prompt checkpoint is copied into the ring only when the slot is next
read or written: a lane its drafter never drafts never pays for its window, and whatever comes first (a read, an
append, a snapshot of another history, a new lane) leaves what restoring at once would have left."""

import pytest
import torch

from speclane.stages.models.drafter_window import Window
from speclane.stages.models.window_snapshot import Unprojected

SIZE, LAYERS, KV = 32, 2, 4


class Lane:
    def __init__(self, slot: int):
        self.slot = slot


def _checkpoint(calls: list, gen: torch.Generator, appended: int = 20, queued: int = 6):
    """A snapshot of `appended` positions in the ring and `queued` rows kept unprojected (counted in `calls`)."""
    window = Window(1, SIZE, LAYERS, KV, torch.float32, "cpu")
    window.claim([Lane(0)])
    k = torch.randn(appended, LAYERS, KV, generator=gen)
    window.append(torch.tensor([0]), k, k + 100, (appended,), None)
    raw = torch.randn(queued, LAYERS, KV, generator=gen)
    return window.snapshot(
        0, torch.zeros(KV), tail=Unprojected(raw, torch.arange(appended, appended + queued), _project(calls))
    )


def _project(calls: list):
    def project(rows, positions):
        calls.append(rows.shape[0])
        return rows, rows + 100, None

    return project


def _ring(window: Window, slot: int):
    return window.positions(slot, min(int(window.count[slot]), SIZE))


def _equal(a: Window, b: Window, slot: int) -> bool:
    return int(a.count[slot]) == int(b.count[slot]) and all(map(torch.equal, _ring(a, slot), _ring(b, slot)))


def test_a_restored_window_snapshotted_again_and_again_is_never_copied_nor_projected():
    """A conversation's later checkpoints taken on a restored slot its drafter never read share the restored
    segments as they are (rows still queued join as unprojected tails); restored and read, the last one is the
    window appending every row would have left."""
    calls, gen = [], torch.Generator().manual_seed(0)
    first = _checkpoint(calls, gen)
    window = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    window.restore(1, first, owner="lane")
    snap, count, tails = first, first.count, []
    for rows in (5, 9, 30):  # each snapshot's tail: every row queued since the restore, as the drafter's queue holds
        tails.append(torch.randn(rows, LAYERS, KV, generator=gen))
        raw = torch.cat(tails)
        tail = Unprojected(raw, torch.arange(first.count, first.count + raw.shape[0]), _project(calls))
        snap = window.snapshot(1, torch.zeros(KV), base=snap, tail=tail)
        count += rows
        assert calls == [] and snap.count == count and int(window.count[1]) == first.count
    assert window.deferred and not window.k.any()
    final = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    final.restore(0, snap, owner="other")
    got = _ring(final, 0)  # reading settles it: the segments inside the window projected, once each
    assert calls == [9, 30]
    eager = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    eager.restore(1, first, owner="lane")
    eager.settle()
    for raw in tails:
        eager.append(torch.tensor([1]), raw, raw + 100, (raw.shape[0],), None)
    assert all(map(torch.equal, got, _ring(eager, 1))) and int(final.count[0]) == int(eager.count[1]) == count


@pytest.mark.parametrize("first", ["read", "append", "other_base", "route"])
def test_whatever_touches_a_restored_slot_first_finds_the_restored_window(first):
    calls, gen = [], torch.Generator().manual_seed(1)
    snap = _checkpoint(calls, gen)
    eager, lazy = (Window(2, SIZE, LAYERS, KV, torch.float32, "cpu", scratch=8) for _ in range(2))
    for w in (eager, lazy):
        w.restore(1, snap, owner="lane")
    eager.settle()
    assert 1 in lazy.deferred and 1 not in eager.deferred
    if first == "read":
        k, v, valid = lazy.read(torch.tensor([1]), 64)
        assert torch.equal(k, eager.read(torch.tensor([1]), 64)[0]) and torch.equal(
            valid, eager.read(torch.tensor([1]), 64)[2]
        )
    elif first == "append":
        raw = torch.randn(3, LAYERS, KV, generator=gen)
        for w in (eager, lazy):
            w.append(torch.tensor([1]), raw, raw + 100, (3,), None)
    elif first == "other_base":
        lazy.snapshot(1, torch.zeros(KV))  # no base: a history of its own, copied from the ring
    else:
        from speclane.stages.models.draft_route import WindowRoute

        WindowRoute(lazy, torch.tensor([1]), 1)
    assert 1 not in lazy.deferred
    assert _equal(lazy, eager, 1)


def test_a_new_lane_in_the_slot_drops_the_deferred_restore():
    calls, gen = [], torch.Generator().manual_seed(2)
    window = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    window.restore(0, _checkpoint(calls, gen), owner="lane")
    assert window.claim([Lane(0)]) == [0]
    assert not window.deferred and int(window.count[0]) == 0 and not window.k.any() and calls == []
