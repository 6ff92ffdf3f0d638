"""The model drafters keep their window lazily (a lane's rows projected when it drafts, or when `PENDING_ROWS`
have piled up): what a proposal reads must be what the eager upkeep (a projection every pass) built, so the
drafts, and with them every acceptance count, are the same. Slot reuse is in play (more requests than lanes), so
a slot that changes hands with rows still pending is covered. A row no proposal reads is never projected: not
for a prompt checkpoint (it keeps them unprojected until restored), not for a slot's next lane, not for a lane
that does not draft while another does."""

import attrs
import pytest
import torch

from speclane.stages.drafters.model_backend import ModelBackend
from tests.round.conftest import engine, mixed_prompts, requests


def run(tiny, tiny_fitted, name, pending_rows, monkeypatch):
    monkeypatch.setattr(ModelBackend, "PENDING_ROWS", pending_rows)
    eng = engine(tiny, name, k=4, max_lanes=2, options={"path": str(tiny_fitted[0])})
    got = eng.generate(requests(mixed_prompts(5), 20))
    lanes = sorted(eng.retired, key=lambda lane: lane.order)
    return [r.tokens for r in got], [(lane.offered_at, lane.accepted_at) for lane in lanes], eng


@pytest.mark.parametrize("name", ["dflash2", "mtp"])
def test_lazy_window_drafts_exactly_what_the_eager_one_did(tiny, tiny_fitted, name, monkeypatch):
    # 64 rows at most in one product: the decode route, whose rows do not depend on how many share it.
    eager_tokens, eager_counts, _ = run(tiny, tiny_fitted, name, 1, monkeypatch)
    lazy_tokens, lazy_counts, eng = run(tiny, tiny_fitted, name, 64, monkeypatch)
    assert lazy_tokens == eager_tokens
    assert lazy_counts == eager_counts
    assert sum(sum(o) for o, _ in lazy_counts) > 0  # drafts were proposed from the window


def queued(state) -> int:
    return sum(state.queue.queued_rows(slot) for slot in range(len(state.queue.entries)))


def counted(eng, monkeypatch) -> list[int]:
    """Rows each `project` call of the engine's drafter took."""
    calls = []
    monkeypatch.setattr(
        type(eng.drafter),
        "project",
        lambda self, raw, pos, orig=type(eng.drafter).project: calls.append(raw.shape[0]) or orig(self, raw, pos),
    )
    return calls


@pytest.mark.parametrize("name", ["dflash2", "mtp"])
def test_nothing_is_projected_while_no_draft_is_asked_for(tiny, tiny_fitted, name, monkeypatch):
    eng = engine(tiny, name, k=4, max_lanes=2, options={"path": str(tiny_fitted[0])})
    assert eng.checkpoints is not None  # prompt and answer ends are checkpointed: their rows stay unprojected
    state = eng.drafter_state
    calls = counted(eng, monkeypatch)
    eng.generate(requests(mixed_prompts(2), 12, spec={"enabled": False}))
    assert calls == [] and queued(state) > 0 and eng.checkpoints.added >= 4
    rows = queued(state)
    eng.drafter.flush(state)
    assert calls == [rows] and not state.queue and bool((state.window.count > 0).any())
    assert torch.isfinite(state.window.k).all()


def test_a_new_lane_drops_the_slots_old_rows_and_a_quiet_lane_keeps_its_own(tiny, tiny_fitted, monkeypatch):
    """One lane: the second request's lane takes the slot with the first one's rows still queued (never
    projected); then two lanes, only one of which drafts: its proposal projects its rows alone."""
    eng = engine(tiny, "dflash2", k=4, max_lanes=2, options={"path": str(tiny_fitted[0])})
    state, calls = eng.drafter_state, counted(eng, monkeypatch)
    off = {"enabled": False}
    eng.generate(requests([mixed_prompts(1)[0]], 8, spec=off))
    first = queued(state)
    eng.generate(requests([mixed_prompts(2)[1]], 8, spec=off))
    assert calls == [] and 0 < queued(state) < first + 8
    quiet, drafting = mixed_prompts(2)
    eng.generate(requests([quiet], 8, spec=off) + requests([drafting], 8))
    assert calls and sum(calls) <= len(drafting) + 8
    slot = next(lane.slot for lane in reversed(eng.retired) if lane.prompt_ids == quiet)
    left = state.queue.queued_rows(slot)
    assert left >= len(quiet)  # the quiet lane's rows were left queued


def test_the_backlog_is_what_a_lanes_catch_up_projects(tiny, tiny_fitted, monkeypatch):
    """`backlog` (what the measured draft plan charges a lane that starts drafting) counts the rows its catch-up
    projects; a lane new to the slot owns none of them (claiming drops them)."""
    eng = engine(tiny, "dflash2", k=4, max_lanes=2, options={"path": str(tiny_fitted[0])})
    state, calls = eng.drafter_state, counted(eng, monkeypatch)
    eng.generate(requests(mixed_prompts(2), 6, spec={"enabled": False}))
    lanes = sorted(eng.retired, key=lambda lane: lane.slot)
    rows = eng.drafter.backlog(state, lanes)
    assert rows == tuple(sum(n for *_, n in state.queue.entries[lane.slot]) for lane in lanes) and min(rows) > 0
    assert eng.drafter.backlog(state, [attrs.evolve(lanes[0])]) == (0,)
    eng.drafter.catch_up(state, lanes[:1])
    assert calls == [rows[0]] and eng.drafter.backlog(state, lanes) == (0, rows[1])
