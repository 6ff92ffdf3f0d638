"""Frames that reach the replicas' door by two channels, put back in order.

On the door's machine a replica sends a request's first and last frames through Ray Serve and those between to the
door's frame socket (pipeline/net/replica.py), every request's ready at once in one message. The two channels keep
no order between them, so each group of frames carries its number (its first frame's index in the request's
stream) and `FrameOrder` hands groups on only in order, holding a group that came early until the gap before it
fills. A gap that stays open `LOST_S` is a lost message (a replica killed between sending one and the other): the
door ends that request with an error rather than wait for it. `FrameSink` is the door's frame socket: on loopback
only (a replica on another machine sends every frame through Ray), and a message counts only if it starts with the
door's random token. Not here: the door (replicas.py), the calls that
bring the Ray side (replica_calls.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import attrs
import zmq

LOST_S = 5.0  # a gap in a request's frames open this long: the frames in it are taken as lost
WIDTH = 8  # bytes of each number on the wire, little-endian
MAX_PART_BYTES = 16 << 20  # a part of a message: one frame (a token's), far below this


def number(n: int) -> bytes:
    return n.to_bytes(WIDTH, "little", signed=True)


def read(b: bytes) -> int:
    return int.from_bytes(b, "little", signed=True)


def groups(parts: list[bytes], token: bytes) -> Iterator[tuple[int, int, list[bytes]]]:
    """A frame socket message's groups, (rid, number, frames): [token, then rid, number, count, frames... per
    group]. Nothing from a message without the door's token (not a replica of this door); a group cut short
    ends the message."""
    if not parts or parts[0] != token:
        return
    i = 1
    while i + 3 <= len(parts):
        rid, seq, count = read(parts[i]), read(parts[i + 1]), read(parts[i + 2])
        frames = parts[i + 3 : i + 3 + count]
        if count < 0 or len(frames) != count:
            return
        yield rid, seq, frames
        i += 3 + count


@attrs.define
class FrameOrder:
    _next: dict = attrs.field(factory=dict)  # rid -> the number of the frame it sends on next
    _held: dict = attrs.field(factory=dict)  # rid -> {number: (frames, last)} that came early
    _since: dict = attrs.field(factory=dict)  # rid -> when its oldest open gap opened

    def put(self, rid: int, seq: int, frames: list[bytes], last: bool, now: float) -> list[tuple[list[bytes], bool]]:
        """Group `frames` of request `rid`, numbered `seq` (`last`: it ends the request): the groups now in
        order, this one and any held behind it, each with its `last`."""
        at = self._next.get(rid, 0)
        if seq == at and rid not in self._held:  # in order, nothing held: the common case, nothing to keep
            if last:
                self._next.pop(rid, None)
            else:
                self._next[rid] = at + len(frames)
            return [(frames, last)]
        held = self._held.setdefault(rid, {})
        held[seq] = (frames, last)
        out = []
        while at in held:
            group = held.pop(at)
            out.append(group)
            at += len(group[0])
            if group[1]:
                self.forget(rid)
                return out
        self._next[rid] = at
        if held:
            self._since.setdefault(rid, now)
        else:
            del self._held[rid]
            self._since.pop(rid, None)
        return out

    def forget(self, rid: int) -> None:
        """`rid` has ended: what is held of it is dropped, and any group of it that comes later is new to this."""
        self._next.pop(rid, None)
        self._held.pop(rid, None)
        self._since.pop(rid, None)

    def lost(self, now: float) -> list[int]:
        """The requests with a gap open LOST_S or more."""
        return [rid for rid, t in self._since.items() if now - t >= LOST_S]

    def __bool__(self) -> bool:
        return bool(self._since)


@attrs.define
class FrameSink:
    sock: zmq.Socket
    token: bytes = attrs.field(factory=lambda: os.urandom(16))

    @classmethod
    def bind(cls, ctx: zmq.Context) -> FrameSink:
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_PART_BYTES)  # a peer sending more is dropped
        sock.bind("tcp://127.0.0.1:*")
        return cls(sock)

    @property
    def address(self) -> tuple[str, bytes]:
        """What the replicas are told: the endpoint and the token."""
        return self.sock.getsockopt_string(zmq.LAST_ENDPOINT), self.token

    def receive(self) -> Iterator[tuple[int, int, list[bytes]]]:
        """The groups of every message waiting, (rid, number, frames), in the order they came."""
        while True:
            try:
                message = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            yield from groups(message, self.token)
