"""A model drafter's window in prompt checkpoints: a snapshot that extends the slot history's previous one copies only
the positions appended since and shares the earlier segments still inside the window; restored (or written to a
file's ring and read back) it puts back exactly the ring the slot held, also after the ring has wrapped."""

import pytest
import torch

from speclane.pipeline.runtime.checkpoints import CheckpointStore
from speclane.pipeline.runtime.engine import Engine
from speclane.stages.models.drafter_window import Window
from speclane.stages.models.window_snapshot import Unprojected, WindowSnapshot
from tests.round.conftest import IdTokenizer, engine, prompt, requests

SIZE, LAYERS, KV = 32, 2, 4


def _append(window: Window, slot: int, rows: int, gen: torch.Generator) -> None:
    k = torch.randn(rows, LAYERS, KV, generator=gen)
    window.append(torch.tensor([slot]), k, k + 100, (rows,), None)


def _ring(window: Window, slot: int):
    n = min(int(window.count[slot]), SIZE)
    return window.positions(slot, n)


@pytest.mark.parametrize("later", [20, 60])  # the second snapshot inside the first one's window, then wrapped past it
def test_an_extending_snapshot_shares_and_restores_the_ring(later):
    gen = torch.Generator().manual_seed(0)
    window = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    window.claim([type("Lane", (), {"slot": 0})()])
    for rows in (7, 8, 5):  # 20 positions
        _append(window, 0, rows, gen)
    carry = torch.randn(KV)
    first = window.snapshot(0, carry)
    assert [(s.start, s.end) for s in first.segments] == [(0, 20)]
    while int(window.count[0]) < 20 + later:
        _append(window, 0, 8, gen)
    second = window.snapshot(0, carry, base=first)
    count = int(window.count[0])
    if count - SIZE < 20:  # the first snapshot's positions are still in the window: shared, not copied
        assert second.segments[0] is first.segments[0]
        assert [(s.start, s.end) for s in second.segments] == [(0, 20), (20, count)]
    else:  # fallen out of it: not held by the later snapshot at all
        assert [(s.start, s.end) for s in second.segments] == [(count - SIZE, count)]
    want_k, want_v = _ring(window, 0)
    for snap in (second, WindowSnapshot.from_ring(*second.ring(), count, carry)):  # as held, and via a file
        other = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
        other.restore(1, snap, owner="lane")
        got_k, got_v = _ring(other, 1)
        assert int(other.count[1]) == count and other.owners[1] == "lane"
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("queued", [5, 40])  # inside the window, then more rows than it holds
def test_rows_still_queued_are_kept_unprojected_until_the_snapshot_is_read(queued):
    """A snapshot taken while the slot's last rows wait for their projection keeps them raw: restored, it puts
    back what appending them would have left (ring and carried vector), projecting only the rows inside the
    window, once, and its byte count does not move when it resolves."""
    gen = torch.Generator().manual_seed(1)
    window = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    window.claim([type("Lane", (), {"slot": 0})()])
    _append(window, 0, 20, gen)
    raw = torch.randn(queued, LAYERS, KV, generator=gen)
    calls = []

    def project(rows, positions):
        calls.append(rows.shape[0])
        return rows, rows + 100, rows[:, 0]  # keys, values, carried vectors [rows, KV]

    first = window.snapshot(0, torch.zeros(KV))
    snap = window.snapshot(
        0, torch.zeros(KV), base=first, tail=Unprojected(raw, torch.arange(20, 20 + queued), project), tail_carries=True
    )
    held = snap.nbytes
    assert calls == [] and snap.count == 20 + queued and snap.segments[-1].k is None
    window.append(torch.tensor([0]), raw, raw + 100, (queued,), None)
    want_k, want_v = _ring(window, 0)
    for _ in range(2):
        other = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
        other.restore(1, snap, owner="lane")
        got_k, got_v = _ring(other, 1)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert torch.equal(snap.carry, raw[-1, 0])
    assert calls == [min(queued, SIZE)] and snap.nbytes == held
    assert torch.equal(WindowSnapshot.from_ring(*snap.ring(), snap.count, snap.carry).ring()[0], snap.ring()[0])


