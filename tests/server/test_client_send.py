"""Client.send: the timeout bounds a refused peer, and a pipe that vanishes between poll and send is retried."""

from __future__ import annotations

import pytest
import zmq

from speclane.pipeline.net.client import Client


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


def test_speclane_client_says_at_once_that_nothing_listens():
    """`speclane client` against a port nobody listens on: a clear message and exit 2, not a 120 s wait."""
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    with socket.socket() as s:  # bound and closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclane.pipeline.cli",
            "client",
            "--connect",
            f"tcp://127.0.0.1:{port}",
            "--prompt",
            "hi",
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"nothing answers at tcp://127.0.0.1:{port}" in done.stderr and "speclane serve" in done.stderr
    assert time.monotonic() - t0 < 30  # the interpreter's start and imports; the probe itself takes ~0 s
