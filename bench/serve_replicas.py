"""One engine against engine replicas: aggregate tokens per second and time to first token (p50, p99) at 1, 4 and 8
clients, and the replicas' own cost per request, measured side by side in one run.

The servers run at once: `speclane serve` (one engine, one torch thread, as many lanes as the most clients) and
`speclane serve --replicas R` (R engines of one thread each, the lanes split between them). At each client count the
arms alternate, in one order in even repeats and the reverse in odd ones. Prompts are chunks of the Python standard
library's source, each batch's with a first line of its own (no server meets a prompt twice, so none answers from a
kept checkpoint), greedy, `ignore_eos`.

A third arm, `pair`, is the machine's own ceiling for R replicas: R plain `speclane serve` processes of one thread
each and no Ray, the bench splitting each batch between them by prompt length. Pair over single is what the cores
and their shared memory bandwidth allow; replicas over pair is what the door, Ray and its routing keep of it.

Ray's cost per request is what the replicas' path (the door, its tokenizing for routing, Ray Serve's routing, the
hop to a replica process and the stream back) adds to a one-token request sent alone, the servers taking turns
request by request, against the single server and against one of the pair (a plain server with a replica's own
lanes and threads, so that difference is the path's alone), in two measures: wall, the median latency's
difference; CPU, the difference in CPU time all of a server's processes spend on a request (the server, and for
the replicas the door, Ray's own processes and the replicas: its whole process tree) beyond what they spend idle
over the same time (Ray's background: its control loops, health checks, published stats). On a loaded machine the
wall figure carries the waits for a core; the CPU figure does not.

    OMP_NUM_THREADS=1 python -m speclane.bench.serve_replicas --clients 1 4 8 --max-tokens 32 --repeats 2

Ray's cost moves between starts of the same code by more than a millisecond (which replica process lands on which
core, what Ray's own processes do meanwhile). `--ray-starts N` measures it N times, the replicas' door stopped and
started again between (a new Ray each time), and reports each start and the median over them; `--clients` with no
count measures only the cost.

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

from speclane.bench.proc_cpu import cpu_of, cpu_per_token, tree_cpu
from speclane.bench.serve_load import budget_flags, code_prompts, one_request, run_all
from speclane.pipeline.cli.serve import spawn, stop
from speclane.pipeline.net.client import Client


def batch(endpoints: list[str], prompts: list[str], max_tokens: int) -> tuple[dict, list[float]]:
    """One batch of concurrent requests: its aggregate tokens/s, and each request's time to first token. With
    several endpoints the prompts are split between them by length, the longest first to the least loaded."""
    out, errors, threads = [], [], []
    sent = [0] * len(endpoints)
    for prompt in sorted(prompts, key=len, reverse=True):
        i = sent.index(min(sent))
        sent[i] += len(prompt)
        threads.append(threading.Thread(target=one_request, args=(endpoints[i], prompt, True, max_tokens, out, errors)))
    run_all(threads, errors)
    wall = max(r["end"] for r in out) - min(r["start"] for r in out)
    tokens = sum(r["tokens"] for r in out)
    return {"aggregate_tps": tokens / wall, "tokens": tokens}, [r["ttft"] for r in out]


ARMS = ("single", "replicas", "pair")


def request_cost(servers: dict[str, tuple], n: int, idle_s: float = 5.0) -> dict[str, dict[str, float]]:
    """Per server (name -> (process, endpoint)): the median seconds of a one-token request with a short prompt,
    sent one at a time, the servers taking turns request by request (a change in the machine's load falls on both
    alike); the CPU seconds its process tree spends a second idle (measured first, over `idle_s`); and the CPU
    seconds it spends a request beyond that idle rate."""
    idle = {}
    for name, (proc, _) in servers.items():
        c0, t0 = tree_cpu(proc.pid), time.perf_counter()
        time.sleep(idle_s / len(servers))
        idle[name] = (tree_cpu(proc.pid) - c0) / (time.perf_counter() - t0)
    times: dict[str, list[float]] = {name: [] for name in servers}
    cpu = dict.fromkeys(servers, 0.0)
    clients = {name: Client(endpoint, timeout=600) for name, (_, endpoint) in servers.items()}
    try:
        for i in range(n):
            for name in servers if i % 2 == 0 else reversed(servers):
                c0, t0 = tree_cpu(servers[name][0].pid), time.perf_counter()
                clients[name].generate(prompt=f"Request {i}:", max_tokens=1).wait()
                times[name].append(time.perf_counter() - t0)
                cpu[name] += tree_cpu(servers[name][0].pid) - c0 - idle[name] * times[name][-1]
    finally:
        for c in clients.values():
            c.close()
    return {
        name: {"wall_s": statistics.median(t), "cpu_s": cpu[name] / n, "idle_cpu_per_s": idle[name]}
        for name, t in times.items()
    }


def cost_summary(costs: list[dict[str, dict[str, float]]]) -> list[str]:
    """Over several Ray starts' costs (each request_cost's answer): the wall and CPU differences against single and
    against pair0 at each start, then their median, least and greatest, in ms."""
    out = [f"Ray's cost per request over {len(costs)} starts (ms; wall, then CPU beyond the idle rate):"]
    for name in ("single", "pair0"):
        for measure in ("wall_s", "cpu_s"):
            diffs = [(c["replicas"][measure] - c[name][measure]) * 1e3 for c in costs]
            each = " ".join(f"{d:.1f}" for d in diffs)
            out.append(
                f"  replicas minus {name}, {measure[:-2]}: median {statistics.median(diffs):.1f} "
                f"[{min(diffs):.1f}, {max(diffs):.1f}]; each start: {each}"
            )
    return out


def cost_lines(cost: dict[str, dict[str, float]]) -> list[str]:
    """The replicas' cost per request, against one engine (`single`, the lanes of all replicas) and against one
    plain server with a replica's own lanes and threads (`pair0`): the second difference is the door's, Ray's and
    the hop's alone, the first also what a replica's fewer lanes change in the engine's own step."""
    many, out = cost["replicas"], ["Ray's cost per request (a one-token request sent alone):"]
    for name, what in (("single", "replicas minus single"), ("pair0", "replicas minus one pair server")):
        one = cost[name]
        out += [
            f"  {what}: wall, median latency {many['wall_s'] * 1e3:.1f} - {one['wall_s'] * 1e3:.1f} = "
            f"{(many['wall_s'] - one['wall_s']) * 1e3:.1f} ms; CPU of every process beyond its idle rate "
            f"{many['cpu_s'] * 1e3:.1f} - {one['cpu_s'] * 1e3:.1f} = {(many['cpu_s'] - one['cpu_s']) * 1e3:.1f} ms"
        ]
    idle = ", ".join(f"{name} {c['idle_cpu_per_s'] * 1e3:.0f} ms" for name, c in cost.items())
    return out + [f"  idle, CPU a second: {idle}"]


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
    p.add_argument("--clients", type=int, nargs="*", default=[1, 4, 8], help="none: measure only Ray's cost")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-lines", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cost-requests", type=int, default=20, help="one-token requests timed for the cost")
    p.add_argument(
        "--ray-starts", type=int, default=1, help="times the replicas' door (and Ray) is started for the cost"
    )
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument(
        "--prefill-rows", type=int, default=None, help="every server's step budget of prompt rows (default: serve's)"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    lanes = max(args.clients, default=1)
    per_replica = max(1, -(-lanes // args.replicas))
    folder = Path(tempfile.mkdtemp(prefix="serve_replicas_"))
    common = ("--dtype", args.dtype, *budget_flags(args.prefill_rows or 0))
    servers = {}
    try:
        servers["single"] = spawn(folder / "single.log", *common, "--max-lanes", str(lanes))
        replica_flags = ("--max-lanes", str(per_replica), "--replicas", str(args.replicas), "--replica-stall", "120")
        servers["replicas"] = spawn(folder / "replicas.log", *common, *replica_flags, timeout=900)
        for i in range(args.replicas):
            servers[f"pair{i}"] = spawn(folder / f"pair{i}.log", *common, "--max-lanes", str(per_replica))
        procs = {"single": ["single"], "replicas": ["replicas"], "pair": [f"pair{i}" for i in range(args.replicas)]}
        arms = {
            "single": [servers["single"][1]],
            "replicas": [servers["replicas"][1]],
            "pair": [servers[f"pair{i}"][1] for i in range(args.replicas)],
        }
        rows = []
        load = [loadavg()]
        costs = []
        for start in range(args.ray_starts):
            if start:  # a new Ray: the door stopped and started again
                stop_replicas(servers.pop("replicas")[0])
                servers["replicas"] = spawn(folder / f"replicas{start}.log", *common, *replica_flags, timeout=900)
                arms["replicas"] = [servers["replicas"][1]]
            timed = {name: servers[name] for name in ("single", "replicas", "pair0")}
            request_cost(timed, 2, idle_s=0.1)  # nothing of a first request's start-up is timed
            costs.append(request_cost(timed, args.cost_requests))
        cost = costs[-1]
        for n in args.clients:
            chunks = code_prompts(n, args.prompt_lines)
            for rep in range(args.repeats):
                # a head of its own for every batch: no prompt is met twice, so no server answers one from a kept
                # checkpoint (each arm would otherwise reuse what an earlier batch left, each by its own routing)
                prompts = [f"# {n} clients, repeat {rep}, request {i}\n{c}" for i, c in enumerate(chunks)]
                for name in ARMS if rep % 2 == 0 else ARMS[::-1]:
                    tree = [servers[s][0] for s in procs[name]]
                    c0 = cpu_of(tree)
                    row, ttfts = batch(arms[name], prompts, args.max_tokens)
                    cpu: dict[str, float] = {}
                    for part in cpu_of(tree, c0):
                        for role, seconds in part.items():
                            cpu[role] = cpu.get(role, 0.0) + seconds
                    rows.append({"clients": n, "server": name, "repeat": rep, **row, "ttfts": ttfts, "cpu_s": cpu})
        load.append(loadavg())
    finally:
        for name, (proc, _) in servers.items():
            (stop_replicas if name == "replicas" else stop)(proc)
    print(
        f"{os.cpu_count()} CPUs here, affinity {sorted(os.sched_getaffinity(0))}; {args.replicas} replicas; "
        f"load average at the start {load[0]}, at the end {load[-1]}"
    )
    print(f"{'clients':>7} {'server':>8} {'agg tok/s':>9} {'ttft p50':>8} {'ttft p99':>8}  tok/s against single")
    for n in args.clients:
        med = {}
        for name in ARMS:
            sel = [r for r in rows if r["clients"] == n and r["server"] == name]
            ttfts = [t for r in sel for t in r["ttfts"]]
            med[name] = statistics.median(r["aggregate_tps"] for r in sel)
            ratio = f"{med[name] / med['single']:.2f}" if name != "single" else ""
            print(f"{n:>7} {name:>8} {med[name]:9.1f} {pct(ttfts, 0.5):8.2f} {pct(ttfts, 0.99):8.2f}  {ratio}")
        print(
            f"{n:>7} replicas / pair (what the door and Ray keep of the ceiling): {med['replicas'] / med['pair']:.2f}"
        )
        print(f"{n:>7} CPU ms a token, by part of each arm's processes: {cpu_per_token(rows, n, ARMS)}")
    print("\n".join(cost_lines(cost) if len(costs) == 1 else cost_summary(costs)))
    if args.json is not None:
        tail = [{"request_cost_s": c, "start": i} for i, c in enumerate(costs)] + [{"load": load}]
        args.json.write_text("\n".join(json.dumps(r) for r in rows + tail) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
