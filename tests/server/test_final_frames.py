"""Every accepted request ends with exactly one `done` or `error`, whatever happens: a stop with a grace period, an
engine failure, a cancel while it is still tokenizing, a second cancel; and one client cannot fill the queue.

An in-process Server on inproc:// in front of a stand-in engine, stepped turn by turn from the test: the
bookkeeping is checked in steps and messages, not in seconds.
"""

from __future__ import annotations

import collections
import threading

import attrs
import pytest
import zmq

from speclane.pipeline.net.client import Client, Unreachable
from speclane.pipeline.net.server import Server
from speclane.stages.contract.errors import RequestError
from speclane.stages.contract.events import DoneEvent, TokenEvent


@attrs.define
class _Lane:
    rid: int
    tokens: int
    emitted: int = 0
    finish_reason: str | None = None


class StandInEngine:
    """One token a lane a step; a prompt "bad" is refused at prepare; `fail` makes the next step raise."""

    def __init__(self, max_lanes: int = 2):
        self.queue: collections.deque = collections.deque()
        self.active: dict[int, _Lane] = {}
        self.max_lanes, self.max_queue, self.fail, self.retired = max_lanes, 10**6, False, []
        self.gate = threading.Event()  # prepare waits on it: a request can be held "tokenizing"
        self.gate.set()
        self.lanes = self

    @property
    def free(self) -> list[int]:
        return list(range(self.max_lanes - len(self.active)))

    def prepare(self, req):
        self.gate.wait(10)
        if req.prompt == "bad":
            raise RequestError("field 'prompt': bad", field="prompt")
        return _Lane(req.id, req.max_tokens)

    def enqueue(self, lane):
        self.queue.append(lane)

    def cancel(self, rid) -> bool:
        for lane in [*self.queue, *self.active.values()]:
            if lane.rid == rid and lane.finish_reason is None:
                lane.finish_reason = "cancelled"
                return True
        return False

    def busy(self) -> bool:
        return bool(self.queue or self.active)

    def step(self) -> list:
        if self.fail:
            raise RuntimeError("the target pass ran out of memory")
        while self.queue and len(self.active) < self.max_lanes:
            lane = self.queue.popleft()
            self.active[lane.rid] = lane
        events = []
        for lane in list(self.active.values()):
            if lane.finish_reason is None:
                events.append(TokenEvent(lane.rid, lane.emitted, 7, "x"))
                lane.emitted += 1
                if lane.emitted == lane.tokens:
                    lane.finish_reason = "length"
            if lane.finish_reason is not None:
                del self.active[lane.rid]
                events.append(DoneEvent(lane.rid, lane.finish_reason, {"completion_tokens": lane.emitted}, {}))
        return events

    def stats(self, lanes):
        return {}


@pytest.fixture
def served(request):
    server = Server(StandInEngine(), f"inproc://final-frames-{request.node.name}", max_queue=8)
    server.start()
    clients = []

    def client() -> Client:
        c = Client(server.endpoint, timeout=5, ctx=server.ctx)
        clients.append(c)
        return c

    yield server, client
    for c in clients:
        c.close()
    server.close()


def turns(server: Server, n: int = 3, settle: bool = True) -> None:
    """`n` loop turns, then (`settle`) more until the worker has tokenized every request (its thread runs at its
    own pace)."""
    for _ in range(n):
        server.turn()
    for _ in range(1000 if settle else 0):
        if not server._preparing():
            return
        server.turn()
    if settle:
        pytest.fail("the worker thread never finished tokenizing")


def finals(client: Client, ids: list, server: Server, limit: int = 200) -> dict:
    """Turn the server until every id got its final message; every message for those ids, by id."""
    got: dict = {rid: [] for rid in ids}
    for _ in range(limit):
        server.turn()
        while client.sock.poll(0):
            msg = client.recv(0)
            got.setdefault(msg.id, []).append(msg)
        if all(got[r] and got[r][-1].type in ("done", "error") for r in ids):
            break
    for rid in ids:
        msgs = got[rid]
        ends = [m for m in msgs if m.type in ("done", "error")]
        assert len(ends) == 1 and msgs[-1] is ends[0], (rid, msgs)
    return got


