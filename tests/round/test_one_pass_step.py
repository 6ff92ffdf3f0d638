"""A step's one pass: where lanes decode and others read their prompt, the prompt chunks' rows go through the decoding
lanes' verify pass (anchor_gather's `prompt_rows`), not a prefill pass of their own. Greedy and seeded output is the
same as with two passes a step, in float32, on the three target families; each step runs one pass; rows that would
take the pass past the decode route's 64 (a recurrent target's at all) get a prefill pass of their own."""

from __future__ import annotations

import pytest

from speclane.pipeline.framework.spec import parse_spec
from speclane.pipeline.runtime.prefill_share import StepPlans
from speclane.stages.anchor_gather import AnchorGather
from speclane.stages.contract.events import TokenEvent
from speclane.stages.models.target import Target
from tests.models.target_artifacts import FAMILIES
from tests.round.conftest import engine, mixed_prompts, prompt, requests


class NoPromptRows(AnchorGather):
    """anchor_gather as a user's stage of its own that takes no `prompt_rows` knob."""

    kind = "tests.round.test_one_pass_step:NoPromptRows"
    knobs = {k: v for k, v in AnchorGather.knobs.items() if k not in ("prompt_rows", "prompt_lanes")}


def staggered(eng, reqs, budget: int, one_pass: bool, every: int = 3) -> dict:
    """`reqs` submitted one every `every` steps, so prompts arrive while lanes decode; each request's token events."""
    eng.set_prefill_rows(budget, 2, one_pass=one_pass)
    out: dict = {}
    pending, n = list(reqs), 0
    while pending or eng.busy():
        if pending and n % every == 0:
            eng.submit(pending.pop(0))
        for ev in eng.step():
            if isinstance(ev, TokenEvent):
                out.setdefault(ev.rid, []).append(ev)
        n += 1
    return out


def counting_passes(monkeypatch) -> list[int]:
    rows: list[int] = []
    orig = Target.forward
    monkeypatch.setattr(Target, "forward", lambda self, b, *a, **kw: rows.append(b.rows) or orig(self, b, *a, **kw))
    return rows


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("backend", ["none", "ngram", "suffix"])
@pytest.mark.parametrize("budget", [3, 16])
def test_greedy_tokens_are_those_of_two_passes_a_step(targets, name, backend, budget):
    prompts = mixed_prompts(4) + [prompt(70, seed=21)]
    runs = [
        staggered(engine(targets[name], backend=backend, k=3, max_lanes=3), requests(prompts, 10), budget, one)
        for one in (True, False)
    ]
    assert {r: [e.token_id for e in evs] for r, evs in runs[0].items()} == {
        r: [e.token_id for e in evs] for r, evs in runs[1].items()
    }
    assert all(len(evs) == 10 for evs in runs[0].values()) and len(runs[0]) == len(prompts)


def test_seeded_sampling_and_logprobs_are_those_of_two_passes_a_step(targets):
    """Sampling keys its uniforms by output position, so the prompt's first token is drawn as a prefill pass draws
    it; a lane asking for logprobs takes the pass's logits path (every row's logits, the sampled rows picked)."""
    prompts = mixed_prompts(3) + [prompt(40, seed=22)]
    fields = {"temperature": 0.9, "seed": 7, "logprobs": True, "top_logprobs": 2}
    runs = [
        staggered(engine(targets["llama"], backend="ngram", k=3, max_lanes=2), requests(prompts, 8, **fields), 5, one)
        for one in (True, False)
    ]
    for rid, evs in runs[0].items():
        other = runs[1][rid]
        assert [e.token_id for e in evs] == [e.token_id for e in other]
        assert [e.logprob for e in evs] == pytest.approx([e.logprob for e in other], abs=1e-4)


def test_a_step_where_lanes_decode_and_prompts_wait_is_one_pass(targets, monkeypatch):
    """A 5-token prompt decodes while a 60-token one is read 8 rows a step: 8 passes of 8 + 1 rows (the last 4 + 1),
    then the two decode together, one pass a step; with two passes a step, 8 prefill passes beside the rounds."""
    rows = counting_passes(monkeypatch)
    eng = engine(targets["llama"], backend="none", max_lanes=2)
    eng.set_prefill_rows(8, 1)
    short, long = requests([prompt(5, seed=1), prompt(60, seed=2)], max_tokens=20)
    eng.submit(short)
    eng.step()
    eng.submit(long)
    for _ in range(8):
        rows.clear()
        eng.step()
        assert len(rows) == 1 and rows[0] in (9, 5)
    assert eng._lane(long.id).out_ids  # its first token came with its last chunk
    rows.clear()
    eng.step()
    assert rows == [2]
    assert eng.passes == {"prefill": 1, "one_pass": 8, "verify": 1}  # what `stats` reports as `passes`


