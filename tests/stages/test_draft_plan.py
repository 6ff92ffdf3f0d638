"""The measured draft plan: its arithmetic on written-out cost tables, the acceptance it learns, the probe's cache."""

import itertools
import json
import random

import attrs
import pytest
import torch

from speclane.stages.contract.costs import STALE_ROUNDS, RoundCosts
from speclane.stages.draft_plan import (
    MARGIN,
    OTHER_VALUE,
    PRIOR,
    AcceptanceTracker,
    catch_up_charges,
    lane_values,
    plan_drafts,
)
from speclane.stages.models import pass_cost

# Pass seconds by row count, written out: bf16 hardware (an 8-row pass costs about a 1-row one), an AVX2-like CPU
# (measured shape: 2 rows +15 %, 4 rows +50 %, 8 rows 2.5x), and a compute-bound one (cost grows with every row).
FLAT = RoundCosts((1, 8, 64), (0.020, 0.021, 0.030))
AVX2 = RoundCosts(
    (1, 2, 3, 4, 5, 6, 7, 8, 16, 64), (0.023, 0.026, 0.031, 0.034, 0.048, 0.058, 0.055, 0.057, 0.140, 0.530)
)
LINEAR = RoundCosts((1, 64), (0.010, 0.640))


def rate(plan, rates, costs, values=None, waiting=0.0, catch_up=None, keys=None) -> float:
    values = values or (1.0,) * len(plan)
    tokens = waiting + sum(v * sum(a**j for j in range(d + 1)) for d, a, v in zip(plan, rates, values))
    extra = sum(c for c, d in zip(catch_up or (0.0,) * len(plan), plan) if d)
    extra += sum(costs.attend_s(k, 1 + d) for k, d in zip(keys or (0,) * len(plan), plan))
    return tokens / (
        costs.target_s(len(plan) + sum(plan)) + costs.draft_s(max(plan, default=0), sum(1 for d in plan if d)) + extra
    )


@pytest.mark.parametrize(
    "caps, rates, costs, want",
    [
        ((7,), (0.9,), FLAT, (7,)),  # rows are free: every draft pays
        ((7, 7, 7, 7), (0.9,) * 4, FLAT, (7, 7, 7, 7)),
        ((7,), (0.9,), LINEAR, (0,)),  # a row costs a token: no draft can pay
        ((7, 7), (0.99, 0.99), LINEAR, (0, 0)),
        ((3, 0), (0.9, 0.9), FLAT, (3, 0)),  # caps hold (a request that turned speculation off)
        ((0, 0), (1.0, 1.0), FLAT, (0, 0)),
        ((7,), (0.0,), FLAT, (0,)),  # nothing accepted: nothing drafted
        ((7,), (0.5,), AVX2, (1,)),  # AVX2, one lane: 1.5 tokens for 1.13x the time
        ((7,), (0.9,), AVX2, (3,)),  # 3.44 tokens in 4 rows beat 5.70 in 8 (2.5x the time)
        ((7,) * 8, (0.9,) * 8, AVX2, (0,) * 8),  # AVX2, 8 lanes: 16 rows cost 2.5x 8 rows
        ((7, 7), (0.9, 0.05), AVX2, (2, 0)),  # the lane that accepts takes the rows
    ],
)
def test_plan_case_table(caps, rates, costs, want):
    assert plan_drafts(caps, rates, costs) == want


def test_the_drafters_own_time_counts():
    costs = RoundCosts((1, 8), (0.020, 0.021))
    assert plan_drafts((7,), (0.6,), costs) == (7,)
    costs.record_draft(7, 0.100)  # a drafter that takes 5 passes' time for 7 drafts: only short runs might pay
    costs.record_draft(1, 0.100)
    assert plan_drafts((7,), (0.6,), costs) == (0,)


