"""bench/plan_check.py as case tables: the plan's pick against the measured best, cell by cell, with the
measurement's interval; settings compared by their effect (mtp's row budget 0 is its 8)."""

import pytest

from speclane.bench.plan_check import (
    Measured,
    cells_from_defaults,
    check,
    check_experts,
    lines,
    measured_acceptance,
    tally,
)


def m(backend, k, rows, lanes, tps, low, high, cell=""):
    return Measured(backend, k, rows, lanes, tps, low, high, cell)


CELLS = [
    m("none", 0, 0, 1, 20.0, 19.0, 21.0),
    m("ngram", 7, 0, 1, 30.0, 28.0, 33.0),
    m("mtp", 7, 0, 1, 36.0, 34.0, 38.0),
    m("none", 0, 0, 4, 50.0, 49.0, 51.0),
    m("ngram", 7, 0, 4, 55.0, 54.0, 56.0),
    m("mtp", 7, 0, 4, 52.0, 50.0, 53.0),
    m("none", 0, 0, 4, 40.0, 39.0, 41.0, cell="prose"),
    m("mtp", 7, 0, 4, 41.0, 39.0, 43.0, cell="prose"),
]


def test_pick_best_within_and_disagree():
    table = {("none", 1): 1.0, ("ngram", 1): 2.0, ("mtp", 1): 3.0, ("none", 4): 1.0, ("ngram", 4): 2.0, ("mtp", 4): 3.0}
    rows = check(CELLS, lambda b, k, r, n: table[(b, n)], choice=("mtp", 7, 8))
    by = {(r["cell"], r["lanes"]): r for r in rows}
    assert [(r["cell"], r["lanes"]) for r in rows] == [("", 1), ("", 4), ("prose", 4)]
    assert by[("", 1)]["agrees"] == "best" and by[("", 1)]["choice_agrees"] == "best"
    # the plan picks mtp at 4 lanes, measured 52 [50, 53] against ngram's 55 [54, 56]: apart, so it disagrees
    assert by[("", 4)]["plan_pick"]["backend"] == "mtp" and by[("", 4)]["agrees"] is None
    assert by[("", 4)]["measured_best"]["backend"] == "ngram" and by[("", 4)]["choice_agrees"] is None
    # mtp 41 [39, 43] is the best there; off's 40 [39, 41] would be within the interval
    assert by[("prose", 4)]["agrees"] == "best"
    off_pick = check(CELLS[6:], lambda b, k, r, n: 1.0 if b == "none" else 0.5)
    assert off_pick[0]["agrees"] == "within"


def test_a_choice_not_measured_in_a_cell_says_so():
    rows = check(CELLS[:3], lambda b, k, r, n: 1.0, choice=("dflash2", 7, 0))
    assert rows[0]["choice_measured"] is False and rows[0]["choice_agrees"] is None


def test_cells_from_a_defaults_result():
    result = {
        "defaults": {
            "workload": "code_gen",
            "rows": [
                {"lanes": 1, "config": "off", "aggregate_tps": {"median": 20.0, "min": 19.0, "max": 21.0}},
                {"lanes": 1, "config": "none", "aggregate_tps": {"median": 20.5, "min": 19.0, "max": 22.0}},
                {
                    "lanes": 1,
                    "config": "mtp",
                    "aggregate_tps": {"median": 30.0, "min": 28.0, "max": 31.0},
                    "tokens_per_round": 2.5,
                    "accepted_per_position": [0.7, 0.5, 0.3, 0.0, 0.0, 0.0, 0.0],
                },
            ],
        }
    }
    cells = cells_from_defaults(result, "code_gen")
    assert [(c.backend, c.draft_tokens, c.row_budget, c.tps, c.cell) for c in cells] == [
        ("none", 0, 0, 20.0, "code_gen"),
        ("mtp", 7, 0, 30.0, "code_gen"),
    ]
    # per position given the ones before, as spec_stats writes it -> P(drafts 1..j), positions never reached dropped
    assert measured_acceptance(result) == {"mtp": pytest.approx((0.7, 0.35, 0.105))}


def _record(backend, k, rows, lanes, share, tps, low, high):
    return {
        "backend": backend,
        "draft_tokens": k,
        "row_budget": rows,
        "lanes": lanes,
        "fast_share": share,
        "tokens_per_s": tps,
        "interval": (low, high),
    }


