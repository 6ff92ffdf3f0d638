"""A small client for `speclane serve`: a DEALER socket, a token iterator per request, stats, graph and cancel.

One client may have several requests in flight; replies are sorted into per-stream inboxes as they arrive, so
iterating one stream never loses another's tokens. An id is the server's key for one request in flight at a time:
a stream is only ever given the messages of the request the server accepted under its id, and a second `generate`
under an id still in flight gets the server's `duplicate_id` refusal and nothing else. Used by `speclane client`,
the server tests and the load benchmark. A server that dies or stops answering is an `Unreachable` error (a
ConnectionError naming the endpoint) within seconds, for every stream then in flight, and the socket reconnects by
itself for new requests (pipeline/net/liveness.py). The message schemas are `pipeline/net/protocol.py`'s; serving is
`pipeline/net/server.py`'s.
"""

from __future__ import annotations

import collections
import itertools
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import zmq

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.liveness import Link, Unreachable, heartbeat
from speclane.pipeline.runtime.request import GenerateRequest, parse_request
from speclane.stages.contract.errors import SpeclaneError

__all__ = ["Client", "ServerError", "Stream", "Unreachable", "probe"]
_SLICE_S = 0.25  # how long one poll waits before the connection's state is looked at again


class ServerError(SpeclaneError):
    """The server answered with an error message; `code`, `field` and `rid` are the message's."""

    def __init__(self, msg: P.Error):
        self.code, self.field, self.rid = msg.code, msg.field, msg.id
        super().__init__(f"[{msg.code}] {msg.message}")


def probe(connect: str, seconds: float = 2.0) -> None:
    """Fail fast when nothing listens at a tcp:// endpoint (a DEALER would wait silently for one to appear).

    A plain TCP connect, closed at once; ipc:// and inproc:// are not probed."""
    url = urlsplit(connect)
    if url.scheme != "tcp":
        return
    host, _, port = connect[len("tcp://") :].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
    except (OSError, ValueError) as exc:
        raise Unreachable(
            f"nothing answers at {connect} ({exc}); is `speclane serve` running there? "
            "(start it, or pass --connect with its endpoint)"
        ) from exc


class Stream:
    """The tokens of one request, as the server streams them; `done` is the final message once iterated."""

    def __init__(self, client: "Client", rid: P.Id):
        self.client, self.id = client, rid
        self.tokens: list[P.Token] = []
        self.done: P.Done | None = None
        self.inbox: collections.deque = collections.deque()  # its messages, sorted in, not yet read
        self.ended = False  # its final message (done or error) is in: nothing more comes for it
        self.lost: Unreachable | None = None  # its server became unreachable before its final message

    def __iter__(self) -> Iterator[P.Token]:
        while self.done is None:
            msg = self.client.next_of(self)
            if isinstance(msg, P.Token):
                self.tokens.append(msg)
                yield msg
            elif isinstance(msg, P.Done):
                self.done = msg
            elif isinstance(msg, P.Error):
                raise ServerError(msg)

    def wait(self) -> P.Done:
        for _ in self:
            pass
        assert self.done is not None
        return self.done

    @property
    def missed(self) -> int:
        """Token messages that never arrived (lost with a dropped connection); the `done` still has them all."""
        return len(self.done.token_ids) - len(self.tokens) if self.done is not None else 0

    @property
    def text(self) -> str:
        """The answer so far; once `done` arrived, its whole text, tokens missed on the way included."""
        return self.done.text if self.done is not None else "".join(t.text for t in self.tokens)

    @property
    def token_ids(self) -> list[int]:
        return list(self.done.token_ids) if self.done is not None else [t.token_id for t in self.tokens]


