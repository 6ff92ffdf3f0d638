"""The suffix drafter past the draft stage's draft tokens (its `max_drafts` option) and the measured plan weighing
the drafter's own per-draft chances: greedy output equals speculation off on the three target families, and lanes
do draft past 7 where the row budget allows."""

import pytest

from tests.round.conftest import engine, mixed_prompts, requests

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def baselines(targets):
    """family -> (prompts, tokens of each with speculation off, each prompt run alone)."""
    out = {}
    for name, target in targets.items():
        prompts = mixed_prompts(4)
        out[name] = (prompts, [engine(target).generate(requests([p], MAX_TOKENS))[0].tokens for p in prompts])
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text", "qwen3_next"])
@pytest.mark.parametrize("plan, lanes", [("fixed", 1), ("fixed", 4), ("measured", 1), ("measured", 4)])
def test_long_drafts_greedy_output_equals_speculation_off(family, plan, lanes, targets, baselines):
    prompts, alone = baselines[family]
    eng = engine(targets[family], "suffix", k=7, max_lanes=lanes, plan=plan, options={"max_drafts": 15})
    # every prompt twice: the second time the lane drafts its whole answer from the first one's, past 7 tokens
    got = eng.generate(requests(prompts + prompts, MAX_TOKENS))
    assert [r.tokens for r in got] == alone + alone
    if plan == "fixed":
        widest = max(len(lane.offered_at) for lane in eng.retired)
        assert widest > 7, widest


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text", "qwen3_next"])
def test_31_drafts_a_round_keep_greedy_output(family, targets, baselines):
    """The cap suffix takes where a 32-row pass is cheap: a repeated answer is drafted past 15 tokens a round."""
    prompts, alone = baselines[family]
    eng = engine(targets[family], "suffix", k=7, max_lanes=1, plan="fixed", options={"max_drafts": 31})
    assert [r.tokens for r in eng.generate(requests(prompts + prompts, MAX_TOKENS))] == alone + alone
    assert max(len(lane.offered_at) for lane in eng.retired) > 15


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_the_measured_plan_with_the_drafters_chances_keeps_greedy_output(family, targets, baselines):
    prompts, alone = baselines[family]
    eng = engine(targets[family], "suffix", k=7, max_lanes=3, plan="measured")
    assert [r.tokens for r in eng.generate(requests(prompts + prompts, MAX_TOKENS))] == alone + alone


def test_the_row_budget_caps_long_drafts(targets, baselines):
    prompts, alone = baselines["llama"]
    eng = engine(targets["llama"], "suffix", k=7, rows=10, max_lanes=1, options={"max_drafts": 15})
    assert [r.tokens for r in eng.generate(requests(prompts + prompts, MAX_TOKENS))] == alone + alone
    assert max(len(lane.offered_at) for lane in eng.retired) == 9  # 10 rows: the anchor and 9 drafts
