"""Generation requests and speculation knobs: the pydantic models behind the CLI, request files and the protocol.

One model per concept, unknown keys refused, so a default is written once and every entry point (CLI flags,
`--requests` lines, ZeroMQ messages) validates the same way. Errors become `RequestError`s naming the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from speclane.stages.contract.errors import ConfigError, RequestError, did_you_mean
from speclane.stages.contract.lanes import MAX_DRAFT_TOKENS
from speclane.stages.drafters import SPEC_BACKENDS

# Temperatures below this sample as greedy (temperature 0), as vLLM does (its _SAMPLING_EPS): dividing logits by a
# smaller one overflows float32 (1e-39 is below its smallest normal number) and sampling becomes garbage, while
# such a temperature already means "always the most likely token".
MIN_TEMPERATURE = 1e-5
MAX_ID_CHARS = 256
# Stop strings are matched on the serve loop: every committed token of every lane looks for each one in the new text
# and for a prefix of it to hold back (stages/contract/lanes.py), work that grows with count x length^2 and that
# every other lane's round waits on. OpenAI's API takes at most 4; 16 of 256 bytes each holds any real list (chat
# templates' end markers, code fences, role headers) and keeps that work a small part of a round.
MAX_STOP_STRINGS = 16
MAX_STOP_BYTES = 256
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


class HugeInt:
    """A JSON integer too long to be any field's value, kept as its digits (json's `parse_int`): Python refuses to
    convert over 4,300 digits, and no field takes more than 20, so the field can be named instead."""

    MAX_DIGITS = 40

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))

    @classmethod
    def parse(cls, text: str) -> "int | HugeInt":
        return int(text) if len(text) <= cls.MAX_DIGITS else cls(text)

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def check_id(rid: Any) -> Any:
    """Ids are a client's own names for its requests: a string or a 64-bit integer, never a bool or a float."""
    if isinstance(rid, HugeInt):
        raise ValueError(f"{rid!r} is out of range for an id")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise ValueError(f"an id must be a string or an integer, got {type(rid).__name__}")
    if isinstance(rid, int) and not -(2**63) <= rid < 2**63:
        raise ValueError("an integer id must fit in 64 bits")
    if isinstance(rid, str) and len(rid) > MAX_ID_CHARS:
        raise ValueError(f"an id may have at most {MAX_ID_CHARS} characters")
    return rid


def _stop_bytes(stop: str) -> str:
    n = len(stop.encode("utf-8", "surrogatepass"))
    if n > MAX_STOP_BYTES:
        raise ValueError(
            f"a stop string may have at most {MAX_STOP_BYTES} bytes of UTF-8, this one has {n}; shorten it"
        )
    return stop


# Strict: a value of the wrong JSON type is refused, never converted ("16" is not a max_tokens, "yes" not a bool).
STRICT = ConfigDict(extra="forbid", strict=True)


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class RequestSpec(BaseModel):
    """Per-request speculation: its own draft tokens, or speculation off for this request."""

    model_config = STRICT
    enabled: bool = True
    draft_tokens: int | None = Field(default=None, ge=1, le=MAX_DRAFT_TOKENS)


class SamplingParams(BaseModel):
    model_config = STRICT
    max_tokens: int = Field(default=128, ge=1, le=1_000_000)
    # Greedy by default: speculation is exact there, and a sampled run asks for it explicitly.
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=2**31 - 1)  # the engine also bounds it by the vocabulary
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: list[Annotated[str, AfterValidator(_stop_bytes)]] = Field(default_factory=list)  # a string: one
    ignore_eos: bool = False
    # The target's own log-probabilities of each output token (its raw logits' log_softmax at the row that chose the
    # token, before temperature, top-k and top-p), and of its `top_logprobs` most likely alternatives.
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    # This very prompt will be sent again (the n choices of one HTTP request): it is checkpointed one token before
    # its end, so a request with the same prompt prefills only that last token.
    share_prompt: bool = False

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> "SamplingParams":
        if self.top_logprobs and not self.logprobs:
            raise RequestError(
                "field 'top_logprobs': needs logprobs: true (the alternatives come with the chosen token's)",
                field="top_logprobs",
            )
        return self

    @field_validator("temperature")
    @classmethod
    def _tiny_is_greedy(cls, t: float) -> float:
        return 0.0 if t < MIN_TEMPERATURE else t

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, stop: Any) -> Any:
        """A string is one stop string; a list is counted before its items are looked at."""
        if isinstance(stop, str):
            return [stop]
        if not isinstance(stop, list):
            raise ValueError(f"give a string or a list of strings, got {type(stop).__name__}")
        if len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}; keep the ones that matter")
        return stop


