"""One engine against engine replicas: aggregate tokens per second and time to first token (p50, p99) at 1, 4 and 8
clients, and the replicas' own cost per request, measured side by side in one run.

Two servers run at once: `speclane serve` (one engine, one torch thread, as many lanes as the most clients) and
`speclane serve --replicas R` (R engines of one thread each, the lanes split between them). At each client count the
two alternate, the single engine first in even repeats and the replicas first in odd ones. Prompts are chunks of
the Python standard library's source, greedy, `ignore_eos`. The cost of the replicas' path (the door, its
tokenizing for routing, Ray Serve's routing and its hop to a replica process) is the difference of the median
latency of a one-token request, sent one at a time, through each server.

    OMP_NUM_THREADS=1 python -m speclane.bench.serve_replicas --clients 1 4 8 --max-tokens 32 --repeats 2

Where every process shares one core (`taskset -c 0`), the replicas cannot run in parallel: the figures then show
the replicas' overhead, not their scaling; report the cores with the figures. Needs the `ray` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from speclane.bench.serve_load import code_prompts, one_request, run_all
from speclane.pipeline.cli.serve import spawn, stop
from speclane.pipeline.net.client import Client


def batch(endpoint: str, prompts: list[str], max_tokens: int) -> tuple[dict, list[float]]:
    """One batch of concurrent requests: its aggregate tokens/s, and each request's time to first token."""
    out, errors = [], []
    run_all(
        [threading.Thread(target=one_request, args=(endpoint, p, True, max_tokens, out, errors)) for p in prompts],
        errors,
    )
    wall = max(r["end"] for r in out) - min(r["start"] for r in out)
    return {"aggregate_tps": sum(r["tokens"] for r in out) / wall}, [r["ttft"] for r in out]


def request_cost(endpoints: dict[str, str], n: int) -> dict[str, float]:
    """Per server, the median seconds of a one-token request with a short prompt, sent one at a time, the servers
    taking turns request by request (so a change in the machine's load falls on both alike)."""
    times: dict[str, list[float]] = {name: [] for name in endpoints}
    clients = {name: Client(endpoint, timeout=600) for name, endpoint in endpoints.items()}
    try:
        for i in range(n):
            for name in endpoints if i % 2 == 0 else reversed(endpoints):
                t0 = time.perf_counter()
                clients[name].generate(prompt=f"Request {i}:", max_tokens=1).wait()
                times[name].append(time.perf_counter() - t0)
    finally:
        for c in clients.values():
            c.close()
    return {name: statistics.median(t) for name, t in times.items()}


def stop_replicas(proc) -> None:
    """SIGTERM a `serve --replicas` door and give it time to shut its Ray down (more than `stop`'s 10 s)."""
    proc.terminate()
    try:
        proc.wait(180)
    except subprocess.TimeoutExpired:
        stop(proc)


def loadavg() -> str:
    """The machine's load averages (1, 5, 15 minutes), for the record next to the figures."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-lines", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cost-requests", type=int, default=20, help="one-token requests timed for the cost")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    lanes = max(args.clients)
    per_replica = max(1, -(-lanes // args.replicas))
    folder = Path(tempfile.mkdtemp(prefix="serve_replicas_"))
    common = ("--dtype", args.dtype)
    servers = {}
    try:
        servers["single"] = spawn(folder / "single.log", *common, "--max-lanes", str(lanes))
        servers["replicas"] = spawn(
            folder / "replicas.log",
            *common,
            "--max-lanes",
            str(per_replica),
            "--replicas",
            str(args.replicas),
            "--replica-stall",
            "120",
            timeout=900,
        )
        rows = []
        endpoints = {name: endpoint for name, (_, endpoint) in servers.items()}
        load = [loadavg()]
        request_cost(endpoints, 2)  # nothing of a first request's start-up is timed
        cost = request_cost(endpoints, args.cost_requests)
        for n in args.clients:
            prompts = code_prompts(n, args.prompt_lines)
            for rep in range(args.repeats):
                for name in ("single", "replicas") if rep % 2 == 0 else ("replicas", "single"):
                    row, ttfts = batch(servers[name][1], prompts, args.max_tokens)
                    rows.append({"clients": n, "server": name, "repeat": rep, **row, "ttfts": ttfts})
        load.append(loadavg())
    finally:
        for name, (proc, _) in servers.items():
            (stop_replicas if name == "replicas" else stop)(proc)
    print(
        f"{os.cpu_count()} CPUs here, affinity {sorted(os.sched_getaffinity(0))}; {args.replicas} replicas; "
        f"load average at the start {load[0]}, at the end {load[-1]}"
    )
    print(f"{'clients':>7} {'server':>8} {'agg tok/s':>9} {'ttft p50':>8} {'ttft p99':>8}  replicas/single tok/s")
    for n in args.clients:
        med = {}
        for name in ("single", "replicas"):
            sel = [r for r in rows if r["clients"] == n and r["server"] == name]
            ttfts = [t for r in sel for t in r["ttfts"]]
            med[name] = statistics.median(r["aggregate_tps"] for r in sel)
            ratio = f"{med['replicas'] / med['single']:.2f}" if name == "replicas" else ""
            print(f"{n:>7} {name:>8} {med[name]:9.1f} {pct(ttfts, 0.5):8.2f} {pct(ttfts, 0.99):8.2f}  {ratio}")
    extra = (cost["replicas"] - cost["single"]) * 1000
    print(
        f"one-token request, median: single {cost['single'] * 1000:.1f} ms, replicas {cost['replicas'] * 1000:.1f} ms;"
        f" the replicas' path costs {extra:.1f} ms a request"
    )
    if args.json is not None:
        args.json.write_text("\n".join(json.dumps(r) for r in rows + [{"request_cost_s": cost, "load": load}]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
