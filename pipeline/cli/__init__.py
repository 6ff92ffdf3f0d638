"""The `speclane` command: one subcommand per module, each adding its own parser.

Subcommand modules expose `add_parser(subparsers)`, which registers a parser whose `func(args) -> int` runs it.
Errors of the speclane hierarchy print their message (every problem, for validation) and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys

from speclane.pipeline.runtime import heap
from speclane.stages.contract.errors import SpeclaneError

COMMANDS = (
    "speclane.pipeline.cli.generate",
    "speclane.pipeline.cli.plan",
    "speclane.pipeline.cli.graph",
    "speclane.pipeline.cli.spec",
    "speclane.pipeline.cli.chat",
    "speclane.pipeline.cli.serve",
    "speclane.pipeline.cli.client",
    "speclane.pipeline.cli.fit",
    "speclane.pipeline.cli.cache",
    "speclane.bench.cmd_bench",
)


def _version() -> str:
    try:
        return importlib.metadata.version("speclane")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speclane", description="A speculative-decoding inference engine.")
    parser.add_argument("--version", action="version", version=f"speclane {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # a subcommand not built yet
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:  # without importing a subcommand (and torch)
        print(f"speclane {_version()}")
        return 0
    args = build_parser().parse_args(argv)
    # As under `python -m`: a spec's user stage `kind = "module:Class"` imports from the current directory.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with heap.scope():  # engine_from_args freezes the start-up heap; thawed when the command returns
            return int(args.func(args) or 0)
    except SpeclaneError as exc:
        print(f"speclane {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `speclane graph ... | head`: the reader left; say nothing, as cat does
        try:  # and no second error when the interpreter flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141
