"""Agents over engine replicas: prefix routing against two random choices, time to first token from turn 3 and
the prompt tokens restored from checkpoints instead of prefilled.

Each agent is one of bench/agents.py's code-editing sessions (the same held-out prompts and tool results, the same
shared system message), driven through `speclane serve --replicas R` over ZeroMQ, one thread an agent, waiting
`--tool-wait` seconds between turns. The door runs once with `--replica-routing prefix` and once with `random`,
in alternating order over repeats (each start is a fresh Ray and fresh replicas, so no checkpoint carries over).
Reported per routing: median time to first token of turns 1-2 and of turns 3 on, checkpoint hits and misses, and
the prompt tokens of all turns split into those restored from a checkpoint and those prefilled. A raw hit is any
held prefix, the system message every agent shares included, which every replica soon holds: raw hits cannot tell
the routings apart. `past shared` is what can: the tokens reused beyond the prefix all agents share (`shared`,
the longest common prefix of their first prompts, tokenized as the door does), summed over hits as
tokens_reused - hits x shared. It is a lower bound of what the conversations' own histories gave back (a hit of
no more than the shared prefix counts at most 0), exact when every such hit covers the shared prefix whole.

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
from speclane.bench.serve_replicas import loadavg, stop_replicas
from speclane.pipeline.cli.serve import spawn
from speclane.pipeline.net.client import Client
from speclane.pipeline.net.replica_cluster import DoorPrompts


def agent(endpoint: str, system: list, users: list[str], max_tokens: int, wait: float, seen: dict, errors: list):
    """One agent's turns; `seen["ttft"]` and `seen["prompt"]` get each turn's time to first token and prompt size."""
    messages = list(system)
    try:
        with Client(endpoint, timeout=900) as client:
            for text in users:
                messages.append({"role": "user", "content": text})
                t0 = time.perf_counter()
                stream = client.generate(messages=messages, max_tokens=max_tokens)
                first = None
                for _ in stream:
                    first = first or time.perf_counter()
                seen["ttft"].append(first - t0)
                seen["prompt"].append(stream.done.usage["prompt_tokens"])
                messages.append({"role": "assistant", "content": stream.done.text})
                time.sleep(wait)
    except Exception as exc:  # noqa: BLE001 - reported after the run, which then fails
        errors.append(exc)


def shared_tokens(system: list, users: list[list[str]]) -> int:
    """How many prompt tokens every agent's first turn shares (the system message, as the chat template renders
    it): the prefix every replica comes to hold, whichever way the turns are routed."""
    from speclane.pipeline.runtime.request import parse_request

    tokenize = DoorPrompts(None)
    firsts = [tokenize(parse_request({"messages": [*system, {"role": "user", "content": u[0]}]})) for u in users]
    shared = 0
    while all(shared < len(f) and f[shared] == firsts[0][shared] for f in firsts):
        shared += 1
    return shared


def drive(endpoint: str, args) -> tuple[list[dict], float]:
    """`args.agents` agents (`sessions`, the shared `system_prompt`) through `endpoint` at once, one thread each:
    what each saw (`agent`'s record) and the seconds until the last one ended; the first failure raised."""
    users, system = sessions(args.agents, args.turns), system_prompt(args.system_chars)
    seen, errors = [{"ttft": [], "prompt": []} for _ in users], []
    threads = [
        threading.Thread(target=agent, args=(endpoint, system, u, args.max_tokens, args.tool_wait, a, errors))
        for u, a in zip(users, seen)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} agent(s) failed: {errors[0]!r}")
    return seen, seconds


def run(args, routing: str, folder: Path) -> dict:
    flags = ("--dtype", args.dtype, "--max-lanes", str(args.lanes), "--replicas", str(args.replicas))
    proc, endpoint = spawn(
        folder / f"{routing}.log", *flags, "--replica-routing", routing, "--replica-stall", "300", timeout=900
    )
    try:
        users, system = sessions(args.agents, args.turns), system_prompt(args.system_chars)
        load = loadavg()
        seen, seconds = drive(endpoint, args)
        with Client(endpoint) as c:
            reply = c.stats()
        checkpoints = reply.checkpoints or {}
    finally:
        stop_replicas(proc)
    return {
        "routing": routing,
        "load": load,
        "served": [r.get("served") for r in reply.replicas],
        "seconds": seconds,
        "ttft_per_turn": [statistics.median(a["ttft"][t] for a in seen) for t in range(args.turns)],
        "ttft_early": statistics.median(x for a in seen for x in a["ttft"][:2]),
        "ttft_late": statistics.median(x for a in seen for x in a["ttft"][2:]),
        "prompt_tokens": sum(sum(a["prompt"]) for a in seen),
        "hits": checkpoints.get("hits", 0),
        "misses": checkpoints.get("misses", 0),
        "tokens_reused": checkpoints.get("tokens_reused", 0),
        "past_shared": max(
            0, checkpoints.get("tokens_reused", 0) - checkpoints.get("hits", 0) * shared_tokens(system, users)
        ),
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
    print(
        f"{args.agents} agents, {args.replicas} replicas of {args.lanes} lanes, {args.turns} turns; load at each start"
    )
    print(
        f"{'routing':>8} {'rep':>3} {'ttft t1-2':>9} {'ttft t3+':>8} {'hits':>5} {'misses':>6} {'prompt tok':>10} "
        f"{'reused':>7} {'past shared':>11} {'prefilled':>9} {'seconds':>8}  load"
    )
    for r in rows:
        r["prefilled"] = r["prompt_tokens"] - r["tokens_reused"]
        print(
            f"{r['routing']:>8} {r['repeat']:3d} {r['ttft_early']:9.2f} {r['ttft_late']:8.2f} {r['hits']:5d} "
            f"{r['misses']:6d} {r['prompt_tokens']:10d} {r['tokens_reused']:7d} {r['past_shared']:11d} "
            f"{r['prefilled']:9d} "
            f"{r['seconds']:8.1f}  {r['load']}"
        )
    med = {
        (k, f): statistics.median(r[f] for r in rows if r["routing"] == k)
        for k in ("prefix", "random")
        for f in ("ttft_late", "hits", "tokens_reused", "past_shared", "prefilled")
    }
    print(
        f"prefix routing against two random choices (medians over repeats): time to first token from turn 3 "
        f"{med['random', 'ttft_late'] / med['prefix', 'ttft_late']:.2f}x lower, checkpoint hits "
        f"{med['prefix', 'hits'] / max(1, med['random', 'hits']):.2f}x (raw), tokens reused past the shared prefix "
        f"{med['prefix', 'past_shared'] / max(1, med['random', 'past_shared']):.2f}x, prompt tokens reused "
        f"{med['prefix', 'tokens_reused'] / max(1, med['random', 'tokens_reused']):.2f}x, prompt tokens prefilled "
        f"{med['random', 'prefilled'] / max(1, med['prefix', 'prefilled']):.2f}x fewer"
    )
    if args.json is not None:
        args.json.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, bars) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [2, 1]})
        for r in rows:
            turns = range(1, len(r["ttft_per_turn"]) + 1)
            style, color = ("-", "C0") if r["routing"] == "prefix" else ("--", "C1")
            ax.plot(turns, r["ttft_per_turn"], style, color=color, marker="o", label=f"{r['routing']} {r['repeat']}")
        ax.set(xlabel="turn", ylabel="time to first token, median over agents (s)", title="agents over replicas")
        ax.set_xticks(list(turns))
        ax.legend(fontsize="small")
        names = [f"{r['routing']} {r['repeat']}" for r in rows]
        bars.bar(names, [r["tokens_reused"] for r in rows], label="restored from a checkpoint")
        bars.bar(names, [r["prefilled"] for r in rows], bottom=[r["tokens_reused"] for r in rows], label="prefilled")
        bars.set(ylabel="prompt tokens, all turns", title="prompt tokens")
        bars.tick_params(axis="x", rotation=45)
        bars.legend(fontsize="small", loc="lower center")
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
