"""`speclane.bench.prefill_lanes` end to end on tiny work: two servers (every waiting prompt a pass, one a pass), each
replay's agents all answered, the rows of both settings written. No timing assertions (docs/benchmarks.md)."""

from __future__ import annotations

import json

from speclane.bench import prefill_lanes


def test_both_settings_replay_every_turn(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["--agents", "2", "--turns", "2", "--max-tokens", "2", "--tool-wait", "0", "--system-chars", "600"]
    assert prefill_lanes.main([*argv, "--repeats", "1", "--json", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["setting"] for r in rows) == ["all", "one"]
    assert all(len(r["ttft_per_turn"]) == 2 and min(r["ttft_per_turn"]) > 0 for r in rows)
    assert "one a pass / all in one" in capsys.readouterr().out
