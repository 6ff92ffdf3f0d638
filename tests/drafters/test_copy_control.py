"""The copy control in small (issue 18): answers that repeat their prompt verbatim, so every draft sits the same
distance back in the window. A block drafter with a working copy path drafts the copy at every block position after a
short fit (tiny llama target, seed 0, 200 steps of 16 anchors, lr 3e-3): dflash2 versions 2, 3 and 4, which can copy
only by finding the earlier occurrence by attention into their window, reached 1.000-1.022 tokens a round at k = 7, and
the full-size control (`python -m speclane.bench.drafter_controls copy`) found the same on the default model
(docs/artifacts.md). Version 5 (what fit-drafter makes) gives its block rows prompt lookup's candidates: the same fit
reaches 8.0. Both are tested, so the contrast is the regression test: a change that breaks the lookup path drops version
5 to version 4's figure."""

import pytest
import torch

from speclane.stages.fitting import controls as ctl
from speclane.stages.models import drafter_weights as dw

BAR = 3.0  # tokens a round at k = 7 on held-out copies


def _fit(tiny, version: int, window: int | None):
    taps = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    try:
        train = ctl.copy_sequences(tiny, 48, 0, (4, 101), prompt_len=24, span=24)
        held = ctl.copy_sequences(tiny, 8, 1, (4, 101), prompt_len=24, span=24)
    finally:
        tiny.hidden_taps = taps
    embed, head = tiny.weights.embed[4:101], tiny.weights.lm_head[4:101]  # the task's tokens, numbered from 4
    torch.manual_seed(0)
    net = dw.new_net("dflash2", tiny.cfg, version=version, **({"window": window} if window is not None else {}))
    ctl.run_fit(
        ctl.ControlFit("dflash2", steps=200, lr=3e-3, warmup=20, anchors=16),
        net,
        train,
        embed,
        head,
        log=lambda msg: None,
    )
    return ctl.acceptance("dflash2", net, held, embed, head)


def test_the_copy_task_labels_are_the_copied_text(tiny, monkeypatch):
    taps = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    try:
        seqs = ctl.copy_sequences(tiny, 3, 0, (4, 101), prompt_len=24, span=10)
    finally:
        tiny.hidden_taps = taps
    for q in seqs:
        t = q["tokens"]
        assert "next" not in q and q["start"] == 24 and len(t) == 34 and q["taps"].shape[0] == 33
        assert len(set(t[:24].tolist())) == 24  # each token names one place
        at = t[:24].tolist().index(int(t[24]))
        assert t[24:].tolist() == t[at : at + 10].tolist()
    # a drafter that proposes the copied text is accepted at every position (8 tokens a round at k = 7), one
    # that is off by one place at none
    for shift, tau in ((0, 8.0), (1, 1.0)):
        monkeypatch.setattr(
            ctl,
            "drafts_at",
            lambda b, n, q, e, h, anchors, width, s=shift: q["tokens"].long()[
                (anchors[:, None] + torch.arange(1, width + 1) + s).clamp(max=len(q["tokens"]) - 1)
            ],
        )
        assert ctl.acceptance("dflash2", torch.nn.Linear(1, 1), seqs, None, None)["tau"] == tau


def test_dflash2_copies_through_prompt_lookup(tiny):
    assert dw.FRESH_DFLASH2_VERSION == 5
    got = _fit(tiny, 5, None)
    assert got["tau"] >= BAR and got["accept"][6] > 0.2, got


def test_without_lookup_the_window_path_does_not_copy(tiny):
    """Version 4 (its block rows without candidates) in the same fit: the copy is not learnt by attention."""
    got = _fit(tiny, 4, None)
    assert got["tau"] < 1.5, got
