"""bench/routing_trace.py: records a MoE target's routing from random prompts (what bench.expert_tier feeds random
weights) into a trace file bench.expert_tier can replay; a dense model or --random-ids without --model is refused."""

import pytest
import torch

from speclane.bench import random_weights, routing_trace
from speclane.stages.models.routing_trace import RowRouting


def test_random_prompts_are_recorded_into_a_trace_file(tmp_path, capsys):
    model = tmp_path / "moe"
    args = ["--moe", "--hidden", "128", "--layers", "2", "--vocab", "256", "--experts", "8", "--top", "2"]
    assert random_weights.main([*args, "--out", str(model)]) == 0
    argv = ["--model", str(model), "--random-ids", "--prompts", "2", "--max-tokens", "5", "--dtype", "float32"]
    assert routing_trace.main([*argv, "--out", str(tmp_path / "t")]) == 0
    trace = RowRouting.load(tmp_path / "t")
    assert (len(trace.layers), trace.rows, trace.experts, trace.top_k) == (2, 2 * (32 + 4), 8, 2)
    out = capsys.readouterr().out
    assert "2 MoE layers x 72 rows, top 2 of 8 experts" in out and "(uniform routing: 90%)" in out
    assert "busiest experts' share of its choices" in out and "(uniform: 25%)" in out
    assert "distinct experts a layer's pass asks for (uniform routing's in brackets): 1 rows 2.0 (2.0), 4 rows" in out
    with pytest.raises(SystemExit):
        routing_trace.main(["--random-ids", "--out", str(tmp_path / "u")])
    assert "--random-ids needs --model" in capsys.readouterr().err


def test_distinct_counts_the_experts_each_window_of_rows_asks_for():
    ids = torch.tensor([[0, 1], [1, 2], [0, 1], [3, 4]])
    trace = RowRouting(5, 2, (ids, ids[[3, 3, 3, 3]]))
    # windows of 2 rows: {0,1,2}, {0,1,2}, {0,1,3,4} in layer 0 and {3,4} three times in layer 1
    assert routing_trace.distinct(trace, 2) == (3 + 3 + 4 + 2 + 2 + 2) / 6
    assert routing_trace.distinct(trace, 1) == 2.0
