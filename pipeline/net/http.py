"""The OpenAI-compatible HTTP gateway: `/v1/models`, `/v1/completions` and `/v1/chat/completions` (server-sent
events with `stream: true`, one JSON answer without), in front of a `speclane serve` ZeroMQ server.

Each HTTP request becomes one request of the ZeroMQ protocol, sent through the project's own client
(pipeline/net/client.py), so what the server does for a ZeroMQ client (lanes, the queue bound, validation,
errors) it does for HTTP alike. Messages are read in short slices in a worker thread, so a client that hangs
up is noticed within one slice and its request cancelled. Body shapes live in pipeline/net/openai_api.py; the
serve loop in pipeline/net/server.py; the listening socket, uvicorn and its read deadline in
pipeline/net/http_door.py. Needs the `http` extra (FastAPI, uvicorn).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import zmq
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client
from speclane.pipeline.net.http_door import DEADLINE_KEY
from speclane.pipeline.net.openai_api import (
    STATUS_BY_CODE,
    ChatBody,
    CompletionBody,
    HttpError,
    chunk,
    parse_body,
    read_json,
    response,
    usage,
)

log = logging.getLogger("speclane.http")

SLICE_S = 0.25  # how long one read waits: the latency of noticing a hung-up client
SEND_TIMEOUT_S = 10.0  # handing a request to the ZeroMQ server; past it the server is taken as down (503)


class ClientGone(Exception):
    """The HTTP client hung up while its request ran; the request has been cancelled."""


class _Call:
    """One generate request on its own DEALER socket: sent, read message by message, cancelled if abandoned."""

    def __init__(self, client: Client, http: Request, idle_timeout: float, body):
        self.client = client
        self.http, self.idle_timeout, self.body = http, idle_timeout, body
        self.rid: str | None = None
        self.finished = False
        self.t_start = time.perf_counter()
        self.t_first = 0.0
        self.checked = time.monotonic()  # when the HTTP connection was last seen open

    async def send(self, request, limit: int) -> None:
        """Send `request`, refused (413) when its message is over the server's `limit`: ZeroMQ would drop the
        connection without a word, and the answer would be a timeout."""
        self.rid = request.id
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

    async def next(self) -> P.Token | P.Done:
        """The next message of this request: HttpError for a server error, ClientGone once the client left."""
        deadline = time.monotonic() + self.idle_timeout
        while True:
            try:
                msg = await run_in_threadpool(self.client.next_for, self.rid, SLICE_S)
            except TimeoutError:
                msg = None
            # Asked every slice even while tokens flow: a non-streaming answer writes nothing until its end.
            if time.monotonic() - self.checked >= SLICE_S:
                self.checked = time.monotonic()
                if await self.http.is_disconnected():
                    raise ClientGone(self.rid)
            if msg is not None:
                break
            if time.monotonic() > deadline:
                raise HttpError(504, f"no message from the speclane server in {self.idle_timeout:g} s", code="timeout")
        if isinstance(msg, P.Error):
            self.finished = True
            raise self.body.refusal(STATUS_BY_CODE.get(msg.code, 400), msg.message, msg.field, msg.code)
        if isinstance(msg, P.Done):
            self.finished = True
        elif not self.t_first:
            self.t_first = time.perf_counter()
        return msg

    def close(self) -> None:
        """Cancel the request if it is still running (the HTTP client left), then drop the socket."""
        if self.rid is not None and not self.finished:
            try:
                self.client.cancel(self.rid)
            except (TimeoutError, ConnectionError):
                pass
            log.info("%s cancelled: the HTTP client went away", self.rid)
        self.client.close()

    def log_done(self, done: P.Done) -> None:
        """The per-request line: id, tokens, time to first token, decode speed, finish reason."""
        n = done.usage.get("completion_tokens", 0)
        decode = time.perf_counter() - self.t_first if self.t_first else 0.0
        tps = f"{(n - 1) / decode:.1f} tok/s" if n > 1 and decode > 0 else "- tok/s"
        ttft = self.t_first - self.t_start if self.t_first else 0.0
        log.info(
            "%s done: prompt %d, completion %d tok, first token %.2f s, %s, finish %s",
            self.rid,
            done.usage.get("prompt_tokens", 0),
            n,
            ttft,
            tps,
            done.finish_reason,
        )


class _SSE(StreamingResponse):
    """A stream whose generator is always closed when the response ends, even when the client left mid-way,
    so its `finally` (cancelling the request) runs at once, not when the generator is collected."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