class GenerateRequest(SamplingParams):
    """One request: exactly one of `prompt`, `prompt_ids`, `messages`."""

    id: str | int = 0
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[Message] | None = None
    spec: RequestSpec = Field(default_factory=RequestSpec)

    _id = field_validator("id", mode="before")(check_id)

    @field_validator("prompt_ids", "messages")
    @classmethod
    def _not_empty(cls, items: list | None, info) -> list | None:
        if items is not None and not items:
            raise ValueError(
                f"{info.field_name} is empty; give at least one "
                f"{'token id' if info.field_name == 'prompt_ids' else 'message'}"
            )
        return items

    @model_validator(mode="after")
    def _one_prompt(self) -> "GenerateRequest":
        given = [k for k in ("prompt", "prompt_ids", "messages") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of prompt, prompt_ids, messages (got {given or 'none'})")
        return self

    def conversation(self, chat: bool = False) -> list[dict[str, str]] | None:
        """The messages the prompt is rendered from through the chat template (`chat`: a plain `prompt` is one user
        message); None for token ids or raw text."""
        if self.messages is not None:
            return [m.model_dump() for m in self.messages]
        return [{"role": "user", "content": self.prompt}] if chat and self.prompt is not None else None


# pydantic's name for a member of a union, which it puts in an error's location after the field ('stop.str')
_MEMBER = re.compile(r"str|int|float|bool|[a-z]+\[.+\]|[A-Z]\w*")


def _member_at(err: dict) -> int | None:
    """Where in the error's location a union member's name is (never the first place, nor an unknown key)."""
    loc, last = err["loc"], len(err["loc"]) - (err["type"] == "extra_forbidden")
    return next((i for i in range(1, last) if isinstance(loc[i], str) and _MEMBER.fullmatch(loc[i])), None)


def _first_error(exc: ValidationError) -> tuple[str, str]:
    """(field, message) of the first problem, the field named as the user wrote it."""
    errors = exc.errors()
    err, at = errors[0], _member_at(errors[0])
    if at is not None:  # every member of a union failed: blame the one the value went deepest into, if just one
        members = [e for e in errors if e["loc"][:at] == err["loc"][:at] and _member_at(e) == at]
        deeper = [e for e in members if len(e["loc"]) > at + 1]
        if len(deeper) != 1:
            field = ".".join(str(p) for p in err["loc"][:at])
            kinds = list(dict.fromkeys(str(e["loc"][at]) for e in members))
            kinds = " or ".join(filter(None, [", ".join(kinds[:-1]), kinds[-1]]))
            got = "" if deeper else f", got {type(err['input']).__name__}"
            return field, f"field '{field}': give {kinds}{got}"
        err = deeper[0]
    field = ".".join(str(p) for i, p in enumerate(err["loc"]) if i != at) or "request"
    if err["type"] == "extra_forbidden":
        known = list(GenerateRequest.model_fields) + list(RequestSpec.model_fields) + list(Message.model_fields)
        hint = did_you_mean(str(err["loc"][-1]), known)
        return field, f"unknown field '{field}'{hint}; remove it (see docs/protocol.md)"
    if isinstance(err.get("input"), HugeInt):
        return field, f"field '{field}': {err['input']!r} is out of range"
    msg = err["msg"].removeprefix("Value error, ")
    return field, f"field '{field}': {msg}"


def _check_text(value: Any, path: tuple) -> None:
    """Every string must be encodable: JSON may carry a lone surrogate ("\\ud800") no tokenizer can take."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            field = ".".join(str(p) for p in path) or "request"
            raise RequestError(
                f"field '{field}': not valid Unicode text (a lone surrogate at character {exc.start}); send UTF-8 text",
                field=field,
            ) from exc
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, path)
            _check_text(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, (*path, i))


def parse_request(data: Any, extra_forbidden: tuple[str, ...] = ()) -> GenerateRequest:
    """Validate one request dict; a RequestError names the first bad field."""
    if not isinstance(data, dict):
        raise RequestError(f"a request must be a JSON object, got {type(data).__name__}", field="request")
    _check_text(data, ())
    try:
        return GenerateRequest.model_validate({k: v for k, v in data.items() if k not in extra_forbidden})
    except ValidationError as exc:
        field, message = _first_error(exc)
        raise RequestError(message, field=field) from exc


class SpecKnobs(BaseModel):
    """The --spec-* settings. One model behind `generate`, `serve`, `plan` and `bench`."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal[SPEC_BACKENDS] | None = None  # None: what the spec file says
    draft_tokens: int | None = Field(default=None, ge=1, le=MAX_DRAFT_TOKENS)
    draft_rows: int | None = Field(default=None, ge=0)
    draft_head: Literal["full", "shortlist"] | None = None
    draft_plan: Literal["measured", "fixed"] | None = None  # measured: drafts that pay on this machine

    @classmethod
    def from_flags(cls, **flags: Any) -> "SpecKnobs":
        try:
            return cls(**flags)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = "--spec-" + str(err["loc"][0]).replace("_", "-")
            hint = {
                "draft_tokens": " (1 to 7)",
                "draft_rows": " (0 means the backend's default)",
                "backend": f" (one of {', '.join(SPEC_BACKENDS)})",
                "draft_plan": " (measured: the drafts that pay on this machine; fixed: every draft allowed)",
            }.get(str(err["loc"][0]), "")
            raise ConfigError(f"{name}: {err['msg']}{hint}") from exc
