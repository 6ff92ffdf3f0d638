"""OpenAI's HTTP shapes for the gateway (pipeline/net/http.py): the request bodies, their translation into
speclane requests, the response and stream-chunk bodies, and the error body.

A body is validated with unknown keys refused, as every edge of speclane is; the fields OpenAI clients send by
habit, and vLLM's extras (openai_extras.py), are accepted when they ask for nothing speclane does not do (penalties
of 0, `user`), and refused, naming the field, when they do. The sampling fields are then checked once more by
`parse_request`, so a range is written once. `n` choices become n speclane requests. Sockets and routes belong in
http.py, answer shapes in openai_shapes.py; the engine never sees these shapes.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from speclane.pipeline.net.openai_extras import ChatExtras, CompletionExtras, SharedExtras
from speclane.pipeline.runtime.request import GenerateRequest, _first_error, parse_request
from speclane.stages.contract.errors import RequestError

# Error `type` by HTTP status, as OpenAI's own API names them (an unknown URL or model is an invalid request there).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
    504: "timeout",
}
# A speclane server error code -> the HTTP status it is answered with (any other: 400).
STATUS_BY_CODE = {
    "queue_full": 429,
    "client_queue_full": 429,
    "stage_error": 500,
    "internal": 500,
    "server_stopping": 503,
}


class HttpError(Exception):
    """An answer in OpenAI's error shape: `status`, and the body's message, param and code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.logged = False  # True for the answer to a server error: the server logged that request

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "error"),
                "param": self.param,
                "code": self.code,
            }
        }


def for_http(message: str) -> str:
    """A speclane error as an HTTP client reads it: the page that documents its fields is docs/http.md, never the
    ZeroMQ protocol's page that the request model's messages name."""
    return message.replace("docs/protocol.md", "docs/http.md")


class _Body(BaseModel):
    # Strict: "16" is not a max_tokens nor "yes" a stream, as at the ZeroMQ door (pipeline/runtime/request.py).
    model_config = ConfigDict(extra="forbid", strict=True)


