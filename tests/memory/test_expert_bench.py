"""The expert-cache benchmark's parts: MoEfication's clustering and router fit, the policy study, the report.

The full section runs in `speclane bench --sections experts`; here each part is checked on small planted data.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET

import torch

from speclane.bench import experts, experts_report
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


def _trace(seed: int, layers: int = 3, experts_: int = 8, steps: int = 40) -> list:
    """A skewed routing trace: each layer prefers a few experts, as text does."""
    rng = random.Random(seed)
    out = [(layer, list(range(experts_))) for layer in range(layers)]  # a prefill chunk chooses every expert
    for _ in range(steps):
        for layer in range(layers):
            out.append((layer, sorted({min(int(rng.expovariate(0.6)), experts_ - 1) for _ in range(2)})))
    return out


def test_study_counts_decode_lookups_and_belady_bounds_every_policy():
    trace = _trace(0)
    start = 3
    res = experts.study(trace, start, slots=6, decay=0.99)
    decode = sum(len(e) for _, e in trace[start:])
    for name, r in res.items():
        assert r["hits"] + r["misses"] == decode, name
    assert all(res["belady"]["misses"] <= r["misses"] for r in res.values())
    assert res["belady"]["misses"] < res["lru"]["misses"]  # the skewed trace leaves LRU room to lose


def _section() -> dict:
    cell = {
        "lanes": 1,
        "setting": "off",
        "tps": {"resident": 4.0, "10%": 3.0, "95%": 3.9},
        "copied": {"10%": 2e6, "95%": 1e4},
        "hit_rate_live": {"10%": 0.3, "95%": 0.99},
        "study": {
            n: {p: {"hit_rate": r, "hits": 1, "misses": 1} for p, r in zip(experts_report.POLICY_ORDER, rates)}
            for n, rates in (("10%", (0.1, 0.3, 0.3, 0.6)), ("95%", (0.99, 0.99, 0.99, 0.99)))
        },
    }
    return {
        "target": "t",
        "expert_bytes": 1024,
        "experts": 10,
        "slots": {"10%": 1, "95%": 9},
        "moefied": {"router_recall_mean": 0.7, "kept_energy_mean": 0.8, "lookahead_hit_mean": 0.5},
        "kept_policy": "lfu",
        "cells": [cell, {**cell, "lanes": 2}],
        "prefetch": {"lookahead_hit": 0.5, "kept": False, "why": "w"},
    }


def test_report_lines_and_svg_plots(tmp_path):
    text = "\n".join(experts_report.lines(_section()))
    assert "10% 10/30/30/60/30" in text and "not kept" in text
    written = experts_report.plot(_section(), tmp_path)
    assert {p.name for p in written} == {"experts_tps.svg", "experts_hit_rate_10.svg", "experts_hit_rate_95.svg"}
    for p in written:
        root = ET.parse(p).getroot()
        assert root.tag.endswith("svg") and root.findall("{http://www.w3.org/2000/svg}polyline")
