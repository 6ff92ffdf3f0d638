"""stream_emit: the committed runs go to their lanes as token events, one token at a time.

Each token is appended to its lane and detokenized; a stop token, stop string or the max-token limit cuts a run
where it falls and nothing past it is emitted; the last committed token becomes the next anchor. The runs arrive
on the host (kv_commit made the round's one copy); nothing here touches a KV length or the drafter. The one
exception is a round where some lane asked for log-probabilities (accept's `logprobs`): they are copied to the host
here, once, and ride on that lane's token events.
"""

from __future__ import annotations

import attrs

from speclane.stages.contract.errors import ContractError
from speclane.stages.contract.events import RowLogprobs, TokenEvent
from speclane.stages.contract.lanes import Lane, push_token
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register


@register
@attrs.frozen
class StreamEmit(Stage):
    kind = "stream_emit"
    inputs = (
        Port("lane_view", "record", ("lanes",), "host", record=Lane),
        Port("runs", "int64", ("lanes", "k1"), "host"),
        Port("run_len", "int", ("lanes",), "host"),
        Port("logprobs", "record", record=RowLogprobs, optional=True, doc="from accept, when a lane asks"),
        Port("final", "bool", ("lanes",), "host", optional=True, doc="whether a lane commits a token this pass"),
    )
    outputs = (Port("events", "record", ("events",), "host", doc="one per streamed token", record=TokenEvent),)
    mutates = ("lane_view",)
    # prefill: a lane whose chunk does not end its prompt commits no token and emits nothing; in a verify round
    # every lane commits at least its bonus, so an empty run there is refused (it would leave no anchor)
    prefill: bool = False

    def run(self, lane_view, runs, run_len, logprobs=None, final=None):
        events = []
        lps = _host(logprobs)
        for i, (lane, row, n) in enumerate(zip(lane_view, runs.tolist(), run_len)):
            if n == 0:
                if self.prefill or (final is not None and not final[i]):  # a prompt chunk that does not end it
                    continue
                raise ContractError(
                    f"stream_emit: lane {lane.rid!r} committed no token in a verify round; accept "
                    f"commits at least the bonus (run_len >= 1)"
                )
            for j, token in enumerate(row[:n]):
                text, done = push_token(lane, token)
                index = len(lane.out_ids) - 1
                extra = {"prompt_tokens": len(lane.prompt_ids)} if index == 0 else {}
                if lps is not None and lane.request.logprobs:
                    chosen, ids, values = lps
                    top = lane.request.top_logprobs
                    extra.update(logprob=chosen[i][j], top_logprobs=tuple(zip(ids[i][j][:top], values[i][j][:top])))
                events.append(TokenEvent(lane.rid, index, token, text, **extra))
                if done:
                    break
            lane.anchor = row[n - 1]
        return {"events": events}


def _host(logprobs: RowLogprobs | None):
    """The round's log-probabilities as nested lists (one copy to the host), or None."""
    if logprobs is None:
        return None
    return logprobs.chosen.tolist(), logprobs.top_ids.tolist(), logprobs.top_values.tolist()