def test_a_spec_without_the_knob_keeps_two_passes(targets):
    """A verify spec whose stages take no `prompt_rows` (a user's own) cannot carry prompt rows: two passes a step."""
    eng = engine(targets["llama"])
    assert eng.steps is not None and StepPlans.serves(eng.spec)
    data = eng.spec.model_dump(by_alias=True)
    data["stages"] = [
        {**st, "kind": "tests.round.test_one_pass_step:NoPromptRows"} if st["kind"] == "anchor_gather" else st
        for st in data["stages"]
    ]
    assert not StepPlans.serves(parse_spec(data, "no-prompt-rows"))


def test_a_failure_in_a_one_pass_step_ends_only_the_lanes_in_that_pass(targets):
    """After a commit a failed round's lanes end; a prompt waiting for a later pass is not one of them."""
    from tests.round.test_engine_failures import _spec_with_failure

    eng = engine(targets["llama"], spec=_spec_with_failure("kv_commit"), max_lanes=3)
    eng.set_prefill_rows(None, 1)
    eng.raise_errors = False
    good, bad, other = eng.generate(requests([[5, 6, 7], [5, 99, 7], [8, 9, 10, 11]], max_tokens=6))
    assert good.finish_reason == bad.finish_reason == "error"
    assert other.finish_reason == "length" and len(other.tokens) == 6


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("k, one", [(7, False), (3, True)])
def test_prompt_rows_never_take_the_decoding_lanes_past_the_decode_route(targets, monkeypatch, name, k, one):
    """Up to 64 rows a pass computes each row as a one-row decode does. Eight lanes drafting up to 7 may fill 64
    rows: a prompt's 8 rows then get a prefill pass of their own, after the round; drafting up to 3 (32 rows at
    most) they join the round."""
    rows = counting_passes(monkeypatch)
    eng = engine(targets[name], backend="ngram", k=k, max_lanes=9)
    eng.set_prefill_rows(8)
    for r in requests([prompt(6, seed=s) for s in range(8)], max_tokens=30):
        eng.submit(r)
    eng.step()  # the eight prompts in one pass: nothing decodes yet
    eng.submit(requests([prompt(40, seed=30)], max_tokens=4)[0])
    rows.clear()
    eng.step()
    assert len(rows) == (1 if one else 2) and rows[0] <= 64, rows
    assert rows[0] >= 8 + 8 if one else rows[1] == 8  # the decoders' rows and the prompt's 8, or its own pass


def test_serves_budget_gives_a_one_pass_the_rows_its_round_can_take_at_the_fair_cost(targets, monkeypatch):
    """With serve's measured budget a one pass reads the fair budget or, where the round's own pass in the table
    grows by at most 1.5 one-row passes with more, that many: here a table where each row past the first costs 0.1
    of a one-row pass gives a one-row round 15 prompt rows (1.4 one-row passes), against a fair budget of 4; a fixed
    `--prefill-rows 4` stays 4 (plus the decoding row)."""
    from speclane.pipeline.runtime.prefill_share import set_serve_budget
    from speclane.stages.models import pass_cost

    rows_table = (1, 2, 4, 8, 16, 32, 64)
    monkeypatch.setattr(
        pass_cost,
        "pass_costs",
        lambda target, costs, most: costs.set_probe(rows_table, tuple(0.01 + 0.001 * (r - 1) for r in rows_table), "t"),
    )
    monkeypatch.setattr(pass_cost, "fair_prefill_rows", lambda *a, **kw: 4)
    for fixed, want in ((None, 16), (4, 5)):
        rows = counting_passes(monkeypatch)
        eng = engine(targets["llama"], backend="none", max_lanes=2)
        set_serve_budget(eng, fixed, None)
        eng.submit(requests([prompt(5, seed=1)], max_tokens=12)[0])
        eng.step()
        eng.submit(requests([prompt(60, seed=2)], max_tokens=2)[0])
        rows.clear()
        eng.step()
        assert rows == [want], (fixed, rows)