def create_app(
    connect: str,
    model: str,
    api_key: str | None = None,
    idle_timeout: float = 600.0,
    max_message_bytes: int = 1 << 20,
    ctx: zmq.Context | None = None,
) -> FastAPI:
    """The gateway for the ZeroMQ server at `connect`, serving `model` (the name /v1/models lists). With
    `api_key`, every request must carry `Authorization: Bearer <api_key>`, and its ZeroMQ message carries the key
    too. `max_message_bytes`: the server's largest message; a larger body or request is refused with 413. `ctx`:
    the ZeroMQ context of the server, for an inproc:// `connect` (what `speclane serve --http` does)."""
    app = FastAPI(title="speclane", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())  # /v1/models' `created`: when this gateway began serving the model

    @app.exception_handler(HttpError)
    async def _http_error(_request: Request, exc: HttpError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def _gone(_request: Request, _exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def _route_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(HttpError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    def check_key(request: Request) -> None:
        # In each route, not a middleware: Starlette's BaseHTTPMiddleware hides a client's hang-up from the route.
        if api_key is not None:
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                raise HttpError(
                    401,
                    "missing or wrong API key; send 'Authorization: Bearer <key>' with the server's "
                    "key (its --api-key-file, $SPECLANE_API_KEY or --api-key)",
                    code="invalid_api_key",
                )

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_key(request)
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": started, "owned_by": "speclane"}],
        }

    @app.get("/health")
    async def health() -> Response:
        # as vLLM's: 200 with no body while the gateway serves, no key needed (load balancers and benchmark
        # tools such as GuideLLM probe it before they start)
        return Response(status_code=200)

    async def generate(kind, request: Request, prefix: str):
        check_key(request)
        try:
            data = await read_json(request, max_message_bytes)
        except ClientDisconnect:
            peer = f"{request.client.host}:{request.client.port}" if request.client else "client"
            late = request.scope.get(DEADLINE_KEY)
            why = f"its body did not arrive within {late:g} s" if late else "hung up before its body arrived whole"
            log.info("HTTP %s: %s; connection closed, nothing was run", peer, why)
            raise ClientGone(None) from None
        rid = f"{prefix}-{uuid.uuid4().hex[:24]}"
        body, req = parse_body(kind, data, rid)
        if body.model != model:
            raise HttpError(
                404,
                f"model {body.model!r} is not served here; this server serves {model!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        call = _Call(Client(connect, timeout=SEND_TIMEOUT_S, ctx=ctx, api_key=api_key), request, idle_timeout, body)
        try:
            await call.send(req, max_message_bytes)
            first = await call.next()  # an error before the first token is an HTTP status, not a stream event
        except BaseException:
            call.close()
            raise
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _SSE(_events(kind, call, model, first, include_usage), media_type="text/event-stream")
        try:
            text, done = [], first
            while isinstance(done, P.Token):
                text.append(done.text)
                done = await call.next()
        finally:
            call.close()
        call.log_done(done)
        return response(kind, rid, model, "".join(text), done)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(ChatBody, request, "chatcmpl")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(CompletionBody, request, "cmpl")

    return app


async def _events(kind, call: _Call, model: str, msg, include_usage: bool) -> AsyncIterator[str]:
    rid = call.rid
    try:
        if kind is ChatBody:
            yield _sse(chunk(kind, rid, model, "", first=True))
        while isinstance(msg, P.Token):
            if msg.text:
                yield _sse(chunk(kind, rid, model, msg.text))
            msg = await call.next()
        yield _sse(chunk(kind, rid, model, finish=msg.finish_reason))
        if include_usage:
            yield _sse(chunk(kind, rid, model, use=usage(msg)))
        call.log_done(msg)
    except HttpError as exc:  # the stream has begun: the error is its last event
        yield _sse(exc.body())
    except ClientGone:
        return
    finally:
        call.close()
    yield "data: [DONE]\n\n"


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"
