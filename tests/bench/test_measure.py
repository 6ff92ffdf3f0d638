"""The bench's arithmetic on made-up runs: decode speed over the first n tokens read from step stamps, and the
length buckets' prompt choice. No model, no timing."""

from __future__ import annotations

import math

from speclane.bench.lengths import bucket_prompts
from speclane.bench.measure import Run


def test_decode_tps_at_reads_the_prefix_of_a_longer_run():
    # first token stamped at t = 10 with 1 token out; then rounds of 3 tokens every 0.5 s
    stamps = [(10.0, 1)] + [(10.0 + 0.5 * i, 1 + 3 * i) for i in range(1, 7)]  # 19 tokens at t = 13
    run = Run(tokens=list(range(19)), ttft=0.2, decode_s=3.0, stamps=stamps)
    # 8 tokens are out by the step that reached 10 (t = 11.5): 9 decoded tokens in 1.5 s
    assert math.isclose(run.decode_tps_at(8), 9 / 1.5)
    assert math.isclose(run.decode_tps_at(19), 18 / 3.0)
    assert math.isnan(run.decode_tps_at(20))  # the run never got that far: no figure, not a made-up one


def test_bucket_prompts_alternate_code_and_prose():
    def prompts_of(w, n):
        return [{"id": f"{w}-{i}"} for i in range(n)]

    assert [p["id"] for p in bucket_prompts(prompts_of, "256", 3)] == ["code_edit-0", "prose-0", "code_edit-1"]
    assert [p["id"] for p in bucket_prompts(prompts_of, "4k", 2)] == ["long_4k-0", "long_4k-1"]