def random_case(rng):
    """A pass-cost table rising with rows, and one to three lanes' caps and acceptance."""
    rows = (1, 2, 4, 8, 16, 32)
    steps = [rng.uniform(0.0, 0.02) for _ in rows]
    costs = RoundCosts(rows, tuple(0.01 + sum(steps[: i + 1]) for i in range(len(rows))))
    n = rng.randint(1, 3)
    return costs, tuple(rng.randint(0, 3) for _ in range(n)), tuple(rng.random() for _ in range(n))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("keyed", [False, True])
def test_never_predicted_slower_than_no_drafts_and_best_among_all_plans(weighted, keyed):
    """Also with lanes' tokens weighted and lanes still prefilling waiting on the round (`lane_values`), and with
    lanes attending to more keys than the probe's (`RoundCosts.attend_s`)."""
    rng = random.Random(0)
    for _ in range(200):
        costs, caps, rates = random_case(rng)
        n = len(caps)
        values = tuple(rng.choice((1.0, OTHER_VALUE)) for _ in range(n)) if weighted else None
        waiting = rng.choice((0.0, 1.0, 2.25)) if weighted else 0.0
        keys = None
        if keyed:
            costs.set_keys(192, rng.uniform(0.0, 4e-6), rng.uniform(0.0, 2e-6))
            keys = tuple(rng.choice((0, 192, 1000, 4000, 16000)) for _ in range(n))
        plan = plan_drafts(caps, rates, costs, values, waiting, keys=keys)
        assert all(0 <= d <= c for d, c in zip(plan, caps))
        off = rate((0,) * n, rates, costs, values, waiting, keys=keys)
        assert rate(plan, rates, costs, values, waiting, keys=keys) >= off
        best = max(
            rate(p, rates, costs, values, waiting, keys=keys) for p in itertools.product(*(range(c + 1) for c in caps))
        )
        if best < off * MARGIN:  # not predicted enough ahead to risk: no drafts
            assert plan == (0,) * n
        else:
            assert rate(plan, rates, costs, values, waiting, keys=keys) == pytest.approx(best, rel=1e-9)


def test_a_long_lane_pays_for_its_keys():
    """Past the probe's context a key costs the lane one read and each of its rows the arithmetic on it: a lane that
    takes every draft of a likely path at a chat turn's length takes fewer at an agent's."""
    costs = RoundCosts(FLAT.rows, FLAT.seconds)
    costs.set_keys(192, 1e-6, 0.5e-6)
    assert costs.attend_s(192, 8) == costs.attend_s(100, 1) == costs.attend_s(5000, 0) == 0.0
    assert costs.attend_s(1192, 1) == pytest.approx(1000 * 1.5e-6)
    assert costs.attend_s(1192, 8) == pytest.approx(1000 * (1e-6 + 8 * 0.5e-6))
    short = plan_drafts((7,), (0.7,), costs, keys=(192,))
    assert short == plan_drafts((7,), (0.7,), costs) == (7,)
    assert 0 < plan_drafts((7,), (0.7,), costs, keys=(8000,))[0] < 7
    # two lanes alike but for their length: the long one gives up its drafts first
    two = plan_drafts((7, 7), (0.7, 0.7), costs, keys=(192, 8000))
    assert two[0] == 7 and two[1] < 7
    with pytest.raises(ValueError, match="keys"):
        costs.set_keys(192, -1e-6, 0.0)


def test_a_table_that_dips_is_weighed_to_the_end():
    """The plan stops weighing longer prefixes once none can beat the best, which needs a pass cost that never falls
    as rows grow; a probe table that dips somewhere (noise) is weighed prefix by prefix, and is still optimal."""
    rng = random.Random(2)
    rows = (1, 2, 4, 8, 16, 32)
    assert RoundCosts(rows, (0.01, 0.01, 0.011, 0.012, 0.02, 0.03)).rising
    for _ in range(200):
        seconds = tuple(rng.uniform(0.01, 0.04) for _ in rows)
        costs, caps = RoundCosts(rows, seconds), tuple(rng.randint(0, 4) for _ in range(rng.randint(1, 3)))
        assert costs.rising == (list(seconds) == sorted(seconds))
        rates = tuple(rng.random() for _ in caps)
        plan = plan_drafts(caps, rates, costs)
        best = max(rate(p, rates, costs) for p in itertools.product(*(range(c + 1) for c in caps)))
        if best < rate((0,) * len(caps), rates, costs) * MARGIN:
            assert plan == (0,) * len(caps)
        else:
            assert rate(plan, rates, costs) == pytest.approx(best, rel=1e-9)