MAX_N = 16  # choices of one request; each is a lane


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage (so far) on every chunk


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _Generate(SharedExtras):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    best_of: int | None = None  # vLLM's: taken when it is n (speclane returns every choice it makes)
    user: str | None = None
    ignore_eos: bool | None = None  # vLLM's extras: decode to max_tokens whatever the model says,
    top_k: int | None = None  # sample from the k most likely tokens,
    request_id: str | None = None  # the answer's id,
    return_tokens_as_token_ids: bool | None = None  # log-probabilities name tokens as "token_id:N"
    # speclane's per-request speculation control, the `spec` of docs/protocol.md: {"enabled": false},
    # {"draft_tokens": 3}. With the openai client: extra_body={"speclane": {...}}.
    speclane: dict[str, Any] | None = None

    def sampling(self) -> dict[str, Any]:
        fields = {
            k: getattr(self, k)
            for k in ("max_tokens", "temperature", "top_p", "top_k", "seed", "ignore_eos")
            if getattr(self, k) is not None
        }
        fields.update(self.logprob_fields())
        if self.stop is not None:
            fields["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        if self.speclane is not None:
            fields["spec"] = self.speclane
        return fields

    def user_field(self, field: str | None) -> str | None:
        """A speclane request field (an error names) as this body calls it."""
        return _renamed(field, "spec", "speclane")

    def refusal(self, status: int, message: str, field: str | None, code: str | None = None) -> HttpError:
        """An HttpError for a speclane error about `field`, naming the field as the user wrote it, in its param and
        in its message."""
        theirs = self.user_field(field)
        if field and theirs != field:
            ours, name = field.split(".")[0], theirs.split(".")[0]
            message = re.sub(rf"(?<![\w.]){re.escape(ours)}(?!\w)", name, message)
        return HttpError(status, for_http(message), param=theirs, code=code)


class ChatBody(_Generate, ChatExtras):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens in chat
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def logprob_fields(self) -> dict[str, Any]:
        asked = {"logprobs": self.logprobs, "top_logprobs": self.top_logprobs}
        return {k: v for k, v in asked.items() if v is not None}

    def prompt_fields(self) -> dict[str, Any]:
        if self.max_completion_tokens is not None:
            if self.max_tokens not in (None, self.max_completion_tokens):
                raise HttpError(
                    400,
                    "give max_completion_tokens or max_tokens, not both (they are one setting)",
                    param="max_completion_tokens",
                )
            self.max_tokens = self.max_completion_tokens
        return {"messages": [{"role": m.role, "content": m.text()} for m in self.messages]}

    def user_field(self, field: str | None) -> str | None:
        if field == "max_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return super().user_field(field)


class CompletionBody(_Generate, CompletionExtras):
    prompt: str | list[str] | list[int]
    echo: Literal[False] = False
    suffix: None = None
    logprobs: int | None = None  # the legacy form: how many alternatives (0: the chosen token's alone)

    def logprob_fields(self) -> dict[str, Any]:
        return {} if self.logprobs is None else {"logprobs": True, "top_logprobs": self.logprobs}

    def prompt_fields(self) -> dict[str, Any]:
        p = self.prompt
        if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
            return {"prompt_ids": p}
        if isinstance(p, list):
            if len(p) != 1:
                raise HttpError(
                    400,
                    f"'prompt': give one prompt, got a list of {len(p)} (speclane answers one "
                    "prompt a request; send several requests)",
                    param="prompt",
                )
            p = p[0]
        return {"prompt": p}

    def user_field(self, field: str | None) -> str | None:
        field = _renamed(_renamed(field, "top_logprobs", "logprobs"), "prompt_ids", "prompt")
        return super().user_field(field)


def _renamed(field: str | None, ours: str, theirs: str) -> str | None:
    """`field` with its first part `ours` called `theirs` (spec.draft_tokens -> speclane.draft_tokens)."""
    if field is None or field.split(".")[0] != ours:
        return field
    return theirs + field[len(ours) :]


async def read_json(request: Any, limit: int) -> Any:
    """An HTTP request's JSON body. Refused with 415 unless sent as `Content-Type: application/json` (a web page
    can send text/plain or a form to a local server without asking first, never JSON), with 413 past `limit`
    bytes before it is all read (the gateway holds no body the server would not take as a message), with 400 when
    it is not JSON or nests deeper than the parser goes."""
    kind = request.headers.get("content-type", "")
    if kind.split(";")[0].strip().lower() != "application/json":
        raise HttpError(
            415,
            f"send the body as JSON with the header 'Content-Type: application/json' (got {kind[:64]!r})",
            param="body",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length", "")
    too_big, body = declared.isdigit() and int(declared) > limit, bytearray()
    if not too_big:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                too_big = True
                break
    if too_big:
        raise HttpError(
            413,
            f"the body is over {limit} bytes, this server's largest message (--max-message-bytes); "
            "send a shorter prompt",
            param="body",
            code="body_too_large",
        )
    try:
        return json.loads(bytes(body))
    except RecursionError as exc:
        raise HttpError(
            400,
            "the body nests arrays or objects deeper than the server parses; no field takes nested values that deep",
            param="body",
        ) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the body is not JSON ({type(exc).__name__}: {exc})", param="body") from exc


def parse_body(kind: type[_Generate], data: Any, rid: str) -> tuple[_Generate, list[GenerateRequest]]:
    """The validated body and the speclane requests it asks for, one a choice (ids `rid`, or `rid-i` for n > 1;
    seeds seed + i); HttpError 400 naming the first bad field."""
    try:
        body = kind.model_validate(data)
    except ValidationError as exc:
        field, message = _first_error(exc)
        if message.startswith("unknown field"):
            message += " (speclane does not support this field)"
        raise HttpError(400, for_http(message), param=field) from exc
    if body.best_of not in (None, body.n):
        raise HttpError(400, f"'best_of' must equal n ({body.n}): speclane returns every choice it makes", "best_of")
    try:
        fields = {**body.prompt_fields(), **body.sampling()}
        if body.n == 1:
            return body, [parse_request({"id": rid, **fields})]
        seed = fields.pop("seed", None)
        return body, [
            parse_request(
                {"id": f"{rid}-{i}", **fields, **({} if seed is None else {"seed": seed + i}), "share_prompt": i == 0}
            )
            for i in range(body.n)
        ]
    except RequestError as exc:
        raise body.refusal(400, str(exc), exc.field) from exc
