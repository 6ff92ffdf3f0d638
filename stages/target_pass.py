"""target_pass: every lane's rows (anchor + drafts, or a prompt chunk) through all target layers in one pass.

Attention writes keys and values for every row; Gated DeltaNet layers record per row what they need to
restore (`record="rows"`), or only each lane's final state (`record="last"`, prefill). Logits come out in
float32 for every row, or only for each lane's last row when that is all the round samples from (prefill).
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.models.state import PassOutput, RowBatch, TargetState


def _one_of(*choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(choices)}, got '{value}'")

    return check


@register
@attrs.frozen
class TargetPass(Stage):
    kind = "target_pass"
    inputs = (
        Port("target", "object", doc="the target model"),
        Port("target_state", "record", doc="KV caches, conv and recurrent state", record=TargetState),
        Port("batch", "record", record=RowBatch),
    )
    outputs = (
        Port("logits", "float32", ("logit_rows", "vocab"), "device", doc="every row, or each lane's last"),
        Port("cu_logits", "int64", ("lanes+1",), "device", doc="offsets of each lane's logit rows"),
        Port("pass_out", "record", doc="hidden, taps, recurrent records", record=PassOutput),
    )
    # each row's keys and values go into the KV cache past its lane's committed length: scratch a rerun overwrites
    touches = ("target_state",)
    record: str = attrs.field(default="rows", validator=_one_of("rows", "last"))
    logits: str = attrs.field(default="all", validator=_one_of("all", "last"))

    def run(self, target, target_state, batch):
        out = target.forward(batch, target_state, record=self.record, logits=self.logits)
        if self.logits == "all":
            cu = batch.cu_rows
        else:
            cu = torch.arange(len(batch.lane_rows) + 1, dtype=torch.int64, device=batch.cu_rows.device)
        return {"logits": out.logits, "cu_logits": cu, "pass_out": out}
