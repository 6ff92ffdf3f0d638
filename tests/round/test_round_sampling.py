"""Invariant 2: sampling keeps the target's distribution; and a seeded request samples the same text anyway.

The statistical test compares the second output token (the first one a verify round commits, with drafts in
play) against its exact marginal sum_t1 p(t1) p(t2 | t1), by a chi-square test at significance 1e-3. It is run
once with the real accept stage and once with a planted bias (a spec whose accept stage takes every draft),
which it must catch.
"""

import pytest
import torch

from speclane.kernels.sampling import process_logits_ref
from speclane.pipeline.framework.spec import load_spec
from speclane.stages.models.state import RowBatch
from tests.round.conftest import VOCAB, engine, prompt, requests

ALPHA = 1e-3
SAMPLES = 2000
PROMPT = prompt(12, seed=7)


def _probs(target, tokens, temperature, top_k, top_p):
    state = target.new_state(1, 64)
    logits = target.forward(RowBatch.build([(0, 0, tokens)]), state, record="last", logits="last").logits
    one = lambda v, dt: torch.tensor([v], dtype=dt)  # noqa: E731
    return process_logits_ref(
        logits, one(temperature, torch.float32), one(top_k, torch.int64), one(top_p, torch.float32)
    )[0].double()


def marginal_second(target, temperature, top_k, top_p):
    p1 = _probs(target, PROMPT, temperature, top_k, top_p)
    out = torch.zeros(VOCAB, dtype=torch.float64)
    for t1 in torch.nonzero(p1).flatten().tolist():
        out += p1[t1] * _probs(target, PROMPT + [t1], temperature, top_k, top_p)
    return out


def chi_square_p(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    n = observed.sum()
    expected = expected_probs * n
    assert observed[expected == 0].sum() == 0, "a token of zero probability was sampled"
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    assert dof >= 4, f"only {dof + 1} bins: the distribution is too peaked for the test to say anything"
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def second_tokens(eng, temperature, top_k, top_p) -> torch.Tensor:
    reqs = requests([PROMPT] * SAMPLES, max_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p)
    for i, r in enumerate(reqs):
        r.seed = 1000 + i
    got = eng.generate(reqs)
    return torch.bincount(torch.tensor([r.tokens[1] for r in got]), minlength=VOCAB).double()


@pytest.fixture(scope="module")
def greedy_continuation(targets):
    return list(engine(targets["llama"]).generate(requests([PROMPT], 8))[0].tokens)


# The tiny random targets are peaked; a high temperature spreads the mass over enough tokens to test.
@pytest.mark.parametrize("temperature, top_k, top_p", [(2.0, 0, 1.0), (3.0, 12, 0.9)])
def test_speculative_sampling_keeps_the_target_distribution(targets, greedy_continuation, temperature, top_k, top_p):
    target = targets["llama"]
    expected = marginal_second(target, temperature, top_k, top_p)
    eng = engine(target, "oracle", k=4, max_lanes=16, options={"corrupt": 0.0}, oracle={None: greedy_continuation})
    observed = second_tokens(eng, temperature, top_k, top_p)
    assert eng.stats(list(eng.retired))["drafted"] >= SAMPLES  # drafts were really in play
    p_value = chi_square_p(observed, expected)
    print(f"T={temperature} top_k={top_k} top_p={top_p}: chi-square p = {p_value:.3g}")
    assert p_value > ALPHA


def test_the_test_catches_a_planted_bias(targets, greedy_continuation, tmp_path):
    target = targets["llama"]
    text = load_spec("verify").source and open(load_spec("verify").source).read()
    biased = tmp_path / "biased.toml"
    biased.write_text(text.replace('kind = "accept"', 'kind = "tests.fixtures.user_stages:AlwaysAccept"'))
    expected = marginal_second(target, 2.0, 0, 1.0)
    eng = engine(
        target, "oracle", k=4, max_lanes=16, options={"corrupt": 0.0}, oracle={None: greedy_continuation}, spec=biased
    )
    observed = second_tokens(eng, 2.0, 0, 1.0)
    p_value = chi_square_p(observed, expected)
    print(f"planted bias: chi-square p = {p_value:.3g}")
    assert p_value < ALPHA


def test_a_seeded_request_samples_the_same_tokens_with_speculation_on_or_off(targets):
    target = targets["qwen3_next"]
    prompts = [prompt(9, seed=s) * 3 for s in range(4)]
    fields = dict(temperature=0.9, top_p=0.95, top_k=30)

    def run(eng, lanes):
        reqs = requests(prompts[:lanes], 20, **fields)
        for i, r in enumerate(reqs):
            r.seed = 77 + i
        return [r.tokens for r in eng.generate(reqs)]

    off = run(engine(target, max_lanes=1), 4)
    assert run(engine(target, "ngram", k=5, max_lanes=4), 4) == off
    assert run(engine(target, "oracle", k=3, max_lanes=2, options={"corrupt": 0.5}, oracle={None: off[0]}), 4) == off
