"""`speclane.bench.soak` end to end for a few seconds: its own server, a calm phase, every hostile kind of both doors
tried, and a report with each section in place. Nothing here asserts a timing (docs/benchmarks.md); the counts
asserted are ones no speed can change (each kind tried, every normal stream exact, the server up at the end)."""

from __future__ import annotations

import json
import re

from speclane.bench import hostile, hostile_http, soak


def test_a_short_soak_reports_every_kind_the_server_alive_and_every_stream(tmp_path, capsys):
    # a rate high enough that both doors go round all their kinds within the hostile phase
    argv = [
        "--seconds",
        "12",
        "--calm",
        "2",
        "--clients",
        "1",
        "--prompts",
        "2",
        "--max-tokens",
        "6",
        "--hostile-rate",
        "20",
        "--json",
        str(tmp_path / "soak.json"),
    ]
    assert soak.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("soak: 12 s asked; calm ") and out[1].startswith("machine: ") and "commit " in out[1]
    header = next(i for i, line in enumerate(out) if line.startswith("hostile kind"))
    rows = {
        line.split()[0]: line.split()[1:6]
        for line in out[header + 1 :]
        if line.split()[:1] and line.split()[0] in {**hostile.ZMQ_KINDS, **hostile_http.HTTP_KINDS}
    }
    assert set(rows) == {*hostile.ZMQ_KINDS, *hostile_http.HTTP_KINDS}
    assert all(int(sent) >= 1 for sent, *_ in rows.values()), rows  # every kind tried at least once
    assert all(int(internal) == 0 for *_, internal in rows.values()), rows  # never the server's own fault
    faults = next(line for line in out if line.startswith("faults survived: "))
    assert "server up at the end: yes" in faults and "a generate after: exact" in faults, faults
    assert "an HTTP completion after: 200" in faults and "tracebacks in its log: 0" in faults, faults
    exact = re.search(r"normal streams exact: (\d+) / (\d+)", "\n".join(out))
    assert exact and exact[1] == exact[2] and int(exact[2]) >= 2, exact
    table = next(i for i, line in enumerate(out) if line.lstrip().startswith("# client phase"))
    streams = [line.split() for line in out[table + 1 :] if line.split()[:1] and line.split()[0].isdigit()]
    assert len(streams) == int(exact[2]) and {s[2] for s in streams} == {"calm", "hostile"}
    assert all(s[5] == "yes" for s in streams), streams
    assert any(line.startswith("hostile streams with a max gap past 3x the calm median: ") for line in out)
    res = json.loads((tmp_path / "soak.json").read_text())
    assert res["after"]["alive"] and len(res["streams"]) == len(streams)
    assert set(res["tally"]) == set(rows)
