"""The server's `stats` reports what the drafter's state holds that grows with use: for suffix (and the suffix
chains), the cache tree's tokens against `--suffix-cache-tokens`, which it never passes however much is served."""

from __future__ import annotations

import torch

from speclane.pipeline.net.client import Client
from speclane.pipeline.net.server import Server
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts, prompt  # noqa: F401  (a fixture)
from tests.round.conftest import engine
from tests.server.test_final_frames import turns

BUDGET = 48


def test_stats_report_the_suffix_cache_within_its_budget(artifacts, request):  # noqa: F811
    torch.set_num_threads(1)
    target = Target.load(artifacts["llama"][0], dtype=torch.float32)
    eng = engine(target, "suffix", k=4, max_lanes=2, options={"cache_tokens": BUDGET})
    server = Server(eng, f"inproc://drafter-stats-{request.node.name}", max_queue=8)
    server.start()
    c = Client(server.endpoint, timeout=5, ctx=server.ctx)
    try:
        seen = []
        for i in range(6):  # 6 x (12 prompt + 8 answer) tokens: more than the budget
            c.generate(id=f"r{i}", prompt_ids=prompt(12, seed=i), max_tokens=8, ignore_eos=True)
            for _ in range(200):
                turns(server, n=1)
                if server.stats().finished.get("length", 0) == i + 1:
                    break
            seen.append(server.stats().drafter)
        # a finished request enters the cache when the backend next sees its lane's end
        assert all(s["cache_budget"] == BUDGET and 0 <= s["cache_tokens"] <= BUDGET for s in seen), seen
        assert seen[-1]["cache_tokens"] > 0 and seen[-1]["cache_requests"] < 5, seen  # the oldest were dropped
    finally:
        c.close()
        server.close()
    none = Server(engine(target, "ngram", k=4, max_lanes=2), "inproc://drafter-stats-none", max_queue=8)
    assert none.stats().drafter is None