def test_charged_lanes_never_predicted_slower_than_no_drafts_nor_than_the_uncharged_lanes_alone():
    """With some lanes charged for their backlog the greedy order is no longer exact, but the plan is never
    predicted slower than no drafts, nor than the best plan of the uncharged lanes alone."""
    rng = random.Random(1)
    for _ in range(200):
        costs, caps, rates = random_case(rng)
        n = len(caps)
        charge = tuple(rng.choice((0.0, 0.0, rng.uniform(0.0, 0.05))) for _ in range(n))
        plan = plan_drafts(caps, rates, costs, catch_up=charge)
        assert all(0 <= d <= c for d, c in zip(plan, caps))
        got, off = rate(plan, rates, costs, catch_up=charge), rate((0,) * n, rates, costs)
        assert plan == (0,) * n or got >= off * MARGIN
        free = tuple(0 if c else cap for c, cap in zip(charge, caps))
        best_free = max(rate(p, rates, costs) for p in itertools.product(*(range(c + 1) for c in free)))
        if best_free >= off * MARGIN:
            assert got >= best_free * (1 - 1e-9)


@pytest.mark.parametrize(
    "backlog_s, remaining, cap, a, want",
    [
        (0.010, 48, 7, 0.0, 0.010 / 48),  # nothing accepted: a token a round, 48 rounds left
        (0.010, 48, 1, 1.0, 0.010 / 24),  # two tokens a round: 24 rounds
        (0.010, 3, 7, 0.9, 0.010),  # near the end: the whole backlog falls on this round
        (0.010, 1, 7, 0.9, 0.010),
        (0.0, 48, 7, 0.9, 0.0),
    ],
)
def test_a_lanes_backlog_is_spread_over_the_rounds_it_has_left(backlog_s, remaining, cap, a, want):
    assert catch_up_charges((backlog_s,), (remaining,), (cap,), (a,)) == (pytest.approx(want),)


def test_a_lane_near_its_end_does_not_pay_its_whole_backlog_for_a_draft_or_two():
    """Four-lane dflash2 trials with costs of the order a trial log showed (10-15 ms of catch-up, 5-8 ms a
    proposal; docs/decisions/0004-draft-cost-record.md): four lanes, one with 3 tokens left that has not drafted,
    its backlog (its prompt and answer) 10 ms to project."""
    costs = RoundCosts((1, 4, 5, 8), (0.021, 0.022, 0.023, 0.024))
    costs.record_draft(3, 0.006)
    caps, rates = (3, 0, 0, 0), (0.8, 0.5, 0.5, 0.5)
    assert plan_drafts(caps, rates, costs) == (3, 0, 0, 0)  # the backlog unseen: the trial is taken
    late = catch_up_charges((0.010, 0.0, 0.0, 0.0), (3, 3, 3, 3), caps, rates)
    assert plan_drafts(caps, rates, costs, catch_up=late) == (0, 0, 0, 0)
    early = catch_up_charges((0.010, 0.0, 0.0, 0.0), (48, 48, 48, 48), (7, 0, 0, 0), rates)
    assert plan_drafts((7, 0, 0, 0), rates, costs, catch_up=early) != (0, 0, 0, 0)  # a prompt, spread: drafts


def test_one_dear_lane_does_not_keep_the_caught_up_ones_from_drafting():
    """The lane that accepts best comes first in the order of gains: with its backlog charged every prefix
    costs it, and only the plan among the uncharged lanes finds the caught-up lane's drafts."""
    caps, rates, charge = (7, 7), (0.95, 0.9), (1.0, 0.0)
    assert plan_drafts(caps, rates, FLAT, catch_up=charge) == (0, 7)
    assert plan_drafts(caps, rates, FLAT) == (7, 7)


