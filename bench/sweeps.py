"""The speclane sweeps: speculation against off per workload and draft tokens, and against lanes and row budgets.

Each section builds its engines on one shared target, then alternates them per prompt
(speclane.bench.measure.alternate). Speculation off is the `decode` spec (the verify graph with the `none` drafter,
one row a lane). Backends that do not load (a drafter not built or not fitted for this model) are skipped with the
reason, never faked. The oracle replays the reference greedy output, so its figures are the ceiling of
speculation at each k on this machine.
Not here: the controls (bench/controls.py), peers (bench/peers.py), printing and plots (bench/report.py).
"""

from __future__ import annotations

import gc
from typing import Any

from speclane.bench.measure import (
    alternate,
    engine_bytes,
    first_divergence,
    forget,
    make_engine,
    paired_ratio,
    run_batch,
    speculation,
    spread,
    tps,
)
from speclane.pipeline.framework.spec import load_spec
from speclane.stages.models.decode import greedy_decode


def try_engine(target, tokenizer, backend: str, skipped: dict[str, str], **kw):
    """The engine, or None with the reason recorded in `skipped` (shown in the report)."""
    try:
        return make_engine(target, tokenizer, backend, **kw)
    except Exception as exc:  # noqa: BLE001 - any load failure is a skip with its message, never a crash
        skipped[backend] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return None


def reference(target, tokenizer, prompts: list[dict], max_tokens: int, max_len: int, tick=None) -> dict[str, list[int]]:
    """Greedy output of speculation off per prompt id: the oracle's drafts and the exactness reference, from the
    plain decode loop (prefilled as the engine's prefill spec does: one lane a pass, chunks of its chunk_rows).
    Also the warm-up: the first calls pay oneDNN kernel selection."""
    chunk = load_spec("prefill").stage("prefill_gather").params["chunk_rows"]
    eos = tokenizer.eos_token_ids
    out = {}
    for i, p in enumerate(prompts):
        out[p["id"]] = greedy_decode(
            target, [p["ids"]], max_tokens, eos=eos, chunk_rows=chunk, state=target.new_state(1, max_len)
        )[0]
        if tick is not None:
            tick(i + 1, len(prompts))
    return out


def draft_token_sweep(
    target,
    tokenizer,
    prompts: list[dict],
    ref: dict[str, list[int]],
    ks: tuple[int, ...],
    backends: tuple[str, ...],
    max_tokens: int,
    repeats: int,
    max_len: int,
    tick=None,
) -> dict[str, Any]:
    """Off against each backend at each k on single-lane prompts of one workload: speedup (paired), tokens per
    round, acceptance per position, TTFT, per-stage round time, and the bf16 first divergence from off."""
    skipped: dict[str, str] = {}
    engines = {"off": make_engine(target, tokenizer, "none", spec="decode", max_len=max_len)}
    for b in backends:
        eng = try_engine(target, tokenizer, b, skipped, k=max(ks), max_len=max_len)
        if eng is not None:
            if b == "oracle":
                eng.drafter.replay(ref)
            engines[b] = eng

    def runner(eng, k):
        return lambda p: run_batch(eng, [(p["id"], p["ids"])], max_tokens, draft_tokens=k, timed=True)[0]

    configs = {"off": runner(engines["off"], None)}
    for b, eng in engines.items():
        if b != "off":
            configs.update({f"{b}@{k}": runner(eng, k) for k in ks})
    res = alternate(configs, prompts, repeats, tick)
    rows = {}
    for name, runs in res.items():
        b, _, k = name.partition("@")
        k = int(k or 0)
        row = {
            "backend": b,
            "k": k,
            "decode_tps": spread([x for rs in tps(runs) for x in rs]),
            "ttft_s": spread([r.ttft for rs in runs for r in rs]),
            "tokens": sum(len(r.tokens) for rs in runs for r in rs),
            "stage_s_per_round": stage_seconds(runs),
            "memory_bytes": engine_bytes(engines[b]),
        }
        if b != "off":
            row["speedup"] = paired_ratio(tps(runs), tps(res["off"]))
            row.update(speculation(runs, k))
            row["first_divergence"] = [first_divergence(ref[p["id"]], rs[0].tokens) for p, rs in zip(prompts, runs)]
        rows[name] = row
    del engines
    gc.collect()
    return {"rows": rows, "skipped": skipped, "prompts": [p["id"] for p in prompts]}


def stage_seconds(runs) -> dict[str, float]:
    """Median over runs of each stage's seconds per round (rounds after the prefill step)."""
    per = {}
    for r in (r for rs in runs for r in rs if r.timed_rounds):
        for name, s in r.stage_s.items():
            per.setdefault(name, []).append(s / r.timed_rounds)
    return {name: spread(v)["median"] for name, v in per.items()}


