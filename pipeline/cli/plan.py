"""`speclane plan`: what the row budget gives for a setting (drafts per lane and rows per round, by lanes) and,
with --model or --memory, the memory plan: what the configuration holds, line by line, and whether it fits.

The memory plan's total is a run's peak resident memory: this process's own (`runtime`, measured here) plus every
allocation, checkpoints as a run of --lanes requests of --context tokens fills them; `bound` is the total with the
checkpoint budget full, which a long run comes to hold and --memory is checked against (docs/memory.md)."""

from __future__ import annotations

import argparse
import json

from speclane.pipeline.cli.common import add_knob_flags, add_memory_flags, add_model_flags, knobs_from_args
from speclane.pipeline.framework.spec import load_spec
from speclane.stages.contract.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="drafts per lane and rows per round for a speculation setting; with --model or "
        "--memory, the bytes it holds and whether they fit",
        description="Drafts per lane and rows per round for a speculation setting. With --model or --memory, the "
        "memory plan: `runtime` (this process before the weights: python, torch, the engine, the tokenizer; "
        "measured), the weights, KV and other state for --lanes lanes of --context tokens, activations, the "
        "checkpoints a run of --lanes requests of --context tokens fills (at most --checkpoint-memory), and "
        "`loading` (what a load holds for a moment past that). `total` is the run's peak resident memory; `bound` "
        "counts the checkpoint budget full, as a long run (serve, chat) comes to hold it, and is what `fits` and "
        "`free` check. `speclane generate` without --max-lanes/--max-len holds a lane a request and its longest "
        "prompt + max_tokens: plan it with those as --lanes and --context. With --profile, the speculation "
        "settings derived from the profile's figures and the model: each candidate's predicted tokens/s at 1, 2, "
        "4, ... lanes (up to the profile's lanes or --lanes) and the choice (docs/profiles.md).",
    )
    add_knob_flags(p)
    p.add_argument("--lanes", type=int, default=1, help="active lanes (the memory plan: lanes allocated)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--routing",
        default=None,
        metavar="TRACE",
        help="with --profile and a MoE model: a routing trace recorded on text (python -m speclane.bench.routing_trace)"
        " for the round model, in place of the model's own (random weights do not route as text does)",
    )
    add_model_flags(p)
    add_memory_flags(p)
    p.add_argument(
        "--context",
        "--max-len",
        dest="max_len",
        type=int,
        default=4096,
        metavar="TOKENS",
        help="KV capacity of a lane: prompt + output tokens (generate's --max-len)",
    )
    p.add_argument(
        "--checkpoint-memory",
        type=int,
        default=512,
        metavar="MB",
        help="prompt checkpoints' budget in MB, as generate's (0: off)",
    )
    p.add_argument(
        "--checkpoint-interval",
        type=int,
        default=1024,
        metavar="TOKENS",
        help="checkpoints every this many tokens of a long prompt, as generate's (0: none)",
    )
    p.add_argument(
        "--checkpoint-host-memory",
        type=int,
        default=None,
        metavar="MB",
        help="with the model on a GPU: the checkpoints' host tier in MB, as generate's (default 4096)",
    )
    p.set_defaults(func=run)


def plan_for(spec, lanes: int) -> dict:
    from speclane.pipeline.framework.knobs import knob_value  # these two import torch: not at the top (--help)
    from speclane.stages.anchor_gather import drafts_per_lane

    backend = knob_value(spec, "backend") or "none"
    k = int(knob_value(spec, "draft_tokens") or 0) if backend != "none" else 0
    budget = int(knob_value(spec, "draft_rows") or 0)
    per_lane = drafts_per_lane(k, budget, lanes)
    measured = knob_value(spec, "draft_plan") == "measured" and per_lane > 0
    return {
        "backend": backend,
        "draft_tokens": k,
        "row_budget": budget,
        "lanes": lanes,
        "plan": "measured" if measured else "fixed",
        # measured: the most each lane may take; how many pay is decided each round on the machine
        "drafts_per_lane": per_lane,
        "rows": lanes * (per_lane + 1),
    }


def run(args: argparse.Namespace) -> int:
    from speclane.pipeline.cli.memory import as_json, plan_from_args, table
    from speclane.pipeline.runtime.engine import resolve_spec

    if args.lanes < 1:
        raise ConfigError(f"--lanes must be >= 1, got {args.lanes}")
    if args.routing is not None and not getattr(args, "profile", None):
        raise ConfigError("--routing feeds the round model of a --profile plan: add --profile (docs/profiles.md)")
    derivation = None
    if getattr(args, "profile", None):  # the profile's settings derived from its figures and the model
        from speclane.pipeline.cli.common import max_lanes_from_args
        from speclane.pipeline.cli.derive import derivation_from_args
        from speclane.pipeline.cli.memory import runtime_bytes
        from speclane.stages.models.artifact import resolve

        if args.model is not None or args.memory is not None or args.host_memory is not None:
            runtime_bytes(resolve(args.model))  # before the probes load the model: the plan's `runtime` line

        derivation = args._derivation = derivation_from_args(args, max(args.lanes, max_lanes_from_args(args)))
    spec = resolve_spec(load_spec(args.spec), knobs_from_args(args))
    result = plan_for(spec, args.lanes)
    memory = None
    if args.model is not None or args.memory is not None or args.host_memory is not None:
        if args.max_len < 1:
            raise ConfigError(f"--context must be >= 1 token, got {args.max_len}")
        if args.checkpoint_memory < 0:
            raise ConfigError(f"--checkpoint-memory must be >= 0 (0: off), got {args.checkpoint_memory}")
        memory = plan_from_args(args, spec, args.lanes, args.max_len)
    if args.json:
        from speclane.pipeline.cli.derive import as_json as derived_json

        extra = {} if derivation is None else derived_json(derivation)
        print(json.dumps({**result, **extra} if memory is None else {**result, **extra, **as_json(*memory)}))
        return 0
    if derivation is not None:
        from speclane.pipeline.cli.derive import table as derived_table

        print("\n".join(derived_table(derivation)))
    for key, value in result.items():
        print(f"{key:<16} {value}")
    if memory is not None:
        print("\n".join(table(*memory)))
    return 0
