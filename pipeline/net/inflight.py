"""The server's book of requests in flight: each one's reply route, its client's own id and quota owner, and
whether it is still tokenizing.

A request is known two ways: by the engine id the server gives it (`rid`, unique in the server), and by its
client's ROUTER identity plus the client's own id, so two clients may both use id 1 (and 1 and "1" stay apart).
Owns that pairing, the ids, the questions asked of it (who is waiting, who is connected, is anything still
tokenizing) and the bounds a new request must fit: its id not already in flight from its client, and the queue
bounds, in all and per client. Not here: the socket, the loop, stopping and every message sent (server.py);
message schemas (protocol.py); the outboxes (outbox.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import attrs

from speclane.pipeline.net import protocol as P


@attrs.define
class Req:
    envelope: list[bytes]  # ROUTER identity (+ a REQ client's empty delimiter)
    cid: Any  # the client's own id
    client: bytes  # whose quota it counts against: its CURVE key where CURVE is on, else its routing id
    prepared: Future | None = None  # tokenizing on the worker; None once the engine has it
    cancelled: bool = False  # a cancel that came while it was tokenizing


def key(envelope: list[bytes], cid: Any) -> tuple[bytes, str]:
    # 1 and "1" are different ids; json.dumps keeps them apart.
    return envelope[0], json.dumps(cid)


@attrs.define
class InFlight:
    """Requests in flight, by engine rid and by (client identity, client id); ended with `pop`."""

    _next: int = 0
    _reqs: dict[int, Req] = attrs.field(factory=dict)  # engine rid -> request
    _by_key: dict[tuple[bytes, str], int] = attrs.field(factory=dict)  # (identity, client id) -> engine rid

    def __len__(self) -> int:
        return len(self._reqs)

    def new_rid(self) -> int:
        rid, self._next = self._next, self._next + 1
        return rid

    def add(self, rid: int, req: Req) -> None:
        self._reqs[rid] = req
        self._by_key[key(req.envelope, req.cid)] = rid

    def rid_of(self, envelope: list[bytes], cid: Any) -> int | None:
        """The engine rid of the client's request `cid`, None where none of its is in flight."""
        return self._by_key.get(key(envelope, cid))

    def get(self, rid: int) -> Req | None:
        return self._reqs.get(rid)

    def items(self) -> list[tuple[int, Req]]:
        """A copy, in arrival order: safe to `pop` from while iterating."""
        return list(self._reqs.items())

    def pop(self, rid: int) -> Req | None:
        req = self._reqs.pop(rid, None)
        if req is not None:
            self._by_key.pop(key(req.envelope, req.cid), None)
        return req

    def preparing(self) -> bool:
        return any(r.prepared is not None for r in self._reqs.values())

    def waiting(self, queued: Iterable[Any]) -> list[bytes]:
        """The clients of requests not yet in a lane (tokenizing, or their rid in `queued`), one entry a request."""
        queued = set(queued)
        return [r.client for rid, r in self._reqs.items() if r.prepared is not None or rid in queued]

    def clients(self) -> set[bytes]:
        """The routing identities with requests in flight."""
        return {r.envelope[0] for r in self._reqs.values()}

    def check_room(self, envelope: list[bytes], cid: Any, client: bytes, engine, max_queue: int, max_client_queue: int):
        """Refuse (ProtocolError) a new request `cid` of `client`: an id already in flight from it, or past the queue
        bounds, in all (`max_queue`) and for one client (`max_client_queue`)."""
        if self.rid_of(envelope, cid) is not None:
            raise P.ProtocolError(
                f"field 'id': request {cid!r} is already in flight from this client; use a new id",
                field="id",
                code="duplicate_id",
                rid=cid,
            )
        # The bounds count requests beyond the free lanes: the engine only admits at its next step, so a burst
        # that arrives between two steps must not be refused while lanes are free.
        waiting, free = self.waiting(lane.rid for lane in engine.queue), len(engine.lanes.free)
        if len(waiting) - free >= max_queue:
            raise P.ProtocolError(
                f"the queue is full ({max_queue} waiting beyond {engine.lanes.max_lanes} busy lanes); retry later",
                field="request",
                code="queue_full",
                rid=cid,
            )
        if sum(c == client for c in waiting) - free >= max_client_queue:
            raise P.ProtocolError(
                f"you have {max_client_queue} requests waiting, this server's limit for one "
                "client (--max-client-queue); wait for one to start, then retry",
                field="request",
                code="client_queue_full",
                rid=cid,
            )
