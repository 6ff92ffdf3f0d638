"""The experts section's plan check: does the CPU profile's plan for the MoEfied model recommend what the section
measured, and does its round model copy what the cells copied?

`measured_cells` gives the section's timed cells as flat records; `plan_agreement` derives `PLAN_PROFILE`'s plan
for the model, its probes (pass cost, copy, routing, rounds and acceptance on the section's own prompts) run in this
run, and checks it cell by cell (bench/plan_check.py `check_experts`); `copy_agreement` sets the round model's expert
copies a committed token (bytes, and seconds at the copy probe's link) beside the cells' bytes and the speed part's
copy time. Not here: the measurement (bench/experts.py), the report (bench/experts_report.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from unittest import mock

from speclane.bench import plan_check

PLAN_PROFILE = "cpu"  # the profile whose plan the cells are checked against: its figures are this machine's probes


def measured_cells(section: dict) -> list[dict]:
    """The section's timed cells as flat records, one per cell and fast-tier share (1.0: every expert resident):
    backend, draft_tokens, row_budget, lanes, fast_share, tokens_per_s (median of the repeats) and interval (min, max).
    What a check of the plan's recommendation against the measurement reads."""
    shares = {"resident": 1.0, **section["fractions"]}
    return [
        {
            "backend": c["backend"],
            "draft_tokens": c["k"] if c["backend"] != "none" else 0,
            "row_budget": c["rows"],
            "lanes": c["lanes"],
            "fast_share": shares[n],
            "tokens_per_s": t["median"],
            "interval": (t["min"], t["max"]),
        }
        for c in section["cells"]
        for n, t in c["tps"].items()
    ]


def plan_agreement(
    where: Path, resident, slots: dict[str, int], section: dict, prompts: list[list[int]], speed_settings
) -> dict:
    """`PLAN_PROFILE`'s plan for the model at `where` (its figures probed on `resident`, every expert resident; its
    rounds and acceptance on `prompts`, the section's workload, at its tokens a lane) checked cell by cell against
    the section's measurement (bench/plan_check.py `check_experts`): in each cell the plan's pick among the
    settings measured there, predicted as the cells ran them (the fixed plan: every lane drafts what the draft
    tokens and the row budget allow) with the slots the run gave each tier. The plan's probes run now, in an empty
    cache: figures cached by an earlier run, on another day's load, would be checked instead of this run's."""
    from speclane.pipeline.cli.derive import derivation_from_args
    from speclane.pipeline.runtime.derivation import Candidate
    from speclane.pipeline.runtime.round_model import rate

    lanes = max(c["lanes"] for c in section["cells"])
    args = argparse.Namespace(profile=PLAN_PROFILE, model=str(where), dtype="bfloat16")
    with tempfile.TemporaryDirectory() as fresh, mock.patch.dict(os.environ, {"SPECLANE_CACHE": fresh}):
        d = derivation_from_args(args, lanes, resident, prompts, section["max_tokens"])  # probed now, not cached
    by_share = {1.0: None, **{section["fractions"][n]: k for n, k in slots.items()}}

    def round_of(backend: str, k: int, rows: int, n: int, share: float):
        return rate(d.machine, d.target, d.drafters[backend], n, Candidate(backend, k, rows).cap(n), by_share[share])

    rows = plan_check.check_experts(measured_cells(section), lambda *a: round_of(*a).tps)
    out = {"profile": PLAN_PROFILE, "choice": d.choice.as_dict(), "cells": rows, "tally": plan_check.tally(rows)}
    return {**out, "link": d.machine.link, "copies": copy_agreement(section, round_of, d.machine.link, speed_settings)}


def copy_agreement(section: dict, round_of, link: float | None, speed_settings) -> list[dict]:
    """The round model's expert copies against the section's, per cell at each tier short of every expert: bytes
    copied a committed token predicted (its misses a round x one expert over its tokens a round) and measured, and
    the copies' seconds a token predicted; where the `speed` part ran the setting (25 % tier, 1 lane) also the
    seconds a token the copies measured there: 1 / tok/s copying - 1 / tok/s computing in place (medians)."""
    speed = {
        next(c for c in speed_settings if c[0] == name)[1:]: v["tps"] for name, v in section.get("speed", {}).items()
    }
    out = []
    for c in section["cells"]:
        for n, share in section["fractions"].items():
            r = round_of(c["backend"], c["k"], c["rows"], c["lanes"], share)
            row = {"lanes": c["lanes"], "setting": c["setting"], "tier": n, "measured_bytes": c["copied"][n]}
            row |= {
                "predicted_bytes": r.parts["copies"] * (link or 0.0) / r.tokens,
                "predicted_s": r.parts["copies"] / r.tokens,
            }
            tps = speed.get((c["backend"], c["k"], c["rows"])) if (n, c["lanes"]) == ("25%", 1) else None
            if tps is not None:
                row["measured_s"] = 1 / tps["25% copy"]["median"] - 1 / tps["25% in place"]["median"]
            out.append(row)
    return out
