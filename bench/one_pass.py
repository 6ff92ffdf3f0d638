"""A step's one pass against two: the same work through one engine with prompt rows in the decoding lanes' pass
(`--one-pass-steps`, the default) and with a prefill pass and then the round each step, side by side in one run.

The engine is set up as `speclane serve` sets its own (the measured fair budget for each prompt being read, every
waiting prompt a prefill pass). The work: `--decoders` requests of short distinct prompts start together and
decode `--max-tokens` each; from step `--after` on, `--prompts` prompts of `--prompt-tokens` ids (distinct from
every other run's, so none starts from a kept checkpoint) arrive `--every` steps apart (0: all at once, a burst),
each answered with `--answer` tokens. Arrivals are counted in engine steps, so both arms do exactly the same work
and the wall time to the last token says what it cost. Arms alternate, the order flipped each repeat; ratios are
paired per repeat (median [min, max]); `--arms` adds arms with a fixed budget (`one:16`: one pass a step, 16
prompt rows), each read against the last arm listed. Reported per arm: wall, the decoders' longest and p99 gap
between tokens while prompts were read, the prompts' time to first token (median and max), and the passes run.

    OMP_NUM_THREADS=1 taskset -c 1 python -m speclane.bench.one_pass --decoders 1 --prompts 7 --prompt-tokens 300 \
        --every 0 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from speclane.pipeline.runtime.prefill_share import set_serve_budget
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.contract.events import DoneEvent, TokenEvent
from speclane.stages.models.target import Target

ARMS = ("one", "two")


def ids(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(200, vocab - 1, (n,), generator=g).tolist()


def run(engine, args, seed: int) -> dict:
    """One pass of the work through `engine`: wall, decoders' gaps while prompts were read, prompts' first tokens."""
    vocab = engine.target.cfg.vocab_size
    passes = [0]
    orig = engine.target.forward
    engine.target.forward = lambda *a, **kw: passes.__setitem__(0, passes[0] + 1) or orig(*a, **kw)
    req = lambda rid, prompt, n: parse_request(  # noqa: E731
        {"id": rid, "prompt_ids": prompt, "max_tokens": n, "ignore_eos": True}
    )
    for d in range(args.decoders):
        engine.submit(req(f"d{d}", ids(8, seed * 1000 + d, vocab), args.max_tokens))
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    stamps: dict[str, list[float]] = {}
    reading: list[tuple[float, float]] = []  # (start, end) of the steps where some prompt was being read
    step, arrivals, t0 = 0, list(range(args.prompts)), time.perf_counter()
    try:
        while arrivals or engine.busy():
            while arrivals and step >= args.after + args.every * (args.prompts - len(arrivals)):
                p = arrivals.pop(0)
                rid = f"p{p}"
                engine.submit(req(rid, ids(args.prompt_tokens, seed * 1000 + 500 + p, vocab), args.answer))
                sent[rid] = time.perf_counter()
            s0 = time.perf_counter()
            busy_prompts = bool(engine.lanes.waiting_prefill() or engine.queue)
            events = engine.step()
            now = time.perf_counter()
            if busy_prompts and sent:
                reading.append((s0, now))
            for ev in events:
                if isinstance(ev, TokenEvent):
                    stamps.setdefault(ev.rid, []).append(now)
                    if ev.index == 0 and ev.rid in sent:
                        first[ev.rid] = now - sent[ev.rid]
                elif isinstance(ev, DoneEvent) and ev.finish_reason != "length":
                    raise RuntimeError(f"request {ev.rid} ended with {ev.finish_reason}: {ev.error}")
            step += 1
    finally:
        engine.target.forward = orig
    wall = time.perf_counter() - t0
    gaps = []
    for rid, ts in stamps.items():
        if rid.startswith("d"):
            gaps += [b - a for a, b in zip(ts, ts[1:]) if any(s <= b and a <= e for s, e in reading)]
    gaps.sort()
    ttft = sorted(first.values())
    tokens = sum(len(ts) for ts in stamps.values())
    return {
        "wall": wall,
        "tok_per_s": tokens / wall,
        "gap_p99": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else float("nan"),
        "gap_max": gaps[-1] if gaps else float("nan"),
        "ttft_med": statistics.median(ttft) if ttft else float("nan"),
        "ttft_max": ttft[-1] if ttft else float("nan"),
        "passes": passes[0],
        "steps": step,
    }


def ratio_line(rows: list[dict], key: str, arm: str = "one", ref: str = "two") -> str:
    """`arm`'s `key` over `ref`'s, paired per repeat: median [min, max]."""
    pairs = sorted(
        a[key] / b[key] for a in rows if a["arm"] == arm for b in rows if b["arm"] == ref and b["repeat"] == a["repeat"]
    )
    return f"{statistics.median(pairs):.3f} [{pairs[0]:.3f}, {pairs[-1]:.3f}]"


def arm_budget(arm: str) -> tuple[bool, int | None]:
    """An `--arms` entry: "one" or "two" passes a step, with ":ROWS" a fixed step budget (else serve's fair one)."""
    passes, _, rows = arm.partition(":")
    if passes not in ARMS or (rows and not rows.isdigit()):
        raise SystemExit(f"--arms: '{arm}' is not one or two, optionally with :ROWS (e.g. one:16)")
    return passes == "one", int(rows) if rows else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decoders", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=96, help="each decoder's answer")
    p.add_argument("--prompts", type=int, default=7)
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--answer", type=int, default=8, help="each prompt's answer")
    p.add_argument("--after", type=int, default=2, help="steps before the first prompt arrives")
    p.add_argument("--every", type=int, default=0, help="steps between prompts (0: all at once)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--spec-backend", default="ngram")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument(
        "--arms",
        nargs="+",
        default=list(ARMS),
        help="one or two passes a step, each with :ROWS for a fixed step budget (default: serve's fair budget); "
        "ratios are each arm's over the last's",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    budgets = {arm: arm_budget(arm) for arm in args.arms}

    from speclane.bench.measure import make_engine
    from speclane.stages.models.loading import load_model

    target, tokenizer = load_model(None, args.dtype)
    assert isinstance(target, Target)
    lanes = args.decoders + args.prompts
    engine = make_engine(target, tokenizer, args.spec_backend, lanes=lanes, plan="measured")
    rows, fair = [], {}
    for rep in range(-1, args.repeats):  # repeat -1 warms every arm up and is dropped
        for i, arm in enumerate(args.arms) if rep % 2 == 0 else reversed(list(enumerate(args.arms))):
            one, fixed = budgets[arm]
            set_serve_budget(engine, fixed, None, one_pass=one)
            fair[arm] = engine.prefill_rows
            row = run(engine, args, seed=100 + len(args.arms) * rep + i)
            if rep >= 0:
                rows.append({"arm": arm, "repeat": rep, **row})
    print(
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} thread(s), affinity "
        f"{sorted(os.sched_getaffinity(0))}; {args.decoders} decoder(s) of {args.max_tokens} tokens, {args.prompts} "
        f"prompt(s) of {args.prompt_tokens} ids every {args.every} steps from step {args.after}, {args.answer} "
        f"tokens each; {args.spec_backend}; {args.repeats} repeats; step budget "
        + ", ".join(f"{arm} {fair[arm]} rows{'' if budgets[arm][1] else ' (fair)'}" for arm in args.arms)
    )
    keys = ("wall", "tok_per_s", "gap_p99", "gap_max", "ttft_med", "ttft_max", "passes", "steps")
    print(f"{'arm':>7} " + " ".join(f"{k:>9}" for k in keys))
    for arm in args.arms:
        sel = [r for r in rows if r["arm"] == arm]
        print(f"{arm:>7} " + " ".join(f"{statistics.median(r[k] for r in sel):9.3f}" for k in keys))
    ref = args.arms[-1]
    for arm in args.arms[:-1]:
        print(f"{arm} / {ref}, paired per repeat, median [min, max]:")
        for key in ("wall", "gap_p99", "gap_max", "ttft_med", "ttft_max"):
            print(f"  {key}: {ratio_line(rows, key, arm, ref)}")
    if args.json is not None:
        args.json.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
