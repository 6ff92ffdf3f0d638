"""The step budget of prompt rows (`Engine(prefill_rows=...)`): a long prompt is prefilled a bounded chunk a step
while the other lanes keep decoding, and the chunking never changes greedy output."""

from __future__ import annotations

import pytest

from speclane.pipeline.runtime.engine import Engine
from speclane.stages.contract.errors import ConfigError
from speclane.stages.contract.events import DoneEvent, TokenEvent
from tests.models.target_artifacts import FAMILIES
from tests.round.conftest import IdTokenizer, engine, mixed_prompts, prompt, requests


def _budget(eng, rows: int | None, lanes: int | None = None, **kw):
    """The same engine with another step budget (a fresh one: lanes and state start empty); `lanes`: the most
    prompts a prefill pass reads (None: the spec's); `kw`: more of Engine's arguments."""
    out = Engine(
        eng.target,
        eng.tokenizer,
        spec=eng.spec,
        max_lanes=eng.lanes.max_lanes,
        max_len=eng.max_len,
        check_contracts=True,
        prefill_rows=rows,
        **kw,
    )
    if lanes is not None:
        out.set_prefill_rows(rows, lanes)
    return out


@pytest.mark.parametrize("name", FAMILIES)
def test_chunked_prefill_gives_the_same_greedy_tokens(targets, name):
    """Prompts of 61 to 150 tokens through budgets that split them at different places, with speculation on and
    off, in float32: the same tokens as one whole-prompt pass."""
    prompts = mixed_prompts(3) + [prompt(150, seed=9)]
    for backend in ("none", "ngram"):
        base = engine(targets[name], backend=backend, k=3, max_lanes=4)
        whole = _budget(base, 512).generate(requests(prompts, max_tokens=12))
        for rows in (1, 7, 32):
            chunked = _budget(base, rows).generate(requests(prompts, max_tokens=12))
            assert [d.tokens for d in chunked] == [d.tokens for d in whole], (name, backend, rows)


def test_a_long_prompt_does_not_stall_a_decoding_lane(targets):
    """Lane 0 decodes; a 200-token prompt arrives. With a budget of 16 rows, every step until lane 0 ends still
    gives lane 0 a token (the prompt takes 13 steps); with the whole prompt as the budget, lane 0 gets one token
    during the prompt's one pass, and the prompt's first token comes in that same step. No step reads more of the
    prompt than the budget."""
    for rows, prefill_steps in ((16, 13), (512, 1)):
        eng = _budget(engine(targets["llama"], backend="none", max_lanes=2), rows)
        short, long = requests([prompt(5, seed=1), prompt(200, seed=2)], max_tokens=40)
        eng.submit(short)
        eng.step()  # lane 0 prefilled: its first token
        eng.submit(long)
        steps_until_first, read = None, 0
        for n in range(1, 40):
            events = eng.step()
            lane = eng._lane(long.id)
            if lane is not None:  # no step reads more of the prompt than the budget
                prefilled = min(lane.kv_len, 200)  # past 200: the step's round, not the prompt
                assert prefilled - read == min(rows, 200 - read), (rows, n, prefilled, read)
                read = prefilled
            mine = [e for e in events if isinstance(e, TokenEvent) and e.rid == short.id]
            assert mine, f"budget {rows}: step {n} gave the decoding lane no token"
            if steps_until_first is None and any(isinstance(e, TokenEvent) and e.rid == long.id for e in events):
                steps_until_first = n
            if any(isinstance(e, DoneEvent) and e.rid == short.id for e in events):
                break
        assert steps_until_first == prefill_steps, (rows, steps_until_first)


def test_the_budget_must_be_positive(targets):
    with pytest.raises(ConfigError, match="prefill_rows"):
        Engine(targets["llama"], IdTokenizer(), prefill_rows=0)


def test_with_no_lane_decoding_a_prompt_takes_the_whole_chunk(targets, monkeypatch):
    """The budget is for the decoding lanes' sake: alone, a 200-token prompt is read in one pass (the prefill
    spec's chunk), not 13 passes of 16 rows; the budget binds again as soon as a lane decodes."""
    from speclane.stages.models.target import Target

    rows = []
    orig = Target.forward
    monkeypatch.setattr(
        Target, "forward", lambda self, batch, *a, **kw: rows.append(batch.rows) or orig(self, batch, *a, **kw)
    )
    eng = _budget(engine(targets["llama"], backend="none", max_lanes=2), 16, lanes=1)  # one prompt a pass
    (alone,) = eng.generate(requests([prompt(200, seed=3)], max_tokens=2))
    assert rows[0] == 200
    rows.clear()
    eng.generate(requests([prompt(5, seed=4), prompt(200, seed=5)], max_tokens=30))
    # the long prompt 16 rows a step while the short one decodes, in the pass of the short one's one row
    assert max(rows[1:]) == 17 and rows.count(17) == 12
    eng.set_prefill_rows(16, 1, one_pass=False)  # a prefill pass and a verify pass a step
    rows.clear()
    eng.generate(requests([prompt(5, seed=6), prompt(200, seed=7)], max_tokens=30))
    assert max(rows[1:]) == 16 and rows.count(1) >= 13
