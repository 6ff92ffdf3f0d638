"""Frames by two channels, back in order: on the door's machine a replica sends a request's first and last frames
through Ray and those between to the door's frame socket, numbered. The door hands a client its frames in the
replica's order whichever channel is first, ends a request once, drops what comes without its token, and ends a
request whose gap stays open with one error."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from speclane.pipeline.net import frame_order
from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client, ServerError
from speclane.pipeline.net.frame_order import FrameOrder, groups, number
from speclane.pipeline.net.replicas import ReplicaDoor
from tests.server.test_replicas_door import FakeCalls, key, token


def test_groups_come_out_in_order_and_the_last_forgets_the_request():
    order = FrameOrder()
    assert order.put(7, 2, [b"c"], False, now=0.0) == []  # early: held
    assert order and order.lost(now=0.0) == []
    assert order.put(7, 0, [b"a", b"b"], False, now=1.0) == [([b"a", b"b"], False), ([b"c"], False)]
    assert not order
    assert order.put(7, 4, [b"end"], True, now=2.0) == []
    assert order.put(7, 3, [b"d"], False, now=2.5) == [([b"d"], False), ([b"end"], True)]
    assert order.put(7, 0, [b"x"], False, now=3.0) == [([b"x"], False)]  # a new request under the same rid


def test_a_gap_open_too_long_is_lost():
    order = FrameOrder()
    order.put(1, 1, [b"b"], False, now=10.0)
    order.put(2, 0, [b"a"], False, now=10.0)
    assert order.lost(now=10.0 + frame_order.LOST_S - 0.1) == []
    assert order.lost(now=10.0 + frame_order.LOST_S) == [1]
    order.forget(1)
    assert not order


def test_a_message_counts_only_with_the_token_and_whole_groups():
    parts = [b"tok", number(3), number(5), number(2), b"f5", b"f6", number(4), number(0), number(1), b"g0"]
    assert list(groups(parts, b"tok")) == [(3, 5, [b"f5", b"f6"]), (4, 0, [b"g0"])]
    assert list(groups(parts, b"other")) == []
    assert list(groups(parts[:-1], b"tok")) == [(3, 5, [b"f5", b"f6"])]  # the cut group is dropped


class DirectCalls(FakeCalls):
    """A replica on the door's machine: the first frame through Ray (b"q" 0), the middle to the frame socket ahead
    of it, the last through Ray (b"Q"); "lost" never sends the middle; "stranger" sends it without the token."""

    def __init__(self, ctx: zmq.Context, events: str, sink):
        super().__init__(ctx, events)
        self.endpoint, self.token = sink
        self.frames = ctx.socket(zmq.PUSH)
        self.frames.connect(self.endpoint)

    def generate(self, rid, cid, request) -> None:
        self.send(key(rid), b"o", b"replica-a")
        middle = [number(rid), number(1), number(2), token(cid, 1), token(cid, 2)]
        if request.prompt != "lost":
            self.frames.send_multipart([self.token if request.prompt != "stranger" else b"x" * 16, *middle])
            time.sleep(0.05)  # the middle is at the door first
        self.send(key(rid), b"q", number(0), token(cid, 0))
        done = P.Done(id=cid, finish_reason="length", usage={"completion_tokens": 4}, spec={}, text="t0t1t2t3")
        self.send(key(rid), b"Q", number(3), token(cid, 3), P.encode(done))

    def close(self) -> None:
        self.frames.close(0)
        super().close()


@pytest.fixture
def door(monkeypatch):
    monkeypatch.setattr(frame_order, "LOST_S", 0.5)
    made: list[DirectCalls] = []
    d = ReplicaDoor(
        lambda ctx, events, sink: made.append(DirectCalls(ctx, events, sink)) or made[0],
        "tcp://127.0.0.1:*",
        max_queue=4,
        room=2,
        direct=True,
    )
    endpoint = d.start()
    thread = threading.Thread(target=d.serve_forever, daemon=True)
    thread.start()
    yield endpoint, d
    d.stop(0)
    thread.join(10)
    d.close()


def test_frames_by_both_channels_reach_the_client_in_order_once(door):
    endpoint, _ = door
    with Client(endpoint, timeout=10) as c:
        stream = c.generate(prompt="ok", max_tokens=4)
        assert [t.text for t in stream] == ["t0", "t1", "t2", "t3"] and stream.done.finish_reason == "length"
        with pytest.raises(TimeoutError):
            c.recv(timeout=0.3)


def test_frames_without_the_token_are_dropped_and_the_gap_ends_the_request(door):
    endpoint, d = door
    for prompt in ("stranger", "lost"):
        with Client(endpoint, timeout=10) as c:
            stream = c.generate(prompt=prompt, max_tokens=4)
            with pytest.raises(ServerError, match="replica_failed"):
                stream.wait()
            assert [t.text for t in stream.tokens] == ["t0"]
            with pytest.raises(TimeoutError):
                c.recv(timeout=0.3)
    assert not d._order and d.finished["replica_failed"] == 2
