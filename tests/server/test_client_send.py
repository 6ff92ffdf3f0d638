"""Client.send: the timeout bounds a refused peer, and a pipe that vanishes between poll and send is retried."""
from __future__ import annotations

import pytest
import zmq

from pipeline.net.client import Client


class _VanishingPipe:
    """Writable at every poll; the first `drops` sends find the pipe gone (zmq.Again), as after a failed handshake."""

    def __init__(self, drops: int):
        self.drops, self.sent = drops, []

    def poll(self, timeout_ms: int, flags: int) -> int:
        return flags

    def send(self, data: bytes, flags: int) -> None:
        if self.drops:
            self.drops -= 1
            raise zmq.Again()
        self.sent.append(data)

    def close(self, linger: int = 0) -> None:
        pass


def _client(sock, timeout: float) -> Client:
    client = Client("tcp://127.0.0.1:1", timeout=timeout)
    client.sock.close(0)
    client.sock = sock
    return client


def test_a_pipe_dropped_between_poll_and_send_is_retried():
    sock = _VanishingPipe(drops=3)
    _client(sock, timeout=5).send({"v": 1, "type": "stats"})
    assert sock.sent == [b'{"v": 1, "type": "stats"}']


def test_a_pipe_that_never_takes_the_message_is_a_timeout_not_zmq_again():
    with pytest.raises(TimeoutError, match="within 0.2 s"):
        _client(_VanishingPipe(drops=10**9), timeout=0.2).send({"v": 1, "type": "stats"})

