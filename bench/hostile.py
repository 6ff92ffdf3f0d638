"""Hostile clients for the soak benchmark (bench/soak.py): the `Door` they share, their errors, and the ZeroMQ
kinds. Each kind builds one bad input, sends it to a running `speclane serve` and returns the labels of the
replies it got back (an error's code, a message's type), so the soak can count inputs, replies and `internal`
faults per kind.

ZeroMQ replies are read up to a `stats` query sent right after the input (the server answers a client's messages
in order), so a missing reply is `Unanswered`; kinds that start a generate read it to its end through `Client`.
Every input is bounded in size (the server's message limit plus 4 KiB at most) and in time (`Door.wait_s`).
Not here: the HTTP kinds (bench/hostile_http.py); what the soak reports (bench/soak_report.py); the server's rules
for these inputs, which tests/server/ pins.
"""

from __future__ import annotations

import json
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client, ServerError

STOP_COUNT, STOP_BYTES = 16, 256  # the protocol's bounds on stop strings (pipeline/runtime/request.py)
ZMTP_GREETING = 64  # what libzmq itself sends on any connection before it reads a byte


class Unanswered(Exception):
    """The server sent no reply (or no `stats` answer after it) within the door's wait."""


class AtBound(Exception):
    """Nothing sent: the kind's bound is reached. `labels`: replies to its earlier inputs, collected all the same."""

    def __init__(self, message: str, labels: list[str]):
        super().__init__(message)
        self.labels = labels


@dataclass
class Door:
    """A server's doors (`url` None: no --http), its limit, and the bounds on one input's wait and stalled sockets."""

    endpoint: str
    url: str | None
    model: str
    max_message_bytes: int
    rng: random.Random
    ctx: zmq.Context
    wait_s: float = 10.0
    max_stalled: int = 8
    stalled: list = field(default_factory=list)  # the stalled HTTP connections still open


# --- ZeroMQ ---------------------------------------------------------------------------------------------------
def _dealer(door: Door) -> zmq.Socket:
    sock = door.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, bytes([door.rng.randint(1, 255)]) + door.rng.randbytes(door.rng.randint(0, 60)))
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(door.endpoint)
    return sock


def _label(raw: bytes) -> str:
    try:
        msg = P.parse_server(raw)
    except Exception:  # noqa: BLE001 - a reply the client's schema cannot read is itself a finding
        return "unreadable"
    return getattr(msg, "code", None) or msg.type


def _exchange(door: Door, frame: bytes) -> list[str]:
    """Send `frame`, then a `stats` query; the labels of every reply before the query's answer."""
    sock, tag = _dealer(door), f"soak-{uuid.uuid4().hex}"
    try:
        sock.send(frame)
        sock.send(json.dumps({"v": 1, "type": "stats", "id": tag}).encode())
        got, deadline = [], time.monotonic() + door.wait_s
        while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
            raw = sock.recv()
            if tag.encode() in raw and _label(raw) == "stats":
                return got
            got.append(_label(raw))
        raise Unanswered(f"{len(got)} replies and no stats answer within {door.wait_s:g} s")
    finally:
        sock.close(0)


def _generate(**fields) -> bytes:
    return json.dumps({"v": 1, "type": "generate", "id": uuid.uuid4().hex[:12], **fields}).encode()


def raw_frame(door: Door) -> list[str]:
    return _exchange(door, door.rng.randbytes(door.rng.randint(1, 3000)))


def raw_tcp(door: Door) -> list[str]:
    """Random bytes on the port, not ZeroMQ at all (sometimes behind a ZMTP signature): at most libzmq's greeting
    comes back; more is a reply (labelled with its size)."""
    host, port = door.endpoint[len("tcp://") :].rsplit(":", 1)
    data = door.rng.randbytes(door.rng.randint(1, 4000))
    if door.rng.random() < 0.5:
        data = b"\xff" + bytes(8) + b"\x7f" + data
    got, deadline = b"", time.monotonic() + 0.5
    with socket.create_connection((host, int(port)), timeout=0.5) as sock:
        try:
            sock.sendall(data)
            while time.monotonic() < deadline and (chunk := sock.recv(65536)):
                got += chunk
        except OSError:  # reset, or the timeout: the server closed or said nothing more
            pass
    return [f"{len(got)} bytes"] if len(got) > ZMTP_GREETING else []


def not_json(door: Door) -> list[str]:
    text = "".join(door.rng.choice('{}[]":,nulltrue0123 \\xé') for _ in range(door.rng.randint(1, 400)))
    return _exchange(door, text.encode())


