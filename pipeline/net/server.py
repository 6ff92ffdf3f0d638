"""The ZeroMQ intake: a ROUTER socket in front of one Engine, streaming each committed token as its own message.

Owns the serve loop (poll briefly when idle, between engine steps when busy), routing (a request is known by
its client's ROUTER identity plus the client's own id, so two clients may both use id 1), per-client outboxes
(a slow client never blocks a round), dropping the requests of a client that went away, and the socket's
security settings (loopback unless allowed, CURVE with a ZAP allow-list, a maximum message size).
Message schemas belong in `pipeline/net/protocol.py`; what a round does belongs to the engine and its spec.
"""
from __future__ import annotations

import collections
import ipaddress
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from pipeline.net import protocol as P
from stages.contract.errors import ConfigError, RequestError
from stages.contract.events import DoneEvent, TokenEvent

log = logging.getLogger("speclane.server")

# A client whose unsent messages pile up past this is not reading: its requests are cancelled.
MAX_OUTBOX = 50_000
# Frames read per loop turn before the engine gets a step: intake cannot starve the running lanes.
MAX_INTAKE = 256


def check_bind(bind: str, allow_remote: bool) -> None:
    """Refuse an endpoint reachable from other machines unless `allow_remote`."""
    url = urlsplit(bind)
    if url.scheme in ("ipc", "inproc"):
        return
    if url.scheme != "tcp":
        raise ConfigError(f"--bind {bind}: use tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    host = bind[len("tcp://"):].rpartition(":")[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # '*', an interface name or a host name: possibly reachable from outside
    if not loopback and not allow_remote:
        raise ConfigError(f"--bind {bind}: '{host}' is not a loopback address; bind to tcp://127.0.0.1:PORT, "
                          f"or pass --allow-remote (and consider --curve-keys)")


@attrs.define
class _Req:
    envelope: list[bytes]   # ROUTER identity (+ a REQ client's empty delimiter)
    cid: Any                # the client's own id


@attrs.define
class Server:
    engine: Any
    bind: str = "tcp://127.0.0.1:5557"
    allow_remote: bool = False
    curve_keys: Path | None = None
    max_message_bytes: int = 1 << 20
    max_queue: int = 64
    idle_poll_ms: int = 50
    ctx: zmq.Context = attrs.field(factory=zmq.Context)
    endpoint: str = ""
    _sock: Any = None
    _auth: Any = None
    _next: int = 0
    _reqs: dict[int, _Req] = attrs.field(factory=dict)            # engine rid -> request
    _by_key: dict[tuple[bytes, str], int] = attrs.field(factory=dict)  # (identity, client id) -> engine rid
    _outbox: dict[bytes, collections.deque] = attrs.field(factory=dict)
    finished: collections.Counter = attrs.field(factory=collections.Counter)
    _stop: bool = False

    def start(self) -> str:
        check_bind(self.bind, self.allow_remote)
        sock = self.ctx.socket(zmq.ROUTER)
        # EHOSTUNREACH on a send to a client that went away, instead of a silent drop: that frees its lanes.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        # Transport heartbeats drop a peer that stops answering even when its TCP connection lingers.
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve_keys is not None:
            self._curve(sock, Path(self.curve_keys))
        sock.bind(self.bind)
        self._sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.endpoint

    def _curve(self, sock, keys: Path) -> None:
        secret, clients = keys / "server.key_secret", keys / "clients"
        if not secret.is_file() or not clients.is_dir():
            raise ConfigError(f"--curve-keys {keys}: expected server.key_secret and a clients/ folder of allowed "
                              "client public keys (*.key); zmq.auth.create_certificates writes both kinds")
        public, private = zmq.auth.load_certificate(secret)
        self._auth = ThreadAuthenticator(self.ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=str(clients))
        sock.curve_secretkey, sock.curve_publickey, sock.curve_server = private, public, True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
        if self._auth is not None:
            self._auth.stop()

    def stop(self) -> None:
        self._stop = True

    # --- the loop -------------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        while not self._stop:
            self.turn()

    def turn(self) -> None:
        """One loop turn: read what arrived, run one engine step if busy, flush outboxes."""
        busy = self.engine.busy()
        if self._sock.poll(0 if busy else self.idle_poll_ms, zmq.POLLIN):
            for _ in range(MAX_INTAKE):
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._receive(frames)
        if self.engine.busy():
            self._step()
        self._flush()

    def _receive(self, frames: list[bytes]) -> None:
        # A DEALER sends [payload]; a REQ socket adds an empty delimiter, which its reply must carry too.
        envelope = frames[:2] if len(frames) == 3 and not frames[1] else frames[:1]
        try:
            if len(frames) != len(envelope) + 1:
                raise P.ProtocolError("send one JSON frame a message (from a DEALER or REQ socket)",
                                      field="message", code="bad_frames")
            self._handle(envelope, P.parse_client(frames[-1]))
        except RequestError as exc:
            self._send(envelope, P.Error(id=getattr(exc, "rid", None), code=exc.code, field=exc.field,
                                         message=str(exc)))
        except Exception as exc:  # noqa: BLE001 - nothing a client sends may take the loop down
            log.exception("message from %r failed", envelope[:1])
            self._send(envelope, P.Error(code="internal", message=f"{type(exc).__name__}: {exc}"))

    def _handle(self, envelope: list[bytes], msg) -> None:
        if isinstance(msg, P.Generate):
            self._generate(envelope, msg.request)
        elif isinstance(msg, P.Cancel):
            rid = self._by_key.get(_key(envelope, msg.id))
            if rid is None or not self.engine.cancel(rid):
                raise P.ProtocolError(f"field 'id': no request {msg.id!r} of yours is in flight", field="id",
                                      code="unknown_id", rid=msg.id)
        elif isinstance(msg, P.StatsQuery):
            self._send(envelope, self.stats(msg.id))
        elif isinstance(msg, P.GraphQuery):
            from pipeline.framework.introspect import graph_json  # imported only when a client asks for the graph

            self._send(envelope, P.GraphReply(id=msg.id, graph=graph_json(self.engine.verify.graph)))

    def _generate(self, envelope: list[bytes], request) -> None:
        key = _key(envelope, request.id)
        if key in self._by_key:
            raise P.ProtocolError(f"field 'id': request {request.id!r} is already in flight from this client; "
                                  "use a new id", field="id", code="duplicate_id", rid=request.id)
        eng = self.engine
        # The queue bound counts requests beyond the free lanes: the engine only admits at its next step, so
        # a burst that arrives between two steps must not be refused while lanes are free.
        if len(eng.queue) - len(eng.lanes.free) >= self.max_queue:
            raise P.ProtocolError(f"the queue is full ({self.max_queue} waiting beyond {eng.lanes.max_lanes} "
                                  "busy lanes); retry later", field="request", code="queue_full", rid=request.id)
        rid = self._next
        try:
            self.engine.submit(request.model_copy(update={"id": rid}))
        except RequestError as exc:
            raise P.ProtocolError(str(exc), field=exc.field, code=exc.code, rid=request.id) from exc
        self._next += 1
        self._reqs[rid] = _Req(envelope, request.id)
        self._by_key[key] = rid

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - an engine fault ends what is in flight, not the server
            log.exception("engine step failed")
            for rid in list(self._reqs):
                self.engine.cancel(rid)
                self._end(rid, P.Error(id=self._reqs[rid].cid, code="internal",
                                       message=f"engine step failed: {type(exc).__name__}: {exc}"))
            return
        for ev in events:
            req = self._reqs.get(ev.rid)
            if req is None:
                continue
            if isinstance(ev, TokenEvent):
                self._send(req.envelope, P.token_msg(req.cid, ev))
            elif isinstance(ev, DoneEvent):
                self.finished[ev.finish_reason] += 1
                self._end(ev.rid, P.done_msg(req.cid, ev))

    def _end(self, rid: int, msg) -> None:
        req = self._reqs.pop(rid, None)
        if req is not None:
            self._by_key.pop(_key(req.envelope, req.cid), None)
            self._send(req.envelope, msg)

    # --- sending --------------------------------------------------------------------------------------------
    def _send(self, envelope: list[bytes], msg) -> None:
        if not envelope:
            return
        box = self._outbox.setdefault(envelope[0], collections.deque())
        box.append(envelope + [P.encode(msg)])
        if len(box) > MAX_OUTBOX:
            log.warning("client %r is not reading; cancelling its requests", envelope[0])
            self._drop(envelope[0])

    def _flush(self) -> None:
        for ident in list(self._outbox):
            box = self._outbox[ident]
            while box:
                try:
                    self._sock.send_multipart(box[0], zmq.NOBLOCK)
                except zmq.Again:
                    break  # its pipe is full: keep the rest for the next turn
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    self._drop(ident)
                    break
                box.popleft()
            if not box:
                self._outbox.pop(ident, None)

    def _drop(self, ident: bytes) -> None:
        """The client went away (or stopped reading): cancel its requests so their lanes free next round."""
        self._outbox.pop(ident, None)
        for rid, req in list(self._reqs.items()):
            if req.envelope[0] == ident:
                if self.engine.cancel(rid):
                    self.finished["cancelled"] += 1
                self._by_key.pop(_key(req.envelope, req.cid), None)
                del self._reqs[rid]

    def stats(self, qid=None) -> P.StatsReply:
        eng = self.engine
        return P.StatsReply(
            id=qid, lanes={"active": len(eng.lanes.active), "free": len(eng.lanes.free), "max": eng.lanes.max_lanes},
            queue={"waiting": len(eng.queue), "max": self.max_queue}, finished=dict(self.finished),
            clients=len({r.envelope[0] for r in self._reqs.values()}), spec=eng.stats(list(eng.retired)))


def _key(envelope: list[bytes], cid: Any) -> tuple[bytes, str]:
    # 1 and "1" are different ids; json.dumps keeps them apart.
    return envelope[0], json.dumps(cid)
