"""`speclane COMMAND --help` for every subcommand (and `spec`'s operations) answers without importing torch, with the
help text of the whole parser (`build_parser()`: every subcommand's module imported).

Each case runs the real entry point (`python -m speclane.pipeline.cli`) under `-X importtime`, which lists on stderr
every module the process imports; the help text on stdout is compared with the one `build_parser()` formats here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from speclane.pipeline.cli import _summaries, build_parser

COMMANDS = [name for name, _, _ in _summaries()]
SPEC_OPS = ("validate", "get", "set", "diff")
CASES = [(name,) for name in COMMANDS] + [("spec", op) for op in SPEC_OPS]
WIDTH = "120"  # argparse wraps to $COLUMNS: the same width here and in the child


def _subparser(parser, name):
    return parser._subparsers._group_actions[0].choices[name]


def full_help(argv: tuple[str, ...]) -> str:
    parser = build_parser()
    for name in argv:
        parser = _subparser(parser, name)
    return parser.format_help()


def test_every_subcommand_is_a_case():
    """The cases come from the subcommands' sources: a command dropped from them would drop its case silently."""
    assert set(COMMANDS) == set(build_parser()._subparsers._group_actions[0].choices)
    assert {"generate", "chat", "serve", "client", "plan", "bench", "graph", "spec", "fit-drafter"} <= set(COMMANDS)


@pytest.mark.parametrize("argv", CASES, ids=" ".join)
def test_help_imports_no_torch_and_reads_as_the_whole_parser(argv, monkeypatch):
    monkeypatch.setenv("COLUMNS", WIDTH)
    want = full_help(argv)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "speclane.pipeline.cli", *argv, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": WIDTH},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")]
    assert "speclane.pipeline.cli" in imported  # the listing is there to be read
    heavy = [m for m in imported if re.fullmatch(r"torch(\..*)?", m)]
    assert not heavy, f"`speclane {' '.join(argv)} --help` imported {heavy[:5]}"
    assert done.stdout == want


def test_fit_drafter_names_the_drafters_with_weights():
    """fit-drafter's --backend choices are written in the CLI (the modules that own them import torch): the same
    names as the weight files' configs and the fitting objectives."""
    from speclane.pipeline.cli.fit import BACKENDS
    from speclane.stages.fitting.objectives import OBJECTIVES
    from speclane.stages.models import drafter_weights

    assert BACKENDS == tuple(drafter_weights.CONFIGS) == tuple(OBJECTIVES)
