"""Whether a ZeroMQ peer is still there: the heartbeat options both ends set, and the client's view of its one
connection, read from its socket's monitor.

ZMTP heartbeats close a connection whose peer stops answering (a server killed, frozen or cut off) within
HEARTBEAT_TIMEOUT_MS; the monitor reports that, and a connection that is not back within GRACE_S is a
`ConnectionError` naming the endpoint instead of a wait for the whole timeout. What a client does with its
streams then is `pipeline/net/client.py`'s; the server's socket options are `pipeline/net/sockets.py`'s.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import zmq
from zmq.utils.monitor import recv_monitor_message

from speclane.stages.contract.errors import SpeclaneError

HEARTBEAT_IVL_MS = 1000  # a PING every second on an otherwise quiet connection
HEARTBEAT_TIMEOUT_MS = 3000  # no traffic this long after a PING: the connection is closed
HEARTBEAT_TTL_MS = 10_000  # asks the other end (whatever its own settings) to drop us after this long silent
# A connection lost this long is a dead server. Shorter would fail streams a reconnect would have saved: the
# server keeps a client's streams 3 s (pipeline/net/outbox.py) and drops a client that sent an oversized message,
# which then reconnects under its routing id at once.
GRACE_S = 3.0

_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class Unreachable(SpeclaneError, ConnectionError):
    """The server cannot be reached: nothing listens at its endpoint, the connection was lost and did not come
    back, or the server refused the handshake."""


def heartbeat(sock: zmq.Socket) -> None:
    """The heartbeat options of both ends: a peer that stops answering is dropped within a few seconds."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TTL_MS)


class Link:
    """A connecting socket's one connection, from its monitor's events: up from a completed handshake until a
    disconnect or a failed handshake. inproc:// has no connection to lose (nor events): always up."""

    def __init__(self, sock: zmq.Socket, endpoint: str):
        self.endpoint = endpoint
        watched = urlsplit(endpoint).scheme in ("tcp", "ipc")
        self.monitor = sock.get_monitor_socket(_EVENTS) if watched else None
        self._sock = sock
        self.up = not watched
        self.down_since = time.monotonic()
        self.why = "nothing answers there"

    def update(self) -> None:
        """Read the monitor's pending events."""
        while self.monitor is not None and self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.up = True
                continue
            if self.up:
                self.down_since, self.why = time.monotonic(), "the connection was lost"
            self.up = False
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.why = "the server refused this client (with --curve-keys: is its key in the server's clients/?)"
            elif event != zmq.EVENT_DISCONNECTED:
                self.why = "the handshake failed (a CURVE server and a client without keys, or the other way round?)"

    def check(self, since: float) -> None:
        """Raise Unreachable if the connection has been down for GRACE_S, counting from `since` at the earliest
        (when the caller began to wait: a server back by then is not reported)."""
        self.update()
        if not self.up and time.monotonic() - max(self.down_since, since) > GRACE_S:
            raise Unreachable(
                f"the server at {self.endpoint} is unreachable: {self.why}, and no connection for "
                f"{GRACE_S:g} s; requests in flight there are lost (is `speclane serve` running? "
                "send them again once it is back)"
            )

    def close(self) -> None:
        if self.monitor is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(0)
            self.monitor = None
