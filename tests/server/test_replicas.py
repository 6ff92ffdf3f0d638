"""`speclane serve --replicas 2` with real processes: a local Ray, two engine replicas, the door with both doors
(ZeroMQ and HTTP, an API key on each). Clients work unchanged; stats lists each replica; a conversation's turns
follow its checkpoints; cancel reaches the owner; a replica stopped with SIGSTOP, and one killed with kill -9,
end each of their requests with exactly one error frame, and new requests go to the other replica; a replaced
replica serves again; and nothing of Ray is left running afterwards.

Slow (Ray and two model loads start in tens of seconds, more on a loaded machine): marked `slow`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("ray.serve", reason="the replica tests need Ray Serve: pip install 'speclane[ray]'")

from speclane.pipeline.cli.serve import HTTP_READY, spawn  # noqa: E402
from speclane.pipeline.cli.serve import stop as stop_server  # noqa: E402
from speclane.pipeline.net import protocol as P  # noqa: E402
from speclane.pipeline.net.client import Client, ServerError  # noqa: E402
from tests.server.conftest import KEY, MODEL, MODEL_FLAGS, post_json, wait_until  # noqa: E402

pytestmark = pytest.mark.slow
STALL_S = 20  # long enough for a replica's first round (its C kernels may compile then)
SYSTEM = "You are a careful assistant. Answer in one short sentence, and never use more words than you need."
LONG = {"prompt": "Count slowly: one, two, three,", "max_tokens": 400, "ignore_eos": True}


def ray_pids() -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    names = ("raylet", "gcs_server", "ray::", "ray/_private", "ray/dashboard")
    return {int(line.split(None, 1)[0]) for line in out if any(n in line for n in names)}


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """(ZeroMQ endpoint, HTTP URL) of one `speclane serve --replicas 2`; on exit, no Ray process of its is left."""
    before = ray_pids()
    log = tmp_path_factory.mktemp("replicas") / "serve.log"
    lines: list[str] = []
    flags = ("--replicas", "2", "--max-lanes", "2", "--replica-stall", str(STALL_S), "--http", "127.0.0.1:0")
    proc, endpoint = spawn(log, *MODEL_FLAGS, *flags, "--api-key", KEY, lines=lines, timeout=600)
    url = next(line[len(HTTP_READY) :].split()[0] for line in lines if line.startswith(HTTP_READY))
    yield endpoint, url
    proc.terminate()  # the door shuts its Ray down, replicas with it: more than stop_server's few seconds
    try:
        proc.wait(180)
    except subprocess.TimeoutExpired:
        stop_server(proc)
    assert proc.returncode == 0, "the door did not stop on SIGTERM"
    wait_until(lambda: not (ray_pids() - before), "every Ray process of the door gone", seconds=120)


def client(endpoint: str, **kw) -> Client:
    return Client(endpoint, api_key=KEY, timeout=120, **kw)


def stats(endpoint: str) -> P.StatsReply:
    with client(endpoint) as c:
        return c.stats()


def served(endpoint: str) -> dict[str, int]:
    return {r["id"]: r["served"] for r in stats(endpoint).replicas if "served" in r}


def busy_replica(endpoint: str) -> dict:
    """The replica with a lane running (its entry in stats)."""
    return wait_until(
        lambda: next((r for r in stats(endpoint).replicas if r.get("lanes", {}).get("active")), None),
        "a replica with a running lane",
    )


def only_end(c: Client, stream, cancelled: bool = False) -> P._Msg:
    """Read `stream` to its end; then nothing more may come for it: its final message. `cancelled`: a cancel was
    sent, which the door refuses (unknown_id) when the request ended before the cancel arrived."""
    end = None
    while end is None:
        msg = c.next_of(stream, timeout=120)
        if isinstance(msg, (P.Done, P.Error)):
            end = msg
    try:
        late = c.recv(timeout=2.0)  # one client a stream here: anything else that arrives now is a second end
    except TimeoutError:
        return end
    assert cancelled and isinstance(late, P.Error) and late.code == "unknown_id", (end, late)
    with pytest.raises(TimeoutError):
        c.recv(timeout=2.0)
    return end


def drain(c: Client, stream, seconds: float) -> P._Msg | None:
    """Read `stream` for up to `seconds`: its final message if that came, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            msg = c.next_of(stream, timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return None
        if isinstance(msg, (P.Done, P.Error)):
            return msg
    return None


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
    assert "stages" in json.dumps(client(endpoint).graph())


def test_stats_lists_every_replica(door):
    reply = stats(door[0])
    assert len(reply.replicas) == 2 and reply.lanes["max"] == 4
    for entry in reply.replicas:
        assert {"id", "lanes", "queue", "served", "pid"} <= set(entry)
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
        time.sleep(3.0)  # the replica publishes what it holds every half second; the router hears of it after
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"And number {turn}?"}]
        with client(endpoint) as c:
            answer = c.generate(messages=messages, max_tokens=6).wait().text
    after = served(endpoint)
    assert after[home] - first[home] == 3, (before, first, after)
    assert stats(endpoint).checkpoints["hits"] >= 3


