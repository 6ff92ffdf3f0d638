"""The replicas' door without Ray: a ReplicaDoor in this process, its replicas played by a fake `calls` that answers
as RayCalls does (owner, frames, an error for a dead replica, stats). Clients see one server: the frames of their
request under their own id, one end each, the API key checked, duplicate ids refused, cancel passed on by the
door's rid, and stats summed with every replica listed."""

from __future__ import annotations

import threading

import pytest
import zmq

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client, ServerError
from speclane.pipeline.net.replicas import ReplicaDoor

KEY = "sk-door"


def key(n: int) -> bytes:
    return n.to_bytes(8, "little", signed=True)


def token(cid, i: int) -> bytes:
    return P.encode(P.Token(id=cid, index=i, token_id=100 + i, text=f"t{i}"))


class FakeCalls:
    """Answers each request by its prompt: "ok" streams two tokens and a done, "dies" one token and the error a
    dead replica gives, "hold" nothing until cancelled."""

    def __init__(self, ctx: zmq.Context, events: str):
        self.push = ctx.socket(zmq.PUSH)
        self.push.connect(events)
        self.lock = threading.Lock()
        self.cancelled: list[int] = []
        self.held: dict[int, object] = {}

    def send(self, *frames: bytes) -> None:
        with self.lock:
            self.push.send_multipart(list(frames))

    def generate(self, rid, cid, request) -> None:
        self.send(key(rid), b"o", b"replica-a")
        if request.prompt == "hold":
            self.held[rid] = cid
            return
        self.send(key(rid), b"0", token(cid, 0))
        if request.prompt == "dies":
            error = P.Error(id=cid, code="replica_failed", message="the replica serving this request failed")
            self.send(key(rid), b"1", P.encode(error))
            return
        done = P.Done(id=cid, finish_reason="length", usage={"completion_tokens": 2}, spec={}, text="t0t1")
        self.send(key(rid), b"1", token(cid, 1), P.encode(done))

    def cancel(self, rid) -> None:
        self.cancelled.append(rid)
        cid = self.held.pop(rid, None)
        if cid is not None:
            self.send(key(rid), b"1", P.encode(P.Done(id=cid, finish_reason="cancelled", usage={}, spec={})))

    def stats(self, qid) -> None:
        import json

        entry = {
            "replica": "replica-a",
            "pid": 1,
            "served": 3,
            "lanes": {"active": 0, "free": 2, "max": 2},
            "queue": {"waiting": 0},
            "spec": {},
        }
        self.send(key(qid), b"s", json.dumps([entry, {"replica": "replica-b", "error": "starting"}]).encode())

    def ask(self, qid, message) -> None:
        self.send(key(qid), b"a", P.encode(P.GraphReply(id=P.parse_client(message).id, graph={"stages": []})))

    def close(self) -> None:
        self.push.close(0)


@pytest.fixture
def door():
    made: list[FakeCalls] = []

    def factory(ctx, events):
        made.append(FakeCalls(ctx, events))
        return made[0]

    d = ReplicaDoor(factory, "tcp://127.0.0.1:*", api_key=KEY, max_queue=4, room=2)
    endpoint = d.start()
    thread = threading.Thread(target=d.serve_forever, daemon=True)
    thread.start()
    yield endpoint, made[0]
    d.stop(0)
    thread.join(10)
    d.close()


def test_frames_arrive_under_the_clients_id_once(door):
    endpoint, _ = door
    with Client(endpoint, api_key=KEY, timeout=10) as c:
        a, b = c.generate(prompt="ok", max_tokens=2), c.generate(prompt="ok", max_tokens=2)
        assert [t.text for t in a] == ["t0", "t1"] and a.done.finish_reason == "length"
        assert b.wait().text == "t0t1"
        with pytest.raises(TimeoutError):
            c.recv(timeout=0.5)


def test_a_dead_replica_ends_the_request_with_one_error(door):
    endpoint, _ = door
    with Client(endpoint, api_key=KEY, timeout=10) as c:
        stream = c.generate(prompt="dies", max_tokens=5)
        with pytest.raises(ServerError, match="replica_failed"):
            stream.wait()
        with pytest.raises(TimeoutError):
            c.recv(timeout=0.5)
        assert c.generate(prompt="ok", max_tokens=2).wait().finish_reason == "length"


def test_key_and_duplicate_ids_are_checked_at_the_door(door):
    endpoint, _ = door
    with Client(endpoint, timeout=10) as anonymous, pytest.raises(ServerError, match="invalid_api_key"):
        anonymous.generate(prompt="ok", max_tokens=2).wait()
    with Client(endpoint, api_key=KEY, timeout=10) as c:
        c.generate(prompt="hold", max_tokens=2, id="x")
        with pytest.raises(ServerError, match="duplicate_id"):
            c.generate(prompt="ok", max_tokens=2, id="x").wait()
        c.cancel("x")
        assert c.next_for("x").finish_reason == "cancelled"
        c.cancel("x")
        refusal = c.next_for("x")
        assert isinstance(refusal, P.Error) and refusal.code == "unknown_id"


def test_cancel_goes_to_the_requests_rid(door):
    endpoint, calls = door
    with Client(endpoint, api_key=KEY, timeout=10) as c:
        stream = c.generate(prompt="hold", max_tokens=2)
        c.cancel(stream.id)
        assert stream.wait().finish_reason == "cancelled"
    assert len(calls.cancelled) == 1


def test_waiting_requests_are_bounded(door):
    endpoint, _ = door
    with Client(endpoint, api_key=KEY, timeout=10) as c:
        held = [c.generate(prompt="hold", max_tokens=2) for _ in range(3)]  # room 2 + a quarter of the queue (1)
        with pytest.raises(ServerError, match="client_queue_full"):
            c.generate(prompt="hold", max_tokens=2).wait()
        for s in held:
            c.cancel(s.id)
            s.wait()


def test_stats_and_graph(door):
    endpoint, _ = door
    with Client(endpoint, api_key=KEY, timeout=10) as c:
        reply = c.stats()
        assert [r["id"] for r in reply.replicas] == ["replica-a", "replica-b"]
        assert reply.replicas[0]["served"] == 3 and reply.replicas[1]["error"] == "starting"
        assert reply.lanes == {"active": 0, "free": 2, "max": 2}
        assert c.graph() == {"stages": []}
