"""drafter_commit: the drafter takes in the rows a pass committed; its window is the drafter's KV.

It runs next to kv_commit, with the same rule for how many rows each lane commits (`advance = "committed"`: the
anchor plus the accepted drafts; `"rows"`: every row of a prefill chunk), so a lane's drafter window and its KV
length move together. Device-side only (the backend appends to its window with the device lengths), so it does
not wait on the round's host copy. A backend without state (none, ngram, oracle) takes nothing in.
"""

from __future__ import annotations

import attrs

from speclane.stages.contract.lanes import Lane
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.kv_commit import _advance, advance_lengths
from speclane.stages.models.state import PassOutput, RowBatch


@register
@attrs.frozen
class DrafterCommit(Stage):
    kind = "drafter_commit"
    inputs = (
        Port("drafter", "object", optional=True, doc="the draft backend the draft stage built; None: no drafter"),
        Port("drafter_state", "object", optional=True, doc="the backend's per-slot state (its window)"),
        Port("lane_view", "record", ("lanes",), "host", record=Lane),
        Port("batch", "record", record=RowBatch),
        Port("pass_out", "record", record=PassOutput),
        Port("committed_len", "int64", ("lanes",), "device", optional=True),
        Port("prompt_rows", "int", ("lanes",), "host", optional=True, doc="a step's one pass: a prompt chunk's rows"),
    )
    outputs = ()
    mutates = ("drafter_state",)
    advance: str = attrs.field(default="committed", validator=_advance)

    def run(self, lane_view, batch, pass_out, drafter=None, drafter_state=None, committed_len=None, prompt_rows=None):
        if drafter is not None:
            lengths = advance_lengths(self.advance, committed_len, batch, prompt_rows)
            drafter.observe(drafter_state, lane_view, batch, pass_out, lengths)
        return {}
