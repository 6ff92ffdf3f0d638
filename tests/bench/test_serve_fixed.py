"""`speclane.bench.serve_load --mixed --fixed` end to end on tiny work: one server per budget, every repeat runs the
same work against each, the table pairs the runs, and bad flags are refused. No timing assertions (docs/benchmarks.md).
The default model in float32 (the server tests' model): the tokenizer-less tiny artifacts cannot serve text."""

from __future__ import annotations

import json

import pytest

from speclane.bench import serve_load

TINY = [
    "--mixed",
    "--fixed",
    "--dtype",
    "float32",
    "--clients",
    "2",
    "--max-tokens",
    "4",
    "--prompt-lines",
    "3",
    "--long-tokens",
    "40",
    "--long-count",
    "2",
    "--long-answer",
    "2",
    "--long-after",
    "0",
    "--long-every",
    "0.2",
    "--budgets",
    "8/2",
    "64",
    "--repeats",
    "2",
]


def test_every_budget_does_the_same_work_each_repeat(tmp_path, capsys):
    assert serve_load.main(TINY + ["--json", str(tmp_path / "rows.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    # alternating: the order flips each repeat; each repeat ends with the decoders alone (no long prompt)
    # "8/2": 8 rows a step, a prefill pass and then the round (--no-one-pass-steps)
    assert [(r["repeat"], r["budget"]) for r in rows] == [
        (0, "8/2"),
        (0, "64"),
        (0, "alone"),
        (1, "64"),
        (1, "8/2"),
        (1, "alone"),
    ]
    for r in rows:
        longs = 0 if r["budget"] == "alone" else 2
        assert r["generated"] == 2 * 4 + longs * 2 and r["long_prompts"] == longs  # the fixed work, all of it
        assert r["wall"] >= r["decoders_done"] > 0 and r["gap_max"] >= r["gap_p99"] >= r["gap_median"] > 0
        assert r["tok_per_s"] == pytest.approx(r["generated"] / r["wall"])
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("fixed work: 2 decoding requests x 4 tokens, 2 prompts of 40 tokens")
    assert [line.split()[0] for line in table[2:]] == ["8/2", "64", "alone"]
    assert table[3].split()[3] == "1.000"  # the reference budget against itself
    assert table[4].split()[-2] == "1.00"  # the decoders alone: p99/alone against themselves


def test_fixed_needs_mixed_and_long_prompts(capsys):
    with pytest.raises(SystemExit):
        serve_load.main(["--fixed"])
    assert "--mixed" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--long-count"):
        serve_load.main(["--mixed", "--fixed", "--long-count", "0"])


def test_a_budget_entry_names_its_rows_and_its_passes():
    assert serve_load.budget_flags("0") == ()
    assert serve_load.budget_flags(0) == ()
    assert serve_load.budget_flags("8") == ("--prefill-rows", "8")
    assert serve_load.budget_flags("8/2") == ("--prefill-rows", "8", "--no-one-pass-steps")
    assert serve_load.budget_flags("0/2") == ("--no-one-pass-steps",)
    assert serve_load.budget_rows("512/2") == 512
