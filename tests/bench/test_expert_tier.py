"""bench/expert_tier.py on a tiny random qwen3_moe: every setting's greedy tokens equal resident's, and a cache of
every expert copies nothing once warm (no timing assertions)."""

import json

from speclane.bench import expert_tier, random_weights


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
