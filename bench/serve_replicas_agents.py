"""Agents over engine replicas: prefix routing against two random choices, time to first token from turn 3 and
the prompt tokens restored from checkpoints instead of prefilled.

Each agent is one of bench/agents.py's code-editing sessions (the same held-out prompts and tool results, the same
shared system message), driven through `speclane serve --replicas R` over ZeroMQ, one thread an agent, waiting
`--tool-wait` seconds between turns. The door runs once with `--replica-routing prefix` and once with `random`,
in alternating order over repeats (each start is a fresh Ray and fresh replicas, so no checkpoint carries over).
Reported per routing: median time to first token of turns 1-2 and of turns 3 on, checkpoint hits, tokens reused.

    OMP_NUM_THREADS=1 python -m speclane.bench.serve_replicas_agents --agents 8 --turns 5 --max-tokens 16 \
        [--plot ttft.png] [--json PATH]

Needs the `ray` extra.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from speclane.bench.agents import sessions, system_prompt
from speclane.pipeline.cli.serve import spawn, stop
from speclane.pipeline.net.client import Client


def agent(endpoint: str, system: list, users: list[str], max_tokens: int, wait: float, ttft: list) -> None:
    messages = list(system)
    with Client(endpoint, timeout=900) as client:
        for text in users:
            messages.append({"role": "user", "content": text})
            t0 = time.perf_counter()
            stream = client.generate(messages=messages, max_tokens=max_tokens)
            first = None
            for _ in stream:
                first = first or time.perf_counter()
            ttft.append(first - t0)
            messages.append({"role": "assistant", "content": stream.done.text})
            time.sleep(wait)


def run(args, routing: str, folder: Path) -> dict:
    flags = ("--dtype", args.dtype, "--max-lanes", str(args.lanes), "--replicas", str(args.replicas))
    proc, endpoint = spawn(
        folder / f"{routing}.log", *flags, "--replica-routing", routing, "--replica-stall", "300", timeout=900
    )
    try:
        users, system = sessions(args.agents, args.turns), system_prompt(args.system_chars)
        ttfts = [[] for _ in users]
        threads = [
            threading.Thread(target=agent, args=(endpoint, system, u, args.max_tokens, args.tool_wait, t))
            for u, t in zip(users, ttfts)
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
        with Client(endpoint) as c:
            checkpoints = c.stats().checkpoints or {}
    finally:
        stop(proc)
    return {
        "routing": routing,
        "seconds": seconds,
        "ttft_per_turn": [statistics.median(a[t] for a in ttfts) for t in range(args.turns)],
        "ttft_early": statistics.median(x for a in ttfts for x in a[:2]),
        "ttft_late": statistics.median(x for a in ttfts for x in a[2:]),
        "hits": checkpoints.get("hits", 0),
        "tokens_reused": checkpoints.get("tokens_reused", 0),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=5, help="at least 3: the figure is turns 3 on")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--lanes", type=int, default=4, help="lanes a replica")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--tool-wait", type=float, default=0.5)
    p.add_argument("--system-chars", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", default=None, metavar="PNG", help="TTFT against turn, one line a routing")
    args = p.parse_args(argv)
    if args.turns < 3:
        p.error("--turns must be at least 3")
    folder = Path(tempfile.mkdtemp(prefix="serve_replicas_agents_"))
    rows = []
    for rep in range(args.repeats):
        for routing in ("prefix", "random") if rep % 2 == 0 else ("random", "prefix"):
            rows.append({"repeat": rep, **run(args, routing, folder)})
    print(f"{'routing':>8} {'ttft t1-2':>9} {'ttft t3+':>8} {'hits':>5} {'reused tok':>10} {'seconds':>8}")
    for r in rows:
        print(
            f"{r['routing']:>8} {r['ttft_early']:9.2f} {r['ttft_late']:8.2f} {r['hits']:5d} "
            f"{r['tokens_reused']:10d} {r['seconds']:8.1f}"
        )
    med = {k: statistics.median(r["ttft_late"] for r in rows if r["routing"] == k) for k in ("prefix", "random")}
    print(f"time to first token from turn 3: random / prefix = {med['random'] / med['prefix']:.2f}x")
    if args.json is not None:
        args.json.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for r in rows:
            turns = range(1, len(r["ttft_per_turn"]) + 1)
            ax.plot(turns, r["ttft_per_turn"], marker="o", label=f"{r['routing']} (repeat {r['repeat']})")
        ax.set(xlabel="turn", ylabel="time to first token, median over agents (s)", title="agents over replicas")
        ax.legend()
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