def test_catch_up_cost_is_learnt_per_row_from_catch_ups_wide_enough_to_measure():
    costs = RoundCosts()
    assert costs.catch_up_s(500) == 0.0  # nothing measured: nothing charged
    costs.record_catch_up(4, 0.004)  # 1 ms a row, but mostly fixed ops: not a sample
    assert costs.catch_up_s(500) == 0.0
    for rows, seconds in ((100, 0.005), (200, 0.010), (400, 0.020), (100, 0.500)):  # the last one paused
        costs.record_catch_up(rows, seconds)
    assert costs.catch_up_s(500) == pytest.approx(0.025) and costs.catch_up_s(0) == 0.0


@pytest.mark.parametrize(
    "remaining, prefilling, queued, want",
    [
        ((47, 30), (), 0, ((1.0, OTHER_VALUE), 0.0)),  # the lane with the most left ends the batch
        ((47, 44), (), 0, ((1.0, 1.0), 0.0)),  # within one round's reach of it: ends with it
        ((47, 30), (), 2, ((1.0, 1.0), 0.0)),  # requests wait for a slot: every early end counts
        ((47,), (48, 48, 48), 0, ((OTHER_VALUE,), 3.0)),  # a batch's first lane, the others still prefilling
        ((700,), (256,), 0, ((1.0,), OTHER_VALUE)),  # a long answer outlasts a short one's prefill
        ((47,), (48,), 1, ((1.0,), 1.0)),
        ((), (48,), 0, ((), 1.0)),
    ],
)
def test_lane_values_case_table(remaining, prefilling, queued, want):
    assert lane_values(remaining, prefilling, queued, reach=8) == want


def test_lanes_still_prefilling_make_a_dear_round_wait():
    """A batch's first lane decodes while three prefill: on the AVX2 table its three drafts (alone, they pay)
    would make all four wait for a pass of twice the time; on bf16 hardware rows are nearly free, so it drafts."""
    values, waiting = lane_values((47,), (48, 48, 48), 0, reach=8)
    assert plan_drafts((7,), (0.9,), AVX2) == (3,)
    assert plan_drafts((7,), (0.9,), AVX2, values, waiting) == (0,)
    assert plan_drafts((7,), (0.9,), FLAT, values, waiting) == (7,)


def test_a_plan_barely_ahead_of_none_drafts_nothing():
    costs = RoundCosts((1, 2), (0.010, 0.0104))
    # one draft at acceptance a: (1 + a) tokens in 1.04x the time; ahead by 1 % at a = 0.0504, by 5 % at 0.092
    assert plan_drafts((1,), (0.06,), costs) == (0,)
    assert plan_drafts((1,), (0.12,), costs) == (1,)


def test_round_costs_interpolate_extend_and_refuse_bad_tables():
    c = RoundCosts((1, 2, 4), (1.0, 2.0, 3.0))
    assert [c.target_s(r) for r in (0, 1, 2, 3, 4, 6)] == [1.0, 1.0, 2.0, 2.5, 3.0, 4.0]
    assert c.covers(4) and not c.covers(5) and not RoundCosts().covers(1)
    with pytest.raises(ValueError, match="not been probed"):
        RoundCosts().target_s(1)
    for rows, secs in (((2, 4), (1.0, 2.0)), ((1, 1), (1.0, 1.0)), ((1, 2), (1.0,))):
        with pytest.raises(ValueError, match="rise from 1"):
            RoundCosts(rows, secs)
    c.record_draft(3, 1.2)
    c.record_draft(3, 2.0)
    assert c.draft_s(0) == 0.0 and c.draft_s(3) == pytest.approx(1.2) and c.draft_s(6) == c.draft_s(3)
    # more lanes drafting cost more: a 1-lane figure is scaled up by the lanes until the lane count is measured
    assert c.draft_s(3, lanes=4) == pytest.approx(4.8)
    c.record_draft(3, 2.0, lanes=4)
    assert c.draft_s(3, lanes=4) == pytest.approx(2.0) and c.draft_s(3, lanes=3) == pytest.approx(2.0)
    assert c.draft_s(3) == pytest.approx(1.2)