class Client:
    def __init__(
        self,
        connect: str = "tcp://127.0.0.1:5557",
        *,
        timeout: float = 60.0,
        server_key: bytes | None = None,
        client_keys: tuple[bytes, bytes] | None = None,
        ctx: zmq.Context | None = None,
        check: bool = False,
        api_key: str | None = None,
    ):
        """`server_key` (the server's CURVE public key) and `client_keys` (public, secret) turn on CURVE.
        `check`: first make sure something listens at a tcp:// endpoint (`Unreachable` within 2 s if not).
        `api_key`: the server's API key, sent as `key` in every message this client builds (not in raw `send`s)."""
        if check:
            probe(connect)
        self.timeout, self.api_key = timeout, api_key
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        # Our own routing id: a reconnect (after the server dropped the connection for an oversized message,
        # say) is known as the same client, and the streams of our requests in flight continue.
        self.sock.setsockopt(zmq.ROUTING_ID, b"speclane-" + uuid.uuid4().hex.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        heartbeat(self.sock)
        if server_key is not None:
            if client_keys is None:
                client_keys = zmq.curve_keypair()
            self.sock.curve_serverkey = server_key
            self.sock.curve_publickey, self.sock.curve_secretkey = client_keys
        self.link = Link(self.sock, connect)  # before connecting: its first handshake is an event too
        self.sock.connect(connect)
        self._inbox: dict[str, collections.deque] = collections.defaultdict(collections.deque)  # no stream's
        self._streams: dict[str, list[Stream]] = {}  # id -> its streams not yet read to the end, oldest first
        self._ids = itertools.count()

    def close(self) -> None:
        self.link.close()
        self.sock.close(0)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- raw messages ---------------------------------------------------------------------------------------
    def send(self, message: dict[str, Any] | bytes) -> None:
        """Send one message as is (a dict becomes JSON): the way to send anything, valid or not.

        A DEALER with no usable peer (a server that refused our handshake, say) blocks on send forever; the
        client's timeout bounds that wait too, with the same TimeoutError as `recv`, and a server unreachable for
        liveness.GRACE_S is `Unreachable` sooner. A pipe can be writable at the poll and gone at the send (the
        handshake failing in between): that is retried until the deadline."""
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        start = time.monotonic()
        deadline = start + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(max(1, int(min(left, _SLICE_S) * 1000)), zmq.POLLOUT):
                self.link.check(start)
                continue
            try:
                self.sock.send(data, zmq.NOBLOCK)
                return
            except zmq.Again:
                time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        raise TimeoutError(f"could not hand a message to the server within {self.timeout:g} s")

    def recv(self, timeout: float | None = None) -> P._Msg:
        """The next message from the server, whatever its id; TimeoutError if none comes in time, `Unreachable`
        (a ConnectionError) once the connection has been lost for liveness.GRACE_S of the wait."""
        start = time.monotonic()
        deadline = start + (self.timeout if timeout is None else timeout)
        while True:
            left = deadline - time.monotonic()
            if self.sock.poll(max(0, int(min(left, _SLICE_S) * 1000)), zmq.POLLIN):
                return P.parse_server(self.sock.recv())
            self.link.check(start)
            if left <= 0:
                raise TimeoutError(f"no message from the server within {deadline - start:g} s")

    def next_for(self, rid: Any, timeout: float | None = None) -> P._Msg:
        """The next message for request `rid` (its oldest stream's, when `generate` sent it); messages for other
        ids wait in their inboxes."""
        key = json.dumps(rid)
        if self._streams.get(key):
            return self.next_of(self._streams[key][0], timeout)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self._inbox[key]:
            self._sort(self._recv(max(0.0, deadline - time.monotonic())))
        return self._inbox[key].popleft()

    def next_of(self, stream: Stream, timeout: float | None = None) -> P._Msg:
        """The next message of `stream`; TimeoutError if none comes in time, `Unreachable` once its server is
        (for this stream and every other one in flight: their requests are lost with the connection)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not stream.inbox:
            if stream.lost is not None:
                raise stream.lost
            self._sort(self._recv(max(0.0, deadline - time.monotonic())))
        msg = stream.inbox.popleft()
        key = json.dumps(stream.id)
        if stream.ended and not stream.inbox and stream in self._streams.get(key, ()):
            self._streams[key].remove(stream)
            if not self._streams[key]:
                del self._streams[key]
        return msg

    def _recv(self, timeout: float) -> P._Msg:
        try:
            return self.recv(timeout)
        except Unreachable as exc:
            # What was in flight died with the connection: a server that comes back does not know those requests.
            for key, streams in list(self._streams.items()):
                for stream in streams:
                    if not stream.ended:
                        stream.ended, stream.lost = True, exc
                self._streams[key] = [s for s in streams if s.lost is None]
                if not self._streams[key]:
                    del self._streams[key]
            raise

    def _sort(self, msg: P._Msg) -> None:
        """Put `msg` in its stream's inbox. The server runs one request an id at a time and answers in order, so
        everything under an id is its oldest running stream's, but for a `duplicate_id` refusal: that one is the
        next stream's, sent while the first still ran."""
        key = json.dumps(getattr(msg, "id", None))
        running = [s for s in self._streams.get(key, ()) if not s.ended]
        if not running:
            self._inbox[key].append(msg)
            return
        refused = isinstance(msg, P.Error) and msg.code == "duplicate_id" and len(running) > 1
        stream = running[1] if refused else running[0]
        stream.inbox.append(msg)
        stream.ended = isinstance(msg, (P.Done, P.Error))

    # --- requests -------------------------------------------------------------------------------------------
    def signed(self, message: dict[str, Any]) -> dict[str, Any]:
        """`message` with this client's API key as its `key` field (as it is, without a key)."""
        return message if self.api_key is None else {**message, "key": self.api_key}

    def new_id(self) -> str:
        return f"r{next(self._ids)}"

    def generate(self, request: GenerateRequest | None = None, **fields: Any) -> Stream:
        """Send a generate request (a GenerateRequest, or its fields) and return its stream."""
        if request is None:
            request = parse_request({"id": self.new_id(), **fields})
        self.send(self.signed(P.generate_json(request)))
        stream = Stream(self, request.id)
        self._streams.setdefault(json.dumps(request.id), []).append(stream)
        return stream

    def cancel(self, rid: P.Id) -> None:
        self.send(self.signed({"v": P.VERSION, "type": "cancel", "id": rid}))

    def _query(self, kind: str) -> P._Msg:
        qid = self.new_id()
        self.send(self.signed({"v": P.VERSION, "type": kind, "id": qid}))
        msg = self.next_for(qid)
        if isinstance(msg, P.Error):
            raise ServerError(msg)
        return msg

    def stats(self) -> P.StatsReply:
        return self._query("stats")

    def graph(self) -> dict[str, Any]:
        return self._query("graph").graph

    def metrics(self) -> str:
        """The server's metrics in Prometheus' text format."""
        return self._query("metrics").text