def test_a_later_snapshot_takes_queued_rows_the_ring_has_since_appended_from_the_ring():
    """Rows a snapshot kept unprojected that the slot then appended (its drafter caught up) are not projected
    again: the next snapshot of that history fills the shared segment from the ring, and restored it puts back
    the ring the slot holds."""
    gen = torch.Generator().manual_seed(2)
    window = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    window.claim([type("Lane", (), {"slot": 0})()])
    _append(window, 0, 12, gen)
    raw = torch.randn(6, LAYERS, KV, generator=gen)
    calls = []

    def project(rows, positions):
        calls.append(rows.shape[0])
        return rows, rows + 100, None

    first = window.snapshot(0, torch.zeros(KV), tail=Unprojected(raw, torch.arange(12, 18), project))
    queued = first.segments[-1]
    assert queued.k is None
    window.append(torch.tensor([0]), raw, raw + 100, (6,), None)  # the catch-up
    _append(window, 0, 5, gen)
    second = window.snapshot(0, torch.zeros(KV), base=first)
    assert second.segments[1] is queued and queued.unprojected is None and calls == []
    assert torch.equal(queued.k, raw.transpose(0, 1)) and torch.equal(queued.v, raw.transpose(0, 1) + 100)
    other = Window(2, SIZE, LAYERS, KV, torch.float32, "cpu")
    other.restore(1, second, owner="lane")
    assert all(torch.equal(a, b) for a, b in zip(_ring(other, 1), _ring(window, 0))) and calls == []


def test_a_conversations_checkpoints_share_the_drafters_window(tiny, tiny_fitted):
    """Three turns of one conversation with dflash2: each checkpoint after the first shares the drafter's earlier
    window segments (held once by the store), and the last turn, served from a checkpoint, decodes as a fresh
    prefill of the whole conversation does."""
    options = {"path": str(tiny_fitted[0])}
    kept = engine(tiny, "dflash2", k=4, max_lanes=1, options=options)
    kept.checkpoints = CheckpointStore(64 << 20)
    convo = prompt(40, seed=41)
    for turn in range(2):
        (answer,) = kept.generate(requests([convo], max_tokens=10))
        convo = convo + list(answer.tokens) + prompt(8, seed=42 + turn)
    (got,) = kept.generate(requests([convo], max_tokens=12))
    fresh = engine(tiny, "dflash2", k=4, max_lanes=1, options=options)
    fresh.checkpoints = None
    (want,) = fresh.generate(requests([convo], max_tokens=12))
    assert got.tokens == want.tokens and kept.checkpoints.hits == 2
    held = list(kept.checkpoints._entries.values())
    windows = [ck.drafter for ck in sorted(held, key=lambda ck: len(ck.tokens))]
    assert len(windows) >= 3
    for earlier, later in zip(windows, windows[1:]):
        assert later.segments[: len(earlier.segments)] == earlier.segments  # the same tensors, not copies
        new = later.segments[len(earlier.segments) :]  # what the later turn added, projected or still queued
        assert new and new[0].start == earlier.count and new[-1].end == later.count
        assert all(a.end == b.start for a, b in zip(new, new[1:]))
    copied = sum(s.nbytes for w in windows for s in w.segments)
    unique = {id(s): s.nbytes for ck in held for s in ck.segments()}  # target keys and drafter windows
    once = {id(x): x.nbytes for w in windows for x in w.segments}
    assert sum(once.values()) < copied
    assert kept.checkpoints.bytes_held == sum(ck.nbytes for ck in held) + sum(unique.values())


def test_a_restarted_engine_restores_the_drafters_window_from_its_files(tiny, tiny_fitted, tmp_path):
    """The files hold the window as the ring held it (the snapshot format keeps the ring as it is): a restarted engine
    with mtp serves the next turn from them with the drafts and acceptance of a fresh prefill."""
    base = engine(tiny, "mtp", k=4, max_lanes=1, options={"path": str(tiny_fitted[0])})

    def started(directory, budget=64 << 20):
        return Engine(
            tiny,
            IdTokenizer(),
            spec=base.spec,
            max_lanes=1,
            max_len=512,
            checkpoint_bytes=budget,
            snapshot_dir=directory,
        )

    first = prompt(40, seed=51)
    (answer,) = started(tmp_path).generate(requests([first], max_tokens=10))
    follow = first + list(answer.tokens) + prompt(8, seed=52)
    restarted = started(tmp_path)
    (got,) = restarted.generate(requests([follow], max_tokens=14))
    (want,) = started(tmp_path / "none", budget=0).generate(requests([follow], max_tokens=14))
    assert restarted.checkpoints.hits == 1 and restarted.checkpoints.tokens_reused >= len(first)
    assert got.tokens == want.tokens and got.spec["drafted"] > 0
    assert got.spec["accepted_per_position"] == want.spec["accepted_per_position"]