def test_a_paused_sample_neither_moves_the_draft_time_nor_keeps_the_plan_off():
    """A full collection of Python's heap inside one proposal (134 ms against 5.6 ms) must not rule the plan."""
    c = RoundCosts((1, 8), (0.0104, 0.0153))
    for s in (0.0056, 0.0058, 0.134, 0.0055, 0.0057):
        c.record_draft(7, s)
    assert c.draft_s(7) == pytest.approx(0.0057)
    assert plan_drafts((7,), (0.6,), c) != (0,)
    spoilt = RoundCosts((1, 8), (0.0104, 0.0153))
    spoilt.record_draft(7, 0.134)  # the only sample: a plan on it drafts nothing
    assert plan_drafts((7,), (0.6,), spoilt) == (0,)
    for _ in range(STALE_ROUNDS):
        spoilt.next_round()
    assert spoilt.draft_s(7) == pytest.approx(0.134)  # not sampled again for STALE_ROUNDS rounds ...
    for _ in range(STALE_ROUNDS):
        spoilt.next_round()
    assert spoilt.draft_s(7) == pytest.approx(0.067)  # ... then fading, halved every STALE_ROUNDS more
    for _ in range(4 * STALE_ROUNDS):
        spoilt.next_round()
    assert plan_drafts((7,), (0.6,), spoilt) != (0,)  # until the next plan drafts and measures again
    spoilt.record_draft(7, 0.0056)
    assert spoilt.draft_s(7) == pytest.approx(0.0056)  # a fresh sample: the median of what is kept, unfaded
    for _ in range(2 * STALE_ROUNDS):
        spoilt.next_round()
    spoilt.record_draft(3, 0.0051)  # a key sampled again does not fade
    assert spoilt.draft_s(3) == pytest.approx(0.0051) and spoilt.draft_s(7) < 0.0056 / 1.9


@attrs.define(eq=False)
class FakeLane:
    offered_at: list = attrs.field(factory=list)
    accepted_at: list = attrs.field(factory=list)

    def round(self, drafted, accepted):
        for i in range(min(drafted, accepted + 1)):
            while len(self.offered_at) <= i:
                self.offered_at.append(0)
                self.accepted_at.append(0)
            self.offered_at[i] += 1
            self.accepted_at[i] += i < accepted


def test_acceptance_is_learnt_per_lane_and_pulled_to_the_engine_mean():
    good, bad, fresh = FakeLane(), FakeLane(), FakeLane()
    tracker = AcceptanceTracker()
    tracker.update([good, bad])
    assert tracker.rate(good) == tracker.rate(bad) == pytest.approx(PRIOR)
    for _ in range(10):
        good.round(7, 7)
        bad.round(7, 0)
        tracker.update([good, bad])
    # each lane's first drafts are pulled towards the engine's mean (half of them accepted); the bad lane never
    # reached a later draft, so its later rate is the engine's (the good lane's)
    assert tracker.rate(good) > 0.75 and tracker.rate(bad) < 0.3
    assert tracker.rates(good)[1] > 0.9 and tracker.rates(bad)[1] == pytest.approx(tracker.engine_rates()[1])
    tracker.update([fresh])  # lanes that left are forgotten; a new one starts at the engine's mean
    assert tracker.rate(fresh) == pytest.approx(tracker.engine_rate())
    assert tracker.rates(good) == tracker.rates(fresh)
    for _ in range(600):  # no drafts for a long time: the engine's means drift back to the prior
        tracker.update([fresh])
    assert tracker.engine_rates() == pytest.approx((PRIOR, PRIOR), abs=0.01)


