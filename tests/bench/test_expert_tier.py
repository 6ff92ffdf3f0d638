"""bench/expert_tier.py on a tiny random qwen3_moe: every setting's greedy tokens equal resident's, and a cache of
every expert copies nothing once warm; a routing trace steers every setting alike (no timing assertions)."""

import json

import pytest
import torch

from speclane.bench import expert_tier, random_weights
from speclane.stages.models.routing_trace import RowRouting


def test_each_share_decodes_the_resident_tokens_and_counts_its_copies(tmp_path, capsys):
    model = tmp_path / "moe"
    args = ["--moe", "--hidden", "128", "--layers", "2", "--vocab", "256", "--experts", "8", "--top", "2"]
    assert random_weights.main([*args, "--out", str(model)]) == 0
    out = tmp_path / "tier.json"
    argv = ["--model", str(model), "--device", "cpu", "--dtype", "float32", "--shares", "0.25", "1", "--prefetch", "0"]
    assert expert_tier.main([*argv, "2", "--rows", "1", "3", "--tokens", "5", "--passes", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [x["setting"] for x in rows] == [
        "resident",
        "25% (4 slots), prefetch 0",
        "25% (4 slots), prefetch 2",
        "100% (16 slots), prefetch 0",
        "100% (16 slots), prefetch 2",
    ]
    assert all(x["tokens"] == rows[0]["tokens"] for x in rows)
    assert rows[0]["rows"]["3"]["mb_per_pass"] is None and rows[1]["rows"]["3"]["mb_per_pass"] > 0
    assert rows[3]["rows"]["1"]["mb_per_pass"] < rows[1]["rows"]["1"]["mb_per_pass"]  # every expert held: few copies
    assert "TOKENS DIFFER" not in capsys.readouterr().out


def test_a_routing_trace_routes_every_setting_alike_and_a_mismatched_one_is_refused(tmp_path, capsys):
    model = tmp_path / "moe"
    args = ["--moe", "--hidden", "128", "--layers", "2", "--vocab", "256", "--experts", "8", "--top", "2"]
    assert random_weights.main([*args, "--out", str(model)]) == 0
    gen = torch.Generator().manual_seed(0)
    layers = tuple(torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(50)]) for _ in range(3))
    RowRouting(8, 2, layers, "fifty rows").save(tmp_path / "trace")
    out = tmp_path / "tier.json"
    argv = ["--model", str(model), "--device", "cpu", "--dtype", "float32", "--shares", "0.25", "--rows", "1", "3"]
    argv += ["--tokens", "5", "--passes", "2", "--json", str(out)]
    assert expert_tier.main([*argv, "--routing", str(tmp_path / "trace")]) == 0
    result = json.loads(out.read_text())
    assert [x["setting"] for x in result["rows"]] == ["resident", "25% (4 slots), prefetch 0"]  # no look-ahead
    assert result["rows"][1]["tokens"] == result["rows"][0]["tokens"]
    assert "a replayed trace of 50 rows (fifty rows)" in result["routing"]
    RowRouting(8, 3, tuple(torch.zeros(1, 3, dtype=torch.long) for _ in range(2))).save(tmp_path / "top3")
    with pytest.raises(SystemExit):
        expert_tier.main([*argv, "--routing", str(tmp_path / "top3")])
    assert "--routing: the trace routes to 3 of 8 experts a row, the target to 2 of 8" in capsys.readouterr().err
