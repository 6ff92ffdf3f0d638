"""The model drafters keep their window lazily (rows projected when a proposal needs them, or when
`PENDING_ROWS` have piled up): what a proposal reads must be what the eager upkeep (a projection every pass)
built, so the drafts, and with them every acceptance count, are the same. Slot reuse is in play (more requests
than lanes), so a slot that changes hands with rows still pending is covered."""
import pytest
import torch

from stages.drafters.model_backend import ModelBackend
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


def test_nothing_is_projected_while_no_draft_is_asked_for(tiny, tiny_fitted, monkeypatch):
    eng = engine(tiny, "dflash2", k=4, max_lanes=2, options={"path": str(tiny_fitted[0])})
    eng.checkpoints = None  # a prompt checkpoint copies the window, so it projects what is pending
    state = eng.drafter_state
    calls = []
    monkeypatch.setattr(type(eng.drafter), "project",
                        lambda self, raw, pos, orig=type(eng.drafter).project: calls.append(raw.shape[0])
                        or orig(self, raw, pos))
    eng.generate(requests(mixed_prompts(2), 12, spec={"enabled": False}))
    assert calls == [] and sum(p.raw.shape[0] for p in state.pending) > 0
    eng.drafter.flush(state)
    assert calls == [sum(calls)] and not state.pending and bool((state.window.count > 0).any())
    assert torch.isfinite(state.window.k).all()
