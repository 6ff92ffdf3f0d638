"""The `experts` section's policy study: routing traces recorded on held-out and training prompts, replayed under
every policy at each fast-tier size, against Belady's optimum.

Owns: recording a setting's traces (each prompt decoded from a cold cache, its lookups and router look-ahead kept,
`record`), and the replays (`compare_policies`): LRU, LFU, frequency with decay (its factor chosen on the training
trace), next use (the live default, and its fade chosen on the training trace), the training trace's frequencies
frozen (`static`, every layer's frequent experts pinned), a per-layer split of the slots sized on the training trace
with LFU inside (`per_layer`) and an even one with LRU inside (`per_layer_lru`, a cache that gives each layer its own
slots), next use with router look-ahead prefetch of 1 and 2 experts a row, and Belady's optimum. Parameters
are only ever chosen on the training trace, recorded on other prompts than the held-out ones replayed. Counted: the
decode lookups (each prompt's prefill warms its cache first): hit rate (an expert in its slot when a row asks) and
copies per lookup (misses plus prefetches: the bytes moved, which Belady's optimum minimizes; a prefetch can raise
the hit rate past Belady's, which is a bound for demand paging only). Not here: the timed runs (bench/experts.py).
"""

from __future__ import annotations

from speclane.bench.measure import make_engine
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.models.expert_policies import FADE, Decay, Lfu, Lru, NextUse
from speclane.stages.models.expert_study import Belady, PerLayer, Static, keys, recording, replay_counts, tune

DECAYS = (0.9, 0.97, 0.99, 0.997, 0.999, 1.0)  # per lookup of any key
FADES = (0.7, 0.8, 0.85, 0.9, 0.95, 1.0)  # per visit of a layer
POLICY_ORDER = (
    "lru",
    "per_layer_lru",
    "lfu",
    "decay",
    "static",
    "per_layer",
    "next_use",
    "next_use_tuned",
    "next_use+pf1",
    "next_use+pf2",
    "belady",
)


def record(target, tokenizer, batches: list[list[list[int]]], backend: str, k: int, rows: int, tokens: int) -> list:
    """Each batch (one prompt a lane) decoded `tokens` tokens with `backend` from a cold cache: per batch, a dict of
    the trace (lookups), the look-ahead per lookup, `start` (the first lookup after every lane's prefill) and the
    tokens committed from there."""
    lanes = max(map(len, batches))
    max_len = max(len(ids) for b in batches for ids in b) + tokens + 16
    spec = "decode" if backend == "none" else "verify"
    engine = make_engine(target, tokenizer, backend, k, rows, lanes, max_len, spec)
    out = []
    for batch in batches:
        target.experts.reset()
        ahead: list = []
        with recording(target, ahead) as trace:
            reqs = [
                {"id": f"s{i}", "prompt_ids": ids, "max_tokens": tokens, "ignore_eos": True}
                for i, ids in enumerate(batch)
            ]
            lanes_ = [engine.submit(parse_request(r)) for r in reqs]
            while engine.busy() and not all(x.out_ids for x in lanes_):
                engine.step()  # every lane's prefill (and a first round): warms the slots, not counted
            start, first = len(trace), sum(len(x.out_ids) for x in lanes_)
            while engine.busy():
                engine.step()
        out.append(
            {
                "lookups": list(trace),
                "ahead": ahead,
                "start": start,
                "tokens": sum(len(x.out_ids) for x in lanes_) - first,
            }
        )
    return out


def _policies(slots: int, train: list, decay: float, fade: float, trace: list) -> dict:
    return {
        "lru": (Lru(), 0),
        "lfu": (Lfu(), 0),
        "decay": (Decay(decay), 0),
        "static": (Static(train), 0),
        "per_layer_lru": (PerLayer.equal(sorted({layer for layer, _ in trace}), slots), 0),
        "per_layer": (PerLayer.trained(train, slots), 0),
        "next_use": (NextUse(), 0),
        "next_use_tuned": (NextUse(fade), 0),
        "next_use+pf1": (NextUse(), 1),
        "next_use+pf2": (NextUse(), 2),
        "belady": (Belady(keys(trace)), 0),
    }


def compare_policies(train: list, held_out: list, slots: int, expert_bytes: int) -> dict:
    """Every policy of the study on the `held_out` traces (as `record` returns them) with `slots` slots, each
    parameter chosen on the `train` traces: per policy hits, lookups, hit rate, copies per lookup and bytes copied
    per committed token, summed over the traces; the chosen parameters under "tuned"."""
    flat = [lookup for t in train for lookup in t["lookups"]]
    decay = tune(flat, slots, Decay, DECAYS)
    fade = tune(flat, slots, NextUse, FADES)
    sums: dict[str, list[float]] = {}
    tokens = sum(t["tokens"] for t in held_out)
    for t in held_out:
        for name, (policy, prefetch) in _policies(slots, flat, decay, fade, t["lookups"]).items():
            r = replay_counts(t["lookups"], slots, policy, t["start"], t["ahead"], prefetch)
            acc = sums.setdefault(name, [0, 0, 0, 0])
            acc[0] += r["hits"]
            acc[1] += r["hits"] + r["misses"]
            acc[2] += r["misses"] + r["prefetched"]
            acc[3] += r["prefetch_hits"]
    out: dict = {
        name: {
            "hits": hits,
            "lookups": lookups,
            "hit_rate": hits / max(1, lookups),
            "copies": copies / max(1, lookups),
            "bytes_per_token": copies * expert_bytes / max(1, tokens),
            "prefetch_hits": used,
        }
        for name, (hits, lookups, copies, used) in sums.items()
    }
    out["tuned"] = {"decay": decay, "fade": fade, "live_fade": FADE}
    return out
