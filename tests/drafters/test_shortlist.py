"""The shortlist proposal head (`head = "shortlist"`, both model drafters): int8 rows of the target's most frequent
tokens. With every token listed in id order it drafts what the full (int8) head drafts; with a short list every
draft is a listed token; either way the target decides, so greedy output is the same as without speculation."""

import pytest
import torch

from speclane.pipeline.framework.spec import load_spec, with_params
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs
from tests.drafters.test_loading import backend
from tests.round.conftest import IdTokenizer, mixed_prompts, requests


def _engine(target, name, path, head, tokens=None):
    options = {"path": str(path), **({"shortlist_tokens": tokens} if tokens else {})}
    spec = with_params(load_spec("verify"), {"draft": {"backend": name, "head": head, "options": {name: options}}})
    eng = Engine(
        target,
        IdTokenizer(),
        spec=spec,
        knobs=SpecKnobs(draft_tokens=4, draft_plan="fixed"),
        max_lanes=2,
        max_len=512,
        check_contracts=True,
    )
    eng.raise_errors = True
    return eng


@pytest.mark.parametrize("name", ["mtp", "dflash2"])
def test_the_whole_vocabulary_as_a_shortlist_drafts_as_the_full_head(tiny, tiny_fitted, name):
    path, vocab = tiny_fitted[0], tiny.cfg.vocab_size
    runs = {}
    for head, tokens in (("full", None), ("shortlist", vocab), ("shortlist", 24)):
        eng = _engine(tiny, name, path, head, tokens)
        got = eng.generate(requests(mixed_prompts(3), 16))
        lanes = sorted(eng.retired, key=lambda lane: lane.order)
        runs[(head, tokens)] = ([r.tokens for r in got], [(lane.offered_at, lane.accepted_at) for lane in lanes])
    off = _engine(tiny, name, path, "full")
    want = [r.tokens for r in off.generate(requests(mixed_prompts(3), 16, spec={"enabled": False}))]
    assert runs[("shortlist", vocab)] == runs[("full", None)]  # the same drafts, so the same acceptance
    assert runs[("shortlist", 24)][1] != runs[("full", None)][1]  # a short list is in effect: other drafts
    assert all(tokens == want for tokens, _ in runs.values())  # the target decides every token


@pytest.mark.parametrize("name", ["mtp", "dflash2"])
def test_a_short_list_drafts_only_listed_tokens(tiny, tiny_fitted, name):
    drafter = backend(name, tiny, tiny_fitted[0], head="shortlist", shortlist_tokens=24)
    states = torch.randn(40, tiny.cfg.hidden_size)
    with torch.no_grad():
        drafts = drafter.head_argmax(states)
    listed = set(drafter.shortlist.ids.tolist())
    assert len(listed) == 24 and set(drafts.tolist()) <= listed and drafter.draft_head is None


def test_a_file_without_ranks_drafts_through_the_full_head(tiny, tmp_path, caplog):
    from speclane.stages.models import drafter_weights as dw

    torch.manual_seed(0)
    dw.export("mtp", dw.new_net("mtp", tiny.cfg), tmp_path, {"test": True})  # no shortlist.ranks
    with caplog.at_level("WARNING", logger="speclane.drafters"):
        drafter = backend("mtp", tiny, tmp_path, head="shortlist")
    assert drafter.shortlist is None and drafter.draft_head is not None
    assert any("no shortlist.ranks" in r.getMessage() and "full head" in r.getMessage() for r in caplog.records)
