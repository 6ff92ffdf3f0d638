"""The OpenAI-compatible HTTP gateway: `/v1/models`, `/v1/completions` and `/v1/chat/completions` (server-sent
events with `stream: true`, one JSON answer without), `/health` and `/metrics`, in front of a `speclane serve`
ZeroMQ server.

Each HTTP request becomes one request of the ZeroMQ protocol a choice, sent through the project's own client
(pipeline/net/client.py), so what the server does for a ZeroMQ client (lanes, the queue bound, validation,
errors, its log line) it does for HTTP alike; `/metrics` asks the server for its metrics the same way. The server
logs every request that reaches it; this gateway logs, one line each, the requests it refuses itself (a bad key,
body or route). Body shapes live in pipeline/net/openai_api.py, answer shapes in openai_shapes.py, one request's
ZeroMQ side in http_call.py; the serve loop in pipeline/net/server.py; the listening socket, uvicorn and its read
deadline in pipeline/net/http_door.py. Needs the `http` extra (FastAPI, uvicorn).
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from typing import Any

import zmq
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from speclane.pipeline.net.client import Client
from speclane.pipeline.net.http_call import SEND_TIMEOUT_S, Call, ClientGone
from speclane.pipeline.net.http_door import DEADLINE_KEY
from speclane.pipeline.net.openai_api import ChatBody, CompletionBody, HttpError, parse_body, read_json

log = logging.getLogger("speclane.http")


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
    async def _http_error(request: Request, exc: HttpError) -> JSONResponse:
        if not exc.logged:  # one the server sent is in its log already
            _log_refusal(request, exc)
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def _gone(_request: Request, _exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def _route_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = _route_refusal(app, request, exc)
        _log_refusal(request, error)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

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

    @app.get("/metrics")
    async def metrics() -> Response:
        # as vLLM's: no key needed (a Prometheus scraper is configured apart from the API's clients)
        def scrape() -> str:
            with Client(connect, timeout=SEND_TIMEOUT_S, ctx=ctx, api_key=api_key) as client:
                return client.metrics()

        try:
            text = await run_in_threadpool(scrape)
        except (TimeoutError, ConnectionError) as exc:
            raise HttpError(503, f"the speclane server does not answer ({exc})", code="unavailable") from exc
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

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
        rid = data.get("request_id") if isinstance(data, dict) else None
        rid = rid if isinstance(rid, str) and rid else f"{prefix}-{uuid.uuid4().hex[:24]}"
        body, reqs = parse_body(kind, data, rid)
        if body.model != model:
            raise HttpError(
                404,
                f"model {body.model!r} is not served here; this server serves {model!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        client = Client(connect, timeout=SEND_TIMEOUT_S, ctx=ctx, api_key=api_key)
        call = Call(client, request, idle_timeout, body, reqs)
        try:
            await call.send(max_message_bytes)
            first = await call.next()  # an error before the first token is an HTTP status, not a stream event
        except BaseException:
            call.close()
            raise
        if body.stream:
            return _SSE(call.events(rid, model, first), media_type="text/event-stream")
        return await call.whole(rid, model)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(ChatBody, request, "chatcmpl")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(CompletionBody, request, "cmpl")

    return app


def _route_refusal(app: FastAPI, request: Request, exc: StarletteHTTPException) -> HttpError:
    """An error the router raised, in OpenAI's shape: a URL no route serves (404, code `unknown_url`, as OpenAI's
    own API answers one) or a method its route does not take (405), each naming the routes there are; any other
    in Starlette's words."""
    where = f"{request.method} {request.url.path}"
    routes = ", ".join(f"{m} {r.path}" for r in app.routes if isinstance(r, APIRoute) for m in sorted(r.methods))
    if exc.status_code == 404:
        return HttpError(404, f"Unknown request URL: {where}; this server serves {routes}", code="unknown_url")
    if exc.status_code == 405:
        takes = (exc.headers or {}).get("Allow", "")
        return HttpError(
            405, f"{where}: this route takes {takes}; this server serves {routes}", code="method_not_allowed"
        )
    return HttpError(exc.status_code, str(exc.detail))


def _log_refusal(request: Request, exc: HttpError) -> None:
    """The one log line of a request refused before it reached the server."""
    peer = f"{request.client.host}:{request.client.port}" if request.client else "client"
    param = f" ({exc.param})" if exc.param else ""
    log.info(
        "HTTP %s %s from %s: %d%s: %s", request.method, request.url.path, peer, exc.status, param, exc.message[:200]
    )
