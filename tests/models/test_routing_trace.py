"""stages/models/routing_trace.py: a recording holds the router's own choices; replaying a target's own trace changes
nothing; replaying another routes every layer's rows to the trace's next rows (what an expert cache is asked for);
files round-trip and a trace a target cannot take is refused, naming why."""

from __future__ import annotations

import pytest
import torch

from speclane.bench.measure import make_engine
from speclane.bench.routing_trace import record, reuse
from speclane.stages.models import routing_trace as rt
from speclane.stages.models.expert_cache import expert_bytes
from speclane.stages.models.expert_study import recording as lookups
from speclane.stages.models.target import Target
from speclane.stages.models.tokenizer import Tokenizer
from tests.models.target_artifacts import artifacts, decode_one, prefill, prompt, with_words  # noqa: F401

F32 = torch.float32


@pytest.fixture(scope="module")
def moe_dir(artifacts):
    return artifacts["qwen3_next"][0]  # a dense layer among MoE layers, top 3


def _run(target: Target, tokens: int = 6) -> list[torch.Tensor]:
    """A prefill of 9 rows in two chunks, then `tokens` greedy decode rows: every pass's logits."""
    state = target.new_state(1, 32)
    ids = prompt(9, seed=3)
    out = [prefill(target, state, 0, ids, chunks=[5, 4])]
    tok, pos = int(out[-1][-1].argmax()), len(ids)
    for _ in range(tokens):
        out.append(decode_one(target, state, [(0, pos, tok)]))
        tok, pos = int(out[-1][-1].argmax()), pos + 1
    return out


def test_a_recording_holds_every_moe_layers_choice_and_replaying_it_changes_nothing(moe_dir):
    target = Target.load(moe_dir, dtype=F32)
    cfg = target.cfg
    with torch.no_grad(), rt.recording(target) as rec:
        plain = _run(target)
    trace = rec.trace("own")
    assert len(trace.layers) == sum(cfg.moe_layers) < cfg.num_layers  # the dense layer is not a MoE layer
    assert trace.rows == 9 + 6 and (trace.experts, trace.top_k) == (cfg.num_experts, cfg.experts_per_token)
    for ids in trace.layers:  # distinct experts a row, as a top-k gives them
        assert all(len(set(r)) == trace.top_k for r in ids.tolist())
    with torch.no_grad(), rt.replaying(trace, target):
        again = _run(target)
    assert all(torch.equal(a, b) for a, b in zip(plain, again))
    assert not rt._ACTIVE  # nothing is left in force after either block


def test_a_replay_routes_each_layers_rows_to_the_traces_next_rows(moe_dir):
    """Through an expert cache of every expert: what each MoE layer looks up, pass by pass, is the distinct experts
    of the trace's next rows, wrapping at its end."""
    cfg = Target.load(moe_dir, dtype=F32).cfg
    every = sum(cfg.moe_layers) * cfg.num_experts
    target = Target.load(moe_dir, dtype=F32, expert_cache_bytes=every * expert_bytes(cfg, F32))
    gen = torch.Generator().manual_seed(0)
    layers = tuple(
        torch.stack([torch.randperm(cfg.num_experts, generator=gen)[: cfg.experts_per_token] for _ in range(7)])
        for _ in range(sum(cfg.moe_layers))
    )
    trace = rt.RowRouting(cfg.num_experts, cfg.experts_per_token, layers)
    with torch.no_grad(), rt.replaying(trace, target, start=2), lookups(target) as seen:
        _run(target, tokens=4)  # 9 + 4 rows from row 2: wraps once
    moe = [i for i, routed in enumerate(cfg.moe_layers) if routed]
    at, want = 2, []
    for rows in (5, 4, 1, 1, 1, 1):
        picked = [(at + r) % 7 for r in range(rows)]
        want += [
            (layer, tuple(sorted({e for r in picked for e in layers[j][r].tolist()}))) for j, layer in enumerate(moe)
        ]
        at = (at + rows) % 7
    assert seen == want


