"""bench/cuda_graphs.py: refuses to claim anything without a GPU, and its steps hold on the CPU (dry run)."""

from __future__ import annotations

import pytest
import torch

from speclane.bench import cuda_graphs
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts, family  # noqa: F401  (fixtures)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script would measure")
def test_without_a_gpu_it_measures_nothing_and_says_so(capsys):
    assert cuda_graphs.main(["--rows", "1"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_bad_rows_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        cuda_graphs.main(["--dry-run", "--rows", "0"])
    assert "--rows" in capsys.readouterr().err


def test_dry_run_refills_the_static_pass_and_matches_eager(family):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    with torch.no_grad():
        results = cuda_graphs.measure(target, lanes=2, rows=(1, 3), context=12, max_len=64, reps=2, dry=True)
    assert [x["rows"] for x in results] == [1, 3]
    assert all(x["equal"] for x in results), (name, results)
    text = "\n".join(cuda_graphs.lines(results, "cpu", dry=True))
    assert "DRY RUN" in text and "nothing here is a GPU figure" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script would measure")
def test_host_link_without_a_gpu_measures_nothing_and_says_so(capsys):
    from speclane.bench import host_link

    assert host_link.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_profile_prints_the_top_operators_of_the_rows_asked_for(artifacts, tmp_path, capsys):
    out = tmp_path / "cg.json"
    path = str(artifacts["llama"][0])
    args = ["--dry-run", "--model", path, "--dtype", "float32", "--rows", "1", "2", "--context", "8", "--max-len", "32"]
    assert cuda_graphs.main([*args, "--reps", "2", "--profile", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 row(s), replay: the top operators" in text and "2 row(s), eager" in text
    assert "1 row(s), replay" not in text and "Self CPU" in text
