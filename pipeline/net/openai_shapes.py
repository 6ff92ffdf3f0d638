"""OpenAI's answer shapes for the gateway: the whole answer, a stream chunk, usage, and log-probabilities in both of
OpenAI's forms (chat's `content` entries, completions' parallel lists), from what the ZeroMQ server sent.

`Choice` gathers one choice's messages as they arrive (its text, its tokens when log-probabilities were asked, its
end); the functions turn choices into bodies. Request bodies live in openai_api.py; routes in http.py.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from speclane.pipeline.net import protocol as P


@attrs.define
class Choice:
    """One choice (one ZeroMQ request) of an HTTP request: what it has produced so far."""

    index: int
    rid: str  # its request id on the ZeroMQ side
    pieces: list[str] = attrs.field(factory=list)
    tokens: list[P.Token] = attrs.field(factory=list)  # kept only when the request asked for log-probabilities
    offsets: list[int] = attrs.field(factory=list)  # where each kept token's text begins in the choice's text
    count: int = 0  # tokens so far
    done: P.Done | None = None
    chars: int = 0

    def add(self, msg: P.Token) -> None:
        self.count += 1
        if msg.logprob is not None:
            self.tokens.append(msg)
            self.offsets.append(self.chars)
        self.pieces.append(msg.text)
        self.chars += len(msg.text)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def final_usage(choices: list[Choice]) -> dict[str, int]:
    """The answer's usage: the prompt once (the n choices share it), every choice's completion."""
    prompt = max((c.done.usage.get("prompt_tokens", 0) for c in choices if c.done is not None), default=0)
    return usage(prompt, sum(c.done.usage.get("completion_tokens", 0) for c in choices if c.done is not None))


def _name(token_id: int, text: str, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else text


def chat_logprobs(tokens: list[P.Token], as_ids: bool) -> dict[str, Any]:
    """Chat's shape: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}."""

    def entry(token_id: int, text: str, logprob: float) -> dict[str, Any]:
        name = _name(token_id, text, as_ids)
        return {"token": name, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    return {
        "content": [
            {
                **entry(t.token_id, t.token, t.logprob),
                "top_logprobs": [entry(a.token_id, a.token, a.logprob) for a in t.top_logprobs],
            }
            for t in tokens
        ]
    }


def completion_logprobs(tokens: list[P.Token], offsets: list[int], as_ids: bool) -> dict[str, Any]:
    """Completions' shape: parallel lists; each `top_logprobs` entry maps the alternatives and the chosen token (as
    vLLM: the chosen one is always there, so an entry may hold one more than asked)."""
    tops = []
    for t in tokens:
        top = {_name(a.token_id, a.token, as_ids): a.logprob for a in t.top_logprobs}
        top.setdefault(_name(t.token_id, t.token, as_ids), t.logprob)
        tops.append(top)
    return {
        "tokens": [_name(t.token_id, t.token, as_ids) for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": tops,
        "text_offset": list(offsets),
    }


def logprobs_of(chat: bool, tokens: list[P.Token], offsets: list[int], as_ids: bool) -> dict[str, Any] | None:
    if not tokens:
        return None
    return chat_logprobs(tokens, as_ids) if chat else completion_logprobs(tokens, offsets, as_ids)


def response(chat: bool, rid: str, model: str, choices: list[Choice], as_ids: bool = False) -> dict[str, Any]:
    """The whole answer of a non-streaming request."""
    out = []
    for c in choices:
        lp = logprobs_of(chat, c.tokens, c.offsets, as_ids)
        body = {"message": {"role": "assistant", "content": c.text}} if chat else {"text": c.text}
        out.append({"index": c.index, **body, "logprobs": lp, "finish_reason": c.done.finish_reason})
    spec = choices[0].done.spec if len(choices) == 1 else [c.done.spec for c in choices]
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": final_usage(choices),
        "speclane": spec,
    }


def chunk(
    chat: bool,
    rid: str,
    model: str,
    index: int = 0,
    text: str | None = None,
    finish: str | None = None,
    first: bool = False,
    logprobs: dict[str, Any] | None = None,
    use: dict[str, int] | None = None,
    usage_only: bool = False,
) -> dict[str, Any]:
    """One server-sent event's body: a piece of choice `index`'s text (with its log-probabilities), its finish
    reason, or (`usage_only`) the usage alone; `use` rides along on any chunk (continuous usage)."""
    if usage_only:
        choices: list[dict[str, Any]] = []
    elif chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choices = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
    else:
        choices = [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]
    out = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if use is not None:
        out["usage"] = use
    return out
