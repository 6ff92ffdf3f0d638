"""`fit-drafter --decay`: the weight of draft j's loss, exp(-(j - 1) / decay), reaches both drafters' losses (the
eleventh session's controls found decay 2 fitting dflash2 faster than the default 4, and "all alike" slower)."""

import pytest
import torch
from pydantic import ValidationError

from speclane.stages.fitting import losses as fit_losses
from speclane.stages.fitting.fit import FitSettings
from speclane.stages.fitting.objectives import OBJECTIVES
from speclane.stages.models import drafter_weights as dw
from tests.drafters.test_teacher_loss import _seqs


@pytest.mark.parametrize("backend", ["dflash2", "mtp"])
def test_the_decay_setting_is_the_losses_weighting(tiny, backend):
    seq = dict(_seqs(tiny, 1)[0])
    seq["next"] = seq["tokens"][1:]  # the text as the target's own choice: every draft of a chain counts
    torch.manual_seed(0)
    net = dw.new_net(backend, tiny.cfg).float()
    embed, head = tiny.weights.embed.float(), tiny.weights.lm_head.float()
    losses = {}
    for decay in (fit_losses.DECAY, 1.0, float("inf")):
        s = FitSettings(backend=backend, corpus=["x"], out="y", decay=decay, anchors=4)
        torch.manual_seed(1)  # the same anchors for every weighting
        losses[decay] = float(OBJECTIVES[backend].loss(s, net, seq, embed, head, None)[0].detach())
    torch.manual_seed(1)
    s = FitSettings(backend=backend, corpus=["x"], out="y", anchors=4)
    assert float(OBJECTIVES[backend].loss(s, net, seq, embed, head, None)[0].detach()) == losses[fit_losses.DECAY]
    assert len(set(losses.values())) == 3


def test_a_decay_of_zero_or_less_is_refused_naming_it():
    with pytest.raises(ValidationError, match="decay"):
        FitSettings(backend="dflash2", corpus=["x"], out="y", decay=0)
