"""The replicas bench's `pair` arm: a batch sent to several plain servers is split between them by prompt length,
the longest first to the least loaded, so the ceiling it measures is not lowered by an uneven split."""

from __future__ import annotations

from speclane.bench import serve_replicas as bench


def test_a_batch_is_split_by_length_between_endpoints(monkeypatch):
    sent: dict[str, list[str]] = {}

    def fake(endpoint, prompt, spec_on, max_tokens, out, errors):
        sent.setdefault(endpoint, []).append(prompt)
        out.append({"start": 0.0, "end": 1.0, "tokens": max_tokens, "ttft": 0.5})

    monkeypatch.setattr(bench, "one_request", fake)
    prompts = ["x" * n for n in (366, 221, 300, 250, 340, 230, 280, 260)]
    row, ttfts = bench.batch(["a", "b"], prompts, 4)
    assert sorted(sent["a"] + sent["b"]) == sorted(prompts)
    loads = [sum(map(len, sent[e])) for e in ("a", "b")]
    assert abs(loads[0] - loads[1]) < 100  # all on one server: 2,247 characters against none
    assert row["aggregate_tps"] == 32 and ttfts == [0.5] * 8


def test_one_endpoint_takes_the_whole_batch(monkeypatch):
    sent = []
    monkeypatch.setattr(
        bench,
        "one_request",
        lambda e, p, *a: (sent.append(e), a[-2].append({"start": 0.0, "end": 2.0, "tokens": 3, "ttft": 0.1})),
    )
    bench.batch(["only"], ["a", "bb", "ccc"], 3)
    assert sent == ["only"] * 3


def test_the_cost_is_read_against_one_engine_and_against_one_of_the_pair():
    cost = {
        "single": {"wall_s": 0.020, "cpu_s": 0.015, "idle_cpu_per_s": 0.0},
        "replicas": {"wall_s": 0.026, "cpu_s": 0.022, "idle_cpu_per_s": 0.08},
        "pair0": {"wall_s": 0.022, "cpu_s": 0.017, "idle_cpu_per_s": 0.0},
    }
    lines = bench.cost_lines(cost)
    assert "replicas minus single: wall, median latency 26.0 - 20.0 = 6.0 ms" in lines[1]
    assert lines[1].endswith("22.0 - 15.0 = 7.0 ms")
    assert "replicas minus one pair server: wall, median latency 26.0 - 22.0 = 4.0 ms" in lines[2]
    assert lines[2].endswith("22.0 - 17.0 = 5.0 ms")
    assert lines[3] == "  idle, CPU a second: single 0 ms, replicas 80 ms, pair0 0 ms"


def test_the_cost_over_several_ray_starts_is_each_start_and_their_median():
    def cost(replicas_ms, pair_ms):
        return {
            "single": {"wall_s": 0.020, "cpu_s": 0.010, "idle_cpu_per_s": 0.0},
            "replicas": {"wall_s": replicas_ms / 1e3, "cpu_s": 0.018, "idle_cpu_per_s": 0.05},
            "pair0": {"wall_s": pair_ms / 1e3, "cpu_s": 0.012, "idle_cpu_per_s": 0.0},
        }

    lines = bench.cost_summary([cost(25.0, 21.0), cost(23.0, 21.0), cost(28.0, 22.0)])
    assert lines[0].endswith("over 3 starts (ms; wall, then CPU beyond the idle rate):")
    assert lines[1] == "  replicas minus single, wall: median 5.0 [3.0, 8.0]; each start: 5.0 3.0 8.0"
    assert lines[3] == "  replicas minus pair0, wall: median 4.0 [2.0, 6.0]; each start: 4.0 2.0 6.0"
    assert lines[4] == "  replicas minus pair0, cpu: median 6.0 [6.0, 6.0]; each start: 6.0 6.0 6.0"
