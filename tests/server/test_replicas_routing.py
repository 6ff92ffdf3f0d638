"""The routing rule of `speclane serve --replicas` as a case table, without Ray: the longest held prefix wins unless
its holder is much busier than the least loaded replica; a prefix counts only at a published checkpoint position
(a KV-only match is no hit); otherwise the less loaded of two random choices. Also the flags' checks and the
deployment options they become, and the stats a door sums."""

from __future__ import annotations

import argparse
import os
import random

import pytest

from speclane.pipeline.net.replica_cluster import AUTOSCALING, QUIET_RAY, REPLICA_ENV, quiet_ray_env
from speclane.pipeline.net.replica_routing import (
    IMBALANCE,
    Ledger,
    held_lengths,
    longest_held,
    prefix_hash,
    prefix_hashes,
    publication,
    rank,
)
from speclane.pipeline.net.replica_stats import aggregate
from speclane.stages.contract.errors import ConfigError

CONVO = tuple(range(100, 160))  # a conversation's tokens; checkpoints at 20 and 40 of them


def pub(*held, load=0):
    return publication([CONVO[:n] for n in held], load)


def test_hash_is_stable_and_tells_prefixes_apart():
    assert prefix_hash([1, 2, 3]) == prefix_hash((1, 2, 3))
    assert prefix_hash([1, 2, 3]) != prefix_hash([1, 2, 4])
    assert prefix_hash([1, 2]) != prefix_hash([1, 2, 0])
    assert prefix_hash([70000]) != prefix_hash([70000 % 65536])  # ids past 16 bits are not truncated


def test_prefix_hashes_in_one_pass_equal_each_prefix_hashed_alone():
    ids = [70000, *range(1, 99)]
    got = prefix_hashes(ids, [64, 0, 1, 7, 7, 99, 250])
    assert got == {n: prefix_hash(ids[:n]) for n in (1, 7, 64)}  # only lengths 1..len-1: a prompt's own is no use


@pytest.mark.parametrize(
    "held, ids, expected",
    [
        ((20, 40), CONVO, 40),  # the longest checkpoint that begins the prompt
        ((20, 40), CONVO[:40], 20),  # a checkpoint of the whole prompt cannot serve it: its last token must run
        ((20, 40), CONVO[:41], 40),
        ((40,), CONVO[:39], 0),  # shares 39 tokens with the checkpoint: KV alone, no state at 39: no hit
        ((40,), CONVO[:30] + (7,) * 20, 0),  # parts at 30: no checkpoint there, no hit
        ((20,), CONVO[:30] + (7,) * 20, 20),
        ((), CONVO, 0),
    ],
)
def test_longest_held(held, ids, expected):
    assert longest_held(pub(*held)["prefixes"], list(ids)) == expected


@pytest.mark.parametrize(
    "published, loads, want",
    [
        ([pub(20), pub(40), pub()], [0, 0, 0], "b"),  # b holds the longer prefix
        ([pub(20), pub(40), pub()], [0, IMBALANCE, 0], "b"),  # busier, but within the imbalance
        ([pub(20), pub(40), pub()], [0, IMBALANCE + 1, 0], None),  # too busy: two random choices
        ([pub(40), pub(40), pub()], [3, 1, 0], "b"),  # a tie in length goes to the less loaded holder
        ([None, pub(), pub()], [0, 0, 0], None),  # nothing held anywhere
    ],
)
def test_rank_prefers_the_holder(published, loads, want):
    ranks = rank(["a", "b", "c"], published, loads, list(CONVO), rng=random.Random(0))
    if want is None:
        assert len(ranks) == 1 and len(ranks[0]) == 2
    else:
        assert ranks[0] == [want] and len(ranks) == 2


def test_two_random_choices_less_loaded_first_and_spread():
    loads = [5, 0, 9, 1]
    seen = set()
    for seed in range(200):
        ranks = rank(["a", "b", "c", "d"], [None] * 4, loads, None, rng=random.Random(seed))
        (pair,) = ranks
        assert len(set(pair)) == 2 and loads["abcd".index(pair[0])] <= loads["abcd".index(pair[1])]
        seen.add(frozenset(pair))
    assert len(seen) == 6  # every pair of four is drawn
    assert rank([], [], [], None) == []
    assert rank(["a"], [None], [0], [1, 2]) == [["a"]]


