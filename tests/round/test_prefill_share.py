"""The step budget for each prompt being read (pipeline/runtime/prefill_share.py): while more lanes wait on their
prompt than decode, a step's prefill pass may take a fair pass's time for each prompt it reads, so a burst of
prompts is read in wide passes; with as many decoders or more the budget is the fair one, and the widening never
changes greedy output."""

from __future__ import annotations

import pytest

from speclane.pipeline.runtime.prefill_share import PrefillShare, set_serve_budget, shared_rows
from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.events import DoneEvent, TokenEvent
from tests.round.conftest import engine, prompt, requests


def _costs(one_row: float = 0.010, per_row: float = 0.001) -> RoundCosts:
    """A table of passes that cost `one_row` plus `per_row` a row past the first, probed up to 64 rows."""
    rows = (1, 2, 4, 8, 16, 32, 64)
    return RoundCosts(rows=rows, seconds=tuple(one_row + per_row * (r - 1) for r in rows))


@pytest.mark.parametrize(
    "waiting, want",
    [
        (1, 8),  # one prompt being read: the fair budget
        (2, 16),  # allowance 1.5 * 10 ms * 2 = 30 ms: 16 rows cost 25, 24 cost 33 by the table's line
        (3, 32),  # 45 ms: 32 rows cost 41, 48 cost 57
        (6, 64),  # 90 ms: 64 rows cost 73, 96 (past the table, by its slope) 105
        (8, 96),  # 120 ms: 96 rows cost 105, 128 cost 137
        (40, 512),  # 600 ms: the whole chunk (521 ms)
    ],
)
def test_each_prompt_being_read_brings_a_fair_pass(waiting, want):
    assert shared_rows(_costs(), 8, 512, waiting) == want


def test_the_budget_widens_only_while_the_prompts_outnumber_the_decoders():
    assert shared_rows(_costs(), 8, 512, 3, decoding=1) == 32
    assert shared_rows(_costs(), 8, 512, 3, decoding=3) == 8  # as many decoders: the fair budget
    assert shared_rows(_costs(), 8, 512, 6, decoding=2) == 64


def test_the_budget_never_passes_the_chunk_nor_falls_below_the_base():
    assert shared_rows(_costs(per_row=0.0), 8, 100, 50) == 100  # rows free: the chunk, not a step past it
    assert shared_rows(_costs(per_row=1.0), 8, 512, 50) == 8  # rows dear: the base even if it costs more
    assert shared_rows(_costs(), 512, 512, 50) == 512


class _Plan:
    def __init__(self, lanes: int):
        from speclane.pipeline.framework.spec import load_spec
        from tests.round.conftest import with_params

        self.graph = type(
            "G", (), {"spec": with_params(load_spec("prefill"), {"prefill_gather": {"lanes_per_pass": lanes}})}
        )


def test_a_plan_is_made_once_per_budget_and_only_prompts_a_pass_reads_count():
    made = []
    base, idle = _Plan(64), _Plan(64)
    share = PrefillShare(_costs(), {8: base, 512: idle}, lambda rows: made.append(rows) or (f"plan {rows}", rows))
    assert share.plan(1) is base and share.plan(40) is idle
    assert share.plan(7) == share.plan(7) == "plan 96"
    assert made == [96]
    one = PrefillShare(_costs(), {8: _Plan(1), 512: idle}, lambda rows: (rows, rows))
    assert one.rows(7) == 8  # one prompt a pass: the others wait their turn and bring no rows
    with pytest.raises(ValueError, match="pass-cost table"):
        PrefillShare(RoundCosts(), {8: base, 512: idle}, lambda rows: None)


def _burst(eng, short, longs):
    """Lane 0 decodes; then the long prompts arrive together. Each step's rows of the long prompts until they have
    all had their first token (the decoding lane has a token every step), then the run to its end: every lane's
    tokens."""
    eng.submit(short)
    eng.step()
    for req in longs:
        eng.submit(req)

    def prompt_rows():
        return sum(min(lane.kv_len, len(lane.prompt_ids)) for lane in eng.lanes.active.values() if lane is not first)

    first = eng._lane(short.id)
    read = []
    while eng.queue or any(lane.anchor < 0 for lane in eng.lanes.active.values()):
        before = prompt_rows()
        events = eng.step()
        read.append(prompt_rows() - before)
        assert any(isinstance(e, TokenEvent) and e.rid == short.id for e in events)  # the decoder goes on
    done = {}
    eng.generate([], on_event=lambda ev: done.update({ev.rid: ev.tokens}) if isinstance(ev, DoneEvent) else None)
    return read, done


def test_a_burst_is_read_in_wide_passes_with_the_same_greedy_tokens(targets):
    """Three 150-token prompts arrive while one lane decodes, in float32: while they outnumber the decoders, each step
    reads 32 rows (three fair passes' time) where the fixed budget reads 8, so the burst takes fewer steps, and
    every lane's tokens are those of the fixed budget."""
    (short,) = requests([prompt(5, seed=1)], max_tokens=120)
    longs = [r.model_copy(update={"id": r.id + 1}) for r in requests([prompt(150, seed=s) for s in (2, 3, 4)], 60)]
    runs = {}
    for share in (None, _costs()):
        eng = engine(targets["llama"], backend="none", max_lanes=4)
        eng.set_prefill_rows(8, share=share)
        runs[share is not None] = _burst(eng, short, longs)
    (fixed, fixed_tokens), (shared, shared_tokens) = runs[False], runs[True]
    assert sum(fixed) == sum(shared) == 450
    assert max(fixed) == 8 and shared[:5] == [32] * 5 and max(shared) == 32
    # the first prompt done, two wait on two decoding: the fair 8 rows a step from there
    assert set(shared[5:]) <= {8, 2} and len(shared) < 0.8 * len(fixed), (len(shared), len(fixed))
    assert shared_tokens == fixed_tokens and len(shared_tokens) == 4


def test_one_prompt_among_decoders_gets_the_fair_budget(targets):
    """A long prompt that arrives while two lanes decode is read 8 rows a step, as under the fixed budget."""
    eng = engine(targets["llama"], backend="none", max_lanes=4)
    eng.set_prefill_rows(8, share=_costs())
    shorts = [r.model_copy(update={"id": r.id + 10}) for r in requests([prompt(5, seed=s) for s in (5, 6)], 40)]
    for req in shorts:
        eng.submit(req)
    eng.step()
    (long,) = requests([prompt(150, seed=7)], max_tokens=4)
    eng.submit(long)
    for _ in range(5):
        eng.step()
    assert eng._lane(long.id).kv_len == 40


def test_serve_takes_the_budget_for_each_prompt_unless_one_is_given(targets, monkeypatch):
    """`speclane serve` (and a replica): no --prefill-rows, the measured fair budget for each prompt being read; a
    given budget is that many rows a step whatever waits."""
    monkeypatch.setattr(
        "speclane.stages.models.pass_cost.pass_costs",
        lambda target, costs, most: costs.set_probe((1, 8, 16, 64), (0.01, 0.014, 0.02, 0.05), "test"),
    )
    eng = engine(targets["llama"], backend="none", max_lanes=4)
    set_serve_budget(eng, None, None)
    assert eng.prefill_rows == 8 and eng.share is not None and eng.share.rows(7) == 128  # 105 ms: 90 by the slope
    set_serve_budget(eng, 24, None)
    assert eng.prefill_rows == 24 and eng.share is None
