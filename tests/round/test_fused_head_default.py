"""The fused output head end to end on the embedded default model in bf16 (its 49,152-token head, packed where the
AVX512-BF16 build runs): generate with speculation (ngram, mtp) gives the same tokens with target_pass's
`logits = "tokens"` as with every row's logits, greedy and seeded sampling, and the fused head ran."""

from __future__ import annotations

import pytest
import torch

from speclane.pipeline.framework.spec import load_spec, with_params
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.loading import load_model
from speclane.stages.models.target import Target

PROMPTS = ["Write a Python function that merges two sorted lists.", "List three uses of a hash map."]
FUSED = with_params(load_spec("verify"), {"target_pass": {"logits": "tokens"}})


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_model(None, "bfloat16")


def _run(model, backend, spec, tokens, **sampling):
    target, tok = model
    knobs = SpecKnobs(backend=backend, draft_tokens=4, draft_plan="fixed")
    eng = Engine(target, tok, spec=spec, knobs=knobs, max_lanes=2, max_len=256)
    eng.raise_errors = True
    reqs = [
        parse_request({"id": i, "prompt": p, "max_tokens": tokens, "seed": 11 + i, **sampling})
        for i, p in enumerate(PROMPTS)
    ]
    return [r.tokens for r in eng.generate(reqs, chat=True)]


@pytest.mark.parametrize("backend", ["ngram", "mtp"])
def test_generate_gives_the_same_tokens_with_the_fused_head(model, backend, monkeypatch):
    assert model[0].fuses_head(8), "the fused kernel must serve the default model here"
    calls = []
    real = Target.head_tokens
    monkeypatch.setattr(Target, "head_tokens", lambda self, *a: calls.append(1) or real(self, *a))
    assert _run(model, backend, FUSED, 24) == _run(model, backend, "verify", 24)
    greedy_calls = len(calls)
    # sampling through the logits route sorts each row's 49,152 probabilities: a few tokens keep the test short
    assert _run(model, backend, FUSED, 8, temperature=0.8) == _run(model, backend, "verify", 8, temperature=0.8)
    assert greedy_calls > 0 and len(calls) > greedy_calls
