"""`speclane.bench.one_pass` end to end on tiny work: both arms do the same work each repeat (the same steps' worth
of tokens), the one-pass arm runs fewer passes, and the ratios are paired per repeat. No timing assertions."""

from __future__ import annotations

import json

import pytest

from speclane.bench import one_pass


def test_both_arms_do_the_same_work_and_one_pass_runs_fewer_passes(tmp_path, capsys):
    argv = ["--dtype", "float32", "--decoders", "1", "--max-tokens", "12", "--prompts", "2", "--prompt-tokens", "40"]
    argv += ["--answer", "2", "--every", "1", "--repeats", "2", "--spec-backend", "none", "--json", str(tmp_path / "r")]
    assert one_pass.main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "r").read_text().splitlines()]
    assert [(r["repeat"], r["arm"]) for r in rows] == [(0, "one"), (0, "two"), (1, "two"), (1, "one")]
    for rep in (0, 1):
        one, two = (next(r for r in rows if r["repeat"] == rep and r["arm"] == a) for a in ("one", "two"))
        for arm in (one, two):  # every token
            assert arm["tok_per_s"] * arm["wall"] == pytest.approx(12 + 2 * 2)
        assert one["passes"] < two["passes"]
    out = capsys.readouterr().out
    assert "one / two, paired per repeat" in out and "wall:" in out


def test_ratios_pair_the_arms_of_each_repeat():
    rows = [
        {"arm": "one", "repeat": 0, "wall": 3.0},
        {"arm": "two", "repeat": 0, "wall": 4.0},
        {"arm": "two", "repeat": 1, "wall": 2.0},
        {"arm": "one", "repeat": 1, "wall": 2.0},
    ]
    assert one_pass.ratio_line(rows, "wall") == "0.875 [0.750, 1.000]"


def test_an_arm_names_its_passes_and_may_fix_its_budget():
    assert one_pass.arm_budget("one") == (True, None)
    assert one_pass.arm_budget("two:8") == (False, 8)
    with pytest.raises(SystemExit, match="--arms"):
        one_pass.arm_budget("three")
    with pytest.raises(SystemExit, match="--arms"):
        one_pass.arm_budget("one:x")
