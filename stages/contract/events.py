"""What a round hands back to the engine's caller: one event per streamed token, one per finished request."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class TokenEvent:
    rid: str | int
    index: int  # position in the request's output, from 0
    token_id: int
    text: str


@attrs.frozen
class DoneEvent:
    rid: str | int
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    usage: dict[str, int]
    spec: dict[str, Any]
    text: str = ""  # the whole output text
    tokens: tuple[int, ...] = ()
    error: str | None = None
