"""The suffix drafter calibrates its trees' estimates by match length: a proposal's outcome is settled when its lane
is next seen with more tokens (never another lane's, never before a round ran), a bucket whose drafts fail is
trusted less, one whose drafts hold is never trusted beyond the trees' own estimate."""

import pytest

from speclane.stages.contract.resources import Resources
from speclane.stages.drafters.suffix import Suffix
from speclane.stages.drafters.suffix_cache import CALIBRATION_PRIOR, CALIBRATION_WEIGHT, Calibration
from speclane.stages.drafters.suffix_tree import Draft
from tests.stages.test_suffix import FakeLane, drafts


def suffix() -> Suffix:
    return Suffix({"cache_tokens": 0}, "full", Resources(target=None))


def test_failed_drafts_lower_their_match_lengths_factor_only():
    backend = suffix()
    state = backend.new_state(1, 64)
    lane = FakeLane([1, 2, 3, 4, 9, 1, 2, 3])
    assert drafts(backend, [lane], (3,), state) == [[4, 9, 1]]  # a 3-token match, each draft certain by the counts
    drafts(backend, [lane], (3,), state)  # no round yet: nothing settled
    assert state.calibration.expected == [0.0] * len(state.calibration.expected)
    lane.out_ids.append(100)  # the target's token: the proposal failed at its first draft
    assert drafts(backend, [lane], (3,), state) == [[]]  # 100 is new: nothing to draft, and no new proposal
    cal = state.calibration
    w, p = CALIBRATION_WEIGHT, CALIBRATION_PRIOR
    assert cal.factor(3) == pytest.approx(w * p / (3 + w)) and cal.factor(4) == cal.factor(3)  # the 3-4 bucket
    assert cal.factor(1) == cal.factor(2) == cal.factor(5) == p
    assert backend.expected(state, Draft((4, 9), (1.0, 1.0), match=3)) == pytest.approx(2 * cal.factor(3, prior=1.0))
    assert cal.factor(3, prior=1.0) == pytest.approx(w / (3 + w))
    lane.out_ids.append(101)
    drafts(backend, [lane], (3,), state)
    assert cal.factor(3) == pytest.approx(w * p / (3 + w))  # settled once only


def test_a_bucket_without_evidence_is_worth_the_prior_to_the_plan_and_drafts_that_hold_lift_it():
    """A fresh server's first proposals are not priced as sure to the plan (a path seen once says 1.0 for every draft
    on it); a chain's choice reads the trees' own estimate, so the trees are tried and learn."""
    cal = Calibration()
    sure = Draft((1, 2, 3, 4), (1.0,) * 4, match=3)
    assert cal.chances(sure) == pytest.approx((CALIBRATION_PRIOR, 1.0, 1.0, 1.0)) and CALIBRATION_PRIOR < 1
    assert cal.worth(sure) == pytest.approx(4.0)
    factors = []
    for _ in range(3):
        cal.settle(sure, accepted=4)
        factors.append(cal.factor(3))
    assert CALIBRATION_PRIOR < factors[0] < factors[1] < factors[2] <= 1.0
    assert cal.factor(10) == CALIBRATION_PRIOR  # another bucket learnt nothing


def test_drafts_that_hold_keep_the_trees_estimate():
    cal = Calibration()
    for _ in range(20):
        cal.settle(Draft((1, 2, 3), (1.0, 0.5, 0.25), match=10), accepted=3)  # better than the trees said
    assert cal.factor(10) == 1.0


def test_another_lane_in_the_slot_settles_nothing():
    backend = suffix()
    state = backend.new_state(1, 64)
    old = FakeLane([1, 2, 3, 4, 9, 1, 2, 3])
    drafts(backend, [old], (3,), state)
    old.finish_reason = "stop"
    new = FakeLane([5, 6, 7, 5, 6, 7, 5, 6, 7, 8])
    drafts(backend, [new], (3,), state)
    assert state.calibration.expected == [0.0] * len(state.calibration.expected)
