"""Several prompts in one prefill pass (`lanes_per_pass`, the `prefill_lanes` knob, `serve --prefill-lanes`): the
shipped prefill spec reads every waiting prompt up to its chunk in one pass, and in float32 that gives each prompt
the same greedy tokens as a pass of its own, on every target family, with checkpoints cutting the chunks."""

from __future__ import annotations

import pytest

from speclane.pipeline.framework.knobs import knob_value
from speclane.stages.contract.errors import ConfigError
from speclane.stages.contract.events import DoneEvent
from tests.models.target_artifacts import FAMILIES
from tests.round.conftest import engine, mixed_prompts, prompt, requests
from tests.round.test_step_budget import _budget


def _lanes(eng, lanes: int | None, rows: int | None = None):
    """The same engine, fresh, reading at most `lanes` prompts a prefill pass (None: the spec's), checkpoints every
    32 tokens."""
    return _budget(eng, rows, lanes, checkpoint_every=32)


def _rows(monkeypatch) -> list[int]:
    from speclane.stages.models.target import Target

    seen, orig = [], Target.forward
    monkeypatch.setattr(
        Target, "forward", lambda self, batch, *a, **kw: seen.append(batch.rows) or orig(self, batch, *a, **kw)
    )
    return seen


@pytest.mark.parametrize("name", FAMILIES)
def test_batched_prompts_give_the_same_greedy_tokens(targets, name):
    """Prompts of 20 to 150 tokens, every one waiting at once, read one a pass, two a pass and all in one, under the
    whole chunk and a small step budget, speculation off and on: the same tokens."""
    prompts = mixed_prompts(3) + [prompt(150, seed=9)]
    for backend in ("none", "ngram"):
        base = engine(targets[name], backend=backend, k=3, max_lanes=4)
        alone = _lanes(base, 1).generate(requests(prompts, max_tokens=10))
        for lanes, rows in ((None, None), (2, None), (None, 7)):
            shared = _lanes(base, lanes, rows).generate(requests(prompts, max_tokens=10))
            assert [d.tokens for d in shared] == [d.tokens for d in alone], (name, backend, lanes, rows)


def test_one_pass_reads_every_waiting_prompt(targets, monkeypatch):
    """No lane decodes: three waiting prompts share the first pass (the spec's default), or go one a pass at 1."""
    base = engine(targets["llama"], backend="none", max_lanes=4)
    assert knob_value(base._prefill_spec, "prefill_lanes") > base.lanes.max_lanes
    prompts = [prompt(20, seed=1), prompt(30, seed=2), prompt(40, seed=3)]
    # 20 + 30 + 32: a chunk ends where its lane keeps a checkpoint (every 32 tokens here)
    for lanes, first in ((None, 82), (1, 20)):
        rows = _rows(monkeypatch)
        _lanes(base, lanes).generate(requests(prompts, max_tokens=2))
        assert rows[0] == first, (lanes, rows)


def test_prefill_lanes_must_be_positive(targets):
    eng = engine(targets["llama"], backend="none", max_lanes=2)
    with pytest.raises(ConfigError, match=r"prefill_lanes \(--prefill-lanes\) must be >= 1, got 0"):
        eng.set_prefill_rows(None, 0)
    eng.set_prefill_rows(16, 1)
    eng.set_prefill_rows(8)  # the lanes set before stay
    assert eng.prefill_rows == 8 and eng._prefill_lanes == 1


def test_prompts_that_share_a_head_prefill_it_once(targets, monkeypatch):
    """Two prompts that share their first 50 tokens, waiting together, checkpoints every 32: the first pass reads
    only the first prompt's 32 (the second's chunk would read the same 32 tokens, which the first keeps); the
    second starts from that checkpoint. The same tokens as one prompt a pass."""
    head = prompt(50, seed=7)
    prompts = [head + prompt(30, seed=8), head + prompt(45, seed=9)]
    base = engine(targets["qwen3_next"], backend="none", max_lanes=2)
    alone = _lanes(base, 1).generate(requests(prompts, max_tokens=6))
    rows = _rows(monkeypatch)
    eng = _lanes(base, None)
    shared = eng.generate(requests(prompts, max_tokens=6))
    assert [d.tokens for d in shared] == [d.tokens for d in alone]
    assert rows[0] == 32 and rows[1] == 64, rows  # then both from 32 on: 32 rows each up to the next mark
    assert eng.checkpoints.hits >= 1


def test_a_prompt_waits_for_a_checkpoint_another_keeps_past_its_own_marks(targets, monkeypatch):
    """The n choices of one prompt arriving together: the first keeps a checkpoint one token short of the prompt's
    end, the second marks nothing there (its own chunk ends at the every-32 mark). It waits a pass and starts from
    the first one's checkpoint instead of reading the same rows beside it; the same tokens."""
    ids = prompt(40, seed=11)
    base = engine(targets["llama"], backend="none", max_lanes=2)
    alone = _lanes(base, 1).generate(requests([ids, ids], max_tokens=6))
    rows = _rows(monkeypatch)
    eng = _lanes(base, None)
    first, second = (eng.prepare(r) for r in requests([ids, ids], max_tokens=6))
    first.checkpoint_at = (39,)  # as `share_prompt` marks the first choice
    for lane in (first, second):
        eng.enqueue(lane)
    done = {}
    while eng.busy():
        done.update({ev.rid: ev.tokens for ev in eng.step() if isinstance(ev, DoneEvent)})
    assert rows[0] == 39, rows  # the first choice alone, up to its checkpoint
    assert eng.checkpoints.hits >= 1
    assert [done[0], done[1]] == [d.tokens for d in alone]