def test_a_trace_file_round_trips_and_a_bad_one_is_named(moe_dir, tmp_path):
    cfg = Target.load(moe_dir, dtype=F32).cfg
    ids = torch.tensor([[0, 1, 2], [3, 4, 5]])
    trace = rt.RowRouting(cfg.num_experts, 3, (ids,) * sum(cfg.moe_layers), "two rows")
    trace.save(tmp_path / "t")
    back = rt.RowRouting.load(tmp_path / "t")
    assert (back.experts, back.top_k, back.source, back.rows) == (trace.experts, 3, "two rows", 2)
    assert all(torch.equal(a, b) for a, b in zip(back.layers, trace.layers))
    with pytest.raises(ValueError, match="cannot be read"):
        rt.RowRouting.load(tmp_path / "missing")
    from safetensors.torch import save_file

    save_file({"layer.0": ids.short()}, str(tmp_path / "plain"), metadata={"format": "other"})
    with pytest.raises(ValueError, match="not a routing trace of format version 1"):
        rt.RowRouting.load(tmp_path / "plain")
    meta = {"format": "speclane-routing-trace", "version": "1", "experts": "4", "top_k": "3"}
    save_file({"layer.0": ids.short()}, str(tmp_path / "wide"), metadata=meta)
    with pytest.raises(ValueError, match=r"layer.0 must be \[rows, 3\] expert ids under 4"):
        rt.RowRouting.load(tmp_path / "wide")


def test_a_trace_the_target_cannot_take_is_refused_naming_the_flag(moe_dir, artifacts):
    target = Target.load(moe_dir, dtype=F32)
    cfg, n = target.cfg, sum(target.cfg.moe_layers)
    ids = torch.zeros(2, cfg.experts_per_token, dtype=torch.long)
    with pytest.raises(ValueError, match=r"--routing: the trace routes to 3 of 99 experts.*--experts 99 --top 3"):
        rt.RowRouting(99, cfg.experts_per_token, (ids,) * n).check(cfg)
    with pytest.raises(ValueError, match=f"the trace has {n - 1} MoE layers, the target {n}"):
        rt.RowRouting(cfg.num_experts, cfg.experts_per_token, (ids,) * (n - 1)).check(cfg)
    dense = Target.load(artifacts["llama"][0], dtype=F32)
    with pytest.raises(ValueError, match="is dense"):
        rt.replaying(rt.RowRouting(cfg.num_experts, 3, (ids,) * n), dense).__enter__()
    with rt.recording(target), pytest.raises(RuntimeError, match="one at a time"):
        rt.recording(target).__enter__()


def test_the_recorder_takes_each_prompt_then_its_answer_in_order(moe_dir, tmp_path):
    words = with_words(moe_dir, tmp_path / "words")
    target = Target.load(words, dtype=F32)
    engine = make_engine(target, Tokenizer.load(words), "none", spec="decode", lanes=1, max_len=64)
    prompts = [prompt(7, seed=1), prompt(5, seed=2)]
    with torch.no_grad():
        trace = record(engine, prompts, 4, "two prompts")
    answers = sorted(len(lane.out_ids) for lane in engine.retired)
    assert answers[0] >= 1 and trace.rows == 7 + 5 + sum(answers) - 2  # each answer's last token is never run
    assert trace.source == "two prompts" and 0 <= reuse(trace) <= 1


def test_the_plans_routing_model_reads_a_row_routing_as_it_reads_the_caches_lookups(moe_dir):
    """Decode rows recorded both ways (this module's recording, the cache's lookups that `speclane plan` records)
    give the round model the same tokens."""
    from speclane.pipeline.runtime.routing_model import RoutingTrace

    cfg = Target.load(moe_dir, dtype=F32).cfg
    every = sum(cfg.moe_layers) * cfg.num_experts
    target = Target.load(moe_dir, dtype=F32, expert_cache_bytes=every * expert_bytes(cfg, F32))
    state, ids = target.new_state(1, 32), prompt(6, seed=4)
    with torch.no_grad():
        tok, pos = int(prefill(target, state, 0, ids)[-1].argmax()), len(ids)
        with rt.recording(target) as rec, lookups(target) as seen:
            for _ in range(5):
                tok, pos = int(decode_one(target, state, [(0, pos, tok)])[-1].argmax()), pos + 1
    moe = [i for i, routed in enumerate(cfg.moe_layers) if routed]
    a, b = RoutingTrace.from_rows(rec.trace(), moe), RoutingTrace.from_lookups(seen, cfg.num_experts)
    assert (a.tokens, a.layers, a.experts) == (b.tokens, b.layers, b.experts) and len(a.tokens) == 5
    with pytest.raises(ValueError, match="MoE layers in the rows"):
        RoutingTrace.from_rows(rec.trace(), moe[1:])
