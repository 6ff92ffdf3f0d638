"""One engine step with a prompt being read: a prefill pass then the verify pass (what the engine does), against
one target pass that carries both sets of rows (issue 16: "prompt rows and verify rows share one pass ... or
alternate; measure which").

At the `Target.forward` level, every lane at the same committed length: a prompt lane reading a chunk of P rows
and L decoding lanes of R rows each (an anchor, or an anchor and one draft). (a) the chunk alone, as the prefill
spec runs it (`record="last"`, `logits="last"`), then the L lanes' verify pass (`record="rows"`, every row's
logits); (b) one pass with the chunk's P rows and the lanes' rows (`record="rows"`, every row's logits, as a
verify pass takes them). The two alternate, which first flipping each repeat, and each is the median of the
repeats. A decoding lane gets its tokens at the end of the step either way: its wait a step is a (prefill + verify)
or b; "extra" is what the prompt adds to its verify pass alone. (b) computes the output head for all of the
prompt's rows, which a shared pass built into the engine would not (it samples only the chunk's last row, and
`Target.forward` has no such selection): `head` times the head over P - 1 rows, in the same repeat, and b' is b
less that (derived from two measurements, not one pass). One untimed round warms each case up; nothing is
committed, so every repeat sees the same state.

    OMP_NUM_THREADS=1 taskset -c 1 python -m speclane.bench.step_share [--model DIR] [--context 256] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from speclane.stages.models.ops import DECODE_ROUTE_MAX_ROWS, linear
from speclane.stages.models.state import AttnCache, RowBatch
from speclane.stages.models.target import Target

ROOT = Path(__file__).resolve().parents[1]


def prefilled(target: Target, slots: int, context: int, max_len: int):
    """`slots` lanes at `context` committed positions: slot 0 prefilled, its caches copied to the others."""
    state = target.new_state(slots, max_len)
    toks = torch.randint(100, target.cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    b = RowBatch.build([(0, 0, toks)])
    target.commit(state, b, torch.tensor([context]), target.forward(b, state, record="last", logits="last"))
    for cache in state.layers:
        for t in (cache.k, cache.v) if isinstance(cache, AttnCache) else (cache.conv, cache.recurrent):
            t[1:] = t[0]
    return state


def batches(prompt: int, lanes: int, rows: int, context: int, vocab: int) -> tuple[RowBatch, RowBatch, RowBatch]:
    """The prompt chunk (slot 0), the decoding lanes' verify batch (slots 1..L), and both in one batch."""
    chunk = (0, context, [(1000 + i) % vocab for i in range(prompt)])
    decoding = [(1 + i, context, [(2000 + 7 * i + j) % vocab for j in range(rows)]) for i in range(lanes)]
    return RowBatch.build([chunk]), RowBatch.build(decoding), RowBatch.build([chunk] + decoding)


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure_case(target: Target, state, prompt: int, lanes: int, rows: int, context: int, reps: int) -> dict:
    alone, verify, shared = batches(prompt, lanes, rows, context, target.cfg.vocab_size)
    head_in = torch.zeros(max(1, prompt - 1), target.cfg.hidden_size, dtype=target.dtype)
    head_w = target.weights.lm_head if target.weights.head is None else target.weights.head
    times: dict[str, list[float]] = {"prefill": [], "verify": [], "shared": [], "head": []}
    diff = 0.0
    for rep in range(-1, reps):  # rep -1 warms up and is dropped

        def alternate():
            p, _ = _timed(lambda: target.forward(alone, state, record="last", logits="last"))
            v, out = _timed(lambda: target.forward(verify, state, record="rows", logits="all"))
            times["prefill"].append(p)
            times["verify"].append(v)
            return out.logits

        def share():
            s, out = _timed(lambda: target.forward(shared, state, record="rows", logits="all"))
            times["shared"].append(s)
            return out.logits[prompt:]  # the decoding lanes' rows

        first, second = (alternate, share) if rep % 2 == 0 else (share, alternate)
        x, y = first(), second()
        diff = max(diff, (x - y).abs().max().item())
        times["head"].append(_timed(lambda: linear(head_in, head_w, out_dtype=torch.float32))[0])
        if rep < 0:
            for v in times.values():
                v.clear()
    med = {k: statistics.median(v) for k, v in times.items()}
    # paired: each repeat's own ratio, so a neighbour's load on the core hits both sides of it alike
    ratios = [s / (p + v) for s, p, v in zip(times["shared"], times["prefill"], times["verify"])]
    net = [(s - h) / (p + v) for s, h, p, v in zip(times["shared"], times["head"], times["prefill"], times["verify"])]
    return {
        "prompt": prompt,
        "lanes": lanes,
        "rows": rows,
        "prefill": med["prefill"],
        "verify": med["verify"],
        "a": med["prefill"] + med["verify"],
        "b": med["shared"],
        "b_over_a": statistics.median(ratios),
        "b_over_a_min": min(ratios),
        "b_over_a_max": max(ratios),
        "head": med["head"],
        "b_net": statistics.median(s - h for s, h in zip(times["shared"], times["head"])),
        "b_net_over_a": statistics.median(net),
        "b_net_over_a_min": min(net),
        "b_net_over_a_max": max(net),
        "decode_route": shared.rows <= DECODE_ROUTE_MAX_ROWS,
        "max_logit_diff": diff,
    }


