"""The round probe on a small artifact: every setting's rounds measured, acceptance as chances of runs of accepted
drafts, and the table cached by the text it was measured on."""

import pytest
import torch

from speclane.pipeline.runtime import drafter_probe
from speclane.stages.models.target import Target
from speclane.stages.models.tokenizer import Tokenizer
from tests.models.target_artifacts import artifacts, with_words  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def loaded(artifacts, tmp_path_factory):  # noqa: F811
    where = with_words(artifacts["llama"][0], tmp_path_factory.mktemp("probe") / "llama")
    return Target.load(where, dtype=torch.float32), Tokenizer.load(where)


def test_the_probe_times_every_setting_and_measures_acceptance(loaded, monkeypatch, tmp_path):
    monkeypatch.setattr(drafter_probe, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(drafter_probe, "REPEATS", 1)
    target, tok = loaded
    repeat = [5, 9, 14, 5, 9, 14, 5, 9, 14, 5, 9]  # text that repeats: prompt lookup finds its drafts
    prompts = [repeat, [7, 8, 11, 12, 7, 8], [20, 21, 22]]
    got = drafter_probe.probe(target, tok, "ngram", (1, 2), prompts, 12)
    assert {(n, w) for n, w, _ in got.rounds} == {(1, 1), (1, 7), (2, 1), (2, 7)}
    assert all(s > 0 for _, _, s in got.rounds)
    assert len(got.accept) == drafter_probe.WIDEST
    assert all(0.0 <= b <= a <= 1.0 for a, b in zip(got.accept, got.accept[1:]))  # runs of accepted drafts
    assert got.where == "3 prompt(s), 12 tokens a lane"
    # how often a round drafts j or more: at most 1, falling with j, and at least what accepting j needs
    assert len(got.offered) == drafter_probe.WIDEST and 0.0 < got.offered[0] <= 1.0
    assert all(b <= a for a, b in zip(got.offered, got.offered[1:]))
    assert all(a <= o for a, o in zip(got.accept, got.offered))
    off = drafter_probe.probe(target, tok, "none", (1, 2), prompts, 12)
    assert {(n, w) for n, w, _ in off.rounds} == {(1, 0), (2, 0)} and off.accept == () and off.proposals == ()

    def no_run(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(drafter_probe, "_run", no_run)
    assert drafter_probe.probe(target, tok, "ngram", (1, 2), prompts, 12) == got  # cached
    assert drafter_probe.probe(target, tok, "ngram", (1,), prompts, 12) == got  # a subset of what was measured
    with pytest.raises(AssertionError, match="measured again"):
        drafter_probe.probe(target, tok, "ngram", (1, 2), prompts[:2], 12)  # other text: measured anew
    with pytest.raises(ValueError, match="lanes"):
        drafter_probe.probe(target, tok, "ngram", (0,), prompts, 12)
