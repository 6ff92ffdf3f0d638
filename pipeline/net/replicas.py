"""The door of `speclane serve --replicas`: the ZeroMQ intake a single server has, in front of engine replicas.

Clients speak the protocol of docs/protocol.md unchanged (the HTTP gateway too, over the inproc endpoint): each
message is checked here exactly as a single server checks it (protocol.parse_client: the version, the schema, the
API key), then a generate request goes to a replica through Ray Serve (replica_calls.py) and its frames come back
as the replica's server wrote them, with the client's own id. The door owns the client side: routes, the bounds on
requests not yet streaming (in all and per client), a client that went away (its requests are cancelled on their
replicas), stopping, and stats over every replica (`replicas`: one entry each). Every accepted generate request
ends with exactly one `done` or `error` frame, whatever happens to its replica.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import attrs
import zmq

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.frame_order import FrameOrder, FrameSink, read
from speclane.pipeline.net.inflight import InFlight, Req
from speclane.pipeline.net.outbox import Outboxes
from speclane.pipeline.net.replica_stats import aggregate
from speclane.pipeline.net.server import MAX_INTAKE
from speclane.pipeline.net.sockets import check_bind, receive, router

log = logging.getLogger("speclane.replicas")


@attrs.define
class ReplicaDoor:
    """`calls(ctx, events)`: builds the RayCalls that talk to the replicas, pushing to the `events` endpoint;
    with `direct`, `calls(ctx, events, sink)`, `sink` the door's frame socket (a loopback endpoint and the token its
    messages must start with), which replicas on this machine send most frames to (frame_order.py).
    `room`: lanes over all replicas, which requests may fill before any counts as waiting."""

    calls_factory: Any
    bind: str = "tcp://127.0.0.1:5557"
    allow_remote: bool = False
    curve_keys: Path | None = None
    api_key: str | None = None
    inproc: str | None = None
    max_message_bytes: int = 1 << 20
    max_queue: int = 64
    max_client_queue: int | None = None
    room: int = 0
    grace_s: float = 10.0
    direct: bool = False
    ctx: zmq.Context = attrs.field(factory=zmq.Context)
    endpoint: str = ""
    calls: Any = None
    finished: collections.Counter = attrs.field(factory=collections.Counter)
    _sock: Any = None
    _auth: Any = None
    _pull: Any = None
    _sink: FrameSink | None = None  # with `direct`
    _order: FrameOrder = attrs.field(factory=FrameOrder)
    _poller: Any = None
    _out: Outboxes | None = None
    _inflight: InFlight = attrs.field(factory=InFlight)
    _waiting: set = attrs.field(factory=set)  # rids with no frame from their replica yet
    _queries: dict = attrs.field(factory=dict)  # query key -> (envelope, client id, client)
    _keys: Any = attrs.field(factory=lambda: itertools.count(-1, -1))  # query keys, apart from rids (>= 0)
    _stop_at: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_client_queue is None:
            self.max_client_queue = max(1, self.max_queue // 4)

    def start(self) -> str:
        check_bind(self.bind, self.allow_remote)
        self._sock, self._auth = router(self.ctx, self.max_message_bytes, self.curve_keys)
        self._sock.bind(self.bind)
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.inproc is not None:
            self._sock.bind(self.inproc)
        events = f"inproc://speclane-door-events-{id(self)}"
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.bind(events)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._pull, zmq.POLLIN)
        self._sink = FrameSink.bind(self.ctx) if self.direct else None
        if self._sink is not None:
            self._poller.register(self._sink.sock, zmq.POLLIN)
        self.calls = self.calls_factory(self.ctx, events, *((self._sink.address,) if self._sink else ()))
        self._out = Outboxes(self._sock)
        return self.endpoint

    def close(self) -> None:
        if self.calls is not None:
            self.calls.close()
        for sock in (self._sock, self._pull, self._sink and self._sink.sock):
            if sock is not None:
                sock.close(0)
        if self._auth is not None:
            self._auth.stop()

    def stop(self, grace: float | None = None) -> None:
        """As Server.stop: no new requests; those in flight get `grace` seconds, then `server_stopping`."""
        now = time.monotonic()
        self._stop_at = now if self._stop_at is not None else now + (self.grace_s if grace is None else grace)

    @property
    def stopping(self) -> bool:
        return self._stop_at is not None

    def serve_forever(self) -> None:
        while not (self.stopping and (not self._inflight or time.monotonic() >= self._stop_at)):
            self.turn()
        late = "the server is stopping and the request did not end in its grace period; send it again once it is up"
        for rid, req in self._inflight.items():
            self.calls.cancel(rid)
            self._end(rid, P.Error(id=req.cid, code="server_stopping", message=late))
        deadline = time.monotonic() + 2.0
        while self._out and time.monotonic() < deadline:
            self._flush()
            time.sleep(0.005)

    def turn(self) -> None:
        ready = dict(self._poller.poll(5 if self._out else 50))
        if self._sock in ready:
            for _ in range(MAX_INTAKE):
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._receive(frames)
        if self._pull in ready:
            while True:
                try:
                    event = self._pull.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._event(read(event[0]), event[1], event[2:])
        if self._sink is not None and self._sink.sock in ready:
            for rid, seq, frames in self._sink.receive():
                self._numbered(rid, seq, frames, False)
        for rid in self._order.lost(time.monotonic()) if self._order else ():
            lost = "frames of this request from its replica were lost (did it fail?); send it again"
            self._end(rid, P.Error(id=self._inflight.get(rid).cid, code="replica_failed", message=lost))
        self._flush()

    # --- from clients ---------------------------------------------------------------------------------------
    def _receive(self, frames: list[zmq.Frame]) -> None:
        receive(frames, self)

    def _handle(self, envelope: list[bytes], msg, client: bytes) -> None:
        if isinstance(msg, P.Generate):
            self._generate(envelope, msg.request, client)
        elif isinstance(msg, P.Cancel):
            rid = self._inflight.rid_of(envelope, msg.id)
            if rid is None:
                raise P.ProtocolError(
                    f"field 'id': no request {msg.id!r} of yours is in flight",
                    field="id",
                    code="unknown_id",
                    rid=msg.id,
                )
            self.calls.cancel(rid)
        elif isinstance(msg, P.StatsQuery):
            key = next(self._keys)
            self._queries[key] = (envelope, msg.id, client)
            self.calls.stats(key)
        else:  # a query any replica answers alike (graph, metrics)
            key = next(self._keys)
            self._queries[key] = (envelope, msg.id, client)
            self.calls.ask(key, P.encode(msg))

    def _generate(self, envelope: list[bytes], request, client: bytes) -> None:
        cid = request.id
        if self.stopping:
            raise P.ProtocolError(
                "the server is stopping and takes no new requests; retry once it is back",
                field="request",
                code="server_stopping",
                rid=cid,
            )
        if self._inflight.rid_of(envelope, cid) is not None:
            raise P.ProtocolError(
                f"field 'id': request {cid!r} is already in flight from this client; use a new id",
                field="id",
                code="duplicate_id",
                rid=cid,
            )
        waiting = [self._inflight.get(r).client for r in self._waiting]
        if len(waiting) - self.room >= self.max_queue:
            raise P.ProtocolError(
                f"the queue is full ({self.max_queue} waiting beyond the replicas' {self.room} lanes); retry later",
                field="request",
                code="queue_full",
                rid=cid,
            )
        if sum(c == client for c in waiting) - self.room >= self.max_client_queue:
            raise P.ProtocolError(
                f"you have {self.max_client_queue} requests waiting, this server's limit for one "
                "client (--max-client-queue); wait for one to start, then retry",
                field="request",
                code="client_queue_full",
                rid=cid,
            )
        rid = self._inflight.new_rid()
        self._inflight.add(rid, Req(envelope, cid, client))
        self._waiting.add(rid)
        self.calls.generate(rid, cid, request)

    # --- from the replicas ----------------------------------------------------------------------------------
    def _event(self, key: int, kind: bytes, frames: list[bytes]) -> None:
        if kind == b"s" or kind == b"a":
            query = self._queries.pop(key, None)
            if query is None:
                return
            envelope, qid, client = query
            if kind == b"a":
                self._send_raw(envelope, frames[0])
                return
            waiting = [self._inflight.get(r).client for r in self._waiting]
            reply = aggregate(
                json.loads(frames[0]),
                qid,
                waiting=waiting,
                client=client,
                clients=len(self._inflight.clients() | {client}),
                finished=dict(self.finished),
                max_queue=self.max_queue,
                max_client_queue=self.max_client_queue,
            )
            self._send(envelope, reply)
            return
        if kind == b"o":
            return
        if kind in (b"q", b"Q"):
            self._numbered(key, read(frames[0]), frames[1:], kind == b"Q")
            return
        req = self._inflight.get(key)
        if req is None:  # its client went away; the request was cancelled
            return
        self._waiting.discard(key)
        for frame in frames:
            self._send_raw(req.envelope, frame)
        if kind == b"1":
            self._inflight.pop(key)
            self._order.forget(key)
            self.finished[_reason(frames[-1])] += 1

    def _numbered(self, rid: int, seq: int, frames: list[bytes], last: bool) -> None:
        """A numbered group of request `rid`'s frames: sent on with those before it, once they are all here."""
        if self._inflight.get(rid) is None:  # ended meanwhile (an error, its client gone)
            self._order.forget(rid)
            return
        for group, end in self._order.put(rid, seq, frames, last, time.monotonic()):
            self._event(rid, b"1" if end else b"0", group)

    def _end(self, rid: int, msg) -> None:
        req = self._inflight.pop(rid)
        self._waiting.discard(rid)
        self._order.forget(rid)
        if req is not None:
            self.finished[msg.code if isinstance(msg, P.Error) else "done"] += 1
            self._send(req.envelope, msg)

    # --- sending --------------------------------------------------------------------------------------------
    def _send(self, envelope: list[bytes], msg) -> None:
        self._send_raw(envelope, P.encode(msg))

    def _send_raw(self, envelope: list[bytes], frame: bytes) -> None:
        if envelope and not self._out.put(envelope + [frame]):
            log.warning("client %r is not reading; cancelling its requests", envelope[0])
            self._drop(envelope[0])

    def _flush(self) -> None:
        for ident in self._out.flush():
            self._drop(ident)

    def _drop(self, ident: bytes) -> None:
        """The client went away: cancel its requests on their replicas."""
        self._out.forget(ident)
        for rid, req in self._inflight.items():
            if req.envelope[0] == ident:
                self.calls.cancel(rid)
                self._inflight.pop(rid)
                self._waiting.discard(rid)
                self._order.forget(rid)
                self.finished["cancelled"] += 1


def _reason(frame: bytes) -> str:
    """The finish reason of a request's last frame (an error counts by its code)."""
    try:
        msg = json.loads(frame)
    except ValueError:
        return "internal"
    return msg.get("finish_reason") or msg.get("code") or "internal"
