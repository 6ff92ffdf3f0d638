"""Section `experts` of `speclane bench`: an expert cache on a MoE target whose routing has the locality of text.

The target: the embedded default model (SmolLM2-135M) MoEfied (stages/fitting/moefy.py): each layer's SwiGLU
neurons split into a shared expert and equal routed experts by co-activation on the Python standard library's
source and prose, routed by a router fitted to pick the experts that hold most of a token's activation, and saved
once in the cache directory (`$SPECLANE_CACHE/moefied/`) as a qwen2_moe directory any command loads with `--model`.
Its routing follows the text a run decodes, which random routing would not (random routing has no locality and
would understate what a cache holds). It is a different model from the dense one (its fit's agreement with the
dense model's greedy tokens is in the result, `moefied`), decoded exactly like any target; with a cache, every
routed expert is read in place from its file on a miss.

Three parts, in one run:
- `study` (bench/experts_study.py): held-out traces (off, ngram at 7 draft tokens and mtp at 3 under a row budget of
  8, at 1 lane; off at 4 lanes) replayed under every policy and Belady's optimum with the fast tier at about 10 %
  ("5090-like"), 25 % and 95 % ("PRO 6000-like") of the experts; parameters chosen on a training trace recorded on
  other prompts.
- `speed`: decode tokens per second at the 25 % tier against every expert resident, at 1 lane, off, ngram and mtp
  k = 3: paired ratios (A B A B per prompt and repeat, median with min and max), with the live cache copying its
  misses, computing every expert in place from the mapped file (no copy: what the copies cost), and prefetching 2
  look-ahead experts a row.
- `cells`: for each setting (off; ngram and mtp under row budgets 3 and 8) at 1, 2 and 4 lanes, tokens per second
  resident and at each tier size over every prompt (settings and tiers alternating batch by batch, twice), expert
  bytes copied per committed token and the live hit rate. A row budget that leaves no draft at a lane count (3
  rows at 2 lanes and up) is that lane count's off, so it is not run twice.
- `plan_check` (bench/experts_plan.py): per cell (a fast-tier share and a lane count), the CPU profile's plan for
  this model, its figures probed in this run, against the measured best, and the round model's expert copies
  beside the measured ones.
Not here: the tables and the plot (bench/experts_report.py), the cache (stages/models/expert_cache.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from speclane.bench import experts_plan, experts_study, workloads
from speclane.bench.measure import alternate, make_engine, paired_ratio, spread
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.anchor_gather import drafts_per_lane
from speclane.stages.fitting import moefy
from speclane.stages.models.artifact import cache_root, resolve
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_cache import DEFAULT_POLICY, expert_bytes

FRACTIONS = {"10%": 0.10, "25%": 0.25, "95%": 0.95}  # the fast tier's share of all routed experts
SETTINGS = (("off", "none", 1, 0), ("ngram@b3", "ngram", 7, 3), ("ngram@b8", "ngram", 7, 8))
MTP = (("mtp@b3", "mtp", 3, 3), ("mtp@b8", "mtp", 3, 8))
LANES = (1, 2, 4)
KEPT = DEFAULT_POLICY  # the live cache's policy, measured here against the others
STUDY = (("off", "none", 1, 0, 1), ("ngram@b8", "ngram", 7, 8, 1), ("mtp@b8", "mtp", 3, 8, 1), ("off", "none", 1, 0, 4))
SPEED = (("off", "none", 1, 0), ("ngram", "ngram", 7, 8), ("mtp", "mtp", 3, 8))
SPEED_MODES = {  # the 25 % cache's settings per mode (ExpertCache.reset)
    "25% copy": {"prefetch": 0, "in_place": False},
    "25% in place": {"prefetch": 0, "in_place": True},
    "25% prefetch 2": {"prefetch": 2, "in_place": False},
}
STUDY_TOKENS, SPEED_TOKENS, SPEED_REPEATS = 48, 24, 2


def artifact(base: Path, tokenizer, s: moefy.MoefySettings, log=print) -> Path:
    """The MoEfied model of the model at `base` (a qwen2_moe directory), fitted on first use and cached by the fit's
    settings and the base's weights."""
    weights = sorted(base.glob("*.safetensors"))
    tag = hashlib.sha256((s.key() + "".join(f"{w.name}:{w.stat().st_size}" for w in weights)).encode()).hexdigest()
    out = cache_root() / "moefied" / tag[:16]
    if not (out / "moe.json").is_file():
        log(f"bench: MoEfying {base.name} (once; cached in {out})")
        moefy.moefy(base, out, s, moefy.fit_ids(tokenizer, s))
    return out


def training_prompts(engine, held_out: list[list[int]]) -> list[list[int]]:
    """One prompt a workload that the held-out ones are not (the last of each in bench/prompts.jsonl), as chat ids."""
    every = workloads.load()
    out = []
    for w in workloads.WORKLOADS:
        ids = engine.apply_chat([{"role": "user", "content": [p for p in every if p["workload"] == w][-1]["user"]}])
        if ids not in held_out:
            out.append(ids)
    return out