def deep_json(door: Door) -> list[str]:
    """Arrays or objects nested up to as deep as fits in one message (past the limit, nothing would be read)."""
    arrays = door.rng.random() < 0.5
    top = max(2, (door.max_message_bytes - 200) // (2 if arrays else 6))
    depth = door.rng.randint(min(1000, top), top)
    inner = b"[" * depth + b"]" * depth if arrays else b'{"a":' * depth + b"1" + b"}" * depth
    return _exchange(door, b'{"v": 1, "type": "generate", "id": 9, "prompt": ' + inner + b"}")


def huge_number(door: Door) -> list[str]:
    key = door.rng.choice(["max_tokens", "id", "top_k", "seed", "v", "temperature"])
    digits = "-" * door.rng.randint(0, 1) + "9" * door.rng.randint(18, 6000)
    msg = json.dumps({"v": 1, "type": "generate", "id": 1, "prompt": "Hi", "max_tokens": 2, key: 0})
    return _exchange(door, msg.replace(f'"{key}": 0', f'"{key}": {digits}').encode())


def surrogate_id(door: Door) -> list[str]:
    rid = door.rng.choice(["\ud800", "\udfff", "a\udc80b", "\ud83d" * door.rng.randint(1, 200)])
    kind = door.rng.choice(["stats", "graph", "cancel", "generate"])
    msg = {"v": 1, "type": kind, "id": rid, **({"prompt": "Hi", "max_tokens": 2} if kind == "generate" else {})}
    return _exchange(door, json.dumps(msg).encode())


def cancel_unknown(door: Door) -> list[str]:
    rid = door.rng.choice([uuid.uuid4().hex, door.rng.randint(-(2**63), 2**63 - 1), "x" * 256])
    return _exchange(door, json.dumps({"v": 1, "type": "cancel", "id": rid}).encode())


def oversized(door: Door) -> list[str]:
    """A generate past --max-message-bytes: the server drops the connection unread, so nothing comes back."""
    sock = _dealer(door)
    try:
        sock.send(_generate(prompt="x" * (door.max_message_bytes + door.rng.randint(1, 4096))))
        return [_label(sock.recv())] if sock.poll(500) else []
    finally:
        sock.close(0)


def _client_labels(*streams) -> list[str]:
    out = []
    for s in streams:
        try:
            s.wait()
        except ServerError as exc:
            out.append(exc.code)
        out += ["token"] * len(s.tokens) + (["done"] if s.done is not None else [])
    return out


def duplicate_id(door: Door) -> list[str]:
    """Two generates under one id on one connection: the second is refused, the first runs to its end."""
    with Client(door.endpoint, timeout=door.wait_s, ctx=door.ctx) as client:
        rid = uuid.uuid4().hex[:8]
        first = client.generate(id=rid, prompt="Count to ten:", max_tokens=8, ignore_eos=True)
        second = client.generate(id=rid, prompt="Hello", max_tokens=8, ignore_eos=True)
        return _client_labels(second, first)


def stop_flood(door: Door) -> list[str]:
    """A generate with as many stop strings as allowed, each as long as allowed, most of them almost matching."""
    word = door.rng.choice(["the ", "one, ", "é", "\n", "def "])
    stops = [(word * STOP_BYTES).encode()[: STOP_BYTES - i].decode(errors="ignore") for i in range(STOP_COUNT - 1)]
    stops.append(door.rng.choice(["x", "\n\n", "é" * (STOP_BYTES // 2)]))
    with Client(door.endpoint, timeout=door.wait_s, ctx=door.ctx) as client:
        return _client_labels(client.generate(prompt=f"Repeat after me: {word * 20}", stop=stops, max_tokens=16))


def vanish(door: Door) -> list[str]:
    """A long generate whose client closes its socket as soon as the first token comes (or the wait ends)."""
    sock = _dealer(door)
    try:
        sock.send(_generate(prompt="Count from one to a thousand:", max_tokens=512, ignore_eos=True))
        return [_label(sock.recv())] if sock.poll(int(door.wait_s * 1000)) else []
    finally:
        sock.close(0)


ZMQ_KINDS: dict[str, Callable[[Door], list[str]]] = {
    "raw_frame": raw_frame,
    "raw_tcp": raw_tcp,
    "not_json": not_json,
    "deep_json": deep_json,
    "huge_number": huge_number,
    "surrogate_id": surrogate_id,
    "oversized": oversized,
    "duplicate_id": duplicate_id,
    "cancel_unknown": cancel_unknown,
    "stop_flood": stop_flood,
    "vanish": vanish,
}
EXPECTED = {
    "raw_frame": "one error",
    "raw_tcp": "nothing past libzmq's greeting",
    "not_json": "one bad_json error",
    "deep_json": "one bad_json error",
    "huge_number": "one error",
    "surrogate_id": "one reply",
    "oversized": "nothing (sender disconnected)",
    "duplicate_id": "duplicate_id; the first's tokens and done",
    "cancel_unknown": "one unknown_id error",
    "stop_flood": "tokens, then done",
    "vanish": "a token, then it hangs up",
}
