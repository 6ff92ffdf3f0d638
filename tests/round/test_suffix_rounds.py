"""The suffix drafter in real rounds: greedy output equals speculation off on the three target families, with drafts
from each lane's own tokens and from earlier requests; sampling keeps the target's distribution; an earlier answer
drafts a later request's repeat of it, which prompt lookup cannot; the cache keeps within its budget; a slot's new
lane starts from its own tokens alone."""

from pathlib import Path

import pytest

from speclane.pipeline.framework.spec import load_spec
from tests.round.conftest import engine, mixed_prompts, prompt, requests
from tests.round.test_round_sampling import ALPHA, SAMPLES, chi_square_p, marginal_second, second_tokens

MAX_TOKENS = 20


@pytest.fixture(scope="module")
def baselines(targets):
    """family -> (prompts, tokens of each with speculation off, each prompt run alone)."""
    out = {}
    for name, target in targets.items():
        prompts = mixed_prompts(8)
        out[name] = (prompts, [engine(target).generate(requests([p], MAX_TOKENS))[0].tokens for p in prompts])
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text", "qwen3_next"])
@pytest.mark.parametrize("k, lanes", [(1, 8), (4, 3), (7, 8)])
def test_greedy_output_equals_speculation_off(family, k, lanes, targets, baselines):
    prompts, alone = baselines[family]
    eng = engine(targets[family], "suffix", k=k, max_lanes=lanes)
    # every prompt twice: the second time, the lane also drafts from the first one's finished answer
    got = eng.generate(requests(prompts + prompts, MAX_TOKENS))
    assert [r.tokens for r in got] == alone + alone
    stats = eng.stats(list(eng.retired))
    assert 0 < stats["accepted"] <= stats["drafted"], stats
    later = eng.stats([lane for lane in eng.retired if lane.rid >= len(prompts)])
    assert later["accepted"] >= len(prompts) * k, later  # the repeats are drafted from the cache


def test_an_earlier_answer_drafts_its_repeat_where_prompt_lookup_cannot(targets):
    # qwen3_5_text's greedy answer to a random prompt repeats no phrase, so prompt lookup has nothing to draft
    target, first = targets["qwen3_5_text"], prompt(15, seed=3)
    off = engine(target).generate(requests([first], 24))[0].tokens

    def second_request(backend, options=None):
        eng = engine(target, backend, k=4, max_lanes=1, options=options)
        got = eng.generate(requests([first, first], 24))
        assert [r.tokens for r in got] == [off, off]
        return eng.stats([list(eng.retired)[-1]])

    ngram = second_request("ngram")
    alone = second_request("suffix", {"cache_tokens": 0})  # the request's own tokens only
    cached = second_request("suffix")
    assert ngram["accepted"] == 0 and alone["accepted"] == 0
    assert cached["accepted"] >= 16 and cached["tokens_per_round"] >= 4, cached  # 23 tokens in at most 5 rounds


def test_the_cache_stays_within_its_budget_after_many_requests(targets):
    budget = 150
    eng = engine(targets["llama"], "suffix", k=3, max_lanes=3, options={"cache_tokens": budget})
    eng.generate(requests([prompt(5 + i % 11, seed=i) for i in range(40)], 12))  # 17 to 27 tokens each
    eng.generate(requests([prompt(6, seed=99)], 4))  # a later call takes the last finished lanes in
    cache = eng.drafter_state.cache
    assert 0 < cache.tokens == cache.tree.held() <= budget
    ended = {tuple(lane.prompt_ids + lane.out_ids) for lane in eng.retired}
    assert set(cache.held) <= ended and cache.tokens > budget - 27  # full, but for less than one request's room


def test_a_reused_slot_starts_from_its_own_lanes_tokens(targets):
    eng = engine(targets["qwen3_5_text"], "suffix", k=4, max_lanes=1, options={"cache_tokens": 0})
    first, second = prompt(20, seed=5), prompt(9, seed=6)
    eng.generate(requests([first, second], 16))
    entry = eng.drafter_state.lanes[0]
    last = list(eng.retired)[-1]
    assert entry.owner is last and entry.tree.tokens == (last.prompt_ids + last.out_ids)[: len(entry.tree.tokens)]
    assert entry.tree.held() == len(entry.tree.tokens) > 0


# The tiny random targets are peaked; a high temperature spreads the mass over enough tokens to test. min_prob 0:
# every request after the first ones drafts its second token from the earlier requests' samples.
@pytest.mark.parametrize("temperature, top_k, top_p", [(2.0, 0, 1.0), (3.0, 12, 0.9)])
def test_sampling_with_suffix_drafts_keeps_the_target_distribution(targets, temperature, top_k, top_p):
    target = targets["llama"]
    expected = marginal_second(target, temperature, top_k, top_p)
    eng = engine(target, "suffix", k=4, max_lanes=16, options={"min_prob": 0.0})
    observed = second_tokens(eng, temperature, top_k, top_p)
    stats = eng.stats(list(eng.retired))
    assert stats["drafted"] >= SAMPLES * 0.9 and 0 < stats["accepted"] < stats["drafted"], stats
    p_value = chi_square_p(observed, expected)
    print(f"T={temperature} top_k={top_k} top_p={top_p}: chi-square p = {p_value:.3g}")
    assert p_value > ALPHA


def test_the_suffix_sampling_test_catches_a_planted_bias(targets, tmp_path):
    target = targets["llama"]
    biased = tmp_path / "biased.toml"
    text = Path(load_spec("verify").source).read_text()
    biased.write_text(text.replace('kind = "accept"', 'kind = "tests.fixtures.user_stages:AlwaysAccept"'))
    expected = marginal_second(target, 2.0, 0, 1.0)
    eng = engine(target, "suffix", k=4, max_lanes=16, options={"min_prob": 0.0}, spec=biased)
    p_value = chi_square_p(second_tokens(eng, 2.0, 0, 1.0), expected)
    print(f"planted bias: chi-square p = {p_value:.3g}")
    assert p_value < ALPHA


def test_a_seeded_request_samples_the_same_tokens_with_suffix_drafts(targets):
    target = targets["qwen3_next"]
    prompts = [prompt(9, seed=s) * 3 for s in range(4)]

    def run(eng):
        reqs = requests(prompts + prompts, 20, temperature=0.9, top_p=0.95, top_k=30)
        for i, r in enumerate(reqs):
            r.seed = 77 + i % len(prompts)
        return [r.tokens for r in eng.generate(reqs)], eng.stats(list(eng.retired))

    off, _ = run(engine(target, max_lanes=1))
    on, stats = run(engine(target, "suffix", k=5, max_lanes=4))
    assert on == off and stats["accepted"] > 0
