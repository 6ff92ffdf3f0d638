"""The model drafters measured: acceptance at k = 1..7 per workload, and speculation on against off, one lane.

    python -m speclane.bench.drafters                          # the default model in bf16, one lane, table to stdout
    python -m speclane.bench.drafters --plot accept.png --json drafters.json --prompts 8 --max-tokens 128

Acceptance (tokens per round and per-position acceptance) is greedy and deterministic, so each
(backend, k, workload) is run once. Speed is decode tokens per second of `off` (--spec-backend none), dflash2 at
its speed k and mtp at its speed k, alternated per prompt (speclane.bench.measure.alternate) in this one process,
with the paired ratio against off. Prompts are bench/prompts.jsonl (held out from the drafters' fitting) in chat mode.
Owns this report only; the general benchmark is bench/cmd_bench.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from speclane.bench.measure import alternate, make_engine, paired_ratio, run_batch, speculation, spread, tps
from speclane.bench.workloads import WORKLOADS, load, pick
from speclane.stages.models.loading import load_model


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m speclane.bench.drafters", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument(
        "--backends",
        nargs="+",
        default=["dflash2", "mtp"],
        choices=("dflash2", "dflash2:shortlist", "dflash2:full", "mtp", "mtp:shortlist", "mtp:full", "ngram"),
        help="NAME:shortlist / NAME:full: the proposal head (--spec-draft-head); NAME alone: the spec's, "
        "shortlist since commit 18e768b",
    )
    p.add_argument("--ks", nargs="+", type=int, default=list(range(1, 8)))
    p.add_argument(
        "--speed-k",
        nargs="+",
        default=["dflash2=7", "mtp=3", "ngram=7"],
        help="backend=k measured for speed against off",
    )
    p.add_argument("--workloads", nargs="+", default=["code_gen", "code_edit", "prose"], choices=WORKLOADS)
    p.add_argument("--prompts", type=int, default=4, help="prompts per workload")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=2, help="speed: A B A B repeats per prompt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--weights",
        default=None,
        help="a directory of drafter files to measure instead of the ones the model ships with (e.g. an earlier fit)",
    )
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of per-position acceptance")
    p.add_argument("--json", type=Path, default=None, help="write every figure as JSON")
    return p.parse_args(argv)


def acceptance(target, tok, backend: str, k: int, prompts, max_tokens: int, weights: str | None = None) -> dict:
    eng = make_engine(target, tok, backend, k=k, lanes=1, weights=weights)
    runs = [
        run_batch(eng, [(0, eng.apply_chat([{"role": "user", "content": p["user"]}]))], max_tokens) for p in prompts
    ]
    return speculation(runs, k)


def speed(
    target, tok, speed_k: dict[str, int], prompts, max_tokens: int, repeats: int, weights: str | None = None
) -> dict:
    engines = {"off": make_engine(target, tok, "none", k=1)}
    engines.update({f"{b} k={k}": make_engine(target, tok, b, k=k, weights=weights) for b, k in speed_k.items()})
    ids = [engines["off"].apply_chat([{"role": "user", "content": p["user"]}]) for p in prompts]
    configs = {name: (lambda item, e=eng: run_batch(e, [(0, item)], max_tokens)[0]) for name, eng in engines.items()}
    runs = alternate(configs, ids, repeats)
    out = {}
    for name, rs in runs.items():
        drafter = engines[name].drafter
        out[name] = {
            "decode_tps": spread([x for row in tps(rs) for x in row]),
            "vs_off": paired_ratio(tps(rs), tps(runs["off"])) if name != "off" else None,
            "drafter_bytes": drafter.memory_bytes() if drafter else 0,
        }
        if name != "off":
            out[name]["spec"] = speculation(rs, speed_k[name.split()[0]])
    return out


def table(res: dict) -> str:
    lines = [
        f"Acceptance, one lane, greedy, chat mode ({res['setup']})",
        f"{'backend':<8} {'workload':<10} "
        + " ".join(f"tau k={k:<2}" for k in res["ks"])
        + "   per-position acceptance at the largest k",
    ]
    for backend, per in res["acceptance"].items():
        for workload, by_k in per.items():
            taus = " ".join(f"{by_k[str(k)]['tokens_per_round']:>7.2f}" for k in res["ks"])
            top = by_k[str(max(res["ks"]))]["accepted_per_position"]
            lines.append(f"{backend:<8} {workload:<10} {taus}   {' '.join(f'{a:.2f}' for a in top)}")
    lines += [
        "",
        f"Speed, decode tokens/s, one lane, alternated ({res['setup']})",
        f"{'config':<22} {'tok/s median (min-max)':<26} {'x off median (min-max)':<26} tau   drafter MB",
    ]
    for name, r in res["speed"].items():
        s, v = r["decode_tps"], r["vs_off"]
        ratio = f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" if v else "1"
        tau = f"{r['spec']['tokens_per_round']:.2f}" if "spec" in r else "1"
        lines.append(
            f"{name:<22} {s['median']:>6.1f} ({s['min']:.1f}-{s['max']:.1f}){'':<10} {ratio:<26} {tau:<5} "
            f"{r['drafter_bytes'] / 1e6:.1f}"
        )
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = max(res["ks"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for backend, per in res["acceptance"].items():
        for workload, by_k in per.items():
            acc = by_k[str(k)]["accepted_per_position"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{backend} {workload}")
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(draft i accepted | drafts before it were)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Per-position acceptance at k = {k} ({res['setup']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tok = load_model(args.model, args.dtype)
    prompts = load()
    speed_k = {b: int(k) for b, k in (s.rsplit("=", 1) for s in args.speed_k) if b in args.backends}
    res = {
        "setup": f"{args.model or 'default model'} {args.dtype}, {args.prompts} prompts a workload, "
        f"{args.max_tokens} new tokens, {args.threads} thread(s)",
        "ks": args.ks,
        "acceptance": {},
    }
    for backend in args.backends:
        res["acceptance"][backend] = {
            w: {
                str(k): acceptance(
                    target, tok, backend, k, pick(prompts, w, args.prompts), args.max_tokens, args.weights
                )
                for k in args.ks
            }
            for w in args.workloads
        }
        print(f"measured acceptance of {backend}", file=sys.stderr, flush=True)
    code = pick(prompts, "code_gen", args.prompts)
    res["speed"] = speed(target, tok, speed_k, code, args.max_tokens, args.repeats, args.weights)
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    if args.plot:
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