def test_with_work_the_pair_is_two_ranks_less_work_first():
    """Ray takes the replica with fewer requests within a rank; work (tokens) orders the pair only as two ranks."""
    loads, work = [2, 2, 3, 0], [900, 100, 50, 400]
    for seed in range(50):
        ranks = rank(["a", "b", "c", "d"], [None] * 4, loads, None, rng=random.Random(seed), work=work)
        assert all(len(r) == 1 for r in ranks) and len(ranks) == 2
        first, second = ("abcd".index(r[0]) for r in ranks)
        assert (work[first], loads[first]) <= (work[second], loads[second])
    # among holders of the same prefix, less work wins; the holder stays first unless past the imbalance in requests
    ranks = rank(["a", "b"], [pub(40), pub(40)], [0, 1], list(CONVO), rng=random.Random(0), work=[500, 10])
    assert ranks[0] == ["b"] and ranks[1:] == [["b"], ["a"]]
    held = held_lengths([pub(40), None, pub(20)], list(CONVO))
    assert held == [40, 0, 20]
    assert rank(["a", "b", "c"], [pub(40), None, pub(20)], [0, 0, 0], list(CONVO), work=[0, 0, 0], held=held)[0] == [
        "a"
    ]


def test_routing_by_work_balances_requests_of_different_sizes():
    """Eight prompts of different lengths sent at once to two idle replicas: counted out by requests (4 and 4, the
    best a count can do) one replica may get the four longest; by the ledger's work the two end within one prompt."""
    sizes = [292, 221, 330, 342, 235, 280, 366, 249]  # the serving bench's eight prompts, in tokens
    ledger = Ledger()
    for i, n in enumerate(sizes):
        work = [ledger.work.get(r, 0) for r in "ab"]
        (first,), _ = rank(["a", "b"], [None, None], [0, 0], [1] * n, rng=random.Random(i), work=work)
        ledger.sent(i, first, n + 32)
    a, b = ledger.work["a"], ledger.work["b"]
    assert abs(a - b) <= max(sizes) and a + b == sum(sizes) + 8 * 32
    ledger.ended(0)
    ledger.ended(0)  # once only
    ledger.sent(1, "a", 10)  # a retry moves the request
    assert sum(ledger.work.values()) == sum(sizes[2:]) + 6 * 32 + 10
    ledger.keep({"a"})
    assert set(ledger.work) <= {"a"}


def test_a_free_lane_comes_before_less_work():
    """A replica whose requests fill its published lanes ranks after one with a lane free, whatever their work (the
    request would wait in the first one's queue); with both full, or lanes not published, work decides."""
    free, full = publication([], 3, lanes=4), publication([], 4, lanes=4)
    for seed in range(20):
        rng = random.Random(seed)
        assert rank(["a", "b"], [full, free], [4, 3], None, rng=rng, work=[100, 900])[0] == ["b"]
        assert rank(["a", "b"], [full, full], [4, 4], None, rng=rng, work=[100, 900])[0] == ["a"]
        assert rank(["a", "b"], [None, None], [4, 3], None, rng=rng, work=[100, 900])[0] == ["a"]
    # the serving bench's eight prompts sent at once to two idle replicas of four lanes: four each, by count, with
    # the work balanced within those counts (by work alone one replica may take five and queue one)
    sizes = [292, 221, 330, 342, 235, 280, 366, 249]
    ledger, loads = Ledger(), {"a": 0, "b": 0}
    for i, n in enumerate(sizes):
        pubs = [publication([], loads[r], lanes=4) for r in "ab"]
        work = [ledger.work.get(r, 0) for r in "ab"]
        (first,), _ = rank(["a", "b"], pubs, [loads[r] for r in "ab"], [1] * n, rng=random.Random(i), work=work)
        ledger.sent(i, first, n + 32)
        loads[first] += 1
    assert loads == {"a": 4, "b": 4}


def test_publication_caches_hashes_and_forgets_evicted():
    cache: dict = {}
    first = publication([CONVO[:20], CONVO[:40]], 3, cache)
    assert first == {
        "prefixes": {20: [prefix_hash(CONVO[:20])], 40: [prefix_hash(CONVO[:40])]},
        "load": 3,
        "lanes": None,
    }
    assert set(cache) == {CONVO[:20], CONVO[:40]}
    publication([CONVO[:40]], 0, cache)
    assert set(cache) == {CONVO[:40]}


