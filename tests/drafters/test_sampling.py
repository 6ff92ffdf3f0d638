"""Sampling keeps the target's distribution with the model drafters in the verify round.

The statistic is tests/round/test_round_sampling.py's: the second output token (the first one a verify round commits,
with drafts in play) against its exact marginal, chi-square at significance ALPHA = 1e-3 over 2,000 seeded requests, on
the tiny llama target with drafters fitted to it for a few seconds (so drafts are often accepted). The same test with a
planted bias (an accept stage that takes every draft) must fail, so it can tell.
"""

import pytest

from speclane.pipeline.framework.spec import load_spec
from tests.round.conftest import engine
from tests.round.test_round_sampling import ALPHA, SAMPLES, chi_square_p, marginal_second, second_tokens


@pytest.mark.parametrize("name", ["dflash2", "mtp"])
def test_sampling_with_a_model_drafter_keeps_the_target_distribution(tiny, tiny_fitted, name):
    expected = marginal_second(tiny, 2.0, 0, 1.0)
    eng = engine(tiny, name, k=4, max_lanes=16, options={"path": str(tiny_fitted[0])})
    # one prompt a prefill pass: lanes join the rounds one step apart, so rounds of a few lanes leave mtp's row
    # budget (8) room to draft; sixteen lanes that start together would get no drafts under it
    eng.set_prefill_rows(None, 1)
    observed = second_tokens(eng, 2.0, 0, 1.0)
    stats = eng.stats(list(eng.retired))
    # Drafts really in play: measured 85 of 15,956 dflash2 drafts and 4,189 of 9,516 mtp drafts accepted (at
    # temperature 2 a greedy draft is accepted with the target's probability of that token).
    assert stats["drafted"] >= SAMPLES and stats["accepted"] >= SAMPLES // 50
    p_value = chi_square_p(observed, expected)
    print(f"{name}: accepted {stats['accepted']} of {stats['drafted']}; chi-square p = {p_value:.3g}")
    assert p_value > ALPHA


def test_the_test_catches_a_planted_bias(tiny, tiny_fitted, tmp_path):
    text = open(load_spec("verify").source).read()
    biased = tmp_path / "biased.toml"
    biased.write_text(text.replace('kind = "accept"', 'kind = "tests.fixtures.user_stages:AlwaysAccept"'))
    eng = engine(tiny, "dflash2", k=4, max_lanes=16, options={"path": str(tiny_fitted[0])}, spec=biased)
    p_value = chi_square_p(second_tokens(eng, 2.0, 0, 1.0), marginal_second(tiny, 2.0, 0, 1.0))
    assert p_value < ALPHA
