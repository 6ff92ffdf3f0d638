"""The Ray Serve request router of the engine replicas: Ray's side of `replica_routing.rank`.

A call that names an `owner` (a replica's id: a cancel, or one replica's stats) goes to that replica and nowhere
else; any other call is ranked by `rank` from what the replicas publish through Ray Serve's routing stats
(`EngineReplica.record_routing_stats`) and the router's own count of each replica's requests in flight. Ray takes
the first rank whose replica accepts, probing queue lengths as its own router does. Needs the `ray` extra; only
`speclane serve --replicas` imports it.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from speclane.pipeline.net.replica_routing import IMBALANCE, rank


class PrefixRouter(RequestRouter):
    def initialize_state(self, imbalance: int = IMBALANCE, prefix: bool = True, **_: Any) -> None:
        """`prefix=False`: two random choices only (`serve --replica-routing random`, for comparisons)."""
        self.imbalance, self.prefix = imbalance, prefix

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        owner = kwargs.get("owner")
        if owner is not None:
            return [[r for r in candidate_replicas if r.replica_id.unique_id == owner]]
        published = [r.routing_stats or None for r in candidate_replicas]
        loads = []
        for r, pub in zip(candidate_replicas, published):
            ongoing = self.replica_queue_len_cache.get(r.replica_id)
            loads.append(ongoing if ongoing is not None else (pub or {}).get("load", 0))
        ids = kwargs.get("prefix_ids") if getattr(self, "prefix", True) else None
        return rank(candidate_replicas, published, loads, ids, getattr(self, "imbalance", IMBALANCE))
