"""recurrent_replay: each lane's conv and recurrent state become exactly those after its committed prefix.

The target pass recorded, per Gated DeltaNet layer, what every row left behind; this stage restores the
record of each lane's last committed row (row committed_len - 1 of the lane), so a rejected draft leaves no
trace, conv window included. Prefill (`advance = "rows"`) takes each lane's final record.
"""

from __future__ import annotations

import attrs

from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.kv_commit import _advance, advance_lengths
from speclane.stages.models.state import PassOutput, RowBatch, TargetState


@register
@attrs.frozen
class RecurrentReplay(Stage):
    kind = "recurrent_replay"
    inputs = (
        Port("target", "object"),
        Port("target_state", "record", record=TargetState),
        Port("batch", "record", record=RowBatch),
        Port("pass_out", "record", record=PassOutput),
        Port("committed_len", "int64", ("lanes",), "device", optional=True),
        Port("prompt_rows", "int", ("lanes",), "host", optional=True, doc="a step's one pass: a prompt chunk's rows"),
    )
    outputs = ()
    mutates = ("target_state",)
    advance: str = attrs.field(default="committed", validator=_advance)

    def run(self, target, target_state, batch, pass_out, committed_len=None, prompt_rows=None):
        lengths = advance_lengths(self.advance, committed_len, batch, prompt_rows)
        target.commit(target_state, batch, lengths, pass_out)
        return {}
