"""Fixtures for the model-drafter tests: the tiny random llama target (tests/models) and freshly made drafter files."""

from __future__ import annotations

import pytest
import torch

from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.target import Target
from tests.models.target_artifacts import VOCAB, artifacts, prompt  # noqa: F401  (fixtures)


@pytest.fixture(scope="session")
def tiny(artifacts):
    """The tiny llama target in float32."""
    torch.set_num_threads(1)
    return Target.load(artifacts["llama"][0], dtype=torch.float32)


def write_drafter(backend: str, target, directory, seed: int = 0):
    """Random drafter files for `target` in `directory` (what fit-drafter writes, before any fitting)."""
    torch.manual_seed(seed)
    net = dw.new_net(backend, target.cfg)
    extra = {"shortlist.ranks": torch.arange(target.cfg.vocab_size, dtype=torch.int32)}
    dw.export(backend, net, directory, {"test": True}, extra)
    return net


@pytest.fixture(scope="session")
def tiny_fitted(tiny, tmp_path_factory):
    """dflash2 and mtp fitted for a few seconds to the tiny target: a directory holding both, and the first-draft
    acceptance on held-out sequences before and after (name -> (before, after)), counted only where the target's
    choice is not the anchor itself. This random tiny target mostly repeats its input token (99 % of its greedy
    continuations, 88 % of positions of random text), which a drafter that copies its anchor hits untrained; the
    other positions are the test. The sequences are random tokens teacher-forced through the target (labels: its
    greedy choice at every position), since its own continuations are almost all repeats."""
    from speclane.stages.fitting import data as fit_data
    from speclane.stages.fitting import losses as fit_losses

    torch.manual_seed(0)
    taps = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    texts = [prompt(32, seed=300 + i) for i in range(240)]
    seqs = fit_data.forced(tiny, [("code", t[:8], t) for t in texts], chunk_rows=640)
    tiny.hidden_taps = taps
    for q in seqs:
        q["taps"] = q["taps"].float()
    train, held = seqs[:200], seqs[200:]
    embed, head = tiny.weights.embed, tiny.weights.lm_head
    directory = tmp_path_factory.mktemp("tiny-drafters")
    scores = {}
    for name in ("dflash2", "mtp"):
        net = dw.new_net(name, tiny.cfg)

        def accepted():
            acc, keep = [], []
            for q in held:
                if name == "dflash2":
                    a = fit_losses.dflash2_accepts(net, q, embed, head)
                    anchors = fit_losses.answer_anchors(q, net.cfg.block_size - 1)
                else:
                    a = fit_losses.mtp_accepts(net, q, embed, head, 3)
                    chains = fit_losses.mtp_chains(q)
                    anchors = chains[chains + 4 < len(q["tokens"])] + 1
                acc.append(a[:, 0])
                keep.append(q["next"][anchors] != q["tokens"][anchors])  # the target does not repeat the anchor
            return float(torch.cat(acc)[torch.cat(keep)].float().mean())

        before = accepted()
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
        for step in range(400):
            q = train[step % len(train)]
            if name == "dflash2":
                loss, _ = fit_losses.dflash2_loss(net, q, embed, head, fit_losses.answer_anchors(q, 1))
            else:
                loss, _ = fit_losses.mtp_loss(net, q, embed, head, 3)
            loss.backward()
            opt.step()
            opt.zero_grad()
        scores[name] = (before, accepted())
        extra = {"shortlist.ranks": torch.arange(VOCAB, dtype=torch.int32)}
        dw.export(name, net, directory, {"test": "tiny fit"}, extra)
    return directory, scores
