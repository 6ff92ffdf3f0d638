"""The HTTP hostile kinds of the soak benchmark (bench/soak.py): each writes raw HTTP/1.1 on a socket to the
server's --http door and returns the statuses it got back. Also `http_send`, `post_head` and `completion_body`,
which the soak's closing check uses, and `reap_stalled`, which closes the stalled connections at the end.

Every body is bounded in size (the server's message limit plus 4 KiB at most) and in time (`Door.wait_s`); stalled
connections in number (`Door.max_stalled` open at once). Not here: the door, its errors and the ZeroMQ kinds
(bench/hostile.py); what the soak reports (bench/soak_report.py).
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from speclane.bench.hostile import AtBound, Door


def http_send(door: Door, head: str, body: bytes = b"", chunk: int = 16384, read: bool = True) -> list[str]:
    """Send `head` (no blank line) and `body` in chunks until the server answers: its status, [] if none."""
    parts = urlsplit(door.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=door.wait_s) as sock:
        try:
            sock.sendall(f"{head}\r\nHost: {parts.hostname}\r\n\r\n".encode())
            for i in range(0, len(body), chunk):
                if select.select([sock], [], [], 0)[0]:
                    break
                sock.sendall(body[i : i + chunk])
            answer = b""
            while read and b"\r\n" not in answer and (got := sock.recv(4096)):
                answer += got
        except OSError:  # reset while sending or reading: the server hung up without an answer
            return []
    return [answer.split(b" ", 2)[1].decode(errors="replace")] if answer.startswith(b"HTTP/") else []


def post_head(path: str, content_type: str, length: int | None) -> str:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return f"POST /v1/{path} HTTP/1.1\r\nContent-Type: {content_type}\r\n{size}"


def completion_body(door: Door, prompt: str = "Hi") -> bytes:
    return json.dumps({"model": door.model, "prompt": prompt, "max_tokens": 2}).encode()


def http_oversized(door: Door) -> list[str]:
    """A body past the server's message limit, its length declared or (chunked) not."""
    body = completion_body(door, "x" * (door.max_message_bytes + door.rng.randint(1, 4096)))
    if door.rng.random() < 0.5:
        return http_send(door, post_head("completions", "application/json", len(body)), body)
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 8192]), body[i : i + 8192]) for i in range(0, len(body), 8192)
    )
    return http_send(door, post_head("completions", "application/json", None), chunks + b"0\r\n\r\n")


def http_content_type(door: Door) -> list[str]:
    kind = door.rng.choice(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "", "x/y"])
    body = completion_body(door)
    return http_send(door, post_head(door.rng.choice(["completions", "chat/completions"]), kind, len(body)), body)


def http_deep(door: Door) -> list[str]:
    top = max(2, (door.max_message_bytes - 200) // 2)  # under the body cap: the parser's refusal, not the cap's
    depth = door.rng.randint(min(1000, top), top)
    body = b'{"model": "' + door.model.encode() + b'", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
    return http_send(door, post_head("completions", "application/json", len(body)), body)


def http_hangup(door: Door) -> list[str]:
    """Headers that promise 1,000 bytes of body, a few of them, then the connection closes."""
    return http_send(door, post_head("completions", "application/json", 1000), b'{"model": ', read=False)


def http_stalled(door: Door) -> list[str]:
    """One more connection stopping mid-headers or mid-body, while fewer than `max_stalled` are open."""
    got = reap_stalled(door, final=False)
    if len(door.stalled) >= door.max_stalled:
        raise AtBound(f"{door.max_stalled} stalled connections open", got)
    parts = urlsplit(door.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=door.wait_s)
    part = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    if door.rng.random() < 0.5:
        part += b'Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{"model": '
    sock.sendall(part)
    door.stalled.append(sock)
    return got


def reap_stalled(door: Door, final: bool) -> list[str]:
    """Statuses of the stalled connections the server answered or closed; `final`: close the rest unanswered."""
    got = []
    for sock in list(door.stalled):
        ready = bool(select.select([sock], [], [], 0)[0])
        if ready:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            got += [data.split(b" ", 2)[1].decode(errors="replace")] if data.startswith(b"HTTP/") else []
        if ready or final:
            sock.close()
            door.stalled.remove(sock)
    return got


HTTP_KINDS: dict[str, Callable[[Door], list[str]]] = {
    "http_oversized": http_oversized,
    "http_content_type": http_content_type,
    "http_deep": http_deep,
    "http_hangup": http_hangup,
    "http_stalled": http_stalled,
}
EXPECTED = {
    "http_oversized": "413",
    "http_content_type": "415",
    "http_deep": "400",
    "http_hangup": "nothing",
    "http_stalled": "408 at the read deadline (30 s)",
}