def measure(target: Target, prompts, lanes, rows, context: int, reps: int) -> list[dict]:
    state = prefilled(target, 1 + max(lanes), context, context + max(prompts) + max(rows) + 1)
    return [measure_case(target, state, p, n, r, context, reps) for p in prompts for n in lanes for r in rows]


def lines(results: list[dict]) -> list[str]:
    names = (
        "P",
        "L",
        "R",
        "prefill ms",
        "verify ms",
        "a ms",
        "b ms",
        "b/a [min, max]",
        "head ms",
        "b' ms",
        "b'/a [min, max]",
        "extra a ms",
        "extra b' ms",
        "route b",
        "max |diff|",
    )
    widths = (3, 2, 2, 10, 9, 7, 7, 20, 7, 7, 20, 10, 11, 7, 10)
    out = [" ".join(n.rjust(w) for n, w in zip(names, widths))]
    for r in results:
        ms = {k: r[k] * 1e3 for k in ("prefill", "verify", "a", "b", "head", "b_net")}
        out.append(
            f"{r['prompt']:>3} {r['lanes']:>2} {r['rows']:>2} {ms['prefill']:10.1f} {ms['verify']:9.1f} "
            f"{ms['a']:7.1f} {ms['b']:7.1f} {r['b_over_a']:8.3f} [{r['b_over_a_min']:.2f}, "
            f"{r['b_over_a_max']:.2f}] {ms['head']:7.1f} {ms['b_net']:7.1f} {r['b_net_over_a']:8.3f} "
            f"[{r['b_net_over_a_min']:.2f}, {r['b_net_over_a_max']:.2f}] {ms['prefill']:10.1f} "
            f"{ms['b_net'] - ms['verify']:11.1f} {'decode' if r['decode_route'] else 'gemm':>7} "
            f"{r['max_logit_diff']:10.3g}"
        )
    return out


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the embedded default model)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--prompt-rows", type=_positive, nargs="+", default=[16, 32, 64], help="P: the chunk's rows")
    ap.add_argument("--lanes", type=_positive, nargs="+", default=[1, 4, 8], help="L: decoding lanes")
    ap.add_argument("--rows", type=_positive, nargs="+", default=[1, 2], help="R: rows a decoding lane")
    ap.add_argument("--context", type=_positive, default=256, help="every lane's committed length")
    ap.add_argument("--reps", type=_positive, default=7)
    args = ap.parse_args(argv)
    from speclane.stages.models.artifact import resolve

    target = Target.load(resolve(args.model), dtype=getattr(torch, args.dtype))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(
        f"CPU {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, {torch.get_num_threads()} "
        f"thread(s), {args.dtype}, commit {commit.stdout.strip() or '?'}, every lane at {args.context} committed "
        f"positions; medians of {args.reps}; b/a paired per repeat"
    )
    with torch.no_grad():
        results = measure(target, args.prompt_rows, args.lanes, args.rows, args.context, args.reps)
    print("\n".join(lines(results)))
    worst = max(r["max_logit_diff"] for r in results)
    print(
        f"max |diff|: the decoding lanes' logits, shared pass against their own pass (worst {worst:.3g}); "
        f"'route b': the shared pass on the decode route (at most {DECODE_ROUTE_MAX_ROWS} rows) or op by op"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
