"""The ZeroMQ wire protocol: one JSON object a frame, versioned, validated by pydantic with unknown keys refused.

This module owns the message schemas in both directions and turning raw frames into validated messages (or a
`ProtocolError` naming the field). The generate message reuses `speclane.pipeline.runtime.request.GenerateRequest` for
every sampling and spec field, so a default or a range is written once. Sockets, lanes and routing belong in
`pipeline/net/server.py` and `pipeline/net/client.py`; docs/protocol.md is the reference for humans.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import PydanticSerializationError

from speclane.pipeline.net.api_key import matches
from speclane.pipeline.runtime.request import GenerateRequest, HugeInt, _first_error, check_id, parse_request
from speclane.stages.contract.errors import RequestError, did_you_mean
from speclane.stages.contract.events import DoneEvent, TokenEvent

VERSION = 1
MAX_FIELD_CHARS, MAX_MESSAGE_CHARS = 200, 1000  # an error's field name and message, cut past these
Id = Annotated[str | int, BeforeValidator(check_id)]
# A message json cannot parse (nested too deep for its recursion) may still name its request: the first "id" key.
_ID_SALVAGE = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,256}"|-?\d{1,19})(?![\d.eE])')


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProtocolError(RequestError):
    """A message the server cannot act on; `rid` is the request id when the message carried a usable one."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_request", rid: Any = None):
        self.rid = rid
        super().__init__(message, field=field, code=code)


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    v: Literal[1] = VERSION


# --- client to server ---------------------------------------------------------------------------------------
class Generate(_Msg):
    """A generate request: the wrapper around GenerateRequest (the fields are documented there)."""

    type: Literal["generate"] = "generate"
    request: GenerateRequest


class Cancel(_Msg):
    type: Literal["cancel"] = "cancel"
    id: Id


class StatsQuery(_Msg):
    """Engine stats: lanes, queue, finished requests by reason, aggregated speculation metrics."""

    type: Literal["stats"] = "stats"
    id: Id | None = None


class GraphQuery(_Msg):
    """The verify round's stage graph as `speclane graph --json` prints it."""

    type: Literal["graph"] = "graph"
    id: Id | None = None


class MetricsQuery(_Msg):
    """The server's metrics in Prometheus' text format (what the HTTP door's GET /metrics answers)."""

    type: Literal["metrics"] = "metrics"
    id: Id | None = None


CLIENT_TYPES: dict[str, type[_Msg]] = {
    m.model_fields["type"].default: m for m in (Generate, Cancel, StatsQuery, GraphQuery, MetricsQuery)
}