def test_stop_finishes_within_the_grace_then_ends_the_rest_with_an_error(served):
    server, client = served
    c = client()
    c.generate(id="short", prompt="hi", max_tokens=2)
    c.generate(id="long", prompt="hi", max_tokens=10**5)
    turns(server)
    server.stop(grace=3600)
    c.generate(id="late", prompt="hi", max_tokens=2)  # refused: the server is stopping
    got = finals(c, ["short", "late"], server)
    assert got["short"][-1].type == "done"
    assert (got["late"][-1].type, got["late"][-1].code) == ("error", "server_stopping")
    server.stop()  # a second stop: the grace ends now
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    msgs = []
    while c.sock.poll(1000):
        msgs.append(c.recv(0))
    ends = [m for m in msgs if m.type in ("done", "error")]
    assert [(m.id, m.type, m.code) for m in ends] == [("long", "error", "server_stopping")]


def test_an_engine_failure_ends_every_request_with_its_id(served):
    server, client = served
    a, b = client(), client()
    a.generate(id=1, prompt="hi", max_tokens=10**5)
    b.generate(id="x", prompt="hi", max_tokens=10**5)
    b.generate(id="y", prompt="hi", max_tokens=10**5)  # queued: no lane yet
    turns(server)
    server.engine.fail = True
    assert finals(a, [1], server)[1][-1].code == "internal"
    got = finals(b, ["x", "y"], server)
    assert [got[r][-1].code for r in ("x", "y")] == ["internal", "internal"], got
    assert "out of memory" in got["x"][-1].message


def test_a_refusal_at_tokenizing_keeps_the_id_and_field(served):
    server, client = served
    c = client()
    c.generate(id=5, prompt="bad", max_tokens=2)
    end = finals(c, [5], server)[5][-1]
    assert (end.type, end.id, end.code, end.field) == ("error", 5, "invalid_request", "prompt")


def test_cancel_while_tokenizing_and_a_second_cancel_each_give_one_done(served):
    server, client = served
    c = client()
    server.engine.gate.clear()  # the worker holds the request: still tokenizing
    c.generate(id="t", prompt="hi", max_tokens=10**5)
    c.cancel("t")
    c.cancel("t")
    turns(server, settle=False)
    server.engine.gate.set()
    assert finals(c, ["t"], server)["t"][-1].finish_reason == "cancelled"
    c.generate(id="r", prompt="hi", max_tokens=10**5)
    turns(server)
    c.cancel("r")
    c.cancel("r")  # before its done: nothing more than the one done
    got = finals(c, ["r"], server)
    assert [m.type for m in got["r"] if m.type != "token"] == ["done"]
    c.cancel("r")  # after its done: no longer in flight
    assert finals(c, ["r"], server)["r"][-1].code == "unknown_id"


def queue_of(server: Server, client: Client) -> dict:
    """The stats reply's queue as `client` would see it (its routing id is how the server knows it)."""
    return server.stats(client=client.sock.getsockopt(zmq.ROUTING_ID)).queue


def test_one_client_cannot_fill_the_queue(served):
    server, client = served  # 2 lanes, a queue of 8, so 2 waiting a client beyond the free lanes
    greedy, other = client(), client()
    for i in range(5):
        greedy.generate(id=i, prompt="hi", max_tokens=10**5)
    turns(server)
    assert finals(greedy, [4], server)[4][-1].code == "client_queue_full"
    assert queue_of(server, greedy)["yours"] == 2 and queue_of(server, other)["yours"] == 0
    other.generate(id=0, prompt="hi", max_tokens=1)
    turns(server)
    queue = queue_of(server, other)
    assert (queue["waiting"], queue["clients_waiting"], queue["max_per_client"]) == (3, 2, 2)


def test_nothing_listening_is_said_at_once():
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on: bound, never listened, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(Unreachable, match=f"127.0.0.1:{port}"):
        Client(f"tcp://127.0.0.1:{port}", check=True)
    assert time.monotonic() - t0 < 5
