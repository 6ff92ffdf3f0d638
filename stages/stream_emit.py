"""stream_emit: the one host transfer of the round; committed runs go to their lanes one token at a time.

A stop token, stop string or max-token limit cuts a run where it falls and nothing past it is emitted; the last
committed token becomes the next anchor; the drafter takes in the committed rows; acceptance is counted.
Everything before this stage stays on the device; this is where lengths become Python ints.
"""
from __future__ import annotations

import attrs
import torch

from stages.contract.events import TokenEvent
from stages.contract.lanes import push_token
from stages.contract.ports import Port
from stages.contract.registry import Stage, register


@register
@attrs.frozen
class StreamEmit(Stage):
    kind = "stream_emit"
    inputs = (
        Port("lane_view", "object", ("lanes",), "host"),
        Port("committed", "int64", ("lanes", "k1"), "device"),
        Port("committed_len", "int64", ("lanes",), "device"),
        Port("draft_len", "int", ("lanes",), "host"),
        Port("batch", "object"),
        Port("pass_out", "object"),
        Port("drafter_state", "object", optional=True),
        Port("drafter", "object", optional=True, doc="the draft backend (Resources.drafter); None: no drafter"),
    )
    outputs = (Port("events", "object", device="host", doc="list of TokenEvent"),)
    mutates = ("lane_view", "drafter_state")
    prefill: bool = False

    def run(self, lane_view, committed, committed_len, draft_len, batch, pass_out, drafter=None,
            drafter_state=None):
        if drafter is not None:
            drafter.observe(drafter_state, lane_view, batch, pass_out, committed_len, self.prefill)
        # One transfer for the whole round: runs and their lengths side by side.
        host = torch.cat([committed, committed_len[:, None]], dim=1).cpu().tolist()
        events = []
        for lane, row, n_rows, drafted in zip(lane_view, host, batch.lane_rows, draft_len):
            n = row[-1]
            if self.prefill:
                lane.kv_len += n_rows
                if n == 0:
                    continue  # a chunk that does not finish the prompt samples nothing
            else:
                lane.kv_len += n
                lane.count_round(drafted, n - 1)
            for token in row[:n]:
                text, done = push_token(lane, token)
                events.append(TokenEvent(lane.rid, len(lane.out_ids) - 1, token, text))
                if done:
                    break
            lane.anchor = row[n - 1]
        return {"events": events}
