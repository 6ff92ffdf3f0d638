"""Fixtures for the verify-round tests: tiny hybrid and llama targets, a stand-in tokenizer, engine builders."""

from __future__ import annotations

import pytest
import torch

from speclane.pipeline.framework.spec import SpecFile, load_spec, with_params
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.target import Target
from tests.models.target_artifacts import FAMILIES, VOCAB, artifacts, prompt  # noqa: F401  (fixtures)

EOS = 3


class IdDetok:
    def push(self, t):
        return f"<{t}>"

    def flush(self):
        return ""


class IdTokenizer:
    """Enough of a tokenizer for prompt_ids requests: token n reads '<n>', one id ends generation."""

    eos_token_ids = (EOS,)

    def detokenizer(self, skip_special=False):
        return IdDetok()


@pytest.fixture(scope="session")
def targets(artifacts):
    """family -> Target in float32 (the exactness dtype for random tiny models)."""
    return {name: Target.load(path, dtype=torch.float32) for name, (path, _) in artifacts.items()}


def engine(
    target,
    backend="none",
    k=7,
    rows=0,
    max_lanes=8,
    options=None,
    oracle=None,
    spec="verify",
    max_len=512,
    plan="fixed",
):
    """An engine on `target`. `plan="fixed"`: every draft k and the rows allow, so a test's drafts do not depend
    on this machine's pass costs (tests/round/test_draft_plan.py runs the measured plan)."""
    base = spec if isinstance(spec, SpecFile) else load_spec(spec)
    if options is not None:  # the spec names the backend and its options (the oracle is no --spec-backend)
        base = with_params(base, {"draft": {"backend": backend, "options": {backend: options}}})
    knobs = SpecKnobs(
        backend=None if options is not None else backend, draft_tokens=k, draft_rows=rows, draft_plan=plan
    )
    eng = Engine(
        target, IdTokenizer(), spec=base, knobs=knobs, max_lanes=max_lanes, max_len=max_len, check_contracts=True
    )
    eng.raise_errors = True
    if oracle is not None:  # the oracle control's continuations, handed to the drafter the engine built
        eng.drafter.replay(oracle)
    return eng


def requests(prompts, max_tokens=24, **fields):
    return [
        parse_request({"id": i, "prompt_ids": p, "max_tokens": max_tokens, "ignore_eos": True, **fields})
        for i, p in enumerate(prompts)
    ]


def repetitive(n: int, seed: int) -> list[int]:
    """A prompt that repeats a short random phrase: the n-gram drafter finds matches in it."""
    phrase = prompt(5 + seed % 4, seed=seed)
    return (phrase * (n // len(phrase) + 1))[:n]


def mixed_prompts(lanes: int) -> list[list[int]]:
    return [repetitive(20 + 3 * i, seed=i) if i % 2 == 0 else prompt(11 + 5 * i, seed=50 + i) for i in range(lanes)]
