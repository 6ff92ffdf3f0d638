"""The Ray Serve request router of the engine replicas: Ray's side of `replica_routing.rank`.

A call that names an `owner` (a replica's id: a cancel, or one replica's stats) goes to that replica and nowhere
else; one whose owner is not running (starting, stopping or gone) fails at once with `ReplicaNotRunning`. Any other
call is ranked by `rank` from what the replicas publish through Ray Serve's routing stats
(`EngineReplica.record_routing_stats`), Ray's count of each replica's requests in flight, and the router's own
`Ledger` of the tokens of work it sent each replica (ended by Ray's `on_request_completed`). Ray takes
the first rank whose replica accepts, probing queue lengths as its own router does, and waits before asking again
when none does (a router that never asks Ray to back off makes it ask again at once, on the router's one event
loop, forever). Needs the `ray` extra; only `speclane serve --replicas` imports it.

Ray Serve pickles this module by value when it ships the router to the door's handle, so the router in the door
holds copies of whatever module objects this file imported by name, made when the deployment was declared. State
the door shares with its router (`UNRESPONSIVE`, `TRAIL`) is therefore always read through the `replica_routing`
module, which is pickled by reference: the door's own module, at call time.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from speclane.pipeline.net import replica_routing
from speclane.pipeline.net.replica_routing import IMBALANCE, Ledger, held_lengths, rank


def _named(pending: PendingRequest | None) -> str:
    return pending.metadata.internal_request_id[:8] if pending is not None else "no request"


def _ids(ranks: list[list[RunningReplica]]) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


KEYS_KEPT = 4096  # Ray's request ids the router maps to the door's, at most


class ReplicaNotRunning(RuntimeError):
    """A call for one replica that is not among the running ones."""


class PrefixRouter(RequestRouter):
    def initialize_state(self, imbalance: int = IMBALANCE, prefix: bool = True, **_: Any) -> None:
        """`prefix=False`: two random choices only (`serve --replica-routing random`, for comparisons)."""
        self.imbalance, self.prefix = imbalance, prefix
        self._held = {}
        self._ledger = replica_routing.LEDGER = Ledger()  # the door's calls end requests in it too
        self._keys: dict[str, Any] = {}  # Ray's internal request id -> the door's id of the request
        replica_routing.TRAIL.state = self._ray_state

    def _ray_state(self) -> str:
        """Ray's side of routing, read from its RequestRouter's fields (for the log; see `replica_routing.TRAIL`)."""
        cache = self.replica_queue_len_cache
        queues = {r.unique_id: cache.get(r) for r in self.curr_replicas}
        return (
            f"replicas (queue length cached) {queues}; pending {len(self._pending_requests_to_route)}; routing tasks "
            f"{self.curr_num_routing_tasks} (target {self.target_num_routing_tasks}, in backoff "
            f"{self.num_routing_tasks_in_backoff}); unresponsive {replica_routing.UNRESPONSIVE.marked()}"
        )

    def _publication(self, replica: RunningReplica) -> dict[str, Any] | None:
        """What `replica` publishes, its hash groups as sets (made once a publication, so a match is O(1))."""
        pub = replica.routing_stats or None
        if pub is None:
            return None
        held = self.__dict__.setdefault("_held", {})
        seen = held.get(replica.replica_id)
        if seen is None or seen[0] is not pub:
            prefixes = {n: frozenset(h) for n, h in pub.get("prefixes", {}).items()}
            seen = held[replica.replica_id] = (pub, {**pub, "prefixes": prefixes})
        return seen[1]

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # no rank accepted: Ray waits, then asks again
        kwargs = pending_request.kwargs if pending_request is not None else {}
        owner = kwargs.get("owner")
        if owner is not None:
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == owner]
            replica_routing.TRAIL.note(f"{_named(pending_request)}: for its owner {owner}, running: {bool(chosen)}")
            if chosen or pending_request is None:
                return [chosen]
            if not pending_request.future.done():
                pending_request.future.set_exception(
                    ReplicaNotRunning(f"replica {owner} is not running (starting, stopping or gone)")
                )
                forget = getattr(self, "_remove_pending_request_from_indices", None)  # as Ray does on success
                if forget is not None:
                    forget(pending_request)
            return [candidate_replicas]  # Ray sees the request settled and routes it no further
        awake = [r for r in candidate_replicas if r.replica_id.unique_id not in replica_routing.UNRESPONSIVE]
        if len(awake) < len(candidate_replicas):
            replica_routing.TRAIL.note(
                f"passed over {[r.replica_id.unique_id for r in candidate_replicas if r not in awake]}"
            )
        if not awake:  # every replica was silent lately: the one silent longest ago
            oldest = set(
                replica_routing.UNRESPONSIVE.least_recent([r.replica_id.unique_id for r in candidate_replicas])
            )
            awake = [r for r in candidate_replicas if r.replica_id.unique_id in oldest]
        candidate_replicas = awake
        published = [self._publication(r) for r in candidate_replicas]
        held = self.__dict__["_held"]
        ledger = self._ledger
        if len(held) > 2 * len(candidate_replicas):  # replicas gone since (autoscaling, faults) are forgotten
            live = {r.replica_id for r in candidate_replicas}
            self._held = {k: v for k, v in held.items() if k in live}
            ledger.keep(live)
        loads = []
        for r, pub in zip(candidate_replicas, published):
            ongoing = self.replica_queue_len_cache.get(r.replica_id)
            loads.append(ongoing if ongoing is not None else (pub or {}).get("load", 0))
        ids = kwargs.get("prefix_ids") if getattr(self, "prefix", True) else None
        imbalance = getattr(self, "imbalance", IMBALANCE)
        if not ids or pending_request is None:  # `--replica-routing random`, or a prompt the door could not read
            ranks = rank(candidate_replicas, published, loads, ids, imbalance)
            replica_routing.TRAIL.note(f"{_named(pending_request)}: loads {loads}, ranks {_ids(ranks)}")
            return ranks
        have = held_lengths(published, ids)
        work = [ledger.work.get(r.replica_id, 0) for r in candidate_replicas]
        busy = [ledger.requests.get(r.replica_id, 0) for r in candidate_replicas]
        ranks = rank(candidate_replicas, published, loads, ids, imbalance, work=work, held=have, busy=busy)
        # Ray takes the first rank's one replica unless it refuses (then it asks again, and the request moves).
        i = candidate_replicas.index(ranks[0][0])
        tokens = len(ids) - have[i] + int(kwargs.get("max_tokens") or 0)
        internal = pending_request.metadata.internal_request_id
        keys = self._keys
        if len(keys) > KEYS_KEPT:  # requests cancelled before Ray sent them never complete: forget the oldest
            for old in list(keys)[: KEYS_KEPT // 4]:
                del keys[old]  # the door still ends them in the ledger by its own id
        key = keys[internal] = kwargs.get("rid", internal)
        ledger.sent(key, ranks[0][0].replica_id, tokens)
        replica_routing.TRAIL.note(
            f"{_named(pending_request)}: loads {loads}, work {work}, held {have}, ranks {_ids(ranks)}"
        )
        return ranks

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        """Ray's call, once for every request sent to a replica, when it ends however it ends."""
        self._ledger.ended(self._keys.pop(internal_request_id, internal_request_id))
