"""Stats over engine replicas: every replica's stats reply summed into the one reply a single server gives, with
each replica listed under `replicas` as {"id", "lanes", "queue", "served"} (and its process id, `pid`).

Lanes and checkpoint counters are summed; the speculation metrics are summed where they are counts and weighted
by rounds where they are rates. The queue's per-client figures are the door's, which alone sees clients. A replica
that did not answer is listed with its `error` and counts for nothing else.
"""

from __future__ import annotations

from typing import Any

from speclane.pipeline.net import protocol as P


def _spec(specs: list[dict[str, Any]]) -> dict[str, Any]:
    rounds = sum(s.get("rounds", 0) for s in specs)
    width = max([len(s.get("accepted_per_position", [])) for s in specs] + [0])
    per_pos = []
    for i in range(width):
        have = [
            (s["accepted_per_position"][i], s.get("rounds", 0)) for s in specs if i < len(s["accepted_per_position"])
        ]
        total = sum(w for _, w in have)
        per_pos.append(round(sum(a * w for a, w in have) / total, 4) if total else 0.0)
    return {
        "rounds": rounds,
        "drafted": sum(s.get("drafted", 0) for s in specs),
        "accepted": sum(s.get("accepted", 0) for s in specs),
        "tokens_per_round": round(sum(s.get("tokens_per_round", 0.0) * s.get("rounds", 0) for s in specs) / rounds, 4)
        if rounds
        else 0.0,
        "accepted_per_position": per_pos,
    }


def aggregate(
    replies: list[dict[str, Any]],
    qid: Any,
    *,
    waiting: list[bytes],
    client: bytes,
    clients: int,
    finished: dict[str, int],
    max_queue: int,
    max_client_queue: int,
) -> P.StatsReply:
    """One StatsReply from the replicas' `replies` (EngineReplica.stats, or {"replica", "error"})."""
    ok = [r for r in replies if "error" not in r]
    lanes = {k: sum(r["lanes"].get(k, 0) for r in ok) for k in ("active", "free", "max")}
    checkpoints = None
    held = [r["checkpoints"] for r in ok if r.get("checkpoints")]
    if held:
        checkpoints = {k: sum(c.get(k, 0) for c in held) for k in held[0]}
    listed = []
    for r in replies:
        if "error" in r:
            listed.append({"id": r.get("replica"), "error": r["error"]})
            continue
        listed.append(
            {
                "id": r["replica"],
                "lanes": r["lanes"],
                "queue": r["queue"].get("waiting", 0),
                "served": r.get("served", 0),
                "pid": r.get("pid"),
                "frames": r.get("frames"),
            }
        )
    queue = {
        "waiting": len(waiting),
        "max": max_queue,
        "max_per_client": max_client_queue,
        "yours": sum(c == client for c in waiting),
        "clients_waiting": len(set(waiting)),
    }
    return P.StatsReply(
        id=qid,
        lanes=lanes,
        queue=queue,
        finished=finished,
        clients=clients,
        spec=_spec([r["spec"] for r in ok if r.get("spec")]),
        checkpoints=checkpoints,
        replicas=listed,
        passes={k: sum((r.get("passes") or {}).get(k, 0) for r in ok) for k in ("verify", "one_pass", "prefill")},
    )
