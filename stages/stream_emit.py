"""stream_emit: committed runs go to their lanes one token at a time.

A stop token, stop string or max-token limit cuts a run where it falls and nothing past it is emitted; the last
committed token becomes the next anchor; the drafter takes in the committed rows; acceptance is counted.
The runs arrive on the host (kv_commit made the round's one transfer); nothing here touches the device.
"""
from __future__ import annotations

import attrs

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
        Port("runs", "int64", ("lanes", "k1"), "host"),
        Port("run_len", "int", ("lanes",), "host"),
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

    def run(self, lane_view, runs, run_len, committed_len, draft_len, batch, pass_out, drafter=None,
            drafter_state=None):
        if drafter is not None:
            drafter.observe(drafter_state, lane_view, batch, pass_out, committed_len, self.prefill)
        events = []
        for lane, row, n, drafted in zip(lane_view, runs.tolist(), run_len, draft_len):
            if self.prefill:
                if n == 0:
                    continue  # a chunk that does not finish the prompt samples nothing
            else:
                lane.count_round(drafted, n - 1)
            for token in row[:n]:
                text, done = push_token(lane, token)
                events.append(TokenEvent(lane.rid, len(lane.out_ids) - 1, token, text))
                if done:
                    break
            lane.anchor = row[n - 1]
        return {"events": events}
