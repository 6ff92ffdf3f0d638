"""Log-probabilities of committed tokens (`logprobs`, `top_logprobs`), as the engine reports them: the target's own
log_softmax at the row that chose each token, the same with speculation off, with n-gram drafts and with an MTP
drafter (float32: equal to rounding, the top tokens in the same order), equal to transformers' on the same tokens,
and nothing computed for a request that does not ask."""

from __future__ import annotations

import pytest
import torch

from speclane.stages.contract.events import TokenEvent
from tests.drafters.conftest import tiny, write_drafter  # noqa: F401  (tiny: a fixture)
from tests.models.target_artifacts import artifacts  # noqa: F401  (a fixture)
from tests.round.conftest import engine, mixed_prompts, requests

TOP = 5
# float32 log_softmax of one row, the row computed in passes of different row counts: a few ulps of a logit
TOL = 1e-4


def run(eng, prompts, **fields):
    """{request id: [TokenEvent, ...]} and the done events of `prompts` generated together."""
    events: dict = {}
    done = eng.generate(
        requests(prompts, max_tokens=20, **fields),
        on_event=lambda ev: events.setdefault(ev.rid, []).append(ev) if isinstance(ev, TokenEvent) else None,
    )
    return events, done


@pytest.fixture(scope="module")
def mtp_dir(tiny, tmp_path_factory):
    directory = tmp_path_factory.mktemp("mtp")
    write_drafter("mtp", tiny, directory)
    return str(directory)


def test_speculation_leaves_logprobs_and_ranks_unchanged(tiny, mtp_dir, artifacts):
    prompts = mixed_prompts(3)
    asked = {"logprobs": True, "top_logprobs": TOP}
    plain, _ = run(engine(tiny, "none"), prompts, **asked)
    runs = {
        "ngram": run(engine(tiny, "ngram", k=4), prompts, **asked),
        "mtp": run(engine(tiny, "mtp", k=3, options={"path": mtp_dir}), prompts, **asked),
    }
    for name, (spec, done) in runs.items():
        # rows past the first are read: ngram's accepted drafts (committed token j from row j); the random MTP
        # head's drafts are mostly rejected, but widen every pass, so each row is computed among others
        key = "accepted" if name == "ngram" else "drafted"
        assert sum(d.spec[key] for d in done) > 0, f"{name}: no draft {key}"
        for rid, want in plain.items():
            got = spec[rid]
            assert [e.token_id for e in got] == [e.token_id for e in want]
            for g, w in zip(got, want):
                assert g.logprob == pytest.approx(w.logprob, abs=TOL)
                assert [t for t, _ in g.top_logprobs] == [t for t, _ in w.top_logprobs], f"{name}: ranks differ"
                assert [v for _, v in g.top_logprobs] == pytest.approx([v for _, v in w.top_logprobs], abs=TOL)
    # the oracle: transformers' log_softmax over the same prompt + output, at the position before each token
    model = artifacts["llama"][1]
    for rid, evs in plain.items():
        ids = prompts[rid] + [e.token_id for e in evs]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        want = torch.log_softmax(logits, dim=-1)[len(prompts[rid]) - 1 : -1]
        got = torch.tensor([e.logprob for e in evs])
        assert torch.allclose(got, want.gather(1, torch.tensor(ids[len(prompts[rid]) :])[:, None])[:, 0], atol=TOL)
        assert [[t for t, _ in e.top_logprobs] for e in evs] == want.topk(TOP, dim=-1).indices.tolist()
        assert evs[0].prompt_tokens == len(prompts[rid]) and all(e.prompt_tokens is None for e in evs[1:])


def test_a_sampled_request_reports_the_raw_distribution(tiny):
    """With temperature and top_p the token is sampled from the processed distribution, but the log-probability
    reported is the raw model's (as vLLM's default): a token top_p would have cut still has its raw value."""
    prompts = mixed_prompts(2)
    sampled, _ = run(engine(tiny, "ngram", k=4), prompts, logprobs=True, top_logprobs=2, temperature=2.0, seed=7)
    plain, _ = run(engine(tiny, "none"), prompts, logprobs=True, top_logprobs=2, temperature=2.0, seed=7)
    for rid, evs in plain.items():
        assert [e.token_id for e in sampled[rid]] == [e.token_id for e in evs]
        assert [e.logprob for e in sampled[rid]] == pytest.approx([e.logprob for e in evs], abs=TOL)
        assert all(e.logprob <= e.top_logprobs[0][1] + TOL for e in evs)


def test_no_logprobs_unless_asked(tiny, monkeypatch):
    calls = []
    real = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    events, _ = run(engine(tiny, "ngram", k=4), mixed_prompts(2))
    assert calls == [] and all(e.logprob is None and e.top_logprobs == () for evs in events.values() for e in evs)
    # one lane asks, the other not: only the asking one carries them
    eng = engine(tiny, "ngram", k=4)
    reqs = requests(mixed_prompts(2), max_tokens=8)
    reqs[1] = reqs[1].model_copy(update={"logprobs": True})
    seen: dict = {}
    eng.generate(reqs, on_event=lambda ev: seen.setdefault(ev.rid, []).append(ev) if isinstance(ev, TokenEvent) else 0)
    assert all(e.logprob is None for e in seen[0]) and all(e.logprob is not None for e in seen[1])
    assert calls and all(e.top_logprobs == () for e in seen[1])
