"""The measured draft plan weighing a drafter's own per-draft chances (`DraftBackend.chances`) in place of a lane's
learnt rate: a sure long path takes its drafts, a weak one is cut where its chances fall, a lane with no draft takes
none; and the draft cap a backend's own option raises past the draft stage's draft tokens (`draft_cap`)."""

import itertools
import math
import random

import pytest

from speclane.stages.anchor_gather import AnchorGather
from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.resources import Resources
from speclane.stages.draft_plan import MARGIN, catch_up_charges, draft_gains, plan_drafts
from speclane.stages.drafters.suffix import Suffix
from tests.stages.conftest import make_lane, table

FLAT = RoundCosts((1, 8, 64), (0.020, 0.021, 0.030))  # bf16 hardware: rows nearly free
AVX2 = RoundCosts(
    (1, 2, 3, 4, 5, 6, 7, 8, 16, 64), (0.023, 0.026, 0.031, 0.034, 0.048, 0.058, 0.055, 0.057, 0.140, 0.530)
)
# A CPU where an 8-row pass costs 1.1x a 1-row one and a 16-row pass 1.9x (past the decode route's 8 rows).
WIDE = RoundCosts((1, 8, 16, 32, 64), (0.010, 0.011, 0.019, 0.036, 0.070))


def tokens(d: int, rate: float, chances) -> float:
    return 1.0 + sum(draft_gains(d, rate, chances))


def predicted(plan, rates, chances, costs) -> float:
    n = len(plan)
    return sum(tokens(d, a, c) for d, a, c in zip(plan, rates, chances)) / costs.target_s(n + sum(plan))


@pytest.mark.parametrize(
    "caps, rates, chances, costs, want",
    [
        ((7,), (0.1,), ((1.0,) * 7,), FLAT, (7,)),  # a sure path drafts whatever the lane's past rounds say
        ((7,), (0.9,), ((0.05,) * 7,), FLAT, (0,)),  # a weak one is not tried on the lane's good record
        ((7,), (0.9,), ((1.0, 1.0, 1.0),), FLAT, (3,)),  # no draft past the drafter's last
        ((7, 7), (0.9, 0.9), ((), None), FLAT, (0, 7)),  # no draft at all; the other lane by its rate
        ((7,), (0.9,), ((0.98, 0.98, 0.2, 0.9, 0.9, 0.9, 0.9),), AVX2, (2,)),  # cut where the path turns weak
        ((15,), (0.5,), ((0.99,) * 15,), WIDE, (15,)),  # a sure long path pays for 16 rows
        ((15,), (0.5,), ((0.99,) * 7 + (0.5,) * 8,), WIDE, (7,)),  # not past where it stops being sure
    ],
)
def test_plan_with_chances_case_table(caps, rates, chances, costs, want):
    assert plan_drafts(caps, rates, costs, chances=chances) == want


def test_with_chances_never_predicted_slower_than_no_drafts_and_best_among_all_plans():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 3)
        caps = tuple(rng.randint(0, 5) for _ in range(n))
        rates = tuple(rng.random() for _ in range(n))
        chances = tuple(
            None if rng.random() < 0.3 else tuple(rng.random() ** 0.3 for _ in range(rng.randint(0, 6)))
            for _ in range(n)
        )
        costs = rng.choice((FLAT, AVX2, WIDE))
        plan = plan_drafts(caps, rates, costs, chances=chances)
        assert all(0 <= d <= min(c, math.inf if p is None else len(p)) for d, c, p in zip(plan, caps, chances))
        off = predicted((0,) * n, rates, chances, costs)
        best = max(predicted(p, rates, chances, costs) for p in itertools.product(*(range(c + 1) for c in caps)))
        if best < off * MARGIN:
            assert plan == (0,) * n
        else:
            assert predicted(plan, rates, chances, costs) == pytest.approx(best, rel=1e-9)


def test_gains_are_the_running_product_of_the_chances():
    assert draft_gains(3, 0.5, None) == (0.5, 0.25, 0.125)
    assert draft_gains(3, 0.5, (0.9, 0.5, 1.0, 1.0)) == pytest.approx((0.9, 0.45, 0.45))
    assert draft_gains(3, 0.5, ()) == ()
    with pytest.raises(ValueError, match="chances must be from 0 to 1"):
        draft_gains(2, 0.5, (1.5,))


def test_a_backlog_is_spread_over_the_rounds_a_sure_path_would_take():
    # 100 tokens left: at 1 + 7 sure drafts a round that is 12.5 rounds; at a rate of 0.1, about 90.
    sure, weak = catch_up_charges((1.0, 1.0), (100, 100), (7, 7), (0.1, 0.1), ((1.0,) * 7, None))
    assert sure == pytest.approx(1.0 / 12.5)
    assert weak == pytest.approx(1.0 / (100 / sum(0.1**j for j in range(8))))


class LongDrafter:
    """A drafter whose own option allows `cap` drafts a round."""

    proposes = True

    def __init__(self, cap):
        self.cap = cap

    def draft_cap(self, costs=None):
        return self.cap


# (draft_tokens K, row_budget R, the backend's own cap, per lane its own cap) -> draft_limit per lane
LONG_CASES = [
    (7, 0, 15, (7,), (15,)),  # the backend's option raises K
    (7, 0, 0, (7,), (7,)),  # a backend without one: K
    (7, 32, 15, (7, 7), (15, 15)),  # 32 // 2 - 1 = 15
    (7, 16, 15, (7, 7), (7, 7)),  # the row budget still caps the round: 16 // 2 - 1 = 7
    (7, 0, 15, (7, 3), (15, 3)),  # a request that lowered its own cap keeps it
    (0, 0, 15, (0,), (0,)),  # speculation off stays off
]


@pytest.mark.parametrize("k, budget, cap, caps, limit", LONG_CASES)
def test_a_backends_own_cap_raises_the_draft_limit_within_the_row_budget(k, budget, cap, caps, limit):
    t = table(*[make_lane(slot=s, anchor=1, kv_len=4, draft_tokens=c) for s, c in enumerate(caps)])
    out = AnchorGather(draft_tokens=k, row_budget=budget).run(t, drafter=LongDrafter(cap))
    assert out["draft_limit"] == limit


def test_the_backends_cap_is_asked_with_the_engines_round_costs():
    """suffix's default cap follows the measured pass cost: the stage hands the backend the engine's RoundCosts."""
    backend = Suffix({}, "full", Resources(target=None))
    rows = (1, 16, 32)
    for seconds, limit in (((0.01, 0.02, 0.025), 31), ((0.01, 0.02, 0.04), 15)):
        t = table(make_lane(slot=0, anchor=1, kv_len=4, draft_tokens=7))
        costs = RoundCosts(rows, seconds)
        out = AnchorGather(draft_tokens=7).run(t, drafter=backend, round_costs=costs)
        assert out["draft_limit"] == (limit,)
