"""`speclane bench`: the parser of the benchmark command; running it is bench/cmd_bench.py's (as for `python -m
speclane.bench`), imported when the command runs, so that `speclane bench --help` imports neither the sections
nor torch. The flags are bench/settings.py's."""

from __future__ import annotations

import argparse

from speclane.bench.settings import add_arguments


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark speculation against off, the controls and the peers (one run)")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speclane.bench import cmd_bench

    return cmd_bench.run(args)
