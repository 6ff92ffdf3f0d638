"""Section `experts` of `speclane bench`: an expert cache on a MoE target whose routing has the locality of text.

The target: the embedded default model (SmolLM2-135M) MoEfied (stages/fitting/moefy.py): each layer's SwiGLU
neurons split into a shared expert and equal routed experts by co-activation on the Python standard library's
source and prose, routed by a router fitted to pick the experts that hold most of a token's activation, and saved
once in the cache directory (`$SPECLANE_CACHE/moefied/`). Its routing follows the text a run decodes, which random
routing would not (random routing has no locality and would understate what a cache holds). It is a different model
from the dense one (its fit's agreement with the dense model's greedy tokens is in the result, `moefied`), decoded
exactly like any target; every routed expert is read in place from its file on a miss.

Measured in one run: for each speculation setting (off; ngram at 7 draft tokens and mtp at 3, the shipped head
fitted to the dense model, under row budgets 3 and 8) at 1, 2 and 4 lanes, one routing trace (the lookups of the
decode rounds, the prefill's warming the cache first), replayed under each live policy and Belady's optimum with the
fast tier at about 10 % ("5090-like"), 25 % and 95 % ("PRO 6000-like") of the experts: hit rate and expert bytes
copied per committed token; and decode tokens per second of the live cache (the kept policy) at each size beside
every expert resident. A row budget that leaves no draft at a lane count (3 rows at 2 lanes and up) is that lane
count's off, so it is not run twice. Router look-ahead prefetch is judged from the fit's look-ahead hit rate
(`prefetch`). Not here: the tables and the plot (bench/experts_report.py), the cache (stages/models/expert_cache.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from speclane.bench.measure import make_engine
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.anchor_gather import drafts_per_lane
from speclane.stages.fitting import moefy
from speclane.stages.models.artifact import cache_root, resolve
from speclane.stages.models.expert_cache import DEFAULT_POLICY
from speclane.stages.models.expert_slots import POLICIES, SlotTable
from speclane.stages.models.expert_study import Belady, keys

FRACTIONS = {"10%": 0.10, "25%": 0.25, "95%": 0.95}  # the fast tier's share of all routed experts
SETTINGS = (("off", "none", 1, 0), ("ngram@b3", "ngram", 7, 3), ("ngram@b8", "ngram", 7, 8))
MTP = (("mtp@b3", "mtp", 3, 3), ("mtp@b8", "mtp", 3, 8))
LANES = (1, 2, 4)
KEPT = DEFAULT_POLICY  # the live cache's policy, measured here against the others


def artifact(base: Path, tokenizer, s: moefy.MoefySettings, log=print) -> Path:
    """The MoEfied artifact of the model at `base`, fitted on first use and cached by the fit's settings and the
    base's weights."""
    weights = sorted(base.glob("*.safetensors"))
    tag = hashlib.sha256((s.key() + "".join(f"{w.name}:{w.stat().st_size}" for w in weights)).encode()).hexdigest()
    out = cache_root() / "moefied" / tag[:16]
    if not (out / "moe.json").is_file():
        log(f"bench: MoEfying {base.name} (once; cached in {out})")
        moefy.moefy(base, out, s, moefy.fit_ids(tokenizer, s))
    return out


def decode_run(engine, target, prompts: list[list[int]], max_tokens: int) -> dict:
    """All prompts as lanes of one batch to completion: decode tokens and seconds after the first step (which
    carries the prefill), the expert counters of those rounds, and the trace index where decode began."""
    lanes = [
        engine.submit(parse_request({"id": f"e{i}", "prompt_ids": ids, "max_tokens": max_tokens, "ignore_eos": True}))
        for i, ids in enumerate(prompts)
    ]
    engine.step()
    trace = target.experts.trace if target.experts is not None else None
    start = (len(trace) if trace is not None else 0, sum(len(x.out_ids) for x in lanes))
    before = target.expert_stats()
    t0 = time.perf_counter()
    while engine.busy():
        engine.step()
    seconds = time.perf_counter() - t0
    tokens = sum(len(x.out_ids) for x in lanes) - start[1]
    out = {"tokens": tokens, "seconds": seconds, "tps": tokens / seconds if seconds > 0 else float("nan")}
    if before is not None:
        out["counts"] = target.expert_stats().since(before).as_dict()
    out["decode_from"] = start[0]
    return out


def study(trace: list, start: int, slots: int, decay: float) -> dict[str, dict]:
    """Hits and misses of the decode part of `trace` (lookups from `start`, the prefill's before it warming the
    slots) under each live policy and Belady's, with `slots` slots."""
    out = {}
    for name in (*POLICIES, "belady"):
        if name == "belady":
            policy = Belady(keys(trace))
        else:
            policy = POLICIES[name](decay) if name == "decay" else POLICIES[name]()
        table, warm = SlotTable(slots, policy), None
        for i, (layer, experts) in enumerate(trace):
            if i == start:
                warm = (table.hits, table.misses)
            table.schedule(layer, sorted(experts))
        warm = warm or (table.hits, table.misses)
        hits, misses = table.hits - warm[0], table.misses - warm[1]
        out[name] = {"hits": hits, "misses": misses, "hit_rate": hits / max(1, hits + misses)}
    return out