def timed(engine, target, batch: list[list[int]], max_tokens: int, settings: dict | None = None) -> dict:
    """`batch` (one prompt a lane) decoded to `max_tokens` from a cold cache, with `settings` for it (ExpertCache.
    reset's): decode tokens per second once every lane has its first token (the steps before carry the prefills),
    every lane's tokens, and the cache's counters of the rounds timed."""
    if target.experts is not None:
        target.experts.reset(**(settings or {}))
    reqs = [
        {"id": f"e{i}", "prompt_ids": ids, "max_tokens": max_tokens, "ignore_eos": True} for i, ids in enumerate(batch)
    ]
    lanes = [engine.submit(parse_request(r)) for r in reqs]
    while engine.busy() and not all(x.out_ids for x in lanes):
        engine.step()  # every lane's prefill, not timed
    first, before, t0 = sum(len(x.out_ids) for x in lanes), target.expert_stats(), time.perf_counter()
    while engine.busy():
        engine.step()
    seconds = time.perf_counter() - t0
    tokens = sum(len(x.out_ids) for x in lanes) - first
    return {
        "tps": tokens / seconds if seconds > 0 else float("nan"),
        "tokens": [list(x.out_ids) for x in lanes],
        "decode_tokens": tokens,
        "counts": None if before is None else target.expert_stats().since(before),
    }


def speed(resident, cached, tokenizer, prompts: list[list[int]]) -> dict:
    """Paired ratios of decode tokens per second, each `SPEED_MODES` mode of the 25 % cache over every expert
    resident, at 1 lane, per `SPEED` setting, and whether every run's tokens equal the resident run's."""
    max_len = max(map(len, prompts)) + SPEED_TOKENS + 16
    out = {}
    for name, backend, k, rows in SPEED:
        spec = "decode" if backend == "none" else "verify"
        engines = {t: make_engine(t, tokenizer, backend, k, rows, 1, max_len, spec) for t in (resident, cached)}

        def runner(mode: str):
            target = resident if mode == "resident" else cached
            return lambda ids: timed(engines[target], target, [ids], SPEED_TOKENS, SPEED_MODES.get(mode))

        runs = alternate({m: runner(m) for m in ("resident", *SPEED_MODES)}, prompts, SPEED_REPEATS)
        tps = {m: [[r["tps"] for r in rs] for rs in v] for m, v in runs.items()}
        out[name] = {
            "tps": {m: spread([x for xs in v for x in xs]) for m, v in tps.items()},
            "ratio": {m: paired_ratio(tps[m], tps["resident"]) for m in SPEED_MODES},
            "identical": all(
                a["tokens"] == b["tokens"]
                for m in SPEED_MODES
                for xs, ys in zip(runs[m], runs["resident"])
                for a, b in zip(xs, ys)
            ),
        }
    cached.experts.reset(**SPEED_MODES["25% copy"])
    return out


def cells(resident, cached: dict, tokenizer, ids: list[list[int]], max_tokens: int, lanes, tick) -> tuple:
    """Tokens per second resident and at each tier size, per lane count: every prompt of `ids` decoded in batches of
    that many lanes (the last batch filled from the first prompts) by every setting at every tier, the settings and
    tiers alternating batch by batch (so a drift of the machine's speed hits every setting alike, and the settings
    of a tier compare as fairly as its tiers do), twice. A cell's figure is a repeat's decode tokens over its
    seconds, all batches together (the text the plan's round probe measures its acceptance on), median and range of
    the two repeats. Bytes copied per committed token and the live hit rate at each size, over every decode round.
    Returns (cells, skipped backends and why)."""
    out, skipped = [], {}
    max_len = max(map(len, ids)) + max_tokens + 16
    targets = {"resident": resident, **cached}
    for step, n_lanes in enumerate(lanes):
        settings, engines = [], {}
        for c in SETTINGS + MTP:
            name, backend, k, rows = c
            if c[0] != "off" and drafts_per_lane(k, rows, n_lanes) == 0:
                continue  # no draft fits the row budget at this lane count: it is off, measured as off
            spec = "decode" if backend == "none" else "verify"
            try:
                made = {
                    (name, n): make_engine(t, tokenizer, backend, k, rows, n_lanes, max_len, spec)
                    for n, t in targets.items()
                }
            except Exception as exc:  # noqa: BLE001 - a drafter that does not load is a skip with its reason
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                continue
            engines |= made
            settings.append(c)
        batches = [[ids[j % len(ids)] for j in range(i, i + n_lanes)] for i in range(0, len(ids), n_lanes)]
        configs = {
            key: (lambda e, t: lambda b: timed(e, t, b, max_tokens))(e, targets[key[1]]) for key, e in engines.items()
        }
        by_batch = alternate(configs, batches, 2)  # (setting, tier) -> [batch][repeat] -> run
        for name, backend, k, rows in settings:
            mine = {n: by_batch[name, n] for n in targets}
            cell = {"lanes": n_lanes, "setting": name, "backend": backend, "k": k, "rows": rows}
            cell["tps"] = {n: spread([aggregate([b[r] for b in rs]) for r in range(2)]) for n, rs in mine.items()}
            cell["identical"] = all(
                r["tokens"] == mine["resident"][i][0]["tokens"]
                for rs in mine.values()
                for i, b in enumerate(rs)
                for r in b
            )
            runs = {n: [r for b in rs for r in b] for n, rs in mine.items()}
            cell["copied"], cell["hit_rate_live"] = {}, {}
            for n in cached:
                counts, toks = [r["counts"] for r in runs[n]], sum(r["decode_tokens"] for r in runs[n])
                cell["copied"][n] = sum(c.bytes_copied for c in counts) / max(1, toks)
                cell["hit_rate_live"][n] = sum(c.hits for c in counts) / max(1, sum(c.hits + c.misses for c in counts))
            out.append(cell)
        if tick is not None:
            tick(step + 1, len(lanes))
    return out, skipped