def _args(**kw):
    base = dict(
        replicas=2,
        min_replicas=None,
        max_replicas=None,
        replica_stall=10.0,
        curve_keys=None,
        snapshot_dir=None,
        max_queue=64,
        grace=10.0,
        threads=1,
        device="cpu",
        ray_address=None,
        replica_routing="prefix",
    )
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"replicas": 0}, "--replicas must be >= 1"),
        ({"min_replicas": 1}, "--min-replicas and --max-replicas go together"),
        ({"min_replicas": 3, "max_replicas": 2}, "0 <= --min-replicas <= --max-replicas"),
        ({"replica_stall": 0}, "--replica-stall must be > 0"),
        ({"snapshot_dir": "x"}, "--snapshot-dir is not supported with replicas"),
    ],
)
def test_bad_replica_flags(flags, message):
    from speclane.pipeline.net.replica_cluster import check_flags

    with pytest.raises(ConfigError, match=message):
        check_flags(_args(**flags))


def test_wants_replicas():
    from speclane.pipeline.net.replica_cluster import wants_replicas

    assert not wants_replicas(_args(replicas=1))
    assert wants_replicas(_args(replicas=2))
    assert wants_replicas(_args(replicas=1, ray_address="auto"))
    assert wants_replicas(_args(replicas=1, min_replicas=1, max_replicas=3))


def test_deployment_options():
    pytest.importorskip("ray.serve", reason="deployment options name the router class: needs the ray extra")
    from speclane.pipeline.net.replica_cluster import deployment_options
    from speclane.pipeline.net.replica_router import PrefixRouter

    fixed = deployment_options(_args(replicas=3), lanes=4)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["request_router_config"]["request_router_class"] is PrefixRouter
    assert fixed["request_router_config"]["request_router_kwargs"] == {"prefix": True}
    plain = deployment_options(_args(replica_routing="random"), lanes=4)["request_router_config"]
    assert plain["request_router_kwargs"] == {"prefix": False}
    assert fixed["ray_actor_options"] == {"num_cpus": 1, "runtime_env": {"env_vars": REPLICA_ENV}}
    scaled = deployment_options(_args(replicas=1, min_replicas=1, max_replicas=4, device="cuda:0"), lanes=4)
    assert "num_replicas" not in scaled and scaled["ray_actor_options"]["num_gpus"] == 1
    auto = scaled["autoscaling_config"]
    assert (auto["min_replicas"], auto["initial_replicas"], auto["max_replicas"]) == (1, 1, 4)
    assert auto["target_ongoing_requests"] == 4
    assert {k: auto[k] for k in AUTOSCALING} == AUTOSCALING


def test_autoscaling_timing_from_flags():
    from speclane.pipeline.net.replica_cluster import autoscaling_timing, deployment_options

    scaled = {"min_replicas": 1, "max_replicas": 2}
    assert autoscaling_timing(_args(**scaled)) == AUTOSCALING
    given = _args(**scaled, downscale_delay=0.0, autoscale_window=2.0)
    assert autoscaling_timing(given) == {**AUTOSCALING, "downscale_delay_s": 0.0, "look_back_period_s": 2.0}
    pytest.importorskip("ray.serve", reason="deployment options name the router class: needs the ray extra")
    auto = deployment_options(given, lanes=2)["autoscaling_config"]
    assert (auto["downscale_delay_s"], auto["look_back_period_s"], auto["upscale_delay_s"]) == (0.0, 2.0, 2.0)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"downscale_delay": -1.0}, "--downscale-delay must be a number of seconds >= 0, got -1"),
        ({"autoscale_interval": 0.0}, "--autoscale-interval must be a number of seconds > 0, got 0"),
        ({"upscale_delay": float("nan")}, "--upscale-delay must be a number of seconds >= 0, got nan"),
        ({"autoscale_window": 0.5}, r"--autoscale-window \(0.5 s\) must be longer than --autoscale-interval \(1 s\)"),
        ({"min_replicas": None, "max_replicas": None, "upscale_delay": 1.0}, "--upscale-delay: autoscaling's timing"),
    ],
)
def test_bad_autoscaling_timing(flags, message):
    from speclane.pipeline.net.replica_cluster import check_flags

    with pytest.raises(ConfigError, match=message):
        check_flags(_args(**{"min_replicas": 1, "max_replicas": 2, **flags}))


