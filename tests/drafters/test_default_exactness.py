"""Invariant 1 with the shipped drafters: on the embedded default model in float32, greedy output with dflash2 and
with mtp equals output with speculation off, token for token, at every k from 1 to 7, with drafts accepted."""

import pytest
import torch

from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.loading import load_model

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Why is the sky blue? Answer in two sentences.",
]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_model(None, "float32")


def run(model, backend, k):
    target, tok = model
    eng = Engine(
        target, tok, knobs=SpecKnobs(backend=backend, draft_tokens=k, draft_plan="fixed"), max_lanes=2, max_len=512
    )
    eng.raise_errors = True
    reqs = [parse_request({"id": i, "prompt": p, "max_tokens": 24}) for i, p in enumerate(PROMPTS)]
    return [r.tokens for r in eng.generate(reqs, chat=True)], eng.stats(list(eng.retired))


@pytest.fixture(scope="module")
def baseline(model):
    return run(model, "none", 1)[0]


@pytest.mark.parametrize("backend", ["dflash2", "mtp"])
def test_greedy_output_equals_speculation_off_at_k(model, baseline, backend):
    # Every k from 1 to 7 is held with the oracle drafter on tiny targets (tests/round); here the model drafters
    # on the real model at the ends and middle of the range keep the suite's time in bounds.
    accepted = 0
    for k in (1, 2, 4, 7):
        got, stats = run(model, backend, k)
        assert got == baseline, (backend, k)
        accepted += stats["accepted"]
    assert accepted > 0
