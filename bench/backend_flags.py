"""A benchmark's `--backends` entries: `NAME` or `NAME:OPTION=N,...`, a draft backend and the options of its spec
table (bench/agent_replay.py). Names are the `--spec-backend` ones and the controls (`oracle`, which replays answers
the benchmark recorded)."""

from __future__ import annotations

import argparse

from speclane.stages.drafters import CONTROLS, SPEC_BACKENDS


def backend_options(text: str) -> tuple[str, dict]:
    """`NAME` or `NAME:OPTION=N,OPTION=N`: a draft backend and the options of its spec table."""
    name, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        try:
            options[key] = float(value) if "." in value else int(value)
        except ValueError:
            raise ValueError(f"backend option {item!r} must be OPTION=NUMBER") from None
    if name not in SPEC_BACKENDS + CONTROLS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(SPEC_BACKENDS)}")
    return name, options


def backend_arg(text: str) -> str:
    try:
        backend_options(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
