"""The measured draft plan in the engine: it drafts where rows are cheap, not where they cost tokens, probes the
pass cost only when a drafter could use it, and never changes a token (the target decides every one)."""

import pytest

from speclane.stages.contract.costs import RoundCosts
from tests.round.conftest import engine, repetitive, requests

FLAT = ((1, 8, 64), (0.020, 0.021, 0.030))  # rows nearly free: every draft pays
LINEAR = ((1, 64), (0.010, 0.640))  # a row costs as much as a token: no draft can pay


@pytest.fixture(scope="module")
def prompts():
    return [repetitive(40, seed) for seed in range(4)]


@pytest.fixture(scope="module")
def baseline(targets, prompts):
    return [r.tokens for r in engine(targets["llama"]).generate(requests(prompts, 24))]


@pytest.mark.parametrize("table, drafts", [(FLAT, True), (LINEAR, False)])
def test_drafts_follow_the_cost_table_and_tokens_do_not(targets, prompts, baseline, table, drafts):
    eng = engine(targets["llama"], "ngram", k=7, max_lanes=4, plan="measured")
    eng.round_costs.set_probe(*table, "written out")  # covers every round: nothing is probed
    got = eng.generate(requests(prompts, 24))
    assert [r.tokens for r in got] == baseline
    stats = eng.stats(list(eng.retired))
    if drafts:
        assert stats["drafted"] > 0 and stats["tokens_per_round"] > 1.5
    else:  # not a draft proposed, and the drafter was never asked for one (its time was never recorded)
        assert stats["drafted"] == 0 and eng.round_costs.draft_s(7) == 0.0
    assert eng.round_costs.source == "written out"


def test_the_probe_runs_at_the_first_round_that_may_draft(targets, prompts, baseline, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))
    off = engine(targets["llama"], "none", k=7, max_lanes=2, plan="measured")
    off.generate(requests(prompts[:2], 8))
    assert not off.round_costs.covers(1)  # a backend that never drafts: nothing measured
    eng = engine(targets["llama"], "ngram", k=7, max_lanes=2, plan="measured")
    got = eng.generate(requests(prompts[:2], 24))
    assert [r.tokens for r in got] == baseline[:2]
    costs = eng.round_costs
    assert costs.source == "measured now" and costs.covers(16) and not costs.covers(17)
    again = engine(targets["llama"], "ngram", k=7, max_lanes=2, plan="measured")
    again.generate(requests(prompts[:1], 4))
    assert again.round_costs.source.startswith(str(tmp_path))  # the cached table, not a new probe


def test_rounds_wider_than_the_probe_do_not_probe_again(targets, prompts, tmp_path, monkeypatch):
    # four suffix lanes of up to 32 rows: 128, past the probe's 64; the table of up to 64 is all there is, and reading
    # (or measuring) it again each round cost a cached table's read a round
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))
    eng = engine(targets["llama"], "suffix", k=7, max_lanes=4, plan="measured")
    eng.round_costs.set_probe(*FLAT, "written out")
    eng.generate(requests(prompts, 24))
    assert eng.round_costs.source == "written out" and not list(tmp_path.iterdir())


@pytest.mark.parametrize("rows, own, most", [(4, 7, 1), (0, 2, 2)])
def test_a_row_budget_and_a_requests_own_cap_still_hold(targets, prompts, rows, own, most):
    eng = engine(targets["llama"], "ngram", k=7, rows=rows, max_lanes=2, plan="measured")
    eng.round_costs.set_probe(*FLAT, "written out")
    eng.generate(requests(prompts[:2], 24, spec={"draft_tokens": own}))
    assert eng.stats(list(eng.retired))["drafted"] > 0
    assert max(len(lane.offered_at) for lane in eng.retired) == most


def test_a_spoilt_draft_time_is_measured_again(targets, prompts, baseline, monkeypatch):
    """One proposal slowed by a pause (a collection of the whole heap) is the plan's only sample: the plan then
    drafts nothing, so it never measures again, unless the sample fades."""
    from speclane.stages.contract import costs

    monkeypatch.setattr(costs, "STALE_ROUNDS", 2)
    eng = engine(targets["llama"], "ngram", k=7, max_lanes=4, plan="measured")
    table = eng.round_costs
    table.set_probe(*FLAT, "written out")
    for width in range(1, 8):
        for lanes in range(1, 5):
            table.record_draft(width, 1.0, lanes)  # a second a proposal (50 passes): no draft can pay
    got = eng.generate(requests(prompts, 24))
    assert [r.tokens for r in got] == baseline
    assert eng.stats(list(eng.retired))["drafted"] > 0 and table.draft_s(7) < 1.0


def test_the_plan_sees_the_requests_waiting_for_a_slot(targets, prompts):
    """A pass's roster carries how many requests wait for a slot (what a lane's early end is worth to the plan);
    tokens stay the target's."""
    eng = engine(targets["llama"], "ngram", k=7, max_lanes=1, plan="measured")
    eng.round_costs.set_probe(*FLAT, "written out")
    for r in requests(prompts[:3], 6):
        eng.submit(r)
    eng.step()
    assert eng.roster().queued == 2
    while eng.busy():
        eng.step()
    assert eng.roster().queued == 0
