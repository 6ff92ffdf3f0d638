"""A real `speclane serve` process stopped by SIGTERM: what finishes within the grace period ends with `done`, the
rest with one `error` (server_stopping), a request sent while stopping is refused, and the process exits 0. Over
HTTP, a request the shutdown ends is answered 503."""

from __future__ import annotations

import signal
import threading

from speclane.pipeline.cli.serve import HTTP_READY
from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client
from tests.server.conftest import post_json, start_server, wait_until


def _end(client: Client, rid) -> tuple[list, P._Msg]:
    """Every message for `rid` up to its final one."""
    msgs = [client.next_for(rid)]
    while msgs[-1].type == "token":
        msgs.append(client.next_for(rid))
    return msgs[:-1], msgs[-1]


def test_sigterm_finishes_or_ends_every_request_with_one_final_message(tmp_path):
    proc, endpoint = start_server(tmp_path / "serve.log", "--max-lanes", "2", "--grace", "4")
    try:
        with Client(endpoint, timeout=60) as client:
            client.generate(id="long", prompt="Count from one to a thousand:", max_tokens=2000, ignore_eos=True)
            assert client.next_for("long").type == "token"  # streaming
            client.generate(id="short", prompt="Hello", max_tokens=8, ignore_eos=True)
            first = client.next_for("short")
            assert first.type == "token", first
            proc.send_signal(signal.SIGTERM)
            client.generate(id="late", prompt="Hello", max_tokens=3)
            tokens, short = _end(client, "short")
            assert short.type == "done", short
            assert short.usage["completion_tokens"] == len(tokens) + 1 == 8
            late = _end(client, "late")[1]
            assert (late.type, late.code) == ("error", "server_stopping")
            tokens, long = _end(client, "long")
            assert (long.type, long.code, long.id) == ("error", "server_stopping", "long")
            assert len(tokens) < 2000
            assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_http_request_queued_at_shutdown_gets_503(tmp_path):
    lines: list[str] = []
    proc, endpoint = start_server(
        tmp_path / "serve.log", "--max-lanes", "1", "--grace", "1", "--http", "127.0.0.1:0", lines=lines
    )
    url = next(line[len(HTTP_READY) :].split()[0] for line in lines if line.startswith(HTTP_READY))
    answer: list = []
    try:
        with Client(endpoint, timeout=60) as client:
            client.generate(id="long", prompt="Count from one to a thousand:", max_tokens=2000, ignore_eos=True)
            assert client.next_for("long").type == "token"  # it holds the one lane
            body = {"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 4}
            waiting = threading.Thread(target=lambda: answer.append(post_json(url, "/v1/completions", body)))
            waiting.start()
            wait_until(lambda: client.stats().queue["waiting"] == 1, "the HTTP request queued behind the lane")
            proc.send_signal(signal.SIGTERM)
            waiting.join(60)
        [(status, reply)] = answer
        assert (status, reply["error"]["code"], reply["error"]["type"]) == (
            503,
            "server_stopping",
            "service_unavailable",
        )
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