def test_a_first_draft_and_the_later_ones_are_learnt_apart():
    """A copy that goes on or not: a quarter of the first drafts accepted, and once one is, the rest. One rate over
    every draft tested reads 0.7 and prices the seventh draft at 0.08 (it is worth 0.25); apart, every draft of the
    seven is worth its row where a row costs about 6 % of a pass."""
    lane, tracker = FakeLane(), AcceptanceTracker()
    for i in range(80):
        lane.round(7, 7 if i % 4 == 0 else 0)
        tracker.update([lane])
    first, later = tracker.rates(lane)
    assert first == pytest.approx(0.25, abs=0.1) and later > 0.9
    assert tracker.chances(lane, 3) == (first, later, later) and tracker.chances(lane, 0) == ()
    pooled = sum(lane.accepted_at) / sum(lane.offered_at)
    assert pooled == pytest.approx(0.7)
    costs = RoundCosts((1, 8), (0.010, 0.014))  # an 8-row pass 1.4x one
    assert plan_drafts((7,), (pooled,), costs)[0] < 7
    assert plan_drafts((7,), (first,), costs, chances=(tracker.chances(lane, 7),)) == (7,)


def test_a_later_draft_untested_is_priced_as_the_first():
    """A plan of one draft a lane never tests a second: its price follows the first draft's, not the prior."""
    lane, tracker = FakeLane(), AcceptanceTracker(prior=0.28)
    for _ in range(30):
        lane.round(1, 1)
        tracker.update([lane])
    first, later = tracker.rates(lane)
    assert first > 0.8 and later == pytest.approx(tracker.engine_rates()[0])


class FakeTarget:
    """Enough of a Target for the probe: counts passes, and keeps a clock the probe reads (`fake_clock`)."""

    KEY_S, ROW_KEY_S = 2e-6, 5e-7

    def __init__(self, dtype=torch.bfloat16):
        self.device, self.dtype, self.cfg = torch.device("cpu"), dtype, "cfg(hidden=8)"
        self.weights = attrs.make_class("W", {"head": attrs.field(default=None)})()
        self.passes, self.now = 0, 0.0

    def new_state(self, slots, max_len):
        return None

    def forward(self, batch, state):
        self.passes += 1
        assert batch.rows <= 64 and max(batch.lane_rows) <= max(pass_cost.ROWS_PER_LANE, pass_cost.KEY_ROWS)
        # a pass's time on the fake clock: the rows, and per lane its keys read once and by each row
        self.now += 0.01 + 0.001 * batch.rows
        self.now += sum(s * (self.KEY_S + self.ROW_KEY_S * r) for s, r in zip(batch.lane_start, batch.lane_rows))


def fake_clock(monkeypatch, target):
    monkeypatch.setattr(pass_cost, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: target.now)}))


def test_the_probe_is_cached_per_machine_and_model(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))
    target = FakeTarget()
    fake_clock(monkeypatch, target)
    costs = RoundCosts()
    pass_cost.pass_costs(target, costs, 16)
    assert costs.rows == pass_cost.probe_rows(16) and costs.rows[-1] == 16 and costs.source == "measured now"
    probed = target.passes
    assert probed == 4 * len(costs.rows) + 4 * 4  # one warm-up and three timed sweeps; the keys' four shapes too
    assert (costs.context, costs.key_s, costs.row_key_s) == (
        pass_cost.CONTEXT,
        pytest.approx(FakeTarget.KEY_S),
        pytest.approx(FakeTarget.ROW_KEY_S),
    )
    again = RoundCosts()
    pass_cost.pass_costs(target, again, 8)  # covered by the cached table: no pass at all
    assert target.passes == probed and again.rows == costs.rows and again.source.endswith(".json")
    pass_cost.pass_costs(target, RoundCosts(), 64)  # wider than the table: measured again
    assert target.passes > probed
    other = FakeTarget(torch.float32)  # another dtype is another model: its own table
    pass_cost.pass_costs(other, RoundCosts(), 8)
    assert other.passes > 0
    assert len(list((tmp_path / "pass_cost").glob("*.json"))) == 2