def test_cancel_reaches_the_owner(door):
    with client(door[0]) as c:
        stream = c.generate(**LONG)
        next(iter(stream))
        c.cancel(stream.id)
        end = only_end(c, stream)
    assert isinstance(end, P.Done) and end.finish_reason == "cancelled"


def test_a_hung_replica_ends_its_requests(door):
    endpoint = door[0]
    with client(endpoint) as c:
        stream = c.generate(**LONG)
        next(iter(stream))
        hung = busy_replica(endpoint)
        os.kill(hung["pid"], signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            end = only_end(c, stream)
            assert isinstance(end, P.Error) and end.code == "replica_unresponsive", end
            assert time.monotonic() - t0 < STALL_S + 10
            assert f"in {STALL_S} s" in end.message
            with client(endpoint) as other:
                assert other.generate(prompt="Water boils at", max_tokens=4).wait().finish_reason == "length"
        finally:
            os.kill(hung["pid"], signal.SIGCONT)


def test_a_killed_replica_ends_each_request_once_and_is_replaced(door):
    endpoint = door[0]
    # steady first: two replicas answering (a replica stopped by the test before may still be being replaced)
    steady = wait_until(
        lambda: (lambda rs: rs if len(rs) == 2 and all("pid" in r for r in rs) else None)(stats(endpoint).replicas),
        "two live replicas",
        seconds=400,
    )
    victim, known = steady[0], {r["id"] for r in steady}
    clients = [client(endpoint) for _ in range(4)]  # two lanes a replica: both replicas get some of them
    try:
        streams = [c.generate(**LONG) for c in clients]
        for s in streams:
            next(iter(s))
        os.kill(victim["pid"], signal.SIGKILL)
        ends = [None] * len(streams)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and None in ends:  # the victim's streams end together; then 3 s more
            for i, (c, s) in enumerate(zip(clients, streams)):
                ends[i] = ends[i] or drain(c, s, 0.2)
            if any(ends):
                deadline = min(deadline, time.monotonic() + 3)
        for i, (c, s) in enumerate(zip(clients, streams)):
            if ends[i] is None:
                c.cancel(s.id)  # a survivor: its end is a cancelled done
                ends[i] = only_end(c, s, cancelled=True)
            else:
                with pytest.raises(TimeoutError):
                    c.recv(timeout=2.0)  # nothing after its one end
    finally:
        for c in clients:
            c.close()
    failed = [e for e in ends if isinstance(e, P.Error)]
    assert failed and all(e.code == "replica_failed" and victim["id"] in e.message for e in failed), ends
    assert all(e.finish_reason == "cancelled" for e in ends if isinstance(e, P.Done)), ends
    with client(endpoint) as c:
        assert c.generate(prompt="Water boils at", max_tokens=4).wait().finish_reason == "length"
    # Ray Serve starts a replacement; once it has loaded the model it takes requests again.
    fresh = wait_until(
        lambda: [r for r in stats(endpoint).replicas if r["id"] not in known and r.get("served") == 0],
        "the killed replica's replacement",
        seconds=400,
    )
    new_id = fresh[0]["id"]
    for i in range(8):
        with client(endpoint) as c:
            c.generate(prompt=f"Request {i} says", max_tokens=2).wait()
        if served(endpoint).get(new_id):
            break
    assert served(endpoint).get(new_id), "the replacement replica never served a request"
