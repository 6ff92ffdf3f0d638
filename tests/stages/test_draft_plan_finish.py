"""The measured plan at the end of an answer: one lane whose drafts can reach its max_tokens takes the last draft
where the round it saves (a 1-row pass for the last token) outweighs the extra row, which the round's own rate
cannot see; never with more lanes, lanes prefilling, or room left past the cap."""

import random

import pytest

from speclane.stages.contract.costs import RoundCosts
from speclane.stages.draft_plan import draft_gains, plan_drafts

# The pass-cost probe on a CPU where the arithmetic of a pass binds from 5 rows: 1-4 rows cost the same.
STEP = RoundCosts((1, 2, 3, 4, 5, 6, 7, 8), (0.01786, 0.01786, 0.01786, 0.01786, 0.02238, 0.02302, 0.02302, 0.0236))
SURE = (1.0, 1.0, 1.0, 1.0)
# The same from 5 rows on where each row past 4 costs about a quarter of a 1-row pass.
STEEP = RoundCosts((1, 4, 5, 6, 7, 8), (0.01786, 0.01786, 0.02238, 0.0269, 0.0314, 0.0359))


def test_without_rooms_the_round_rate_stops_one_draft_short():
    assert plan_drafts((4,), (0.5,), STEP, chances=(SURE,)) == (3,)  # 4 / 17.86 ms above 5 / 22.38 ms


def test_a_lane_that_can_end_its_answer_takes_the_last_draft():
    assert plan_drafts((4,), (0.5,), STEP, chances=(SURE,), rooms=(4,)) == (4,)


@pytest.mark.parametrize(
    "caps, chances, rooms, waiting",
    [
        ((4,), (SURE,), (9,), 0.0),  # room past the cap: the answer does not end this round
        ((4,), ((1.0, 1.0, 1.0, 0.1),), (4,), 0.0),  # the last draft is unlikely: the saved round too
        ((4,), (SURE,), (4,), 1.0),  # a lane prefilling: the next round runs anyway
    ],
)
def test_the_last_draft_is_left_where_no_round_is_saved(caps, chances, rooms, waiting):
    rates = (0.5,) * len(caps)
    plan = plan_drafts(caps, rates, STEP, waiting=waiting, chances=chances)
    assert plan == (3,)  # the round's rate alone stops short
    assert plan_drafts(caps, rates, STEP, waiting=waiting, chances=chances, rooms=rooms) == plan


def test_two_lanes_leave_the_last_draft_where_one_lane_takes_it():
    """The same 4th row of the pass, and the same chance that the answer ends with it."""
    assert plan_drafts((4,), (0.5,), STEEP, chances=((1.0, 1.0, 1.0, 0.6),)) == (3,)
    assert plan_drafts((4,), (0.5,), STEEP, chances=((1.0, 1.0, 1.0, 0.6),), rooms=(4,)) == (4,)
    two = {"chances": ((1.0, 1.0, 0.6), None)}
    assert plan_drafts((3, 0), (0.5, 0.5), STEEP, **two) == (2, 0)
    assert plan_drafts((3, 0), (0.5, 0.5), STEEP, **two, rooms=(3, 0)) == (2, 0)


def test_one_token_left_drafts_it_even_where_the_margin_keeps_the_round_plain():
    costs = RoundCosts((1, 2), (0.010, 0.0195))  # 2 / 19.5 ms is under 1 / 10 ms times the plan's margin
    assert plan_drafts((1,), (0.5,), costs, chances=((1.0,),)) == (0,)
    assert plan_drafts((1,), (0.5,), costs, chances=((1.0,),), rooms=(1,)) == (1,)


def test_the_last_draft_is_taken_exactly_where_it_shortens_the_expected_time_to_the_end():
    """Against the two ways to end: the full plan (a 1-row round follows only if a draft is refused) and the plan
    one short (a 1-row round always follows)."""
    rng = random.Random(7)
    for _ in range(300):
        cap = rng.randint(1, 6)
        chances = tuple(rng.random() ** 0.2 for _ in range(cap))
        one = rng.uniform(0.005, 0.02)
        costs = RoundCosts(tuple(range(1, 9)), tuple(one * (1 + rng.uniform(0, 0.15) * r) for r in range(8)))
        costs = RoundCosts(costs.rows, tuple(sorted(costs.seconds)))
        plan = plan_drafts((cap,), (0.5,), costs, chances=(chances,))
        got = plan_drafts((cap,), (0.5,), costs, chances=(chances,), rooms=(cap,))
        if plan != (cap - 1,):
            assert got == plan
            continue
        p_all = draft_gains(cap, 0.5, chances)[-1]
        full = costs.target_s(cap + 1) + (1 - p_all) * costs.target_s(1)
        short = costs.target_s(cap) + costs.target_s(1)
        assert got == ((cap,) if full < short else plan)
