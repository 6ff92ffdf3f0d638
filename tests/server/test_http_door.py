"""What reaches the HTTP door before any route runs: only JSON sent as JSON is served, a request must arrive within
the read deadline (a thousand stalled connections are all closed), a client that hangs up mid-body is one log line,
a body nested 100,000 deep is a 400 naming the body, and a URL or method no route serves is answered in OpenAI's
error shape, naming the routes there are."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.server.conftest import KEY, MODEL, post_json, wait_until

pytest.importorskip("fastapi")  # the `http` extra

BODY = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""])
def test_a_body_not_sent_as_json_is_refused_with_415(gateway, content_type):
    # A web page may post text/plain or a form to a local server without a CORS preflight; never application/json.
    status, answer = post_json(gateway[0], "/v1/completions", BODY, key=KEY, content_type=content_type)
    assert (status, answer["error"]["code"], answer["error"]["param"]) == (415, "unsupported_media_type", "body")
    assert "Content-Type: application/json" in answer["error"]["message"]


def test_json_with_a_charset_is_json(gateway):
    status, answer = post_json(
        gateway[0], "/v1/completions", BODY, key=KEY, content_type="Application/JSON; charset=utf-8"
    )
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1


def test_a_body_nested_100000_deep_is_a_400_naming_the_body(gateway):
    deep = b'{"model": "' + MODEL.encode() + b'", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, answer = post_json(gateway[0], "/v1/completions", deep, key=KEY)
    assert (status, answer["error"]["param"]) == (400, "body")
    assert "nests arrays or objects deeper" in answer["error"]["message"]


@pytest.mark.parametrize(
    "method, path, status, code",
    [
        ("GET", "/v1/nowhere", 404, "unknown_url"),
        ("POST", "/v1/chat/completion", 404, "unknown_url"),  # a typo of a route
        ("GET", "/v1/completions", 405, "method_not_allowed"),
        ("POST", "/v1/models", 405, "method_not_allowed"),
    ],
)
def test_a_route_or_method_not_served_is_an_openai_error(gateway, method, path, status, code):
    parts = urlsplit(gateway[0])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        got, answer = resp.status, json.loads(resp.read())
    finally:
        conn.close()
    assert got == status and list(answer) == ["error"], answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}, error  # OpenAI's error object, nothing else
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, code), error
    assert f"{method} {path}" in error["message"]
    assert "POST /v1/chat/completions" in error["message"] and "GET /v1/models" in error["message"]  # the way on


def test_a_client_that_hangs_up_mid_body_is_one_log_line(gateway):
    url, _, log = gateway
    with _connect(url) as conn:
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b'\r\nContent-Length: 1000\r\n\r\n{"model": '
        )
        time.sleep(0.3)  # the route is reading the body
    wait_until(lambda: "hung up before its body arrived whole" in log.read_text(), "the hang-up logged", 30)
    assert post_json(url, "/v1/completions", BODY, key=KEY)[0] == 200  # and the door still serves
    text = log.read_text()
    assert text.count("hung up before its body arrived whole") == 1
    assert "Traceback" not in text and "Exception in ASGI application" not in text


def test_stalled_connections_are_closed_at_the_read_deadline(caplog):
    """A thousand connections that never finish their request: half stall in their headers, half in their body.
    Each is answered 408 and closed once the deadline passes (one log line each), and the door serves others."""
    caplog.set_level(logging.INFO, logger="speclane.http")
    from speclane.pipeline.net.http import create_app
    from speclane.pipeline.net.http_door import Gateway, http_socket

    gateway = Gateway(http_socket("127.0.0.1:0", False), create_app("inproc://nobody", MODEL), read_timeout=1.0)
    url = gateway.start()
    stalled = []
    try:
        for i in range(1000):
            conn = _connect(url)
            conn.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                if i % 2
                else b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            stalled.append(conn)
        parts = urlsplit(url)
        import http.client

        check = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        check.request("GET", "/v1/models")
        assert check.getresponse().status == 200
        check.close()
        deadline = time.monotonic() + 60
        answers = []
        for conn in stalled:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            data = b""
            try:
                while chunk := conn.recv(4096):
                    data += chunk
            except TimeoutError:
                pytest.fail(f"a stalled connection is still open after the deadline (got {data!r} so far)")
            answers.append(data)
        assert all(a.startswith(b"HTTP/1.1 408 ") and b'"code": "request_timeout"' in a for a in answers), {
            a[:40] for a in answers
        }
    finally:
        for conn in stalled:
            conn.close()
        gateway.stop()
    lines = [r for r in caplog.records if "did not arrive within 1 s; connection closed" in r.getMessage()]
    assert len(lines) == 1000 and not any(r.exc_info for r in caplog.records if r.levelno >= logging.WARNING)
