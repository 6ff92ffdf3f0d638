"""What a person sees of `generate` in a pseudo-terminal (tests/terminal.py rebuilds its screen from the bytes it
wrote): progress bars never erase the answer, Ctrl-C ends the answer's line and still prints its timing, and the
timing line fits an 80-column terminal."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from speclane.pipeline.cli.progress import timing_line
from tests.terminal import Terminal, in_terminal, screen

PROMPT = "What is the capital of France?"
ARGS = ["generate", "--chat", "--prompt", PROMPT, "--max-tokens", "12", "--spec-backend", "ngram"]


def test_the_streamed_answer_stays_on_screen():
    done = subprocess.run(
        [sys.executable, "-m", "speclane.pipeline.cli", *ARGS, "--json"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.splitlines()[0])["text"].strip()
    assert answer
    shown = "\n".join(screen(in_terminal(ARGS)))
    assert answer.split("\n")[0] in shown, shown


TIMING = re.compile(r"^\d+ in, (\d+) out( \|.*)?$")  # the timing line, pipeline/cli/progress.py


def test_ctrl_c_ends_the_answer_line_and_prints_the_timing_so_far():
    term = Terminal(
        [
            "generate",
            "--prompt",
            "1, 2, 3, 4, 5,",
            "--max-tokens",
            "1000",
            "--spec-backend",
            "none",
            "--dtype",
            "float32",
            "--threads",
            "1",
        ]
    )

    def first_token(lines: list[str]) -> bool:
        planned = next((i for i, line in enumerate(lines) if line.startswith("planned the rounds")), None)
        return planned is not None and any(line.strip() for line in lines[planned + 1 :])

    term.wait_for(first_token)
    term.interrupt()
    assert term.close() == 130
    lines = term.screen()
    planned = next(i for i, line in enumerate(lines) if line.startswith("planned the rounds"))
    at = next((i for i, line in enumerate(lines) if TIMING.match(line)), None)
    assert at is not None, "no timing line:\n" + "\n".join(lines)
    assert "".join(lines[planned + 1 : at - 2]).strip()  # the partial answer ...
    assert lines[at - 2] == "(stopped)"  # ... its line ended before this one
    assert lines[at - 1].startswith("compute: ")
    assert 1 <= int(TIMING.match(lines[at]).group(1)) < 1000  # the tokens it had, not the 1000 asked for


SPEC = {"rounds": 4, "drafted": 12, "accepted": 6, "tokens_per_round": 2.5, "accepted_per_position": []}
FULL = {"rounds": 9, "drafted": 63, "accepted": 63, "tokens_per_round": 8.0, "accepted_per_position": []}


@pytest.mark.parametrize(
    "usage, ttft, decode_s, spec, line",
    [
        (
            {"prompt_tokens": 7, "completion_tokens": 11},
            0.25,
            2.0,
            SPEC,
            "7 in, 11 out | ttft 0.25 s | 5.0 tok/s | 2.50 tok/round, 50 % accepted",
        ),
        ({"prompt_tokens": 7, "completion_tokens": 1}, 0.1, 0.0, None, "7 in, 1 out | ttft 0.10 s"),
        ({"prompt_tokens": 7, "completion_tokens": 0}, 0.0, 0.0, None, "7 in, 0 out"),  # stopped before any
        (
            {"prompt_tokens": 4000, "completion_tokens": 4000},
            12.345,
            3.9,
            FULL,
            "4000 in, 4000 out | ttft 12.3 s | 1025 tok/s | 8.00 tok/round, 100 % accepted",
        ),
        (
            {"prompt_tokens": 999_999, "completion_tokens": 99_999},
            999.4,
            10.0005,
            FULL,
            "999999 in, 99999 out | ttft 999 s | 9999 tok/s | 8.00 tok/round, 100 % accepted",
        ),
    ],
)
def test_the_timing_line_fits_80_columns(usage, ttft, decode_s, spec, line):
    assert timing_line(usage, ttft, decode_s, spec) == line
    assert len(line) <= 80
