"""`speclane serve`'s step flags: what a step reads of the prompts waiting, beside the decoding lanes' round.

`--prefill-rows` (the step budget), `--prefill-lanes` (prompts a prefill pass reads) and `--one-pass-steps` (prompt
rows in the decoders' pass). A replica takes the same flags (pipeline/net/replica.py). docs/protocol.md, "Fairness".
"""

from __future__ import annotations

import argparse

from speclane.stages.contract.costs import FAIR_PASS, PREFILL_ROWS
from speclane.stages.contract.errors import ConfigError


def add_step_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefill-rows",
        type=int,
        default=None,
        help=f"step budget of prompt rows: each engine step prefills at most this many prompt tokens, "
        f"then runs every decoding lane's round, so a long prompt delays other streams by one bounded "
        f"pass a step (default: the most rows, up to {PREFILL_ROWS}, whose pass costs at most "
        f"{FAIR_PASS}x a one-row pass on this machine, from the pass-cost probe, for each prompt being read "
        f"while those outnumber the decoding lanes, all of them in one pass; docs/protocol.md)",
    )
    p.add_argument(
        "--prefill-lanes",
        type=int,
        default=None,
        help="the most prompts one prefill pass reads (default: the prefill spec's, every waiting prompt up to the "
        "pass's rows; 1 gives a prompt the same shapes whatever else waits, where batched prompts can move a bf16 "
        "near-tie first token)",
    )
    p.add_argument(
        "--one-pass-steps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a step where lanes decode and prompts are read runs the prompt rows in the decoding lanes' pass, "
        "each weight streamed once a step, where they fit its rows (default; docs/protocol.md, Fairness); "
        "--no-one-pass-steps runs a prefill pass and then the round",
    )


def check_step_flags(args: argparse.Namespace) -> None:
    for flag, value in (("--prefill-rows", args.prefill_rows), ("--prefill-lanes", args.prefill_lanes)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")


def apply_step_flags(engine, args: argparse.Namespace) -> None:
    """The engine's step budget and passes from the flags (torch: only once serving)."""
    from speclane.pipeline.runtime.prefill_share import set_serve_budget

    set_serve_budget(engine, args.prefill_rows, args.prefill_lanes, getattr(args, "one_pass_steps", True))