def test_a_cached_table_without_the_keys_costs_has_them_measured_and_added(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))
    target = FakeTarget()
    fake_clock(monkeypatch, target)
    pass_cost.pass_costs(target, RoundCosts(), 8)
    (path,) = (tmp_path / "pass_cost").glob("*.json")
    table = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in table.items() if k not in ("key_s", "row_key_s")}))
    passes, costs = target.passes, RoundCosts()
    pass_cost.pass_costs(target, costs, 8)
    assert target.passes == passes + 4 * 4  # the keys' shapes only: the rows' table is the cached one
    assert costs.seconds == tuple(table["seconds"]) and costs.row_key_s == pytest.approx(FakeTarget.ROW_KEY_S)
    again = json.loads(path.read_text())
    assert again == {**table, "key_s": pytest.approx(table["key_s"]), "row_key_s": pytest.approx(table["row_key_s"])}


def test_the_probe_smooths_noise_into_a_table_that_rises_with_rows():
    assert pass_cost.monotone([1.0, 2.0, 3.0]) == (1.0, 2.0, 3.0)
    assert pass_cost.monotone([1.0, 5.0, 3.0, 4.0]) == (1.0, 4.0, 4.0, 4.0)  # a spike is pooled, not kept
    assert pass_cost.monotone([3.0, 1.0]) == (2.0, 2.0)


def test_the_drafting_lanes_backlog_is_caught_up_before_the_proposal_is_timed(monkeypatch):
    """A model drafter's window backlog is projected only for the lanes that draft (its lazy window), before the
    draft stage starts its clock: a lane's first proposal would otherwise carry its prompt's projection, and with
    it the plan's only sample of that proposal. A round in which no lane drafts leaves the backlog queued; the
    first proposal (one-time set-up) is not a sample."""
    from types import SimpleNamespace

    import speclane.stages.draft as draft_stage
    from speclane.stages.drafters.base import DraftBackend, proposal_from_lists

    clock, calls = [0.0], []
    monkeypatch.setattr(draft_stage, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class Backlogged(DraftBackend):
        name = "backlogged"

        def backlog(self, state, lanes):
            return tuple(lane.kv_len for lane in lanes)

        def catch_up(self, state, lanes=None):
            calls.append(("catch_up", [lane.kv_len for lane in lanes]))
            clock[0] += 0.020 * sum(lane.kv_len for lane in lanes) / 40  # a prompt's rows projected

        def propose(self, lanes, anchors, limits, state):
            calls.append("propose")
            clock[0] += 0.005  # the drafting itself
            return proposal_from_lists([[7] * n for n in limits], limits, anchors.device)

    stage, costs = draft_stage.Draft(backend="ngram"), RoundCosts()
    kept = {"drafter": Backlogged({}, "full", None), "round_costs": costs, "state": stage.new_state()}
    lanes = [SimpleNamespace(kv_len=40), SimpleNamespace(kv_len=4)]
    stage.run(lanes, torch.tensor([1, 2]), torch.tensor([0, 1]), (0, 0), **kept)
    assert calls == ["propose"] and costs.draft_s(3) == 0.0  # nothing drafts: the backlog may wait
    stage.run(lanes, torch.tensor([1, 2]), torch.tensor([0, 1]), (3, 0), **kept)
    assert calls == ["propose", ("catch_up", [40]), "propose"]  # only the drafting lane's backlog
    assert costs.draft_s(3, 1) == 0.0  # the first drafting proposal: not a sample
    assert costs.catch_up_s(40) == pytest.approx(0.020)  # the backlog is timed apart, per row
    stage.run(lanes, torch.tensor([1, 2]), torch.tensor([0, 1]), (3, 0), **kept)
    assert costs.draft_s(3, 1) == pytest.approx(0.005)
