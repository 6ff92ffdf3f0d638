"""The ZeroMQ intake: a ROUTER socket in front of one Engine, streaming each committed token as its own message.

Owns the serve loop (poll briefly when idle, between engine steps when busy), tokenizing requests on a worker
thread (a huge or bad prompt never costs the running lanes a step), sending each reply to its request's client
through per-client outboxes (a slow client never blocks a round), dropping the requests of a client that went
away, and stopping: no new requests, a grace period, then an error for each request still in flight.
Every accepted generate request ends with exactly one `done` or `error` message to its client.
Message schemas belong in `pipeline/net/protocol.py`; the socket's options in `pipeline/net/sockets.py`; the
outboxes in `pipeline/net/outbox.py`; the requests in flight (routes, client ids, the queue bounds) in
`pipeline/net/inflight.py`.
"""

from __future__ import annotations

import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import zmq

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.inflight import InFlight, Req
from speclane.pipeline.net.metrics import Metrics
from speclane.pipeline.net.outbox import Outboxes
from speclane.pipeline.net.request_log import log_done, log_error, log_gone
from speclane.pipeline.net.sockets import check_bind, receive, router
from speclane.stages.contract.errors import RequestError
from speclane.stages.contract.events import DoneEvent, TokenEvent

__all__ = ["Server", "check_bind"]
log = logging.getLogger("speclane.server")

# Frames read per loop turn before the engine gets a step: intake cannot starve the running lanes.
MAX_INTAKE = 256
RECENT_ENDED = 4096  # ended requests remembered so a cancel that crossed their `done` is not an error


