"""Prompt checkpoints with the model drafters: a restored prefix brings the drafter's window and carried vector
with it, so the next turn drafts as a fresh prefill's would: the same drafts and acceptance, the same tokens."""

import pytest

from speclane.pipeline.runtime.checkpoints import CheckpointStore
from tests.round.conftest import engine, prompt, requests


@pytest.mark.parametrize("name", ["dflash2", "mtp"])
def test_a_restored_turn_drafts_as_a_fresh_prefill(tiny, tiny_fitted, name):
    options = {"path": str(tiny_fitted[0])}
    kept = engine(tiny, name, k=4, max_lanes=1, options=options)
    kept.checkpoints = CheckpointStore(64 << 20)
    fresh = engine(tiny, name, k=4, max_lanes=1, options=options)
    fresh.checkpoints = None
    first = prompt(40, seed=21)
    (answer,) = kept.generate(requests([first], max_tokens=12))
    follow = first + list(answer.tokens) + prompt(8, seed=22)
    (got,) = kept.generate(requests([follow], max_tokens=16))
    (want,) = fresh.generate(requests([follow], max_tokens=16))
    # the first turn's prompt at least (its answer too, unless the last round's drafts ran past max_tokens: then
    # the slot holds keys of tokens the answer does not return, and nothing is kept at its end)
    assert kept.checkpoints.hits == 1 and kept.checkpoints.tokens_reused >= len(first)
    assert got.tokens == want.tokens
    assert got.spec["drafted"] > 0
    # drafts read the restored window: acceptance as with the whole prompt prefilled (drafts are proposals, so
    # this holds to rounding of the window's keys; on this float32 tiny target they agree exactly)
    assert got.spec["accepted_per_position"] == want.spec["accepted_per_position"]
