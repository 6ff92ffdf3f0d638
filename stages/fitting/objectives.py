"""What differs between fitting a dflash2 and an mtp drafter, behind one interface; the loop (`fit.py`) is shared.

An objective says which of the target's taps its drafter reads, the loss of one training sequence, the held-out
acceptance of one sequence, and the extra tensors exported beside the net. Not here: the losses' math
(`losses.py`), data (`data.py`), the networks (`stages/models`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from speclane.stages.fitting import losses as fit_losses


class Objective:
    name: ClassVar[str] = ""
    keep_taps: ClassVar[slice] = slice(None)  # the taps each sequence keeps once loaded

    def loss(self, s: Any, net, seq: dict, embed: Tensor, head: Tensor, teacher) -> tuple[Tensor, int] | None:
        """(loss, rows fitted) of one sequence, or None when it has nothing to fit."""
        raise NotImplementedError

    def accepts(self, s: Any, net, seq: dict, embed: Tensor, head: Tensor) -> Tensor:
        raise NotImplementedError

    def extra(self, train: list[dict], head: Tensor) -> dict[str, Tensor]:
        """The shortlist head's order: tokens by how often the target wrote them in the training answers."""
        counts = torch.bincount(torch.cat([q["tokens"][q["start"] :].long() for q in train]), minlength=head.shape[0])
        return {"shortlist.ranks": torch.argsort(counts, descending=True, stable=True).to(torch.int32)}


class DFlash2Objective(Objective):
    name = "dflash2"

    def loss(self, s, net, seq, embed, head, teacher):
        cand = fit_losses.answer_anchors(seq, 1)
        if len(cand) == 0:
            return None
        anchors = cand[torch.randperm(len(cand))[: s.anchors]].sort().values
        return fit_losses.dflash2_loss(net, seq, embed, head, anchors, teacher, decay=s.decay)

    def accepts(self, s, net, seq, embed, head):
        return fit_losses.dflash2_accepts(net, seq, embed, head)


class MtpObjective(Objective):
    name = "mtp"
    keep_taps = slice(-1, None)  # mtp reads only the last layer's output

    def loss(self, s, net, seq, embed, head, teacher):
        return fit_losses.mtp_loss(net, seq, embed, head, s.depth, teacher, decay=s.decay)

    def accepts(self, s, net, seq, embed, head):
        return fit_losses.mtp_accepts(net, seq, embed, head, s.depth)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (DFlash2Objective(), MtpObjective())}