def aggregate(runs: list[dict]) -> float:
    """Decode tokens per second of `timed` runs taken together: their tokens over their seconds."""
    seconds = sum(r["decode_tokens"] / r["tps"] for r in runs if r["decode_tokens"])
    return sum(r["decode_tokens"] for r in runs) / seconds if seconds > 0 else float("nan")


def experts_section(
    tokenizer, prompts: list[dict], max_tokens: int, lanes: tuple[int, ...] = LANES, tick=None, log=print
) -> dict:
    """The section's result (see the module docstring) at each lane count of `lanes`; `prompts` carry chat token
    ids (`ids`), one a lane (cycled when there are fewer prompts than lanes)."""
    s = moefy.MoefySettings()
    where = artifact(resolve(None), tokenizer, s, log)
    record = json.loads((where / "moe.json").read_text())
    cfg = ModelConfig.load(where)
    one = expert_bytes(cfg, torch.bfloat16)
    every = sum(cfg.moe_layers) * cfg.num_experts
    slots = {name: max(1, round(f * every)) for name, f in FRACTIONS.items()}
    resident = moefy.moefied(where, torch.bfloat16)
    cached = {n: moefy.moefied(where, torch.bfloat16, k * one, KEPT) for n, k in slots.items()}
    ids = [p["ids"] for p in prompts]
    held = ids[:3]
    train = training_prompts(make_engine(resident, tokenizer, "none", spec="decode"), ids)
    log(f"bench: experts study: {len(held)} held-out and {len(train)} training prompts, {STUDY_TOKENS} tokens")
    train_traces = experts_study.record(cached["25%"], tokenizer, [[p] for p in train], "none", 1, 0, STUDY_TOKENS)
    study = {}
    for name, backend, k, rows, n in STUDY:
        batches = (
            [held[i : i + n] for i in range(0, len(held), n)] if n == 1 else [[ids[j % len(ids)] for j in range(n)]]
        )
        traces = experts_study.record(cached["25%"], tokenizer, batches, backend, k, rows, STUDY_TOKENS)
        study[f"{n}x {name}"] = {
            size: experts_study.compare_policies(train_traces, traces, k_slots, one) for size, k_slots in slots.items()
        }
    log("bench: experts speed: 25 % tier against every expert resident, paired")
    fast = speed(resident, cached["25%"], tokenizer, held)
    found, skipped = cells(resident, cached, tokenizer, ids, max_tokens, lanes, tick)
    out = {
        "target": "SmolLM2-135M MoEfied: " + f"{cfg.num_experts} routed experts of {cfg.moe_intermediate_size} "
        f"neurons a layer, top {cfg.experts_per_token}, shared expert of {cfg.shared_expert_intermediate_size}",
        "model_dir": str(where),
        "moefied": {k: v for k, v in record.items() if not isinstance(v, list)},
        "expert_bytes": one,
        "experts": every,
        "slots": slots,
        "fractions": FRACTIONS,
        "kept_policy": KEPT,
        "max_tokens": max_tokens,
        "study": study,
        "study_tokens": STUDY_TOKENS,
        "speed": fast,
        "cells": found,
        "skipped": skipped,
    }
    log(f"bench: experts plan check: profile {experts_plan.PLAN_PROFILE}'s plan against each measured cell")
    try:
        out["plan_check"] = (
            experts_plan.plan_agreement(where, resident, slots, out, ids, SPEED)
            if found
            else {"error": "no cell measured"}
        )
    except Exception as exc:  # noqa: BLE001 - the measurement stands without the check; the reason is reported
        out["plan_check"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
