"""The mtp proposal in one C call (kernels/draft_chain.py) drafts exactly what the step loop it replaces drafts
(stages/drafters/mtp.py, `_draft_in_place`: the same C calls from Python), on the embedded default model in bf16,
for two lanes at once and a window part-full; and the engine with it still gives speculation off's tokens. A
catch-up's window rows project in one C call too (`mtp_project`), to the torch route's keys and values."""

from __future__ import annotations

import pytest
import torch

from speclane.kernels.draft_chain import chain_serves
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.loading import load_model

pytestmark = pytest.mark.skipif(not chain_serves(), reason="the C chain needs the AVX512-BF16 build of the kernels")

PROMPTS = ["Write a Python function that merges two sorted lists.", "List three uses of a hash map."]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_model(None, "bfloat16")


def _engine(model, backend):
    target, tok = model
    knobs = SpecKnobs(backend=backend, draft_tokens=7, draft_plan="fixed")
    eng = Engine(target, tok, knobs=knobs, max_lanes=2, max_len=512)
    eng.raise_errors = True
    return eng


@torch.no_grad()
def test_the_chain_drafts_what_the_step_loop_drafts(model):
    eng = _engine(model, "mtp")
    mtp = eng.drafter
    assert mtp.chain is not None
    seen, real = [], type(mtp).propose

    def capture(self, lanes, anchors, limits, state):
        out = real(self, lanes, anchors, limits, state)
        if max(limits) > 0 and len(seen) < 6:
            chained = self.draft(lanes, anchors, limits, state)  # through the chain (the window is caught up)
            chain, self.chain = self.chain, None
            try:
                looped = self.draft(lanes, anchors, limits, state)
            finally:
                self.chain = chain
            seen.append((chained, looped))
        return out

    mtp.propose = capture.__get__(mtp)
    reqs = [parse_request({"id": i, "prompt": p, "max_tokens": 24}) for i, p in enumerate(PROMPTS)]
    eng.generate(reqs, chat=True)
    assert len(seen) == 6 and any(c.shape[0] == 2 for c, _ in seen)
    for chained, looped in seen:
        assert torch.equal(chained, looped)


@torch.no_grad()
def test_greedy_output_with_the_chain_equals_speculation_off(model):
    reqs = lambda: [parse_request({"id": i, "prompt": p, "max_tokens": 24}) for i, p in enumerate(PROMPTS)]  # noqa: E731
    off = [r.tokens for r in _engine(model, "none").generate(reqs(), chat=True)]
    eng = _engine(model, "mtp")
    on = [r.tokens for r in eng.generate(reqs(), chat=True)]
    assert on == off
    assert eng.stats(list(eng.retired))["accepted"] > 0


@torch.no_grad()
def test_forced_tokens_are_drafts_and_the_next_steps_inputs(model):
    """Prompt lookup's trusted tokens (`forced`) are the drafts where given and the following steps read them, in
    the C chain and in the step loop alike: a step after a forced token drafts what it drafts after that token."""
    eng = _engine(model, "mtp")
    mtp = eng.drafter
    seen, real = [], type(mtp).propose

    def capture(self, lanes, anchors, limits, state):
        out = real(self, lanes, anchors, limits, state)
        if max(limits) >= 4 and len(seen) < 3:
            width = max(limits)
            free = self._draft_steps(lanes, anchors, width, state, None)
            forced = torch.full_like(free, -1)
            forced[:, 1] = (free[:, 1] + 1) % self.embed.shape[0]  # a token the head did not choose
            chained = self._draft_steps(lanes, anchors, width, state, forced)
            chain, self.chain = self.chain, None
            try:
                looped = self._draft_steps(lanes, anchors, width, state, forced)
            finally:
                self.chain = chain
            seen.append((free, forced, chained, looped))
        return out

    mtp.propose = capture.__get__(mtp)
    reqs = [parse_request({"id": i, "prompt": p, "max_tokens": 24}) for i, p in enumerate(PROMPTS)]
    eng.generate(reqs, chat=True)
    assert len(seen) == 3
    for free, forced, chained, looped in seen:
        assert torch.equal(chained, looped)
        assert torch.equal(chained[:, 1], forced[:, 1]) and torch.equal(chained[:, 0], free[:, 0])
    assert any(not torch.equal(c[:, 2:], f[:, 2:]) for f, _, c, _ in seen)  # the forced token steered later steps


@torch.no_grad()
def test_window_rows_project_in_one_call_as_the_torch_route_does(model):
    """A catch-up's rows (taken from a run) and rows far along the sequence (the RoPE table grown past them)
    project through the one C call to the torch route's keys and values (fusion, norm, k and v products, RoPE):
    bit for bit but where torch's product of many rows rounds a value the other way."""
    eng = _engine(model, "mtp")
    mtp = eng.drafter
    seen, real = [], type(mtp).project

    def capture(self, raw, positions):
        seen.append((raw.clone(), positions.clone()))
        return real(self, raw, positions)

    mtp.project = capture.__get__(mtp)
    eng.generate([parse_request({"id": i, "prompt": p, "max_tokens": 16}) for i, p in enumerate(PROMPTS)], chat=True)
    assert len(seen) >= 3 and mtp.chain is not None
    far = (seen[0][0][:3], torch.tensor([9000, 5000, 17]))
    for raw, positions in seen[:4] + [far]:
        k, v, _ = real(mtp, raw, positions)
        want_k, want_v = mtp.net.pair_kv(mtp.net.fuse(raw[:, 0], raw[:, 1]), positions)
        for got, want in ((k, want_k), (v, want_v)):  # torch's GEMM of many rows may sum in another order
            torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-10)
            assert (got == want).float().mean() > 0.99
    assert mtp.rope_rows[0].shape[0] > 9000


def test_lookup_trust_is_checked():
    from speclane.stages.models.lookup import trust_option

    assert trust_option("mtp", 3) == 3
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="mtp option lookup_trust must be an integer >= 0"):
            trust_option("mtp", bad)
