"""Record a MoE target's routing on text into a routing trace (stages/models/routing_trace.py), for a bench to replay
where the target it measures cannot route as text does (`bench.expert_tier --routing`).

    python -m speclane.bench.routing_trace --out FILE [--model DIR] [--workloads code_edit prose] [--prompts 4]
        [--max-tokens 96] [--dtype bfloat16] [--random-ids]

The target decodes greedily, one prompt at a time, each prompt of the bench's held-out workloads (bench/workloads.py)
rendered as a chat turn: the trace holds each prompt's tokens, then its answer's, in order. Without `--model` the
target is the experts section's MoEfied default model (bench/experts.py: fitted on first use, then cached).
`--random-ids`: each prompt is instead 32 random token ids, as bench.expert_tier feeds a target (random weights
have no tokenizer): the routing that bench measures there, to set beside text's.
It prints the trace's size and two figures beside uniform routing's: the share of a row's experts that one of the
`WINDOW` rows before it also chose (`reuse`; uniform routing of top k of E experts gives 1 - (1 - k/E)^WINDOW), the
distinct experts r consecutive rows choose in a layer (`distinct`, what a verify pass of r rows asks a cache for;
uniform: E (1 - (1 - k/E)^r)), and the share of a layer's choices its k busiest experts take (`busiest`, the median
layer; uniform: k/E).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from speclane.bench import workloads
from speclane.bench.expert_tier import PROMPT, decode
from speclane.bench.measure import make_engine
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.models.loading import load_model
from speclane.stages.models.routing_trace import RowRouting, recording
from speclane.stages.models.target import Target

WINDOW = 8  # rows before a row whose experts count as seen (about a verify pass's rows)
PASS_ROWS = (1, 4, 8)  # verify passes whose distinct experts are reported


def reuse(trace: RowRouting, window: int = WINDOW) -> float:
    """The share of each row's experts chosen by one of the `window` rows before it too, over every layer."""
    seen = total = 0
    for ids in trace.layers:
        rows = [set(r) for r in ids.tolist()]
        for i in range(window, len(rows)):
            before = set().union(*rows[i - window : i])
            seen += len(rows[i] & before)
            total += len(rows[i])
    return seen / max(1, total)


def distinct(trace: RowRouting, rows: int) -> float:
    """The distinct experts a layer's `rows` consecutive rows choose, on average (what a verify pass of that many
    rows asks a cache for), over every layer and every window of the trace."""
    total = count = 0
    for ids in trace.layers:
        chosen = ids.tolist()  # read once a layer, as `reuse` does
        for i in range(0, len(chosen) - rows + 1):
            total += len(set().union(*chosen[i : i + rows]))
            count += 1
    return total / max(1, count)


def busiest(trace: RowRouting) -> float:
    """The share of a layer's choices that its top_k most chosen experts take, for the median layer."""
    shares = []
    for ids in trace.layers:
        counts = torch.bincount(ids.flatten(), minlength=trace.experts).sort(descending=True).values
        shares.append(float(counts[: trace.top_k].sum()) / max(1, ids.numel()))
    return sorted(shares)[len(shares) // 2]


def record(engine, prompts: list[list[int]], max_tokens: int, source: str) -> RowRouting:
    """The routing of `engine`'s target while the engine decodes each of `prompts` (token ids) greedily, alone."""
    with recording(engine.target) as rec:
        for i, ids in enumerate(prompts):
            engine.generate([parse_request({"id": i, "prompt_ids": ids, "max_tokens": max_tokens})])
    return rec.trace(source)


def _moefied(dtype: str):
    """The experts section's MoEfied default model (fitted once, then cached) and its tokenizer."""
    from speclane.bench.experts import artifact
    from speclane.stages.fitting.moefy import MoefySettings
    from speclane.stages.models.artifact import resolve
    from speclane.stages.models.tokenizer import Tokenizer

    base = resolve(None)
    where = artifact(base, Tokenizer.load(base), MoefySettings())
    return (*load_model(str(where), dtype), "the MoEfied default model")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclane.bench.routing_trace", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the trace file to write (safetensors)")
    ap.add_argument("--model", default=None, help="a MoE target (default: the MoEfied default model)")
    ap.add_argument("--workloads", nargs="+", default=["code_edit", "prose"], choices=workloads.WORKLOADS)
    ap.add_argument("--prompts", type=int, default=4, help="prompts of each workload")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--random-ids", action="store_true", help="random prompts of 32 ids, as bench.expert_tier feeds")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.max_tokens < 1:
        ap.error("--prompts and --max-tokens must be at least 1")
    if args.random_ids:
        if args.model is None:
            ap.error("--random-ids needs --model (a MoE target; random weights have no tokenizer to need)")
        target, name = Target.load(args.model, dtype=getattr(torch, args.dtype)), Path(args.model).name
    elif args.model is None:
        target, tokenizer, name = _moefied(args.dtype)
    else:
        target, tokenizer = load_model(args.model, args.dtype)
        name = Path(args.model).name
    if not any(target.cfg.moe_layers):
        ap.error(f"--model: {target.cfg.model_type} is dense, it has no routed experts to record")
    with torch.no_grad():
        if args.random_ids:
            source = f"{name}: {args.prompts} prompts of {PROMPT} random ids, greedy, {args.max_tokens} tokens"
            with recording(target) as rec:
                for seed in range(args.prompts):
                    decode(target, args.max_tokens, seed)
            trace = rec.trace(f"{source}, {args.dtype}")
        else:
            engine = make_engine(target, tokenizer, "none", spec="decode", lanes=1)
            chats = [p["user"] for w in args.workloads for p in workloads.pick(workloads.load(), w, args.prompts)]
            prompts = [engine.apply_chat([{"role": "user", "content": text}]) for text in chats]
            source = (
                f"{name}: {len(prompts)} prompts ({', '.join(args.workloads)}, {args.prompts} each), greedy, "
                f"up to {args.max_tokens} tokens, {args.dtype}"
            )
            trace = record(engine, prompts, args.max_tokens, source)
    trace.save(args.out)
    k, e = trace.top_k, trace.experts
    print(f"routing trace: {source}")
    print(f"{len(trace.layers)} MoE layers x {trace.rows} rows, top {k} of {e} experts; written to {args.out}")
    print(
        f"a row's experts chosen by one of the {WINDOW} rows before it too: {reuse(trace):.0%} "
        f"(uniform routing: {1 - (1 - k / e) ** WINDOW:.0%})"
    )
    asked = ", ".join(f"{r} rows {distinct(trace, r):.1f} ({e * (1 - (1 - k / e) ** r):.1f})" for r in PASS_ROWS)
    print(f"distinct experts a layer's pass asks for (uniform routing's in brackets): {asked}")
    top = busiest(trace)
    print(f"a layer's {k} busiest experts' share of its choices, the median layer: {top:.0%} (uniform: {k / e:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
