"""`speclane serve --replicas 2` with real processes: a local Ray, two engine replicas, the door with both doors
(ZeroMQ and HTTP, an API key on each). Clients work unchanged; stats lists each replica; a conversation's turns
follow its checkpoints; frames between a request's first and last reach the door by its frame socket, in
order; cancel reaches the owner; a replica killed with kill -9 ends each of its requests with
exactly one error frame, new requests go to the other replica, and its replacement serves again; a replica stopped
with SIGSTOP ends its requests with `replica_unresponsive`; nothing of Ray is left running afterwards.

One door serves the whole module, and the tests run in this order: the killed replica's replacement is waited for,
and the stopped replica comes last, so nothing waits on its replacement.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytest.importorskip("ray.serve", reason="the replica tests need Ray Serve: pip install 'speclane[ray]'")

from speclane.pipeline.net import protocol as P  # noqa: E402
from speclane.pipeline.net.client import Client, ServerError  # noqa: E402
from tests.server.conftest import KEY, MODEL, post_json  # noqa: E402
from tests.server.replica_procs import (  # noqa: E402
    LONG,
    assert_silent,
    client,
    ends_of,
    live,
    replica_door,
    served,
    spread,
    stats,
    wait_for,
)

STALL_S = 8  # a replica silent this long (its heartbeat is every second) is taken as hung
SYSTEM = "You are a careful assistant. Answer in one short sentence, and never use more words than you need."
ROUTED_S = 1.5  # a replica publishes what it holds every half second; the router hears of it within this


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """(ZeroMQ endpoint, HTTP URL) of one `speclane serve --replicas 2`, two lanes a replica."""
    flags = ("--replicas", "2", "--max-lanes", "2", "--replica-stall", str(STALL_S), "--http", "127.0.0.1:0")
    with replica_door(tmp_path_factory.mktemp("replicas"), *flags) as doors:
        yield doors


def test_both_doors_answer_as_one_server(door):
    endpoint, url = door
    with client(endpoint) as c:
        texts = [c.generate(prompt="The capital of France is", max_tokens=8).wait().text for _ in range(2)]
    assert texts[0] == texts[1] and texts[0]
    status, body = post_json(
        url, "/v1/completions", {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8}, key=KEY
    )
    assert status == 200 and body["choices"][0]["text"] == texts[0]
    status, body = post_json(url, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    with Client(endpoint, timeout=30) as anonymous, pytest.raises(ServerError, match="invalid_api_key"):
        anonymous.generate(prompt="Hi", max_tokens=2).wait()
    with client(endpoint) as c:  # refused at the door as by one server (sent raw: the client checks too)
        c.send(c.signed({"v": 1, "type": "generate", "id": "bad", "prompt": "Hi", "temperature": -1}))
        refusal = c.next_for("bad")
        assert isinstance(refusal, P.Error) and refusal.field == "temperature"
        assert "stages" in json.dumps(c.graph())


def test_stats_lists_every_replica(door):
    with client(door[0]) as c:  # frames between its first and last: on this machine, to the door's frame socket
        stream = c.generate(prompt="Count from one to twenty:", max_tokens=32, ignore_eos=True)
        assert [t.index for t in stream] == list(range(32)) and stream.done.usage["completion_tokens"] == 32
    reply = stats(door[0])
    assert len(reply.replicas) == 2 and reply.lanes["max"] == 4
    for entry in reply.replicas:
        assert {"id", "lanes", "queue", "served", "pid", "frames"} <= set(entry)
    assert sum(r["frames"]["sink"] for r in reply.replicas) > 0
    # every request the door has ended so far ran on exactly one replica
    assert sum(r["served"] for r in reply.replicas) == sum(reply.finished.values()) > 0


def test_a_conversation_follows_its_checkpoints(door):
    endpoint = door[0]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    before = served(endpoint)
    with client(endpoint) as c:
        answer = c.generate(messages=messages, max_tokens=6).wait().text
    first = served(endpoint)
    (home,) = [r for r in first if first[r] > before.get(r, 0)]
    for turn in range(3):
        time.sleep(ROUTED_S)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"And number {turn}?"}]
        with client(endpoint) as c:
            answer = c.generate(messages=messages, max_tokens=6).wait().text
    after = served(endpoint)
    assert after[home] - first[home] == 3, (before, first, after)
    assert stats(endpoint).checkpoints["hits"] >= 3


def test_cancel_reaches_the_owner(door):
    with client(door[0]) as c:
        stream = c.generate(prompt="Count slowly: one, two, three,", **LONG)
        next(iter(stream))
        c.cancel(stream.id)
        end = ends_of(c, stream)
        assert isinstance(end, P.Done) and end.finish_reason == "cancelled"
        assert_silent([c])


def test_a_stream_longer_than_the_stall_is_not_taken_for_a_hung_replica(door):
    """Its frames go to the door's frame socket, past Ray: the replica's heartbeats still reach the door."""
    with client(door[0]) as c:
        stream = c.generate(prompt="Count slowly: one, two, three,", max_tokens=2000, ignore_eos=True)
        deadline, tokens = time.monotonic() + STALL_S + 3, 0
        for _ in stream:  # an error frame (replica_unresponsive) raises here
            tokens += 1
            if time.monotonic() > deadline:
                break
        assert time.monotonic() > deadline, f"the stream ended after {tokens} tokens"
        c.cancel(stream.id)
        end = ends_of(c, stream)
        assert isinstance(end, P.Done) and end.finish_reason == "cancelled"


def test_a_killed_replica_ends_each_request_once_and_is_replaced(door):
    endpoint = door[0]
    known = {r["id"] for r in wait_for(lambda: len(live(endpoint)) == 2 and live(endpoint), "two replicas", 300)}
    clients = [client(endpoint) for _ in range(4)]  # two lanes a replica; distinct prompts spread them by load
    try:
        streams = [c.generate(prompt=f"Count slowly from {n}: {n}, {n + 1},", **LONG) for n, c in enumerate(clients)]
        for s in streams:
            next(iter(s))
        victim = wait_for(lambda: next((r for r in live(endpoint) if r["lanes"]["active"]), None), "a busy replica", 60)
        os.kill(victim["pid"], signal.SIGKILL)
        ends = [None] * len(streams)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and None in ends:  # the victim's streams end together; then 3 s more
            for i, (c, s) in enumerate(zip(clients, streams)):
                ends[i] = ends[i] or ends_of(c, s, 0.2)
            if any(ends):
                deadline = min(deadline, time.monotonic() + 3)
        for i, (c, s) in enumerate(zip(clients, streams)):
            if ends[i] is None:
                c.cancel(s.id)  # a survivor: its end is a cancelled done
                ends[i] = ends_of(c, s)
        assert_silent(clients, cancelled=True)  # nothing after any stream's one end
    finally:
        for c in clients:
            c.close()
    failed = [e for e in ends if isinstance(e, P.Error)]
    assert failed and all(e.code == "replica_failed" and victim["id"] in e.message for e in failed), ends
    # a survivor's stream is cancelled, or on a quiet machine it may have run to its length first: one end either way
    assert all(e.finish_reason in ("cancelled", "length") for e in ends if isinstance(e, P.Done)), ends
    with client(endpoint) as c:
        assert c.generate(prompt="Water boils at", max_tokens=4).wait().finish_reason == "length"
    # Ray Serve starts a replacement; once it has loaded the model it takes requests again.
    fresh = wait_for(
        lambda: next((r["id"] for r in live(endpoint) if r["id"] not in known), None) or (False, live(endpoint)),
        "the killed replica's replacement",
        seconds=300,
    )
    for _ in range(5):
        spread(endpoint, ["Iron melts at", "Gold is", "Salt tastes", "Rain falls"])
        if served(endpoint).get(fresh):
            break
    assert served(endpoint).get(fresh), ("the replacement replica never served a request", stats(endpoint).replicas)


def test_a_hung_replica_ends_its_requests(door):
    endpoint = door[0]
    with client(endpoint) as c:
        stream = c.generate(prompt="Count slowly: one, two, three,", **LONG)
        next(iter(stream))
        hung = wait_for(lambda: next((r for r in live(endpoint) if r["lanes"]["active"]), None), "a busy replica", 60)
        os.kill(hung["pid"], signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            end = ends_of(c, stream)
            assert isinstance(end, P.Error) and end.code == "replica_unresponsive", end
            assert time.monotonic() - t0 < STALL_S + 10 and f"in {STALL_S} s" in end.message
            assert_silent([c])
            with client(endpoint) as other:
                assert other.generate(prompt="Water boils at", max_tokens=4).wait().finish_reason == "length"
        finally:
            os.kill(hung["pid"], signal.SIGCONT)