@attrs.define
class Server:
    engine: Any
    bind: str = "tcp://127.0.0.1:5557"
    allow_remote: bool = False
    curve_keys: Path | None = None
    api_key: str | None = None  # every message must carry it as `key` (pipeline/net/api_key.py)
    inproc: str | None = None  # also bound there: an in-process client (the HTTP gateway) sharing ctx
    max_message_bytes: int = 1 << 20
    max_queue: int = 64
    max_client_queue: int | None = None  # None: a quarter of max_queue (at least 1)
    grace_s: float = 10.0
    idle_poll_ms: int = 50
    ctx: zmq.Context = attrs.field(factory=zmq.Context)
    endpoint: str = ""
    _sock: Any = None
    _auth: Any = None
    _inflight: InFlight = attrs.field(factory=InFlight)
    _out: Outboxes | None = None
    _pool: ThreadPoolExecutor = attrs.field(factory=lambda: ThreadPoolExecutor(1, "speclane-intake"))
    finished: collections.Counter = attrs.field(factory=collections.Counter)
    metrics: Metrics = attrs.field(factory=Metrics)
    _stop_at: float | None = None
    # (client, id) of the last requests that ended: a cancel racing their `done` is a no-op, not an unknown id
    _ended: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=RECENT_ENDED))

    def __attrs_post_init__(self) -> None:
        if self.max_client_queue is None:
            self.max_client_queue = max(1, self.max_queue // 4)

    def start(self) -> str:
        check_bind(self.bind, self.allow_remote)
        self._sock, self._auth = router(self.ctx, self.max_message_bytes, self.curve_keys)
        self._sock.bind(self.bind)
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.inproc is not None:  # no TCP, no CURVE handshake (inproc has none), reachable from nowhere else
            self._sock.bind(self.inproc)
        self._out = Outboxes(self._sock)
        return self.endpoint

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._sock is not None:
            self._sock.close(0)
        if self._auth is not None:
            self._auth.stop()

    def stop(self, grace: float | None = None) -> None:
        """Stop admitting; requests in flight get `grace` seconds (default grace_s) to finish, then an error with
        code `server_stopping`. A second call ends them at once. Safe from a signal handler."""
        now = time.monotonic()
        self._stop_at = now if self._stop_at is not None else now + (self.grace_s if grace is None else grace)

    @property
    def stopping(self) -> bool:
        return self._stop_at is not None

    # --- the loop -------------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        while not (self.stopping and (not self._inflight or time.monotonic() >= self._stop_at)):
            self.turn()
        self._abort_all(
            "server_stopping",
            "the server is stopping and the request did not finish within its "
            "grace period; send it again once the server is back",
        )
        deadline = time.monotonic() + 2.0  # the last messages out, without waiting on a client that cannot read
        while self._out and time.monotonic() < deadline:
            self._flush()
            time.sleep(0.005)

    def turn(self) -> None:
        """One loop turn: read what arrived, queue what the worker tokenized, run one engine step if busy, flush."""
        wait = 0 if self.engine.busy() else 5 if self._preparing() else self.idle_poll_ms
        if self._sock.poll(wait, zmq.POLLIN):
            for _ in range(MAX_INTAKE):
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._receive(frames)
        self._admit()
        if self.engine.busy():
            self._step()
        self._flush()

    def _receive(self, frames: list[zmq.Frame]) -> None:
        receive(frames, self)

    def _handle(self, envelope: list[bytes], msg, client: bytes) -> None:
        if isinstance(msg, P.Generate):
            self._generate(envelope, msg.request, client)
        elif isinstance(msg, P.Cancel):
            self._cancel(envelope, msg.id)
        elif isinstance(msg, P.StatsQuery):
            self._send(envelope, self.stats(msg.id, client))
        elif isinstance(msg, P.GraphQuery):
            from speclane.pipeline.framework.introspect import (
                graph_json,  # imported only when a client asks for the graph
            )

            self._send(envelope, P.GraphReply(id=msg.id, graph=graph_json(self.engine.verify.graph)))
        elif isinstance(msg, P.MetricsQuery):
            self._send(envelope, P.MetricsReply(id=msg.id, text=self.metrics.render(self)))

    def _generate(self, envelope: list[bytes], request, client: bytes) -> None:
        if self.stopping:
            raise P.ProtocolError(
                "the server is stopping and takes no new requests; retry once it is back",
                field="request",
                code="server_stopping",
                rid=request.id,
            )
        self._inflight.check_room(envelope, request.id, client, self.engine, self.max_queue, self.max_client_queue)
        rid = self._inflight.new_rid()
        self.metrics.begin(rid)
        prepared = self._pool.submit(self.engine.prepare, request.model_copy(update={"id": rid}))
        self._inflight.add(rid, Req(envelope, request.id, client, prepared))

    def _cancel(self, envelope: list[bytes], cid) -> None:
        rid = self._inflight.rid_of(envelope, cid)
        if rid is None and (envelope[0] if envelope else None, cid) in self._ended:  # crossed its `done`: answered
            message = f"field 'id': request {cid!r} of yours has ended (its done was sent)"
            self._send(envelope, P.Error(id=cid, code="unknown_id", field="id", message=message), logged=False)
            return
        if rid is None:
            raise P.ProtocolError(
                f"field 'id': no request {cid!r} of yours is in flight", field="id", code="unknown_id", rid=cid
            )
        req = self._inflight.get(rid)
        if req.prepared is not None:
            req.cancelled = True  # the engine does not have it yet: cancelled as it arrives
        else:
            self.engine.cancel(rid)  # False for a second cancel: the first one's `done` is on its way

    def _preparing(self) -> bool:
        return self._inflight.preparing()

    def waiting(self) -> list[bytes]:
        """The clients of requests not yet in a lane (tokenizing or queued), one entry a request."""
        return self._inflight.waiting(lane.rid for lane in self.engine.queue)

    def _admit(self) -> None:
        """Queue, in arrival order, the requests the worker has tokenized; refuse those it found bad."""
        for rid, req in self._inflight.items():
            if req.prepared is None or not req.prepared.done():
                continue
            future, req.prepared = req.prepared, None
            try:
                self.engine.enqueue(future.result())
            except RequestError as exc:
                self._end(rid, P.Error(id=req.cid, code=exc.code, field=exc.field, message=str(exc)))
                continue
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                log.exception("preparing request %r failed", req.cid)
                self._end(rid, P.Error(id=req.cid, code="internal", message=f"{type(exc).__name__}: {exc}"))
                continue
            if req.cancelled:
                self.engine.cancel(rid)

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - an engine fault ends what is in flight, not the server
            log.exception("engine step failed")
            self._abort_all("internal", f"engine step failed: {type(exc).__name__}: {exc}")
            return
        self.metrics.on_events(events, self.engine)
        for ev in events:
            req = self._inflight.get(ev.rid)
            if req is None:
                continue
            if isinstance(ev, TokenEvent):
                self._send(req.envelope, P.token_msg(req.cid, ev, getattr(self.engine, "tokenizer", None)))
            elif isinstance(ev, DoneEvent):
                self.finished[ev.finish_reason] += 1
                log_done(self.engine, req.cid, ev)
                self._end(ev.rid, P.done_msg(req.cid, ev))

    def _abort_all(self, code: str, message: str) -> None:
        """End every request in flight with an error (engine failure, shutdown)."""
        for rid, req in self._inflight.items():
            if req.prepared is not None:
                req.prepared.cancel()
            self.engine.cancel(rid)
            self.finished[code] += 1
            self._end(rid, P.Error(id=req.cid, code=code, message=message))

    def _end(self, rid: int, msg) -> None:
        self.metrics.forget(rid)
        req = self._inflight.pop(rid)
        if req is not None:
            self._ended.append((req.envelope[0] if req.envelope else None, req.cid))
            self._send(req.envelope, msg)

    # --- sending --------------------------------------------------------------------------------------------
    def _send(self, envelope: list[bytes], msg, logged: bool = True) -> None:
        """`logged=False`: a reply that is no fault of anyone's (a cancel that crossed its request's end)."""
        if isinstance(msg, P.Error) and logged:  # a refused message or a failed request: its one log line
            log_error(msg)
        if envelope and not self._out.put(envelope + [P.encode(msg)]):
            log.warning("client %r is not reading; cancelling its requests", envelope[0])
            self._drop(envelope[0])

    def _flush(self) -> None:
        for ident in self._out.flush():
            self._drop(ident)

    def _drop(self, ident: bytes) -> None:
        """The client went away (or stopped reading): cancel its requests so their lanes free next round."""
        self._out.forget(ident)
        for rid, req in self._inflight.items():
            if req.envelope[0] == ident:
                if req.prepared is not None:
                    req.prepared.cancel()
                if req.prepared is not None or self.engine.cancel(rid):
                    self.finished["cancelled"] += 1
                    log_gone(req.cid)
                self._inflight.pop(rid)

    def stats(self, qid=None, client: bytes | None = None) -> P.StatsReply:
        eng, waiting = self.engine, self.waiting()
        queue = {
            "waiting": len(waiting),
            "max": self.max_queue,
            "max_per_client": self.max_client_queue,
            "yours": sum(c == client for c in waiting),
            "clients_waiting": len(set(waiting)),
        }
        return P.StatsReply(
            id=qid,
            lanes={"active": len(eng.lanes.active), "free": len(eng.lanes.free), "max": eng.lanes.max_lanes},
            queue=queue,
            finished=dict(self.finished),
            # clients with requests in flight, the one asking included (it is connected, whatever it has sent)
            clients=len(self._inflight.clients() | ({client} if client else set())),
            spec=eng.stats(list(eng.retired)),
            checkpoints=eng.checkpoints.stats() if getattr(eng, "checkpoints", None) is not None else None,
            drafter=eng.drafter.state_stats(eng.drafter_state) if getattr(eng, "drafter", None) is not None else None,
            passes=dict(getattr(eng, "passes", {})),
        )