def test_the_retired_environment_variable_is_refused_by_name(monkeypatch):
    from speclane.pipeline.net.replica_cluster import GONE_ENV, check_flags

    monkeypatch.setenv(GONE_ENV, '{"downscale_delay_s": 5}')
    with pytest.raises(ConfigError, match=r"\$SPECLANE_AUTOSCALING is no longer read; .* --downscale-delay"):
        check_flags(_args())


def test_ray_background_settings_only_for_a_ray_started_here(monkeypatch):
    for key in QUIET_RAY:  # set, then removed: monkeypatch restores each as it was, whatever the code sets
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.2")  # the user's own setting wins
    assert quiet_ray_env(argparse.Namespace(ray_address="auto")) == {}  # a joined cluster keeps its own
    assert "RAY_task_events_report_interval_ms" not in os.environ
    set_here = quiet_ray_env(argparse.Namespace(ray_address=None))
    assert set_here == {k: v for k, v in QUIET_RAY.items() if k != "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"}
    assert (
        os.environ["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.2" and os.environ["RAY_enable_metrics_collection"] == "0"
    )


def test_stats_aggregate_lists_each_replica():
    one = {
        "replica": "r1",
        "pid": 11,
        "served": 5,
        "lanes": {"active": 1, "free": 3, "max": 4},
        "queue": {"waiting": 2},
        "spec": {"rounds": 10, "drafted": 20, "accepted": 10, "tokens_per_round": 2.0, "accepted_per_position": [0.5]},
        "checkpoints": {"entries": 2, "hits": 1},
        "frames": {"ray": 3, "sink": 9},
    }
    two = {**one, "replica": "r2", "pid": 12, "served": 1, "lanes": {"active": 0, "free": 4, "max": 4}}
    two["spec"] = {"rounds": 30, "drafted": 0, "accepted": 0, "tokens_per_round": 1.0, "accepted_per_position": [1.0]}
    dead = {"replica": "r3", "error": "ActorDiedError: no stats"}
    reply = aggregate(
        [one, two, dead],
        "q",
        waiting=[b"x", b"y", b"x"],
        client=b"x",
        clients=2,
        finished={"stop": 6},
        max_queue=8,
        max_client_queue=2,
    )
    assert reply.lanes == {"active": 1, "free": 7, "max": 8}
    assert reply.queue == {"waiting": 3, "max": 8, "max_per_client": 2, "yours": 2, "clients_waiting": 2}
    assert reply.spec["rounds"] == 40 and reply.spec["tokens_per_round"] == 1.25
    assert reply.spec["accepted_per_position"] == [0.875]
    assert reply.checkpoints == {"entries": 4, "hits": 2}
    assert [r["id"] for r in reply.replicas] == ["r1", "r2", "r3"]
    assert reply.replicas[0] == {
        "id": "r1",
        "lanes": one["lanes"],
        "queue": 2,
        "served": 5,
        "pid": 11,
        "frames": {"ray": 3, "sink": 9},
    }
    assert reply.replicas[2]["error"].startswith("ActorDiedError")


def test_router_routes_owned_calls_and_backs_off():
    """A call for one replica goes there; for one not running it fails at once (Ray would otherwise ask the router
    again at once, forever, on the router's one event loop); every routed call lets Ray back off when none accepts."""
    pytest.importorskip("ray.serve", reason="the router subclasses Ray Serve's: needs the ray extra")
    import asyncio
    from collections import namedtuple
    from types import SimpleNamespace

    from ray.serve.request_router import PendingRequest

    from speclane.pipeline.net import replica_routing
    from speclane.pipeline.net.replica_router import PrefixRouter, ReplicaNotRunning

    ReplicaId = namedtuple("ReplicaId", "unique_id")
    router = PrefixRouter.__new__(PrefixRouter)  # its routing needs no deployment: only what the replicas publish
    router.initialize_state()
    router._replica_queue_len_cache, router._pending_requests_by_id = {}, {}
    replicas = [
        SimpleNamespace(replica_id=ReplicaId(name), routing_stats=pub(*held))
        for name, held in (("a", (20,)), ("b", (40,)))
    ]

    async def choose(**kwargs):
        request = PendingRequest(args=[], kwargs=kwargs, metadata=SimpleNamespace(internal_request_id=str(kwargs)))
        ranks = await router.choose_replicas(replicas, request)
        return request, ranks

    async def cases():
        request, ranks = await choose(owner="a")
        assert ranks == [[replicas[0]]] and request.routing_context.should_backoff and not request.future.done()
        request, ranks = await choose(owner="gone")
        assert any(ranks) and isinstance(request.future.exception(), ReplicaNotRunning)
        request, ranks = await choose(prefix_ids=list(CONVO))
        assert ranks[0] == [replicas[1]] and request.routing_context.should_backoff
        replicas[1].routing_stats = pub(load=2)  # b evicted its checkpoint: a new publication, read anew
        request, ranks = await choose(prefix_ids=list(CONVO), max_tokens=8)
        assert ranks[0] == [replicas[0]]
        # the ledger: each routed request's tokens past the chosen replica's checkpoint, until Ray says it ended
        a, b = replicas[0].replica_id, replicas[1].replica_id
        assert router._ledger.work == {b: len(CONVO) - 40, a: len(CONVO) - 20 + 8}
        router.on_request_completed(a, request.metadata.internal_request_id)
        assert router._ledger.work == {b: len(CONVO) - 40}
        # keyed by the door's id: the door ends it at its last frame, before Ray's call ends; Ray's end is then moot
        request, _ = await choose(prefix_ids=list(CONVO), rid=7)
        assert router._ledger.requests == {b: 1, a: 1}
        replica_routing.LEDGER.ended(7)
        assert router._ledger.requests == {b: 1}
        router.on_request_completed(a, request.metadata.internal_request_id)
        assert router._ledger.requests == {b: 1}

    asyncio.run(cases())


def test_a_replica_silent_past_the_stall_is_passed_over_until_it_speaks(monkeypatch):
    """The door marks a replica that left a stream silent past its stall; the router passes it over while another
    replica runs, for UNRESPONSIVE_S or until the replica sends an item again."""
    pytest.importorskip("ray.serve", reason="the router subclasses Ray Serve's: needs the ray extra")
    import asyncio
    from collections import namedtuple
    from types import SimpleNamespace

    from speclane.pipeline.net import replica_routing
    from speclane.pipeline.net.replica_router import PrefixRouter

    clock = [100.0]
    monkeypatch.setattr(replica_routing.time, "monotonic", lambda: clock[0])
    silent = replica_routing.Unresponsive()
    monkeypatch.setattr(replica_routing, "UNRESPONSIVE", silent)
    # the router as Ray ships it to the door: its module pickled by value, so a mark must reach it through the
    # door's own `replica_routing` (a module-level copy made when the deployment was declared would never see one)
    from ray.serve.config import RequestRouterConfig

    PrefixRouter = RequestRouterConfig(request_router_class=PrefixRouter).get_request_router_class()  # noqa: N806
    ReplicaId = namedtuple("ReplicaId", "unique_id")
    router = PrefixRouter.__new__(PrefixRouter)
    router.initialize_state(prefix=False)
    router._replica_queue_len_cache, router._pending_requests_by_id = {}, {}
    replicas = [SimpleNamespace(replica_id=ReplicaId(name), routing_stats=None) for name in ("a", "b")]

    def chosen() -> set[str]:
        return {r.replica_id.unique_id for rank in asyncio.run(router.choose_replicas(replicas, None)) for r in rank}

    assert chosen() == {"a", "b"}
    silent.mark("a")
    assert chosen() == {"b"}
    clock[0] += 1
    silent.mark("b")
    assert chosen() == {"a"}  # every replica marked: the one marked longest ago (b fell silent since)
    silent.clear("b")
    assert chosen() == {"b"}
    clock[0] += replica_routing.UNRESPONSIVE_S + 1
    assert "a" not in silent and chosen() == {"a", "b"}
    # the trail the door logs when a request waits past the stall with no replica named
    trail = replica_routing.TRAIL.dump().splitlines()
    assert "passed over ['a']" in trail[-3] and "ranks [['b']]" in trail[-2] and "no request" in trail[-1]
    silent.mark("a")
    silent.mark("b")
    assert chosen() == {"a", "b"}  # marked at once: both stay candidates
