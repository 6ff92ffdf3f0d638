"""`fit-drafter --loss kl`: the teacher's distribution is the target's own next-token distribution at the row a
draft is labelled from, and both losses line their rows up with the hard labels (a teacher sharpened to one-hot
gives the cross-entropy loss back)."""

import torch

from speclane.stages.fitting import data as fit_data
from speclane.stages.fitting import losses as fit_losses
from speclane.stages.models import drafter_weights as dw
from tests.models.target_artifacts import prompt


def _seqs(tiny, n=4):
    taps = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    try:
        seqs = fit_data.forced(tiny, [("code", t[:8], t) for t in (prompt(32, seed=500 + i) for i in range(n))])
    finally:
        tiny.hidden_taps = taps
    return seqs


def _teacher(tiny, sharpen=1.0):
    return fit_losses.Teacher(tiny.weights.final_norm.float() * sharpen, tiny.cfg.rms_norm_eps)


def test_teacher_is_the_targets_distribution(tiny):
    for q in _seqs(tiny):
        rows = torch.arange(len(q["next"]))
        p = fit_losses.teacher_probs(q, rows, tiny.weights.lm_head, _teacher(tiny))
        assert torch.allclose(p.sum(-1), torch.ones(len(rows)), atol=1e-4)
        top = p.topk(2, dim=-1).values.log()
        clear = top[:, 0] - top[:, 1] > 0.05  # not a near-tie (the taps are stored bf16)
        assert clear.float().mean() > 0.7
        assert torch.equal(p.argmax(-1)[clear], q["next"].long()[clear])


def test_a_one_hot_teacher_gives_the_hard_loss_back(tiny):
    torch.manual_seed(0)
    head = tiny.weights.lm_head
    for backend in ("mtp", "dflash2"):
        net = dw.new_net(backend, tiny.cfg)
        for q in _seqs(tiny, 2):
            q["taps"] = q["taps"].float()
            if backend == "mtp":
                ce, rows = fit_losses.mtp_loss(net, q, tiny.weights.embed, head, 3)
                kl, rows_kl = fit_losses.mtp_loss(net, q, tiny.weights.embed, head, 3, _teacher(tiny, 1e4))
                soft, _ = fit_losses.mtp_loss(net, q, tiny.weights.embed, head, 3, _teacher(tiny))
            else:
                anchors = fit_losses.answer_anchors(q, 1)
                ce, rows = fit_losses.dflash2_loss(net, q, tiny.weights.embed, head, anchors)
                kl, rows_kl = fit_losses.dflash2_loss(net, q, tiny.weights.embed, head, anchors, _teacher(tiny, 1e4))
                soft, _ = fit_losses.dflash2_loss(net, q, tiny.weights.embed, head, anchors, _teacher(tiny))
            assert rows == rows_kl
            assert abs(float(kl.detach()) - float(ce.detach())) < 0.02 * float(ce.detach()), backend
            assert abs(float(soft.detach()) - float(ce.detach())) > 1e-3, (
                backend
            )  # the soft labels are not the hard ones
