"""A client notices a dead server within seconds and says so, naming the endpoint, instead of waiting its whole
timeout; and it reconnects by itself to a server restarted on the same endpoint.

Real `speclane serve` processes: one killed with SIGKILL while a stream is in flight (its connection closes), then
one frozen with SIGSTOP (its connection stays open: only the ZMTP heartbeats can tell). The client's timeout is
120 s; each loss must be reported in under 10 s.
"""

from __future__ import annotations

import signal
import time

import pytest

from speclane.pipeline.cli.serve import stop as stop_server
from speclane.pipeline.net.client import Client, Unreachable
from tests.server.conftest import start_server

LONG = {"prompt": "Count from one to a thousand:", "max_tokens": 2000, "ignore_eos": True}


def _lost_within(stream, endpoint: str, seconds: float) -> Unreachable:
    t0 = time.monotonic()
    with pytest.raises(ConnectionError) as err:
        stream.wait()
    assert time.monotonic() - t0 < seconds, f"the loss took {time.monotonic() - t0:.1f} s to be reported"
    assert isinstance(err.value, Unreachable) and endpoint in str(err.value), str(err.value)
    return err.value


def test_a_killed_server_is_reported_and_a_restarted_one_serves_the_same_client(tmp_path):
    proc, endpoint = start_server(tmp_path / "first.log", "--max-lanes", "2")
    again = None
    try:
        with Client(endpoint, timeout=120) as client:
            stream = client.generate(**LONG)
            next(iter(stream))  # streaming
            proc.kill()
            proc.wait(30)
            error = _lost_within(stream, endpoint, 10)
            assert "connection was lost" in str(error) and "send them again" in str(error)
            with pytest.raises(Unreachable):  # and the stream stays lost: no second wait
                stream.wait()
            # A request sent while nothing listens: the same error, after the grace period, not after 120 s.
            t0 = time.monotonic()
            with pytest.raises(Unreachable):
                client.generate(prompt="Hello", max_tokens=2).wait()
            assert time.monotonic() - t0 < 10
            again, endpoint_again = start_server(tmp_path / "second.log", "--max-lanes", "2", "--bind", endpoint)
            assert endpoint_again == endpoint
            done = client.generate(prompt="Hello", max_tokens=3).wait()
            assert done.usage["completion_tokens"] >= 1
    finally:
        if proc.poll() is None:
            proc.kill()
        if again is not None:
            stop_server(again)


def test_a_frozen_server_is_reported_by_the_heartbeats(tmp_path):
    proc, endpoint = start_server(tmp_path / "serve.log", "--max-lanes", "2")
    try:
        with Client(endpoint, timeout=120) as client:
            stream = client.generate(**LONG)
            next(iter(stream))
            proc.send_signal(signal.SIGSTOP)  # its TCP connection stays open; nothing answers on it
            _lost_within(stream, endpoint, 10)
    finally:
        proc.send_signal(signal.SIGCONT)
        stop_server(proc)
