"""The expert-cache benchmark's parts: MoEfication's clustering and router fit, the policy study, the report.

The full section runs in `speclane bench --sections experts`; here each part is checked on small planted data.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET

import pytest
import torch

from speclane.bench import experts, experts_plan, experts_report, experts_study, plan_check
from speclane.stages.fitting.moefy import balanced_clusters, fit_router


def test_balanced_clusters_recover_planted_groups():
    # 4 groups of 6 neurons; a neuron fires (with noise) on its group's tokens only
    gen = torch.Generator().manual_seed(0)
    groups, size, tokens = 4, 6, 200
    which = torch.randint(0, groups, (tokens,), generator=gen)
    truth = torch.arange(groups * size) // size
    features = (truth[:, None] == which[None, :]).float() + 0.1 * torch.rand(groups * size, tokens, generator=gen)
    perm = torch.randperm(groups * size, generator=gen)
    members = balanced_clusters(features[perm], groups, iterations=5, seed=1)
    assert members.shape == (groups, size)
    assert sorted(members.flatten().tolist()) == list(range(groups * size))  # a partition, equal sizes
    for row in members:
        assert len(set(truth[perm][row].tolist())) == 1  # each cluster is one planted group


def test_fit_router_recovers_a_linear_map():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(500, 16, generator=gen)
    w = torch.randn(5, 16, generator=gen)
    got = fit_router(h, h @ w.T, ridge=1e-6)
    assert torch.allclose(got, w, atol=1e-3)


def _trace(seed: int, layers: int = 3, experts_: int = 8, steps: int = 40) -> dict:
    """A skewed routing trace as experts_study.record keeps one: each layer prefers a few experts, as text does;
    a prefill lookup of every expert a layer first, and a look-ahead guess per lookup."""
    rng = random.Random(seed)
    lookups = [(layer, tuple(range(experts_))) for layer in range(layers)]
    for _ in range(steps):
        for layer in range(layers):
            lookups.append((layer, tuple(sorted({min(int(rng.expovariate(0.6)), experts_ - 1) for _ in range(2)}))))
    ahead = [((0, 1), (1, 2)) for _ in lookups]
    return {"lookups": lookups, "ahead": ahead, "start": layers, "tokens": steps}


def test_the_study_counts_decode_lookups_tunes_on_training_and_belady_bounds_the_copies():
    held, train = [_trace(0), _trace(1)], [_trace(2)]
    res = experts_study.compare_policies(train, held, slots=6, expert_bytes=1000)
    decode = sum(len(e) for t in held for _, e in t["lookups"][t["start"] :])
    assert set(experts_study.POLICY_ORDER) <= set(res) and res["tuned"]["decay"] in experts_study.DECAYS
    for name in experts_study.POLICY_ORDER:
        r = res[name]
        assert r["lookups"] == decode, name
        assert r["copies"] >= res["belady"]["copies"], name  # nothing moves fewer bytes than Belady's optimum
        assert r["bytes_per_token"] == pytest.approx(r["copies"] * decode * 1000 / 80)
    assert res["belady"]["hits"] > res["lru"]["hits"]  # the skewed trace leaves LRU room to lose
    assert res["next_use+pf2"]["prefetch_hits"] > 0


def _cell(lanes: int) -> dict:
    tps = {n: {"median": m, "min": m - 1, "max": m + 1, "n": 2} for n, m in (("resident", 4.0), ("10%", 3.0))}
    return {
        "lanes": lanes,
        "setting": "off",
        "backend": "none",
        "k": 1,
        "rows": 0,
        "tps": tps,
        "identical": True,
        "copied": {"10%": 2e6},
        "hit_rate_live": {"10%": 0.3},
    }


def _section() -> dict:
    rates = dict(zip(experts_report.POLICY_ORDER, (0.0, 0.2, 0.3, 0.3, 0.35, 0.32, 0.41, 0.58, 0.57)))
    study = {p: {"hit_rate": r, "copies": 1 - r} for p, r in rates.items()}
    return {
        "target": "t",
        "model_dir": "/m",
        "expert_bytes": 1024,
        "experts": 10,
        "slots": {"10%": 1},
        "fractions": {"10%": 0.1},
        "moefied": {"router_recall_mean": 0.7, "kept_energy_mean": 0.8, "lookahead_hit_mean": 0.5},
        "kept_policy": "next_use",
        "study_tokens": 48,
        "study": {"1x off": {"10%": {**study, "tuned": {"decay": 0.999, "fade": 0.85}}}},
        "speed": {
            "off": {
                "tps": {"resident": {"median": 40.0}},
                "ratio": {"25% copy": {"median": 0.8, "min": 0.7, "max": 0.9}},
                "identical": True,
            }
        },
        "cells": [_cell(1), _cell(2)],
        "plan_check": {
            "profile": "cpu",
            "choice": {"backend": "none", "draft_tokens": 0, "row_budget": 0},
            "cells": plan_check.check_experts(
                [
                    {
                        "backend": "none",
                        "draft_tokens": 0,
                        "row_budget": 0,
                        "lanes": 1,
                        "fast_share": 0.1,
                        "tokens_per_s": 3.0,
                        "interval": (2.0, 4.0),
                    },
                    {
                        "backend": "ngram",
                        "draft_tokens": 7,
                        "row_budget": 8,
                        "lanes": 1,
                        "fast_share": 0.1,
                        "tokens_per_s": 5.0,
                        "interval": (4.5, 5.5),
                    },
                ],
                lambda b, k, r, n, s: 1.0 if b == "none" else 0.5,
            ),
            "tally": {"best": 0, "within": 0, "disagree": 1},
        },
    }


def test_report_lines_and_svg_plots(tmp_path):
    text = "\n".join(experts_report.lines(_section()))
    assert "41 / 0.59" in text and "57 / 0.43" in text and "decay 0.999, fade 0.85" in text
    assert "25% copy 0.80 [0.70, 0.90]; same tokens" in text
    assert "plan check, profile cpu (its choice: none k 0 rows 0): 0 cell(s) the best, 0 within the interval, 1" in text
    assert "fast 10%   1 lane(s): measured best ngram k7 b8 5.0 [4.5, 5.5]; plan picks off (measured 3.0" in text
    failed = experts_report.lines({**_section(), "plan_check": {"error": "ValueError: no probe"}})
    assert failed[-1] == "  plan check: not run (ValueError: no probe)"
    written = experts_report.plot(_section(), tmp_path)
    assert {p.name for p in written} == {"experts_tps.svg", "experts_hit_rate_10.svg"}
    for p in written:
        root = ET.parse(p).getroot()
        assert root.tag.endswith("svg") and root.findall("{http://www.w3.org/2000/svg}polyline")


def test_measured_cells_are_flat_records_for_a_plan_check():
    got = experts_plan.measured_cells(_section())
    assert len(got) == 4  # 2 cells x (resident, 10 %)
    assert got[0] == {
        "backend": "none",
        "draft_tokens": 0,
        "row_budget": 0,
        "lanes": 1,
        "fast_share": 1.0,
        "tokens_per_s": 4.0,
        "interval": (3.0, 5.0),
    }
    assert got[1]["fast_share"] == 0.1 and got[1]["tokens_per_s"] == 3.0


def test_the_copy_check_sets_the_round_models_copies_beside_the_measured_ones():
    from speclane.pipeline.runtime.round_model import Round

    sec = _section()
    sec["fractions"] = {"25%": 0.25}
    sec["cells"] = [{**_cell(n), "copied": {"25%": 3e6}} for n in (1, 2)]
    sec["speed"]["off"]["tps"] |= {"25% copy": {"median": 40.0}, "25% in place": {"median": 50.0}}
    asked = []

    def round_of(backend, k, rows, lanes, share):
        asked.append((backend, k, rows, lanes, share))
        return Round(lanes, 0, 2.0 * lanes, {"pass": 0.01, "copies": 0.004 * lanes})

    got = experts_plan.copy_agreement(sec, round_of, 1e9, experts.SPEED)
    assert asked == [("none", 1, 0, 1, 0.25), ("none", 1, 0, 2, 0.25)]
    # 4 ms of copies a round at 1 GB/s over 2 tokens a round: 2 MB and 2 ms a token
    assert got[0] == {
        "lanes": 1,
        "setting": "off",
        "tier": "25%",
        "measured_bytes": 3e6,
        "predicted_bytes": pytest.approx(2e6),
        "predicted_s": pytest.approx(0.002),
        "measured_s": pytest.approx(1 / 40 - 1 / 50),  # the speed part ran off at the 25 % tier, 1 lane
    }
    assert "measured_s" not in got[1]  # the speed part ran 1 lane only
    lines = experts_report.copy_lines({"link": 1e9, "copies": got})
    assert lines[1] == "    1 x off        25%:   2.00 /   3.00 MB; 2.00 / 5.00 ms"
    assert lines[2] == "    2 x off        25%:   2.00 /   3.00 MB; 2.00 ms"


def test_a_cells_figure_is_its_batches_tokens_over_their_seconds():
    # 10 tokens at 10 tok/s (1 s) and 30 at 60 tok/s (0.5 s): 40 tokens in 1.5 s, not the runs' mean of 35 tok/s
    runs = [{"decode_tokens": 10, "tps": 10.0}, {"decode_tokens": 30, "tps": 60.0}, {"decode_tokens": 0, "tps": 0.0}]
    assert experts.aggregate(runs) == pytest.approx(40 / 1.5)
    untimed = experts.aggregate([{"decode_tokens": 0, "tps": float("nan")}])
    assert untimed != untimed  # NaN: nothing was timed
