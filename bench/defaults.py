"""The defaults section: speculation on with default settings against off, at 1, 2, 4 and 8 lanes, per drafter.

What a new user gets without touching a knob: each backend at the spec's defaults (7 draft tokens, the backend's
row budget, the measured draft plan of stages/draft_plan.py) against speculation off on the same batch of
different prompts, alternated A B A B. The promise is that no default makes a user slower: every ratio here at or
above 0.97. Each engine runs one short warm-up request first, so the pass-cost probe (once per machine and model,
then cached) is not inside a timed run. A control runs beside them: the speculative path with no drafter
(`none`), the same work as off, so its distance from 1.0 is this run's noise; a drafter below 0.97 by no more than
that is reported as within the noise, not as a broken promise. Every run starts as on a fresh server: a drafter
that learns from finished requests (suffix) forgets them first, since the repeats run the same prompts and it
would otherwise be measured on answers it has seen; what it gains across requests is the agent replay's to show
(bench/agents.py). A chained backend (`suffix+mtp`) run beside its parts gets its ratio to each part, paired by
batch and repeat as against off: the chain's promise is to be at least its better part. Not here: fixed-k sweeps
(bench/sweeps.py), which take every draft.
"""

from __future__ import annotations

import gc
from typing import Any

from speclane.bench.measure import make_engine
from speclane.bench.sweeps import lanes_against_off, try_engine

DEFAULT_K = 7  # specs/verify.toml's draft_tokens
CONTROL = "none"  # the speculative path with no drafter: what off does, through the verify graph


def defaults_sweep(
    target,
    tokenizer,
    prompts: list[dict],
    lanes: tuple[int, ...],
    backends: tuple[str, ...],
    max_tokens: int,
    repeats: int,
    max_len: int,
    tick=None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": [], "skipped": {}}
    for step, n in enumerate(lanes):
        engines = {"off": make_engine(target, tokenizer, "none", spec="decode", lanes=n, max_len=max_len)}
        for b in (CONTROL,) + tuple(b for b in backends if b != CONTROL):
            eng = try_engine(
                target, tokenizer, b, out["skipped"], k=DEFAULT_K, lanes=n, max_len=max_len, plan="measured"
            )
            if eng is not None:
                engines[b] = eng
        progress = tick and (lambda done, total, s=step: tick(s * total + done, len(lanes) * total))
        out["rows"] += lanes_against_off(
            engines, prompts, n, DEFAULT_K, max_tokens, repeats, warm_up=True, tick=progress, timed=True
        )
        del engines
        gc.collect()
    return out


def _drafter_share(row: dict) -> str:
    """The drafter's own stages (proposing, taking in the committed rows) as a share of the round's stage time:
    what a drafter costs even when the plan drafts nothing (its hidden-state taps sit inside the target pass)."""
    st = row.get("stage_s_per_round") or {}
    total = sum(st.values())
    own = st.get("draft", 0.0) + st.get("drafter_commit", 0.0)
    return f"  drafter stages {100 * own / total:.1f} % of a round" if total else ""


def lines(res: dict) -> list[str]:
    """The section's table: one line per lane count and backend."""
    if "defaults" not in res:
        return []
    d = res["defaults"]
    out = [
        f"defaults on {d['workload']} (k = {DEFAULT_K}, measured draft plan): aggregate decode tok/s, on / off "
        "at the same lanes (the promise: never below 0.97)"
    ]
    out += [f"  {b}: skipped ({why})" for b, why in d["skipped"].items()]
    for r in d["rows"]:
        s = r["aggregate_tps"]
        extra = (
            f"  on/off {r['speedup']['median']:.3f} ({r['speedup']['min']:.3f}-{r['speedup']['max']:.3f})"
            f"  tau {r['tokens_per_round']:.2f}  drafted {r['drafted']}{_drafter_share(r)}"
            if "speedup" in r
            else ""
        )
        out.append(f"  {r['lanes']} lanes {r['config']:<8} {s['median']:6.1f} tok/s{extra}")
        for part, q in r.get("against_parts", {}).items():
            w = r.get("against_parts_workload", {}).get(part)
            whole = (
                f"; the workload's tokens over its time {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f})" if w else ""
            )
            out.append(
                f"    {r['config']} / {part} {q['median']:.3f} ({q['min']:.3f}-{q['max']:.3f}), paired by batch{whole}"
            )
    noise = {r["lanes"]: abs(r["speedup"]["median"] - 1.0) for r in d["rows"] if r["config"] == CONTROL}
    low = [r for r in d["rows"] if "speedup" in r and r["config"] != CONTROL and r["speedup"]["median"] < 0.97]
    below = [r for r in low if r["speedup"]["median"] < 0.97 - noise.get(r["lanes"], 0.0)]
    within = [r for r in low if r not in below]
    if not low:
        out.append("  every default at or above 0.97x off")
    if below:
        out.append("  BELOW 0.97x off: " + ", ".join(f"{r['config']} at {r['lanes']} lanes" for r in below))
    if within:
        out.append(
            "  below 0.97x off within this run's noise (the control's distance from 1.0 at those lanes): "
            + ", ".join(
                f"{r['config']} at {r['lanes']} lanes ({r['speedup']['median']:.3f}; control "
                f"{1 - noise[r['lanes']]:.3f}-{1 + noise[r['lanes']]:.3f})"
                for r in within
            )
        )
    return out + [""]
