"""ruff, configured once in pyproject.toml: the tree is formatted as `ruff format` writes it, and the linter finds
nothing (unused or undefined names, import order, lines past 120 characters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_tree_is_formatted():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, "run `ruff format` on:\n" + done.stdout[-4000:] + done.stderr[-2000:]
