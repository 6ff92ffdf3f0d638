"""No round drafts past a lane's max_tokens: a round emits at most its drafts plus one, so drafts beyond
`max_tokens - 1` outputs would cost verify rows for nothing and commit keys past the answer's end (which then
could not be checkpointed: pipeline/runtime/engine.py `_keep`)."""

import pytest

from tests.round.conftest import engine, prompt, requests


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9])
def test_drafts_stop_at_the_answers_end_and_its_keys_match_its_tokens(targets, max_tokens):
    target = targets["llama"]
    p = prompt(24, seed=3)
    (alone,) = engine(target).generate(requests([p], max_tokens))
    oracle = {0: list(alone.tokens)}  # every draft right: a round takes every draft the lane may
    eng = engine(target, "oracle", k=7, max_lanes=1, oracle=oracle, options={"corrupt": 0.0})
    (got,) = eng.generate(requests([p], max_tokens))
    (lane,) = eng.retired
    assert list(got.tokens) == list(alone.tokens)
    assert lane.kv_len == len(p) + max_tokens - 1  # the last token is emitted, its keys not yet written
    assert lane.drafted == lane.accepted == max(0, max_tokens - 2)  # the first token comes from the prefill
