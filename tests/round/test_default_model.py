"""The embedded default model (SmolLM2-135M-Instruct) through the whole engine: it answers, and speculation
changes nothing but speed: greedy tokens with the n-gram and oracle drafters equal speculation off, in bf16
(the default dtype, exact on the decode route) and float32, with one and several lanes."""

import pytest
import torch

from speclane.pipeline.framework.spec import load_spec, with_params
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.loading import load_model

CODE = (
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n\n"
    "Repeat the function above exactly, but rename total to acc:\n"
)
PROMPTS = [
    CODE,
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List the first ten prime numbers, separated by commas.",
]


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def model(request):
    torch.set_num_threads(1)
    return load_model(None, request.param)


def run(model, prompts, backend="none", k=7, lanes=1, max_tokens=32, spec="verify"):
    target, tok = model
    eng = Engine(
        target,
        tok,
        spec=spec,
        knobs=SpecKnobs(backend=backend, draft_tokens=k, draft_plan="fixed"),
        max_lanes=lanes,
        max_len=1024,
    )
    eng.raise_errors = True
    reqs = [parse_request({"id": i, "prompt": p, "max_tokens": max_tokens}) for i, p in enumerate(prompts)]
    return eng.generate(reqs, chat=True), eng


def test_the_default_model_knows_the_capital_of_france(model):
    (res,), _ = run(model, ["What is the capital of France?"])
    assert "Paris" in res.text
    assert res.finish_reason == "stop"


def test_ngram_greedy_equals_speculation_off(model):
    base, _ = run(model, PROMPTS, lanes=1)
    for k, lanes in ((3, 1), (7, 4)):
        got, eng = run(model, PROMPTS, "ngram", k=k, lanes=lanes)
        assert [r.tokens for r in got] == [r.tokens for r in base], (k, lanes)
        stats = eng.stats(list(eng.retired))
        assert stats["accepted"] > 0 and stats["tokens_per_round"] > 1.0


def test_oracle_drafts_are_all_accepted_and_change_nothing(model):
    base, _ = run(model, PROMPTS[:2], lanes=1)
    spec = with_params(load_spec("verify"), {"draft": {"backend": "oracle", "options": {"oracle": {}}}})
    target, tok = model
    eng = Engine(target, tok, spec=spec, knobs=SpecKnobs(draft_tokens=7, draft_plan="fixed"), max_lanes=2, max_len=1024)
    eng.drafter.replay({i: list(r.tokens) for i, r in enumerate(base)})
    reqs = [parse_request({"id": i, "prompt": p, "max_tokens": 32}) for i, p in enumerate(PROMPTS[:2])]
    got = eng.generate(reqs, chat=True)
    assert [r.tokens for r in got] == [r.tokens for r in base]
    stats = eng.stats(list(eng.retired))
    assert stats["accepted"] == stats["drafted"] > 0