def lane_sweep(
    target,
    tokenizer,
    prompts: list[dict],
    lanes: tuple[int, ...],
    budgets: tuple[int, ...],
    backend: str,
    k: int,
    max_tokens: int,
    repeats: int,
    max_len: int,
    tick=None,
) -> dict[str, Any]:
    """At each lane count: off against `backend` under each row budget, every lane decoding at once (a batch of
    different prompts). Aggregate tokens per second (all lanes' decode tokens / first token to last) and the
    median lane's own decode speed; paired ratios against off."""
    out: dict[str, Any] = {"rows": [], "skipped": {}}
    for step, n in enumerate(lanes):
        engines = {"off": make_engine(target, tokenizer, "none", spec="decode", lanes=n, max_len=max_len)}
        for r in budgets:
            eng = try_engine(target, tokenizer, backend, out["skipped"], k=k, rows=r, lanes=n, max_len=max_len)
            if eng is not None:
                engines[f"rows={r}"] = eng
        per = len(engines) * repeats
        progress = tick and (lambda done, _total, s=step: tick(s * per + done, len(lanes) * per))
        for row in lanes_against_off(engines, prompts, n, k, max_tokens, repeats, tick=progress):
            row["memory_bytes"] = engine_bytes(engines[row["config"]])
            out["rows"].append(row)
        del engines
        gc.collect()
    return out


def lanes_against_off(
    engines: dict,
    prompts: list[dict],
    n: int,
    k: int,
    max_tokens: int,
    repeats: int,
    warm_up: bool = False,
    tick=None,
    timed: bool = False,
) -> list[dict]:
    """Batches of `n` lanes, each lane a different prompt, through every engine alternately: as many whole batches
    as the prompts fill (one lane: every prompt on its own), or one batch cycling the prompts when there are fewer
    prompts than lanes. A row per engine with aggregate and per-lane tok/s and, against "off", the ratio paired by
    batch and repeat and speculation counters. `warm_up`: one short request per engine first, outside the timing.
    `timed`: each row also gets its stages' seconds per round (`stage_s_per_round`; two clock reads a stage).
    Every run starts with the drafter's learning from earlier requests forgotten (`forget`): the repeats run the same
    prompts, and a drafter that keeps finished answers (suffix) would otherwise be measured on answers it has seen."""
    batch = [
        [(f"{prompts[j % len(prompts)]['id']}#{j}", prompts[j % len(prompts)]["ids"]) for j in range(b * n, b * n + n)]
        for b in range(max(1, len(prompts) // n))
    ]
    if warm_up:
        for eng in engines.values():
            run_batch(eng, batch[0][:1], 4)
    configs = {
        name: (lambda items, e=eng: run_batch(forget(e), items, max_tokens, timed=timed))
        for name, eng in engines.items()
    }
    res = alternate(configs, batch, repeats, tick)
    agg = {name: [[aggregate(b) for b in rs] for rs in runs] for name, runs in res.items()}
    whole = {name: [[workload(rs, r) for r in range(repeats)]] for name, rs in res.items()}
    rows = []
    for name, runs in res.items():
        row = {
            "lanes": n,
            "config": name,
            "aggregate_tps": spread([x for xs in agg[name] for x in xs]),
            "lane_tps": spread([r.decode_tps for rs in runs for b in rs for r in b]),
        }
        if timed:
            row["stage_s_per_round"] = stage_seconds([b[:1] for rs in runs for b in rs])  # one engine clock a batch
        if name != "off":
            row["speedup"] = paired_ratio(agg[name], agg["off"])
            row.update(speculation([[r for b in rs for r in b] for rs in runs], k))
        if "+" in name:  # a chain against each of its parts run beside it, paired as against off
            row["against_parts"] = {p: paired_ratio(agg[name], agg[p]) for p in name.split("+") if p in agg}
            row["against_parts_workload"] = {
                p: paired_ratio(whole[name], whole[p]) for p in name.split("+") if p in whole
            }
        rows.append(row)
    return rows


def _decoded(runs) -> tuple[int, float]:
    """One batch's decode tokens (after each lane's first stamp) and the span from the first lane's first token
    to the last lane's last."""
    span = max(r.lane.t_done for r in runs) - min(r.lane.t_first for r in runs)
    return sum(max(0, len(r.tokens) - r.first_tokens) for r in runs), span


def aggregate(runs) -> float:
    """A batch's decode tokens over its decode span."""
    tokens, span = _decoded(runs)
    return tokens / span if span > 0 else float("nan")


def workload(batches, repeat: int) -> float:
    """Repeat `repeat` of every batch as one workload: their decode tokens over their decode spans summed, what a
    user running the batches one after another gets (a batch that decodes many tokens quickly weighs as much as
    its tokens, where the median of per-batch ratios weighs every batch alike)."""
    parts = [_decoded(rs[repeat]) for rs in batches]
    span = sum(s for _, s in parts)
    return sum(t for t, _ in parts) / span if span > 0 else float("nan")
