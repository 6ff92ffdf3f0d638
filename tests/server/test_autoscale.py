"""Autoscaling by requests in flight, with real processes: `speclane serve --min-replicas 1 --max-replicas 2`, two
lanes a replica (a replica's target). Six requests in flight are three replicas' worth: Ray Serve's autoscaler adds
the second replica, `stats` lists it, and new requests go to it; once the load ends the autoscaler removes one
again, and the one left still serves. The timing is short (--upscale-delay and the others) so no step waits on the
defaults' delays, but the test still starts a Ray and two replicas of its own, one after the other: marked `slow`, it
runs with `python -m pytest -m slow` (tests/server/test_replicas.py covers the replicas in the default suite).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="the autoscaling test needs Ray Serve: pip install 'speclane[ray]'")

from speclane.pipeline.net import protocol as P  # noqa: E402
from tests.server.replica_procs import (  # noqa: E402
    LONG,
    assert_silent,
    client,
    ends_of,
    live,
    replica_door,
    served,
    spread,
    wait_for,
)

pytestmark = pytest.mark.slow
TIMING = (
    "--autoscale-interval",
    "0.5",
    "--autoscale-window",
    "1.5",
    "--upscale-delay",
    "0.5",
    "--downscale-delay",
    "2",
)
SCALE_S = 300  # a replica's start (a model load) on a loaded machine


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    flags = ("--min-replicas", "1", "--max-replicas", "2", "--max-lanes", "2", "--replica-stall", "30", *TIMING)
    with replica_door(tmp_path_factory.mktemp("autoscale"), *flags) as d:
        yield d[0]


def test_load_adds_a_replica_and_its_end_removes_it(door):
    (first,) = wait_for(lambda: live(door), "the first replica", 120)
    assert len(live(door)) == 1  # --replicas 1: the autoscaler starts with one
    clients = [client(door) for _ in range(6)]
    try:
        streams = [c.generate(prompt=f"Count slowly from {n}: {n}, {n + 1},", **LONG) for n, c in enumerate(clients)]
        both = wait_for(lambda: len(live(door)) == 2 and live(door), "a second replica under load", SCALE_S)
        (added,) = [r["id"] for r in both if r["id"] != first["id"]]
        for _ in range(5):  # the added replica is the less loaded: new requests go to it
            spread(door, ["Iron melts at", "Gold is"])
            if served(door).get(added):
                break
        assert served(door).get(added), "the added replica never served a request"
        for c, s in zip(clients, streams):
            c.cancel(s.id)
        ends = [ends_of(c, s) for c, s in zip(clients, streams)]
        counts = served(door)  # before the autoscaler removes one (it waits 2 s of no load)
        assert all(isinstance(e, P.Done) and e.finish_reason == "cancelled" for e in ends), ends
        assert_silent(clients, cancelled=True)
    finally:
        for c in clients:
            c.close()
    assert counts.get(first["id"], 0) >= 6 and counts.get(added, 0) >= 1, counts  # served by both
    # the load is over: back to one replica, which serves
    wait_for(lambda: len(live(door)) == 1 or (False, live(door)), "back to one replica after the load", SCALE_S)
    with client(door) as c:
        assert c.generate(prompt="Water boils at", max_tokens=4).wait().finish_reason == "length"
