"""`speclane plan`: what the row budget gives for a setting: drafts per lane and rows per round, by lanes."""
from __future__ import annotations

import argparse
import json

from speclane.pipeline.cli.common import add_knob_flags, knobs_from_args
from speclane.pipeline.framework.knobs import knob_value
from speclane.pipeline.framework.spec import load_spec
from speclane.pipeline.runtime.engine import resolve_spec
from speclane.stages.anchor_gather import drafts_per_lane
from speclane.stages.contract.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="drafts per lane and rows per round for a speculation setting")
    add_knob_flags(p)
    p.add_argument("--lanes", type=int, default=1, help="active lanes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def plan_for(spec, lanes: int) -> dict:
    backend = knob_value(spec, "backend") or "none"
    k = int(knob_value(spec, "draft_tokens") or 0) if backend != "none" else 0
    budget = int(knob_value(spec, "draft_rows") or 0)
    per_lane = drafts_per_lane(k, budget, lanes)
    measured = knob_value(spec, "draft_plan") == "measured" and per_lane > 0
    return {"backend": backend, "draft_tokens": k, "row_budget": budget, "lanes": lanes,
            "plan": "measured" if measured else "fixed",
            # measured: the most each lane may take; how many pay is decided each round on the machine
            "drafts_per_lane": per_lane, "rows": lanes * (per_lane + 1)}


def run(args: argparse.Namespace) -> int:
    if args.lanes < 1:
        raise ConfigError(f"--lanes must be >= 1, got {args.lanes}")
    spec = resolve_spec(load_spec(args.spec), knobs_from_args(args))
    result = plan_for(spec, args.lanes)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:<16} {value}")
    return 0