# --- server to client ---------------------------------------------------------------------------------------
class Alternative(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_id: int
    token: str
    logprob: float


class Token(_Msg):
    type: Literal["token"] = "token"
    id: Id
    index: int  # position in the request's output, counting from 0, contiguous
    token_id: int
    text: str  # the text this token adds (may be "" while a possible stop string is held back)
    prompt_tokens: int | None = None  # the prompt's length, on the first token (index 0) only
    # With `logprobs`: the token alone as text, its log-probability, its `top_logprobs` likeliest (else None).
    token: str | None = None
    logprob: float | None = None
    top_logprobs: list[Alternative] | None = None


class Done(_Msg):
    type: Literal["done"] = "done"
    id: Id
    finish_reason: Literal["stop", "length", "cancelled"]
    usage: dict[str, int]
    spec: dict[str, Any]
    # The whole answer, so a client that missed token messages (a connection dropped and taken over mid-stream)
    # still has all of it: the concatenated token texts and the token ids, in order.
    text: str = ""
    token_ids: list[int] = []


class Error(_Msg):
    """Its `field` and `message` are cut to MAX_FIELD_CHARS and MAX_MESSAGE_CHARS: whatever a client sent, the
    answer to one message is one reply of bounded size."""

    type: Literal["error"] = "error"
    id: Id | None = None
    code: str
    field: Annotated[str, AfterValidator(lambda s: _clip(s, MAX_FIELD_CHARS))] | None = None
    message: Annotated[str, AfterValidator(lambda s: _clip(s, MAX_MESSAGE_CHARS))]


class StatsReply(_Msg):
    type: Literal["stats"] = "stats"
    id: Id | None = None
    lanes: dict[str, int]  # active, free, max
    queue: dict[str, int]  # waiting, max
    finished: dict[str, int]  # requests ended since start, by finish reason (and "error")
    clients: int  # clients with a request in flight, the one asking included
    spec: dict[str, Any]  # engine.stats over recently finished lanes
    checkpoints: dict[str, int] | None = None  # prompt checkpoints: hits, tokens reused, bytes held, ... (None: off)
    drafter: dict[str, int] | None = None  # what the drafter's state holds (suffix: cache tokens and budget, ...)
    replicas: list[dict[str, Any]] | None = None  # `serve --replicas`: {"id", "lanes", "queue", "served", "pid"} each
    passes: dict[str, int] | None = None  # target passes by kind: verify, one_pass, prefill (docs/protocol.md)


class GraphReply(_Msg):
    type: Literal["graph"] = "graph"
    id: Id | None = None
    graph: dict[str, Any]


class MetricsReply(_Msg):
    type: Literal["metrics"] = "metrics"
    id: Id | None = None
    text: str  # Prometheus' text exposition format, version 0.0.4


SERVER_TYPES: dict[str, type[_Msg]] = {
    m.model_fields["type"].default: m for m in (Token, Done, Error, StatsReply, GraphReply, MetricsReply)
}


def _salvaged_id(raw: bytes) -> Any:
    match = _ID_SALVAGE.search(raw)
    try:
        return check_id(json.loads(match.group(1))) if match else None
    except ValueError:
        return None


def _load(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw, parse_int=HugeInt.parse)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(
            f"the message is not JSON ({exc}); send one JSON object a frame", field="message", code="bad_json"
        ) from exc
    except RecursionError as exc:
        raise ProtocolError(
            "the message nests arrays or objects deeper than the server parses; no field takes nested values that deep",
            field="message",
            code="bad_json",
            rid=_salvaged_id(raw),
        ) from exc
    if not isinstance(data, dict):
        raise ProtocolError(f"a message must be a JSON object, got {type(data).__name__}", field="message")
    return data


def _header(data: dict[str, Any], types: dict[str, type[_Msg]]) -> type[_Msg]:
    if "v" not in data:
        raise ProtocolError(f"missing field 'v'; this server speaks protocol version {VERSION}", field="v")
    if type(data["v"]) is not int or data["v"] != VERSION:  # true and 1.0 equal 1 in Python, not on the wire
        raise ProtocolError(
            f"field 'v': unsupported protocol version {_shown(data['v'])}; use {VERSION}", field="v", code="bad_version"
        )
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in types:  # a list or an object cannot even be looked up
        hint = did_you_mean(kind, types) if isinstance(kind, str) and len(kind) < 64 else ""
        what = "missing field 'type'" if kind is None else f"field 'type': unknown message type {_shown(kind)}{hint}"
        raise ProtocolError(f"{what}; one of {', '.join(types)}", field="type")
    return types[kind]


def _shown(value: Any) -> str:
    """A client's value as an error message quotes it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 64 else text[:60] + "..."


def _usable_id(data: dict[str, Any]) -> Any:
    try:
        return check_id(data.get("id"))
    except ValueError:
        return None


def parse_client(raw: bytes, api_key: str | None = None) -> _Msg:
    """One client frame as a validated message; a ProtocolError names the first bad field. With `api_key`, the
    message's `key` field must be that key (checked before anything else is); without, a `key` is ignored."""
    data = _load(raw)
    rid = _usable_id(data)
    given = data.pop("key", None)
    if api_key is not None and not matches(given, api_key):
        raise ProtocolError(
            f"{'missing' if given is None else 'wrong'} field 'key': this server asks every message "
            "for its API key (`speclane client --api-key-file`, `Client(api_key=...)`)",
            field="key",
            code="invalid_api_key",
            rid=rid,
        )
    try:
        cls = _header(data, CLIENT_TYPES)
    except ProtocolError as exc:
        exc.rid = rid
        raise
    if cls is Generate:
        if "id" not in data:
            raise ProtocolError(
                "missing field 'id'; every generate request needs an id, unique among this client's requests in flight",
                field="id",
            )
        try:
            request = parse_request(data, extra_forbidden=("v", "type"))
        except RequestError as exc:
            raise ProtocolError(str(exc), field=exc.field, code=exc.code, rid=rid) from exc
        return Generate(request=request)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        field, message = _first_error(exc)
        raise ProtocolError(message, field=field, rid=rid) from exc


def parse_server(raw: bytes) -> _Msg:
    """One server frame as a validated message (the client's side of the schema)."""
    data = _load(raw)
    cls = _header(data, SERVER_TYPES)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        field, message = _first_error(exc)
        raise ProtocolError(f"server message: {message}", field=field) from exc


def generate_json(request: GenerateRequest) -> dict[str, Any]:
    """The wire form of a request: its fields flat beside v and type, defaults left out."""
    return {"v": VERSION, "type": "generate", **request.model_dump(exclude_unset=True), "id": request.id}


# OpenAI's stand-in for a log-probability of minus infinity, which JSON cannot write
MIN_LOGPROB = -9999.0


def token_msg(rid: Id, ev: TokenEvent, tokenizer: Any = None) -> Token:
    """The message of one token; with log-probabilities (the request asked) the tokens are decoded one by one."""
    msg = Token(id=rid, index=ev.index, token_id=ev.token_id, text=ev.text, prompt_tokens=ev.prompt_tokens)
    if ev.logprob is not None:
        msg.token, msg.logprob = tokenizer.decode([ev.token_id]), max(ev.logprob, MIN_LOGPROB)
        msg.top_logprobs = [
            Alternative(token_id=t, token=tokenizer.decode([t]), logprob=max(v, MIN_LOGPROB))
            for t, v in ev.top_logprobs
        ]
    return msg


def done_msg(rid: Id, ev: DoneEvent) -> _Msg:
    if ev.finish_reason == "error":
        return Error(id=rid, code="stage_error", message=f"the request failed inside the engine: {ev.error}")
    return Done(
        id=rid, finish_reason=ev.finish_reason, usage=ev.usage, spec=ev.spec, text=ev.text, token_ids=list(ev.tokens)
    )


def encode(msg: _Msg) -> bytes:
    """A message as one frame. Never raises on what a client sent: an id or text that UTF-8 cannot hold (a lone
    surrogate, which JSON's `\\ud800` escape lets a client send) is written back escaped, as ASCII JSON."""
    unset = isinstance(msg, Token)  # a token message carries its optional fields only when they are set
    try:
        return msg.model_dump_json(exclude_none=unset).encode()
    except (PydanticSerializationError, UnicodeEncodeError):
        return json.dumps(msg.model_dump(exclude_none=unset), ensure_ascii=True, default=str).encode()
