"""What a chain learns of its model drafter: its acceptance per lane from the rounds it drafted there (rounds the
trees drafted do not count), pulled towards the engine's mean and the prior; and its time as a share of a round
without it, from the chain's own clock, the first proposal left out; the passes it has yet to observe."""

import attrs
import pytest

from speclane.stages.drafters.chain_model import HELD_PASSES, Held, ModelCosts, ModelRates, Seen


@attrs.define(eq=False)
class CountingLane:
    slot: int = 0
    drafted: int = 0
    accepted: int = 0


def round_of(rates, lane, part, drafted, accepted):
    rates.update([lane])
    rates.drafted(lane, part)
    lane.drafted += drafted
    lane.accepted += accepted


def test_a_lane_whose_network_drafts_fail_expects_less_and_one_whose_drafts_hold_more():
    rates = ModelRates(prior=0.5)
    bad, good, fresh = CountingLane(0), CountingLane(1), CountingLane(2)
    for _ in range(6):
        round_of(rates, bad, "model", 7, 0)
        round_of(rates, good, "model", 7, 7)
    rates.update([bad, good, fresh])
    assert rates.rate(bad) < 0.5 < rates.rate(good)  # each moved from the prior its own way
    assert rates.rate(fresh) == pytest.approx(rates.engine_rate())
    assert rates.rate(bad) < rates.rate(fresh) < rates.rate(good)
    assert rates.expected(good, 3) > rates.expected(fresh, 3) > rates.expected(bad, 3) > 0
    assert rates.expected(fresh, 0) == 0


def test_rounds_the_trees_drafted_teach_nothing_about_the_network():
    rates = ModelRates(prior=0.5)
    lane = CountingLane()
    before = rates.rate(lane)
    for _ in range(5):
        round_of(rates, lane, "suffix", 7, 0)
    rates.update([lane])
    assert rates.rate(lane) == before == pytest.approx(0.5)


def test_the_engines_mean_drifts_back_to_the_prior_while_the_network_drafts_nothing():
    """A few answers whose network drafts all failed sink the engine's mean; rounds the trees drafted (or nobody)
    teach nothing of the network, but the evidence ages, so its mean returns towards the prior and the network is
    tried again instead of being kept out for good by an early run of hard text."""
    rates = ModelRates(prior=0.6)
    lane = CountingLane()
    for _ in range(10):
        round_of(rates, lane, "model", 1, 0)
    rates.update([lane])
    sunk = rates.engine_rate()
    assert sunk < 0.15
    for _ in range(100):
        round_of(rates, lane, "suffix", 3, 3)
    rates.update([lane])
    assert 2 * sunk < rates.engine_rate() < 0.6
    for _ in range(200):
        round_of(rates, lane, "", 0, 0)
    rates.update([lane])
    assert rates.engine_rate() == pytest.approx(0.6, abs=0.01)


def test_a_new_lane_in_a_slot_starts_from_the_engines_mean():
    rates = ModelRates(prior=0.5)
    old = CountingLane(0)
    for _ in range(6):
        round_of(rates, old, "model", 7, 0)
    rates.update([old])
    old_rate = rates.rate(old)
    new = CountingLane(0, drafted=3, accepted=3)  # its counters are its own, not a round of the old lane's
    rates.update([new])
    assert rates.rate(new) == pytest.approx(rates.engine_rate()) and rates.rate(new) > old_rate


def test_the_networks_share_of_a_round_from_the_chains_clock():
    now = iter([0.0, 0.012, 0.026])
    costs = ModelCosts(clock=lambda: next(now))
    assert costs.share(0) == 0.0  # nothing timed yet: the network is free
    costs.tick()
    costs.proposed(0.002)  # the first proposal pays one-time set-up: not a sample
    costs.tick()  # a 12 ms period, 2 of them the network's: a 10 ms round without it
    costs.proposed(0.003)
    costs.caught_up(100, 0.001)
    costs.tick()  # 14 ms, 4 of them the network's
    assert list(costs.periods) == pytest.approx([0.010, 0.010]) and list(costs.proposals) == [0.003]
    assert costs.share(0) == pytest.approx(0.3) and costs.share(100) == pytest.approx(0.4)


@attrs.define(eq=False)
class Pass:
    lane_rows: tuple


def test_held_passes_count_their_rows_per_lane_and_are_taken_oldest_first():
    held, a, b = Held(), CountingLane(0), CountingLane(1)
    for rows in ((1, 3), (2, 1)):
        held.hold([a, b], Pass(rows), Seen("hidden", "taps"), None)
    assert len(held) == 2 and (held.rows(a), held.rows(b)) == (3, 4)
    first = held.take(1)
    assert first[0][1].lane_rows == (1, 3) and first[0][2] == Seen("hidden", "taps")
    assert (held.rows(a), held.rows(b)) == (2, 1)
    assert [p[1].lane_rows for p in held.take()] == [(2, 1)] and len(held) == 0 and held.rows(a) == 0


def test_a_held_pass_whose_lanes_all_left_their_slots_is_forgotten():
    held, old, other, new = Held(), CountingLane(0), CountingLane(1), CountingLane(0)
    held.hold([old], Pass((5,)), Seen(None, None), None)
    held.hold([old, other], Pass((1, 1)), Seen(None, None), None)
    held.hold([new], Pass((7,)), Seen(None, None), None)  # slot 0 changes hands: the first pass is old's alone
    assert [p[1].lane_rows for p in held.passes] == [(1, 1), (7,)]  # the second still holds `other`'s row
    assert (held.rows(old), held.rows(new), held.rows(other)) == (0, 7, 1)


def test_held_passes_count_in_the_networks_cost_and_bound_how_many_wait():
    costs = ModelCosts(clock=lambda: 0.0)
    assert costs.held_passes() == HELD_PASSES  # nothing timed yet
    costs.periods.append(0.010)
    costs.proposals.append(0.002)
    costs.observed(10, 0.0001 * 10)  # a tenth of a millisecond a pass: a 10 ms round observes a hundred
    assert costs.held_passes() == 100
    assert costs.share(0, 50) == pytest.approx((0.002 + 50 * 0.0001) / 0.010)
