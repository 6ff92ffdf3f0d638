"""The fused output head in real rounds: target_pass with `logits = "tokens"` gives the tokens of the logits route.

On the tiny targets of the three families, in float32 and bf16, with the ngram and mtp drafters (deterministic:
no `draft_probs`), 4 lanes of up to 4 rows each (1 to 16 rows a pass), greedy, and a round mixing greedy lanes
with lanes sampling (seeded) at 0.8; then sampling at two other temperatures: the committed tokens are the same
with the fused head on and off, and the fused head ran. A round whose lanes ask for top-k, top-p or logprobs keeps
the logits route (and its tokens), and so does a target with its own head arithmetic (Gemma 3's soft-cap).
Sampled tokens could part only at a float32 near-tie of a CDF boundary (tests/kernels/test_fused_head.py bounds how
rare); the seeds here meet none.
"""

from __future__ import annotations

import pytest
import torch

from speclane.pipeline.framework.spec import load_spec, with_params
from speclane.stages.models.target import Target
from tests.drafters.conftest import write_drafter
from tests.models.gemma_artifacts import gemma_artifacts  # noqa: F401  (fixture)
from tests.round.conftest import FAMILIES, engine, mixed_prompts, requests

FUSED = with_params(load_spec("verify"), {"target_pass": {"logits": "tokens"}})


@pytest.fixture(scope="module")
def bf16_targets(artifacts):
    return {name: Target.load(path, dtype=torch.bfloat16) for name, (path, _) in artifacts.items()}


@pytest.fixture(scope="module")
def mtp_files(targets, bf16_targets, tmp_path_factory):
    """(family, dtype name) -> a directory with random mtp files for that target."""
    out = {}
    for dtype, group in (("float32", targets), ("bfloat16", bf16_targets)):
        for name, target in group.items():
            out[(name, dtype)] = tmp_path_factory.mktemp(f"fused-{name}-{dtype}")
            write_drafter("mtp", target, out[(name, dtype)])
    return out


@pytest.fixture
def fused_calls(monkeypatch):
    """How many passes took their tokens from the fused head."""
    seen = {"passes": 0}
    real = Target.head_tokens

    def counted(self, *args):
        seen["passes"] += 1
        return real(self, *args)

    monkeypatch.setattr(Target, "head_tokens", counted)
    return seen


def _tokens(target, backend, directory, spec, **sampling):
    options = None if backend == "ngram" else {"path": str(directory)}
    eng = engine(target, backend, k=3, max_lanes=4, options=options, spec=spec)
    mixed = sampling.pop("temperature", None) == "mixed"
    reqs = requests(mixed_prompts(4), 10, **sampling)
    for i, r in enumerate(reqs):
        r.seed = 100 + i
        if mixed:  # greedy and sampling lanes in one round
            r.temperature = 0.0 if i % 2 else 0.8
    return [r.tokens for r in eng.generate(reqs)], eng.stats(list(eng.retired))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend", ["ngram", "mtp"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_rounds_commit_the_logits_routes_tokens(
    family, backend, dtype, targets, bf16_targets, mtp_files, fused_calls
):
    target = (targets if dtype == "float32" else bf16_targets)[family]
    directory = mtp_files[(family, dtype)]
    assert target.fuses_head(16), "the fused kernel must serve this target here"
    for sampling in ({}, {"temperature": "mixed"}):
        off, _ = _tokens(target, backend, directory, "verify", **sampling)
        before = fused_calls["passes"]
        on, stats = _tokens(target, backend, directory, FUSED, **sampling)
        assert on == off, sampling
        assert fused_calls["passes"] > before and stats["drafted"] > 0, sampling


@pytest.mark.parametrize("temperature", [0.4, 1.5])
def test_sampling_at_other_temperatures(temperature, bf16_targets, fused_calls):
    target = bf16_targets["qwen3_5_text"]
    off, _ = _tokens(target, "ngram", None, "verify", temperature=temperature)
    on, _ = _tokens(target, "ngram", None, FUSED, temperature=temperature)
    assert on == off and fused_calls["passes"] > 0


@pytest.mark.parametrize(
    "asks", [{"top_k": 5, "temperature": 0.7}, {"top_p": 0.9, "temperature": 0.7}, {"logprobs": True}]
)
def test_a_round_that_needs_logits_keeps_them(asks, targets, fused_calls):
    target = targets["qwen3_next"]
    off, _ = _tokens(target, "ngram", None, "verify", **asks)
    on, _ = _tokens(target, "ngram", None, FUSED, **asks)
    assert on == off and fused_calls["passes"] == 0


def test_a_target_with_its_own_head_keeps_the_logits(gemma_artifacts, fused_calls):  # noqa: F811
    target = Target.load(gemma_artifacts["capped"][0], dtype=torch.float32)
    assert not target.fuses_head(4)
    off, _ = _tokens(target, "ngram", None, "verify")
    on, _ = _tokens(target, "ngram", None, FUSED)
    assert on == off and fused_calls["passes"] == 0
