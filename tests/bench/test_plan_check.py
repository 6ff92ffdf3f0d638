"""bench/plan_check.py as case tables: the plan's pick against the measured best, cell by cell, with the
measurement's interval; settings compared by their effect (mtp's row budget 0 is its 8)."""

from speclane.bench.plan_check import Measured, cells_from_defaults, check, measured_acceptance


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
    assert measured_acceptance(result) == {"mtp": (0.7, 0.5, 0.3, 0.0, 0.0, 0.0, 0.0)}
