"""The `speclane` command: one subcommand per module, each adding its own parser.

Subcommand modules expose `add_parser(subparsers)`, which registers a parser whose `func(args) -> int` runs it.
A subcommand module's top-level imports are what its parser needs and never torch or the engine, which its `run`
imports: `speclane COMMAND ...` imports that one subcommand's module (the others are listed by the name and help
line read from their sources), so `speclane COMMAND --help`, like `speclane --help` and `--version`, answers
without them. Errors of the speclane hierarchy print their message (every problem, for validation) and exit 2.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import importlib.util
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
    "speclane.pipeline.cli.bench",
)


def _version() -> str:
    try:
        return importlib.metadata.version("speclane")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: every subcommand's module imported and its parser added."""
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


def _summaries() -> list[tuple[str, str, str]]:
    """(name, help, module) of every subcommand, read from its module's source (its `add_parser` call), not
    imported."""
    out = []
    for name in COMMANDS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        for node in ast.walk(ast.parse(open(spec.origin, encoding="utf-8").read())):
            args = getattr(node, "args", None)
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_parser" and args):
                continue
            helps = [k.value for k in node.keywords if k.arg == "help" and isinstance(k.value, ast.Constant)]
            if isinstance(args[0], ast.Constant) and helps:
                out.append((args[0].value, helps[0].value, name))
                break
    return out


def overview_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand's name and help line, no subcommand imported (`speclane --help`);
    with `command`, a subcommand's name, that one's own parser in its place, its module imported: the parser of
    `speclane COMMAND ...`, equal to `build_parser()`'s for it."""
    parser = argparse.ArgumentParser(prog="speclane", description="A speculative-decoding inference engine.")
    parser.add_argument("--version", action="version", version=f"speclane {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text, module in _summaries():
        if name == command:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=text)
    return parser


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given == ["--version"]:  # without importing a subcommand (and torch)
        print(f"speclane {_version()}")
        return 0
    if given in (["--help"], ["-h"]):  # likewise: the subcommands' help lines read from their sources
        overview_parser().print_help()
        return 0
    # The top level takes no option with a value: its first other argument names the subcommand.
    command = next((a for a in given if not a.startswith("-")), None)
    args = overview_parser(command).parse_args(given)
    # A spec's user stage `kind = "module:Class"` imports from the current directory, after what is installed: in
    # front, a folder there would hide an installed package of its name (run from this repository's root, kernels/
    # would hide the `kernels` distribution transformers imports).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
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
