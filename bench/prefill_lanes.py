"""Agents through `speclane serve`, every waiting prompt in one prefill pass (the default) against one prompt a pass
(`--prefill-lanes 1`): time to first token per turn and the whole replay's time, side by side in one run.

Each agent is one of bench/agents.py's code-editing sessions (held-out prompts and tool results, the shared system
message), driven over ZeroMQ, one thread an agent, `--tool-wait` seconds between turns, through a server of as many
lanes as agents with the serving defaults (the step budget of prompt rows included). The two servers run side by
side, fresh for every repeat (a replay's answers are checkpointed, and the next replay of the same conversations
would start from them), the default first in even repeats, each after one short request of other text. Reported:
per setting the median over agents of each turn's time to first token, then medians over repeats, and the ratios
one a pass / all in one.

    OMP_NUM_THREADS=1 taskset -c 1 python -m speclane.bench.prefill_lanes --agents 4 --turns 5 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from speclane.bench.serve_replicas import loadavg
from speclane.bench.serve_replicas_agents import drive
from speclane.pipeline.cli.serve import spawn, stop
from speclane.pipeline.net.client import Client

SETTINGS = {"all": (), "one": ("--prefill-lanes", "1")}  # every waiting prompt a pass (the default), one a pass


def replay(endpoint: str, args) -> dict:
    seen, seconds = drive(endpoint, args)
    return {
        "seconds": seconds,
        "ttft_per_turn": [statistics.median(a["ttft"][t] for a in seen) for t in range(args.turns)],
    }


def warm_up(endpoint: str) -> None:
    """One short request of text no agent sends: a server's first round pays what the probes have not cached."""
    with Client(endpoint, timeout=600) as client:
        client.generate(prompt="Warm-up: count to three.", max_tokens=4).wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--tool-wait", type=float, default=0.5)
    p.add_argument("--system-chars", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="prefill_lanes_"))
    rows, load = [], [loadavg()]
    for rep in range(args.repeats):
        servers = {}
        try:  # fresh servers each repeat: no checkpoint of an earlier replay's conversations serves this one
            for name, flags in SETTINGS.items():
                servers[name] = spawn(folder / f"{name}.log", "--max-lanes", str(args.agents), *flags, timeout=900)
                warm_up(servers[name][1])
            for name in SETTINGS if rep % 2 == 0 else reversed(SETTINGS):
                rows.append({"setting": name, "repeat": rep, **replay(servers[name][1], args)})
        finally:
            for proc, _ in servers.values():
                stop(proc)
    load.append(loadavg())
    print(f"{args.agents} agents, {args.turns} turns, {args.max_tokens} tokens a turn; load {load[0]} -> {load[-1]}")
    med = {}
    for name in SETTINGS:
        sel = [r for r in rows if r["setting"] == name]
        per = [statistics.median(r["ttft_per_turn"][t] for r in sel) for t in range(args.turns)]
        med[name] = (statistics.median(r["seconds"] for r in sel), per)
        label = "every waiting prompt a pass" if name == "all" else "one prompt a pass (--prefill-lanes 1)"
        print(f"{label:>38}: {med[name][0]:6.1f} s; TTFT per turn " + " ".join(f"{x:.2f}" for x in per))
    late = {n: statistics.median(per[1:]) for n, (_, per) in med.items()}
    print(
        f"one a pass / all in one (medians over repeats): replay time {med['one'][0] / med['all'][0]:.2f}x, "
        f"TTFT of turn 1 {med['one'][1][0] / med['all'][1][0]:.2f}x, from turn 2 {late['one'] / late['all']:.2f}x"
    )
    if args.json is not None:
        args.json.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
