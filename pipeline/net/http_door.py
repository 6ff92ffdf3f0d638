"""The HTTP door of `speclane serve --http`: its listening socket, the uvicorn server that runs the gateway app in a
thread of its own, and the time a request may take to arrive.

Every request must arrive whole, headers and body, within `read_timeout` seconds of its connection opening (or of
the previous answer on a kept-alive connection ending); a connection that has not is answered 408 and closed, so
stalled connections cannot pile up. Routes, bodies and the ZeroMQ side are `pipeline/net/http.py`'s and
`pipeline/net/openai_api.py`'s.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import socket
import threading
import time

import h11
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from speclane.stages.contract.errors import ConfigError

log = logging.getLogger("speclane.http")

READ_TIMEOUT_S = 30.0  # headers and body of one request, from its connection (or the previous answer)
DEADLINE_KEY = "speclane.read_deadline"  # set in the scope of a request whose body missed its deadline


def _timeout_answer(seconds: float) -> bytes:
    """A 408 in OpenAI's error shape, written as is: h11 has no request to answer while headers are missing."""
    body = json.dumps(
        {
            "error": {
                "message": f"the request did not arrive whole within {seconds:g} s; send it again",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_timeout",
            }
        }
    )
    return (
        f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n\r\n{body}"
    ).encode()


class ReadDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request (headers and body): a connection still
    sending its request `read_timeout` seconds after it opened, or after the previous answer ended, is closed."""

    def __init__(self, *args, read_timeout: float = READ_TIMEOUT_S, **kwargs):
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout
        self._deadline: object | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # Armed first: a pipelined request read in full by super() is then answered, not timed out (see _expired).
        self._arm()
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.read_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        # IDLE: its headers are not all in; SEND_BODY: its body is not. DONE and after: it is being answered.
        if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            return
        cycle = self.cycle if self.cycle is not None and not self.cycle.response_complete else None
        if cycle is not None and self.conn.their_state is h11.SEND_BODY:
            cycle.scope[DEADLINE_KEY] = self.read_timeout  # the route reading the body logs its one line
        else:
            log.info(
                "HTTP %s: its request did not arrive within %g s; connection closed",
                _peer(self.client),
                self.read_timeout,
            )
        if cycle is None or not cycle.response_started:
            self.transport.write(_timeout_answer(self.read_timeout))
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "client"


def http_socket(address: str, allow_remote: bool) -> socket.socket:
    """A listening socket for `--http HOST:PORT` (port 0 picks a free one), bound before any model loads so a
    refused address is quick; a non-loopback host needs `allow_remote`."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--http {address}: use HOST:PORT, e.g. 127.0.0.1:8000")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not allow_remote:
        raise ConfigError(
            f"--http {address}: '{host}' is not a loopback address; use 127.0.0.1:PORT, or pass "
            "--allow-remote (and consider --api-key-file)"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--http {address}: cannot listen there ({exc.strerror})") from exc
    sock.listen(1024)
    return sock


class Gateway:
    """uvicorn serving `app` on `sock` in a thread of its own, beside the ZeroMQ serve loop. Its log lines go
    through the process's logging (the `uvicorn.error` logger, warnings and up)."""

    def __init__(self, sock: socket.socket, app: FastAPI, read_timeout: float = READ_TIMEOUT_S):
        import uvicorn

        self.sock = sock
        protocol = functools.partial(ReadDeadline, read_timeout=read_timeout)
        config = uvicorn.Config(
            app, http=protocol, log_config=None, log_level="warning", lifespan="off", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="speclane-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"the HTTP gateway did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
