"""bench/step_share.py on the tiny target families: the shared pass computes what the decoding lanes' own pass
does, every case is reported, and bad arguments are refused by name. No timing assertions (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import torch

from speclane.bench import step_share
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts, family  # noqa: F401  (fixtures)


def test_each_case_is_measured_and_the_shared_pass_matches(family):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    with torch.no_grad():
        results = step_share.measure(target, prompts=(3, 5), lanes=(1, 2), rows=(1, 2), context=12, reps=2)
    assert [(r["prompt"], r["lanes"], r["rows"]) for r in results] == [
        (p, n, k) for p in (3, 5) for n in (1, 2) for k in (1, 2)
    ]
    for r in results:
        # the decoding lanes' logits do not depend on whether the prompt's rows share their pass
        assert r["max_logit_diff"] < 1e-4, (name, r)
        assert r["a"] == pytest.approx(r["prefill"] + r["verify"]) and r["b"] > 0 and r["head"] > 0
        assert r["decode_route"]  # at most 5 + 2 x 2 rows
    text = step_share.lines(results)
    assert len(text) == 1 + len(results) and text[0].split()[:3] == ["P", "L", "R"]


def test_bad_arguments_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        step_share.main(["--reps", "0"])
    assert "--reps" in capsys.readouterr().err
