"""One HTTP generate request on the ZeroMQ side: its n choices sent as n speclane requests on one DEALER socket,
their messages read as they come (in short slices in a worker thread, so a client that hangs up is noticed within
one slice and its requests cancelled), and the answer built, whole or as server-sent events.

The n choices share their prompt: they are sent together, and the first asks the server to checkpoint the prompt
one token short of its end (`share_prompt`), so the others, admitted with it, prefill only that last token. Routes,
the key and the body belong to http.py; shapes to openai_shapes.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client
from speclane.pipeline.net.openai_api import STATUS_BY_CODE, ChatBody, HttpError
from speclane.pipeline.net.openai_shapes import Choice, chunk, final_usage, logprobs_of, response, usage

log = logging.getLogger("speclane.http")

SLICE_S = 0.25  # how long one read waits: the latency of noticing a hung-up client
SEND_TIMEOUT_S = 10.0  # handing a request to the ZeroMQ server; past it the server is taken as down (503)


class ClientGone(Exception):
    """The HTTP client hung up while its request ran; the request has been cancelled."""


class Call:
    """The choices of one HTTP request: sent, read message by message, cancelled if abandoned."""

    def __init__(self, client: Client, http: Request, idle_timeout: float, body, requests: list):
        self.client, self.http, self.idle_timeout, self.body = client, http, idle_timeout, body
        self.requests = requests
        self.choices = [Choice(i, r.id) for i, r in enumerate(requests)]
        self._by_id = {json.dumps(c.rid): c for c in self.choices}
        self.prompt_tokens = 0
        self.checked = time.monotonic()  # when the HTTP connection was last seen open

    @property
    def finished(self) -> bool:
        return all(c.done is not None for c in self.choices)

    async def send(self, limit: int) -> None:
        """Send every choice's request, refused (413) when one is over the server's message `limit`: ZeroMQ would
        drop the connection without a word, and the answer would be a timeout."""
        for request in self.requests:
            data = json.dumps(self.client.signed(P.generate_json(request))).encode()
            if len(data) > limit:
                field = "messages" if isinstance(self.body, ChatBody) else "prompt"
                raise HttpError(
                    413,
                    f"the request is {len(data)} bytes as a speclane message, over this server's largest "
                    f"({limit} bytes, --max-message-bytes); shorten {field}",
                    param=field,
                    code="body_too_large",
                )
            try:
                await run_in_threadpool(self.client.send, data)
            except (TimeoutError, ConnectionError) as exc:
                raise HttpError(503, f"the speclane server does not take requests ({exc})", code="unavailable") from exc

    async def next(self) -> tuple[Choice, P.Token | P.Done]:
        """The next message of any choice: HttpError for a server error, ClientGone once the client left."""
        deadline = time.monotonic() + self.idle_timeout
        while True:
            try:
                msg = await run_in_threadpool(self.client.recv, SLICE_S)
            except TimeoutError:
                msg = None
            # Asked every slice even while tokens flow: a non-streaming answer writes nothing until its end.
            if time.monotonic() - self.checked >= SLICE_S:
                self.checked = time.monotonic()
                if await self.http.is_disconnected():
                    raise ClientGone(self.choices[0].rid)
            choice = self._by_id.get(json.dumps(getattr(msg, "id", None)))
            if choice is not None:
                break
            if time.monotonic() > deadline:
                raise HttpError(504, f"no message from the speclane server in {self.idle_timeout:g} s", code="timeout")
        if isinstance(msg, P.Error):
            choice.done = msg  # ended: nothing to cancel; the others are cancelled on close
            error = self.body.refusal(STATUS_BY_CODE.get(msg.code, 400), msg.message, msg.field, msg.code)
            error.logged = True  # the server logged the request it refused
            raise error
        if isinstance(msg, P.Done):
            choice.done = msg
        else:
            if msg.prompt_tokens is not None:
                self.prompt_tokens = msg.prompt_tokens
            choice.add(msg)
        return choice, msg

    def close(self) -> None:
        """Cancel the choices still running (the client left, or a sibling failed), then drop the socket."""
        for c in self.choices:
            if c.done is None:
                try:
                    self.client.cancel(c.rid)
                except (TimeoutError, ConnectionError):
                    pass
        self.client.close()

    def usage_so_far(self) -> dict[str, int]:
        return usage(self.prompt_tokens, sum(c.count for c in self.choices))

    async def whole(self, rid: str, model: str) -> dict[str, Any]:
        """Read every choice to its end: the whole answer."""
        try:
            while not self.finished:
                await self.next()
        finally:
            self.close()
        return response(self.chat, rid, model, self.choices, bool(self.body.return_tokens_as_token_ids))

    @property
    def chat(self) -> bool:
        return isinstance(self.body, ChatBody)

    async def events(self, rid: str, model: str, first) -> AsyncIterator[str]:
        """The server-sent events, from the `first` message (already read) on."""
        opts, chat, as_ids = self.body.stream_options, self.chat, bool(self.body.return_tokens_as_token_ids)
        every = bool(opts and opts.continuous_usage_stats)
        try:
            if chat:
                for c in self.choices:
                    yield _sse(chunk(True, rid, model, c.index, "", first=True, use=self._use(every)))
            choice, msg = first
            while True:
                if isinstance(msg, P.Token) and (msg.text or msg.logprob is not None):
                    lp = (
                        logprobs_of(chat, choice.tokens[-1:], choice.offsets[-1:], as_ids)
                        if msg.logprob is not None
                        else None
                    )
                    yield _sse(chunk(chat, rid, model, choice.index, msg.text, logprobs=lp, use=self._use(every)))
                elif isinstance(msg, P.Done):
                    yield _sse(chunk(chat, rid, model, choice.index, finish=msg.finish_reason, use=self._use(every)))
                    if self.finished:
                        break
                choice, msg = await self.next()
            if opts and opts.include_usage:
                yield _sse(chunk(chat, rid, model, use=final_usage(self.choices), usage_only=True))
        except HttpError as exc:  # the stream has begun: the error is its last event
            yield _sse(exc.body())
        except ClientGone:
            return
        finally:
            self.close()
        yield "data: [DONE]\n\n"

    def _use(self, every: bool) -> dict[str, int] | None:
        return self.usage_so_far() if every else None


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"
