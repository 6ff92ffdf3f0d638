"""What a model drafter's proposal costs, by route, side by side in one run: the one-call layers that read and
write the drafter's window in place (stages/models/draft_route.py) against the per-op layers over the window read
out, and the proposal head as int8 rows times int8 weights (kernels/q8.py) against bf16 rows times int8 weights
(kernels/packed.py).

One engine per drafter (the embedded default model and its shipped mtp and dflash2 files, the fixed plan at
k = `--k`, one lane) runs held-out code prompts greedily; every proposal is timed. The four routes alternate A B C D
/ D C B A per prompt and repeat, so drift and a neighbour's load hit all alike; the target's tokens are the same
under every route (the target decides every token), the drafts may differ in a near-tie; for mtp a fifth route runs
the whole step loop in one C call (kernels/draft_chain.py). Reports per route the
median proposal time, per draft step, the drafts accepted per round (tau) and the ratio to the per-op route with
the bf16-rows head (the route before either change), plus decode tokens per second.

    OMP_NUM_THREADS=1 taskset -c 1 python -m speclane.bench.draft_cost [--prompts 4] [--max-tokens 96] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import attrs
import torch

from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch
from speclane.bench.soak import machine_line
from speclane.kernels.packed import pack, packs
from speclane.kernels.q8 import Q8Weight
from speclane.kernels.quant import Int8Weight

ROUTES = ("per-op, bf16 rows", "per-op, int8 rows", "one-call, bf16 rows", "one-call, int8 rows")
CHAIN = "one call a proposal"  # mtp: the whole step loop in C (kernels/draft_chain.py), int8 rows


def _forms(drafter, route: str):
    """(layer forms, head) the drafter uses under `route`: its own where the route is its default."""
    forms = drafter.forms if route.startswith("one") else (None,) * len(drafter.forms)
    head = drafter.shortlist.rows if drafter.shortlist is not None else drafter.draft_head
    if route.endswith("bf16 rows") and isinstance(head, Q8Weight):  # the same int8 weights, packed for bf16 rows
        q = Int8Weight(q=head.unpack(), scale=head.scale)
        head = pack(q) if packs(q) else q
    return forms, head


def _time(engine, drafter, route, ids, max_tokens, heads):
    forms, head = heads[route]
    drafter.forms = forms
    if hasattr(drafter, "chain"):
        drafter.chain = heads["chain"] if route == CHAIN else None
    if drafter.shortlist is not None:
        drafter.shortlist = attrs.evolve(drafter.shortlist, rows=head)
    else:
        drafter.draft_head = head
    times, widths = [], []
    real = type(drafter).propose

    def timed(self, lanes, anchors, limits, state):
        t0 = time.perf_counter()
        out = real(self, lanes, anchors, limits, state)
        if max(limits) > 0:
            times.append(time.perf_counter() - t0)
            widths.append(max(limits))
        return out

    drafter.propose = timed.__get__(drafter)
    try:
        run = run_batch(engine, [("p", ids)], max_tokens, ignore_eos=True)[0]
    finally:
        del drafter.propose
    return {"times": times, "widths": widths, "tps": run.decode_tps, "tokens": run.tokens, "lane": run.lane}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", nargs="+", default=["mtp", "dflash2"], choices=("mtp", "dflash2"))
    ap.add_argument("--k", type=int, default=7, help="drafts a proposal (the fixed plan)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from speclane.stages.models.loading import load_model

    torch.set_num_threads(1)
    print(machine_line())
    print(f"command: python -m speclane.bench.draft_cost {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    target, tokenizer = load_model(None, "bfloat16")
    render = make_engine(target, tokenizer, "none", spec="decode")
    prompts = [render.apply_chat([{"role": "user", "content": p["user"]}]) for p in _prompts(args.prompts)]
    del render
    with torch.no_grad():
        for name in args.backends:
            engine = make_engine(target, tokenizer, name, k=args.k, plan="fixed", max_len=4096)
            drafter = engine.drafter
            routes = ROUTES + ((CHAIN,) if getattr(drafter, "chain", None) is not None else ())
            heads = {route: _forms(drafter, route) for route in routes}
            heads["chain"] = getattr(drafter, "chain", None)
            got = {route: [] for route in routes}
            for ids in prompts:
                for r in range(args.repeats):
                    for route in routes if r % 2 == 0 else routes[::-1]:
                        got[route].append(_time(engine, drafter, route, ids, args.max_tokens, heads))
            _report(name, got)
    return 0


def _prompts(n: int) -> list[dict]:
    return workloads.pick(workloads.load(), "code_gen", n)


def _report(name: str, got: dict) -> None:
    base = statistics.median(t for run in got[ROUTES[0]] for t in run["times"])
    ref = [run["tokens"] for run in got[ROUTES[0]]]
    print(f"\n{name}: proposal time by route, one lane, median over every proposal")
    for route, runs in got.items():
        times = [t for run in runs for t in run["times"]]
        steps = sum(w for run in runs for w in run["widths"])
        same = all(run["tokens"] == r for run, r in zip(runs, ref))
        lanes = [run["lane"] for run in runs]
        drafted = sum(getattr(lane, "drafted", 0) for lane in lanes)
        accepted = sum(getattr(lane, "accepted", 0) for lane in lanes)
        tps = statistics.median(run["tps"] for run in runs)
        med = statistics.median(times)
        print(
            f"  {route:<20} {med * 1e3:6.2f} ms a proposal ({sum(times) / steps * 1e3:5.3f} ms a draft step)  "
            f"x{base / med:4.2f} of per-op bf16  accepted {accepted}/{drafted}  decode {tps:6.1f} tok/s  "
            f"tokens {'same' if same else 'DIFFER'}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
