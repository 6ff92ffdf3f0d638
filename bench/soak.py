"""Soak: normal clients and hostile clients against one `speclane serve` for a bounded time. Nothing one client
sends may take the server down or change another's tokens; how much it slows the others is reported.

The soak starts its own server on loopback (one torch thread, a small --max-message-bytes so oversized inputs stay
cheap, --http unless --no-http) and runs each normal prompt alone once (its reference). Then a calm phase: normal
clients alone, each running greedy streams one after another (prompts from bench/prompts.jsonl, EOS ignored,
speculation off per request unless --spec, so a token message is a round). Then a hostile phase: the same normal
clients, and beside them the hostile kinds of bench/hostile.py and bench/hostile_http.py in turn, at a bounded
rate a door.

It prints the machine; per hostile kind the inputs sent and the replies received; whether the server is still up
and answering at the end (stats, a generate, an HTTP completion, tracebacks in its log, its exit status after
SIGTERM); how many normal streams equal their solo run token for token; and per normal stream the median and max
gap between token messages, the max's ratio to the calm phase's median gap (flagged past 3x: a figure, not a
pass/fail).

    OMP_NUM_THREADS=1 python -m speclane.bench.soak                     # 180 s: 20 s calm, then hostile
    OMP_NUM_THREADS=1 python -m speclane.bench.soak --seconds 60 --clients 3 --json soak.json

Owns the server, the phases and the command line. Not here: the clients (bench/soak_clients.py), the hostile
inputs (bench/hostile.py, bench/hostile_http.py), the report's lines (bench/soak_report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

from speclane.bench import hostile, hostile_http, soak_report
from speclane.bench.soak_clients import drive, judge, new_tally, normal_client, normal_prompts, one_stream
from speclane.pipeline.cli.serve import HTTP_READY, spawn, stop
from speclane.pipeline.net.client import Client

ROOT = Path(__file__).resolve().parents[1]


def machine_line() -> str:
    """CPU kind, torch, cores, load and the commit measured (marked +dirty when tracked files differ)."""
    import torch

    from speclane.kernels import cpu_build

    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True).returncode != 0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"machine: {cpu_build.cpu_name()}; CPU {torch.backends.cpu.get_cpu_capability()}, torch "
        f"{torch.__version__}, {os.cpu_count()} cores, load average {load} at start; server on one torch "
        f"thread; commit {(head or 'unknown') + ('+dirty' if head and dirty else '')}"
    )


# --- the run --------------------------------------------------------------------------------------------------
def start_server(args) -> tuple:
    flags = [
        "--dtype",
        args.dtype,
        "--spec-draft-rows",
        "8",
        "--max-lanes",
        str(args.clients + args.hostile_lanes),
        "--max-message-bytes",
        str(args.max_message_bytes),
    ]
    lines: list[str] = []
    log = Path(tempfile.mkdtemp(prefix="soak_")) / "serve.log"
    proc, endpoint = spawn(log, *flags, *([] if args.no_http else ["--http", "127.0.0.1:0"]), lines=lines)
    url, model = None, ""
    for line in lines:
        if line.startswith(HTTP_READY):
            url, _, rest = line[len(HTTP_READY) :].partition(" ")
            model = rest.strip().removeprefix("(model ").removesuffix(")")
    return proc, endpoint, url, model, log


def after(proc, endpoint: str, door: hostile.Door, prompt: dict, solo: dict, args, log: Path) -> dict:
    """Is the server still up and answering once every hostile client is done?"""
    out = {"alive": proc.poll() is None}
    try:
        with Client(endpoint, timeout=30) as client:
            out["finished"] = dict(client.stats().finished)
    except Exception as exc:  # noqa: BLE001
        out["finished"] = f"no stats answer: {type(exc).__name__}: {exc}"[:120]
    row = one_stream(endpoint, prompt, args)
    judge(row, solo)
    out["generate"] = "exact" if row["exact"] else (row["error"] or "tokens differ from its solo run")
    if door.url is not None:
        body = hostile_http.completion_body(door)
        got = hostile_http.http_send(door, hostile_http.post_head("completions", "application/json", len(body)), body)
        out["http"] = got[0] if got else "no answer"
    stop(proc)
    out["exit"] = proc.returncode
    out["tracebacks"] = log.read_text(errors="replace").count("Traceback")
    return out


def run(args) -> dict:
    res = {"machine": machine_line(), "args": {k: v for k, v in vars(args).items() if k != "json"}}
    proc, endpoint, url, model, log = start_server(args)
    try:
        prompts = normal_prompts(args.prompts)
        solo_rows = [one_stream(endpoint, p, args) for p in prompts]
        if any(r["error"] for r in solo_rows):
            raise RuntimeError(f"a solo run failed: {[r['error'] for r in solo_rows if r['error']][0]}")
        solo = {r["prompt"]: r["ids"] for r in solo_rows}
        until, streams, t0 = threading.Event(), [], time.monotonic()
        normal = [
            threading.Thread(target=normal_client, args=(i, endpoint, prompts, args, until, streams))
            for i in range(args.clients)
        ]
        for t in normal:
            t.start()
        until.wait(min(args.calm, args.seconds / 2))
        while {r["client"] for r in streams} != set(range(args.clients)) and time.monotonic() - t0 < args.seconds:
            time.sleep(0.05)  # the calm phase lasts until each client has finished a stream
        hostile_start = time.monotonic()
        ctx = zmq.Context()
        doors = [
            (
                hostile.Door(endpoint, url, model, args.max_message_bytes, random.Random(args.seed), ctx),
                hostile.ZMQ_KINDS,
            )
        ]
        if url is not None:
            doors.append(
                (
                    hostile.Door(endpoint, url, model, args.max_message_bytes, random.Random(args.seed + 1), ctx),
                    hostile_http.HTTP_KINDS,
                )
            )
        tally = new_tally(k for _, kinds in doors for k in kinds)
        drivers = [
            threading.Thread(target=drive, args=(door, kinds, args.hostile_rate, until, tally)) for door, kinds in doors
        ]
        for t in drivers:
            t.start()
        until.wait(max(0.0, t0 + args.seconds - time.monotonic()))
        until.set()
        hostile_s = time.monotonic() - hostile_start  # streams in flight then run on to their end
        for t in normal + drivers:
            t.join()
        for door, kinds in doors:
            if "http_stalled" in kinds:
                got = hostile_http.reap_stalled(door, final=True)
                tally["http_stalled"]["replies"] += len(got)
                tally["http_stalled"]["got"].update(got)
        ctx.destroy(0)
        res["after"] = after(proc, endpoint, doors[0][0], prompts[0], solo, args, log)
    finally:
        if proc.poll() is None:
            stop(proc)
    for row in streams:
        judge(row, solo)
        row["phase"] = "calm" if row["end"] < hostile_start else "hostile"
    calm_gaps = [g for r in streams if r["phase"] == "calm" for g in r["gaps"]]
    res.update(
        calm_s=hostile_start - t0,
        hostile_s=hostile_s,
        tally=tally,
        calm_median_gap=statistics.median(calm_gaps) if calm_gaps else None,
        streams=[{k: v for k, v in r.items() if k not in ("stamps", "ids", "done_ids")} for r in streams],
    )
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--seconds",
        type=float,
        default=180.0,
        help="calm and hostile phases together (server start and solo runs come on top)",
    )
    p.add_argument(
        "--calm",
        type=float,
        default=20.0,
        help="seconds of normal clients alone first (at most half "
        "of --seconds; longer until each client has finished a stream)",
    )
    p.add_argument("--clients", type=int, default=2, help="normal clients")
    p.add_argument("--prompts", type=int, default=3, help="normal prompts, taken in turn")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens of each normal stream (EOS ignored)")
    p.add_argument(
        "--spec",
        action="store_true",
        help="normal streams with the server's drafter (several tokens "
        "a round arrive back to back, so gaps mix rounds and bursts)",
    )
    p.add_argument("--hostile-rate", type=float, default=5.0, help="hostile inputs a second, at most, a door")
    p.add_argument("--hostile-lanes", type=int, default=4, help="lanes beyond one a normal client")
    p.add_argument("--max-message-bytes", type=int, default=65536)
    p.add_argument("--no-http", action="store_true", help="no --http door, no HTTP hostile clients")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a normal stream may wait for a message")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.clients < 1 or args.prompts < 1 or args.hostile_rate <= 0:
        p.error("--seconds, --clients, --prompts and --hostile-rate must be positive")
    res = run(args)
    print("\n".join(soak_report.lines(res)))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