def experts_section(
    tokenizer, prompts: list[dict], max_tokens: int, lanes: tuple[int, ...] = LANES, tick=None, log=print
) -> dict:
    """The section's result (see the module docstring) at each lane count of `lanes`; `prompts` carry chat token
    ids (`ids`), one a lane (cycled when there are fewer prompts than lanes)."""
    s = moefy.MoefySettings()
    base = resolve(None)
    where = artifact(base, tokenizer, s, log)
    record = json.loads((where / "moe.json").read_text())
    cfg = moefy.moe_config(base, record)
    one = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 2  # bf16
    every = cfg.num_layers * cfg.num_experts
    slots = {name: max(1, round(f * every)) for name, f in FRACTIONS.items()}
    decay = 1.0 - 1.0 / (cfg.num_layers * cfg.experts_per_token * 4)  # scores fade over about four tokens' lookups
    ids = [p["ids"] for p in prompts]
    max_len = max(map(len, ids)) + max_tokens + 16
    resident = moefy.moefied(base, where, torch.bfloat16)
    cached = {n: moefy.moefied(base, where, torch.bfloat16, k * one, KEPT) for n, k in slots.items()}
    settings = SETTINGS + MTP
    cells, skipped = [], {}
    plan = [(n, c) for n in lanes for c in settings if c[0] == "off" or drafts_per_lane(c[2], c[3], n) > 0]
    for step, (n_lanes, (name, backend, k, rows)) in enumerate(plan):
        spec = "decode" if backend == "none" else "verify"
        batch = [ids[j % len(ids)] for j in range(n_lanes)]
        cell = {"lanes": n_lanes, "setting": name, "backend": backend, "k": k, "rows": rows, "tps": {}, "copied": {}}
        try:
            engines = {"resident": make_engine(resident, tokenizer, backend, k, rows, n_lanes, max_len, spec)}
            engines.update(
                {n: make_engine(t, tokenizer, backend, k, rows, n_lanes, max_len, spec) for n, t in cached.items()}
            )
        except Exception as exc:  # noqa: BLE001 - a drafter that does not load is a skip with its reason
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        trace: list = []
        for n, eng in engines.items():
            target = resident if n == "resident" else cached[n]
            if target.experts is not None:
                target.experts.reset()  # every cell starts cold, as the replays of its trace do
            if n == "95%":  # the routing is the same at every size: recorded where copies are fewest
                target.experts.trace = trace
            run = decode_run(eng, target, batch, max_tokens)
            if target.experts is not None:
                target.experts.trace = None
                cell["copied"][n] = run["counts"]["bytes_copied"] / max(1, run["tokens"])
                cell.setdefault("hit_rate_live", {})[n] = run["counts"]["hits"] / max(
                    1, run["counts"]["hits"] + run["counts"]["misses"]
                )
            if n == "95%":
                start, cell["tokens"] = run["decode_from"], run["tokens"]
            cell["tps"][n] = run["tps"]
        cell["study"] = {n: study(trace, start, k, decay) for n, k in slots.items()}
        for res in cell["study"].values():
            for r in res.values():
                r["bytes_per_token"] = r["misses"] * one / max(1, cell["tokens"])
        cell["distinct_per_layer"] = sum(len(e) for _, e in trace[start:]) / max(1, len(trace) - start)
        cell["trace"] = {"decode_from": start, "lookups": [[layer, list(e)] for layer, e in trace]}
        cells.append(cell)
        if tick is not None:
            tick(step + 1, len(plan))
    return {
        "target": "SmolLM2-135M MoEfied: " + f"{cfg.num_experts} routed experts of {cfg.moe_intermediate_size} "
        f"neurons a layer, top {cfg.experts_per_token}, shared expert of {cfg.shared_expert_intermediate_size}",
        "moefied": {k: v for k, v in record.items() if not isinstance(v, list)},
        "expert_bytes": one,
        "experts": every,
        "slots": slots,
        "decay": decay,
        "kept_policy": KEPT,
        "max_tokens": max_tokens,
        "cells": cells,
        "skipped": skipped,
        "prefetch": prefetch_verdict(record, cfg.experts_per_token),
    }


def prefetch_verdict(record: dict, top_k: int) -> dict:
    """Router look-ahead from the fit: the share of layer i+1's chosen experts that its router predicts from layer
    i's input. On a CPU the copy runs on the thread that computes, so a right guess moves a copy earlier without
    hiding it and a wrong one adds a copy: prefetch pays only where a copy overlaps compute (a GPU's side stream)."""
    hit = record["lookahead_hit_mean"]
    return {
        "lookahead_hit": hit,
        "extra_copies_per_layer_if_prefetched": round((1 - hit) * top_k, 3),
        "kept": False,
        "why": "on a CPU a copy runs on the computing thread: a right guess hides nothing, a wrong one adds a copy",
    }
