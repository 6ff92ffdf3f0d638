"""`python -m speclane.bench`: the same as `speclane bench` (see bench/cmd_bench.py)."""

from __future__ import annotations

import argparse
import sys

from speclane.bench.cmd_bench import run
from speclane.bench.settings import add_arguments


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m speclane.bench", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
