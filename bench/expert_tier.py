"""The expert cache's mechanics on one target: decode speed, time per pass at 1 to 8 rows and expert bytes copied,
at each fast-tier share against every expert resident, greedy tokens compared, in one run.

What a verify round costs where the experts do not all fit the fast tier: each row of a pass chooses its own
experts, so a pass of r rows copies the union of r rows' misses. This prints, per setting (every expert resident;
then each `--shares` fraction of the routed experts in slots, with each `--prefetch`), greedy decode tokens per
second from one prompt and their ratio to resident, the hit rate and MB copied a token, and per row count the time
of a pass (the median of `--passes`), its ratio to resident at the same rows, and MB copied a pass. Every setting's
greedy tokens must equal resident's (exit code 1 otherwise).

    python -m speclane.bench.expert_tier --model DIR [--device cuda] [--dtype bfloat16] [--shares 0.1 0.25 0.95]
        [--prefetch 0 2] [--rows 1 4 8] [--tokens 32] [--passes 10] [--routing TRACE] [--json PATH]

On a target with random weights (`bench.random_weights --moe`) the router's choices are not text's (a random model
favours a few experts of each layer, and a greedy decode from random ids repeats itself): only the mechanics (copy
time, overlap) carry over, not its hit rates. `--routing TRACE` gives such a target text's routing: every setting
replays the trace (recorded on text by `bench.routing_trace`; stages/models/routing_trace.py) from its first row in
place of the router's choice, so decode takes its rows one a pass and each pass of r rows the next r, and every
setting routes alike. The target must have the trace's experts and top k (`bench.random_weights --moe --experts E
--top K`). Prefetch is then 0 unless `--prefetch` says otherwise: its look-ahead reads the target's own router,
which knows nothing of the trace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

from speclane.stages.models.expert_cache import ExpertCache, expert_bytes
from speclane.stages.models.routing_trace import RowRouting, replaying
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

PROMPT = 32


def _sync(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def decode(target: Target, tokens: int, seed: int = 0) -> tuple[list[int], float]:
    """Greedy tokens from a random prompt, one row a pass, and the seconds the decode took (the prefill not)."""
    dev, sync = target.device, _sync(target.device)
    state = target.new_state(1, PROMPT + tokens + 1)
    prompt = torch.randint(0, target.cfg.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(seed))
    batch = RowBatch.build([(0, 0, prompt.tolist())], device=dev)
    out = target.forward(batch, state, record="last", logits="last")
    target.commit(state, batch, torch.tensor([PROMPT], device=dev), out)
    got = [int(out.logits[-1].argmax())]
    sync()
    t = time.perf_counter()
    for pos in range(PROMPT, PROMPT + tokens - 1):
        batch = RowBatch.build([(0, pos, [got[-1]])], device=dev)
        out = target.forward(batch, state)
        target.commit(state, batch, torch.tensor([1], device=dev), out)
        got.append(int(out.logits[-1].argmax()))
    sync()
    return got, time.perf_counter() - t


def passes(target: Target, rows: int, n: int) -> tuple[float, float | None]:
    """Median ms of n passes of `rows` random rows after a committed prompt (verify-shaped, never committed), and
    the MB the cache copied a pass (None without a cache)."""
    dev, sync = target.device, _sync(target.device)
    state = target.new_state(1, PROMPT + rows + 1)
    gen = torch.Generator().manual_seed(rows)
    batch = RowBatch.build(
        [(0, 0, torch.randint(0, target.cfg.vocab_size, (PROMPT,), generator=gen).tolist())], device=dev
    )
    target.commit(state, batch, torch.tensor([PROMPT], device=dev), target.forward(batch, state, record="last"))
    times, before = [], target.expert_stats()
    for _ in range(n):
        toks = torch.randint(0, target.cfg.vocab_size, (rows,), generator=gen).tolist()
        batch = RowBatch.build([(0, PROMPT, toks)], device=dev)
        sync()
        t = time.perf_counter()
        target.forward(batch, state)
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    after = target.expert_stats()
    return statistics.median(times), None if after is None else after.since(before).bytes_copied / n / 1e6


def warm_up(target: Target, rows: list[int]) -> None:
    """A short decode and one pass of each row count, timed by nobody: the first call of each kernel shape compiles
    it (triton on a GPU), which would otherwise land on whichever setting runs first."""
    decode(target, 4, seed=1)
    for r in rows:
        passes(target, r, 1)


def measure(target: Target, label: str, args) -> dict:
    """One setting: decode, then each row count's passes; the cache's counters per token and per pass. With a
    routing trace (`args.routing`), all of it routed by the trace from its first row."""
    with contextlib.nullcontext() if args.routing is None else replaying(args.routing, target):
        c0 = target.expert_stats()
        tokens, seconds = decode(target, args.tokens)
        c1 = target.expert_stats()
        row = {"setting": label, "tokens": tokens, "tok_s": (len(tokens) - 1) / seconds, "rows": {}}
        if c1 is not None:
            d = c1.since(c0)
            row["hit_rate"] = d.hits / max(1, d.hits + d.misses)
            row["mb_per_token"] = d.bytes_copied / (len(tokens) - 1) / 1e6
        for r in args.rows:
            ms, mb = passes(target, r, args.passes)
            row["rows"][r] = {"ms": ms, "mb_per_pass": mb}
        return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclane.bench.expert_tier", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a MoE target artifact")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.25, 0.95])
    ap.add_argument("--prefetch", type=int, nargs="+", default=None, help="default: 0 2 (0 with --routing)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--routing", default=None, metavar="TRACE", help="a routing trace to replay (bench.routing_trace)")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    if args.prefetch is None:
        args.prefetch = [0] if args.routing else [0, 2]
    if not all(0 < s <= 1 for s in args.shares) or args.tokens < 2 or min(args.rows) < 1:
        ap.error("--shares must be in (0, 1], --tokens at least 2 and --rows at least 1")
    dtype = getattr(torch, args.dtype)
    resident = Target.load(args.model, dtype=dtype, device=args.device)
    cfg = resident.cfg
    one, total = expert_bytes(cfg, dtype), sum(cfg.moe_layers) * cfg.num_experts
    if not total:
        ap.error(f"--model: {cfg.model_type} is dense, it has no routed experts")
    if args.routing is not None:
        try:
            args.routing = RowRouting.load(args.routing)
            args.routing.check(cfg)
        except ValueError as exc:
            ap.error(str(exc))
    where = torch.cuda.get_device_name() if resident.device.type == "cuda" else "cpu"
    print(
        f"device: {where}; {cfg.model_type}, {total} routed experts of {one / 1e6:.2f} MB, top {cfg.experts_per_token}"
    )
    trace = args.routing
    routing = "the target's own router" if trace is None else f"a replayed trace of {trace.rows} rows ({trace.source})"
    print(f"routing: {routing}")
    with torch.no_grad():
        warm_up(resident, args.rows)
        rows = [measure(resident, "resident", args)]
        del resident
        cached = Target.load(
            args.model,
            dtype=dtype,
            device=args.device,
            expert_cache_bytes=max(1, round(max(args.shares) * total)) * one,
        )
        tier = cached.experts.slow
        warm_up(cached, args.rows)  # the cache's own kernels (each setting below starts from a cold cache)
        for share in args.shares:
            for prefetch in args.prefetch:
                slots = max(1, round(share * total))
                cached.experts = ExpertCache(tier, slots, device=cached.device, prefetch=prefetch)
                rows.append(measure(cached, f"{share:.0%} ({slots} slots), prefetch {prefetch}", args))
    base = rows[0]
    print(
        f"{'setting':<34} {'tok/s':>7} {'x res':>6} {'hits':>5} {'MB/tok':>7}  "
        + "  ".join(f"{r:>2} rows ms  x res  MB/pass" for r in args.rows)
    )
    for x in rows:
        hits = f"{x['hit_rate']:.0%}" if "hit_rate" in x else "-"
        mb = f"{x['mb_per_token']:.1f}" if "mb_per_token" in x else "-"
        cells = []
        for r in args.rows:
            c = x["rows"][r]
            copied = "-" if c["mb_per_pass"] is None else f"{c['mb_per_pass']:.1f}"
            cells.append(f"{c['ms']:11.2f} {c['ms'] / base['rows'][r]['ms']:6.2f} {copied:>8}")
        same = "" if x["tokens"] == base["tokens"] else "  TOKENS DIFFER"
        print(
            f"{x['setting']:<34} {x['tok_s']:7.1f} {x['tok_s'] / base['tok_s']:6.2f} {hits:>5} {mb:>7}  "
            + "  ".join(cells)
            + same
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "routing": routing, "rows": rows}, f, indent=1)
    return 0 if all(x["tokens"] == base["tokens"] for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
