"""What a round hands back to the engine's caller: one event per streamed token, one per finished request."""

from __future__ import annotations

from typing import Any

import attrs

from speclane.stages.contract.ports import Port


@attrs.frozen
class TokenEvent:
    rid: str | int
    index: int  # position in the request's output, from 0
    token_id: int
    text: str
    # the prompt's length, on the first token (index 0) only: it rides along, no part of what the event says
    prompt_tokens: int | None = attrs.field(default=None, eq=False)
    logprob: float | None = None  # the target's log-probability of this token, when the request asks
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), most likely first


@attrs.frozen
class RowLogprobs:
    """The target's log-probabilities of each lane's committed run (accept makes it only when a lane asks): the row
    that chose committed token j of lane i is the one read. Values past a lane's committed length mean nothing."""

    chosen: Any  # [lanes, k1] float32: log_softmax of the row's raw logits at the committed token
    top_ids: Any  # [lanes, k1, top] int64: the row's most likely tokens, most likely first
    top_values: Any  # [lanes, k1, top] float32: their log-probabilities

    PORTS = (Port("chosen", "float32", ("lanes", "k1"), "device"),)


@attrs.frozen
class DoneEvent:
    rid: str | int
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    usage: dict[str, int]
    spec: dict[str, Any]
    text: str = ""  # the whole output text
    tokens: tuple[int, ...] = ()
    error: str | None = None
