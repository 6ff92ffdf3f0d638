"""A slot reused by a new lane starts with an empty drafter window (no stale state from its last owner): the second
request in a one-lane engine drafts exactly what it drafts alone in a fresh engine, and its output equals speculation
off."""

import pytest

from tests.round.conftest import engine, prompt, requests


@pytest.mark.parametrize("name", ["dflash2", "mtp"])
def test_a_reused_slot_drafts_as_a_fresh_one(tiny, tiny_fitted, name):
    first, second = prompt(30, seed=11), prompt(9, seed=12)

    def drafted(eng, prompts):
        out = eng.generate(requests(prompts, 16))
        last = list(eng.retired)[-1]
        return out[-1].tokens, eng.stats([last])

    options = {"path": str(tiny_fitted[0])}
    alone_tokens, alone = drafted(engine(tiny, name, k=3, max_lanes=1, options=options), [second])
    reused_tokens, reused = drafted(engine(tiny, name, k=3, max_lanes=1, options=options), [first, second])
    off = engine(tiny, "none", max_lanes=1).generate(requests([second], 16))[0].tokens
    assert alone_tokens == reused_tokens == off
    assert reused == alone and alone["accepted"] > 0