EXPERT_CELLS = [
    # every expert resident, 1 lane: mtp measured best, clearly apart from off
    _record("none", 0, 0, 1, 1.0, 20.0, 19.0, 21.0),
    _record("mtp", 3, 8, 1, 1.0, 30.0, 29.0, 31.0),
    _record("ngram", 7, 3, 1, 1.0, 24.0, 23.0, 25.0),
    # a 10 % tier, 1 lane: off measured best; mtp's interval reaches off's low end
    _record("none", 0, 0, 1, 0.1, 10.0, 9.5, 10.5),
    _record("mtp", 3, 8, 1, 0.1, 9.0, 8.0, 9.6),
    _record("ngram", 7, 3, 1, 0.1, 7.0, 6.5, 7.5),
    # a 10 % tier, 2 lanes: off measured best, ngram far below
    _record("none", 0, 0, 2, 0.1, 15.0, 14.0, 16.0),
    _record("ngram", 7, 8, 2, 0.1, 11.0, 10.0, 12.0),
    # a backend the plan skipped (no drafter files): left out of the check
    _record("dflash2", 7, 0, 1, 0.1, 99.0, 98.0, 100.0),
]


def test_the_experts_cells_are_checked_per_fast_tier_share_and_lane_count():
    # the plan: speculation pays when every expert is resident, and the mtp > off > ngram order on a small tier
    def predict(backend, k, rows, lanes, share):
        if backend == "dflash2":
            raise KeyError(backend)
        if share >= 1.0:
            return {"none": 1.0, "ngram": 1.5, "mtp": 2.0}[backend]
        return {"none": 1.0, "ngram": 0.5, "mtp": 1.2}[backend] * lanes

    rows = check_experts(EXPERT_CELLS, predict)
    by = {(r["cell"], r["lanes"]): r for r in rows}
    assert [(r["cell"], r["lanes"]) for r in rows] == [("fast 10%", 1), ("fast 10%", 2), ("resident", 1)]
    assert by[("resident", 1)]["agrees"] == "best" and by[("resident", 1)]["plan_pick"]["backend"] == "mtp"
    # at 10 % the plan picks mtp (9.0 [8.0, 9.6]); off is best (10.0 [9.5, 10.5]): the intervals overlap
    assert by[("fast 10%", 1)]["plan_pick"]["backend"] == "mtp" and by[("fast 10%", 1)]["agrees"] == "within"
    assert by[("fast 10%", 1)]["measured_best"]["backend"] == "none"
    assert by[("fast 10%", 2)]["plan_pick"]["backend"] == "none" and by[("fast 10%", 2)]["agrees"] == "best"
    assert all(r["measured_best"]["backend"] != "dflash2" for r in rows)  # the skipped backend is not compared
    assert tally(rows) == {"best": 2, "within": 1, "disagree": 0}
    # a plan that prefers ngram on the small tier disagrees at 2 lanes: 11.0 [10, 12] against 15.0 [14, 16]
    wrong = check_experts(EXPERT_CELLS[6:8], lambda b, k, r, n, s: 2.0 if b == "ngram" else 1.0)
    assert wrong[0]["agrees"] is None and tally(wrong) == {"best": 0, "within": 0, "disagree": 1}
    assert "DISAGREES" in lines(wrong)[0] and lines(wrong)[0].startswith("fast 10%")


def test_measured_acceptance_reads_what_spec_stats_writes():
    # rounds of 3 drafts with known accepted counts: P(drafts 1..j accepted) is the share of rounds accepting >= j
    from speclane.stages.contract.lanes import Lane, spec_stats

    lane = Lane("a", 0, 0, [1], None, 3, frozenset(), None, 0)
    outcomes = [3, 2, 0, 1, 3, 0, 2, 3]
    for accepted in outcomes:
        lane.count_round(3, accepted)
    row = {"lanes": 1, "config": "mtp", **spec_stats([lane], 7)}  # positions 4..7 never offered: written as 0
    want = tuple(sum(a >= j for a in outcomes) / len(outcomes) for j in (1, 2, 3))  # 0.75, 0.625, 0.375
    assert measured_acceptance({"defaults": {"rows": [row]}}) == {"mtp": pytest.approx(want, abs=1e-3)}
