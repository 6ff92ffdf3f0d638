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
