"""bench/pass_ops.py: one pass's operations on the device route, counted on the meta device, per family."""

import re

import pytest

import speclane.kernels.moe as moe
from speclane.bench import pass_ops
from tests.models.target_artifacts import artifacts, family  # noqa: F401  (fixtures)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_counts_a_pass_s_operations_and_splits_off_the_views(family, capsys):
    name, path, _ = family
    assert pass_ops.main(["--model", str(path), "--rows", "1", "3", "--top", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("1 row(s): ") and lines[2].startswith("3 row(s): "), name
    total, launching = map(int, re.match(r"1 row\(s\): (\d+) operations, (\d+) of them", lines[0]).groups())
    assert 0 < launching < total, name
    assert moe.moe_experts_ref is not pass_ops._all_experts  # the twin is back for every later pass
    assert len(lines[1].split(", ")) == 4 and "view" not in lines[1], name
