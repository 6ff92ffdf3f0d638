"""Soak: normal clients and hostile clients against one `speclane serve` for a bounded time. Nothing one client
sends may take the server down or change another's tokens; how much it slows the others is reported.

The soak starts its own server on loopback (one torch thread, a small --max-message-bytes so oversized inputs stay
cheap, --http unless --no-http) and runs each normal prompt alone once (its reference). Then a calm phase: normal
clients alone, each running greedy streams one after another (prompts from bench/prompts.jsonl, EOS ignored,
speculation off per request unless --spec, so a token message is a round). Then a hostile phase: the same normal
clients, and beside them the hostile kinds of bench/hostile.py in turn, at a bounded rate a door.

It prints the machine; per hostile kind the inputs sent and the replies received; whether the server is still up
and answering at the end (stats, a generate, an HTTP completion, tracebacks in its log, its exit status after
SIGTERM); how many normal streams equal their solo run token for token; and per normal stream the median and max
gap between token messages, the max's ratio to the calm phase's median gap (flagged past 3x: a figure, not a
pass/fail).

    OMP_NUM_THREADS=1 python -m speclane.bench.soak                     # 180 s: 20 s calm, then hostile
    OMP_NUM_THREADS=1 python -m speclane.bench.soak --seconds 60 --clients 3 --json soak.json
"""
from __future__ import annotations

import argparse
import collections
import itertools
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

from speclane.bench import hostile, workloads
from speclane.pipeline.cli.serve import HTTP_READY, spawn, stop
from speclane.pipeline.net.client import Client

FLAG_RATIO = 3.0   # a stream whose max gap is past this many calm median gaps is flagged
ROOT = Path(__file__).resolve().parents[1]


def machine_line() -> str:
    """CPU kind, torch, cores, load and the commit measured (marked +dirty when tracked files differ)."""
    import torch

    from speclane.kernels import cpu_build

    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True).returncode != 0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine: {cpu_build.cpu_name()}; CPU {torch.backends.cpu.get_cpu_capability()}, torch "
            f"{torch.__version__}, {os.cpu_count()} cores, load average {load} at start; server on one torch "
            f"thread; commit {(head or 'unknown') + ('+dirty' if head and dirty else '')}")


# --- normal clients -------------------------------------------------------------------------------------------
def normal_prompts(n: int) -> list[dict]:
    """`n` prompts, the workloads taken in turn (code_edit-00, code_gen-00, prose-00, code_edit-01, ...)."""
    rows = workloads.load()
    per = [workloads.pick(rows, w, n) for w in workloads.WORKLOADS]
    return [p for group in itertools.zip_longest(*per) for p in group if p is not None][:n]


def one_stream(endpoint: str, prompt: dict, args, client_no: int = -1) -> dict:
    """One greedy stream: its token ids (from the token messages and from `done`), arrival stamps, or its error."""
    row = {"client": client_no, "prompt": prompt["id"], "ids": [], "done_ids": None, "stamps": [], "error": None,
           "start": time.monotonic()}
    try:
        with Client(endpoint, timeout=args.timeout) as client:
            stream = client.generate(messages=[{"role": "user", "content": prompt["user"]}],
                                     max_tokens=args.max_tokens, ignore_eos=True, spec={"enabled": args.spec})
            for tok in stream:
                row["stamps"].append(time.monotonic())
                row["ids"].append(tok.token_id)
            row["done_ids"] = list(stream.done.token_ids)
    except Exception as exc:  # noqa: BLE001 - a failed normal stream is a finding, reported with the others
        row["error"] = f"{type(exc).__name__}: {exc}"[:160]
    row["end"] = time.monotonic()
    return row


def normal_client(no: int, endpoint: str, prompts: list[dict], args, until: threading.Event, out: list) -> None:
    """Streams one after another, prompts in turn from the `no`-th, until `until` is set."""
    for k in itertools.count(no):
        if until.is_set():
            return
        out.append(one_stream(endpoint, prompts[k % len(prompts)], args, no))


def judge(row: dict, solo: dict[str, list[int]]) -> None:
    """Exactness against the solo run, and the gaps between token messages (seconds)."""
    ref = solo.get(row["prompt"])
    row["exact"] = row["error"] is None and ref is not None and row["ids"] == ref and row["done_ids"] == ref
    row["gaps"] = [b - a for a, b in zip(row["stamps"], row["stamps"][1:])]
    row["ttft"] = row["stamps"][0] - row["start"] if row["stamps"] else None
    row["tokens"] = len(row["ids"])


# --- hostile clients ------------------------------------------------------------------------------------------
def drive(door: hostile.Door, kinds: dict, rate: float, until: threading.Event, tally: dict) -> None:
    """Each kind in turn, at most `rate` inputs a second, until `until` is set. This thread alone writes the
    tally rows of `kinds`."""
    for name in itertools.cycle(kinds):
        if until.is_set():
            return
        t0, row, got = time.monotonic(), tally[name], []
        try:
            got = kinds[name](door)
            row["sent"] += 1
        except hostile.AtBound as exc:
            row["at_bound"] += 1
            got = exc.labels
        except Exception as exc:  # noqa: BLE001 - no reply, or a reset or timeout on our side: counted, and on
            row["sent"] += 1
            row["unanswered" if isinstance(exc, hostile.Unanswered) else "failed"] += 1
            row["failure"] = f"{type(exc).__name__}: {exc}"[:120]
        row["replies"] += len(got)
        row["got"].update(got)
        until.wait(max(0.0, 1.0 / rate - (time.monotonic() - t0)))


def new_tally(kinds) -> dict:
    return {k: {"sent": 0, "replies": 0, "unanswered": 0, "failed": 0, "at_bound": 0, "failure": "",
                "got": collections.Counter()} for k in kinds}


# --- the run --------------------------------------------------------------------------------------------------
def start_server(args) -> tuple:
    flags = ["--dtype", args.dtype, "--spec-draft-rows", "8", "--max-lanes", str(args.clients + args.hostile_lanes),
             "--max-message-bytes", str(args.max_message_bytes)]
    lines: list[str] = []
    log = Path(tempfile.mkdtemp(prefix="soak_")) / "serve.log"
    proc, endpoint = spawn(log, *flags, *([] if args.no_http else ["--http", "127.0.0.1:0"]), lines=lines)
    url, model = None, ""
    for line in lines:
        if line.startswith(HTTP_READY):
            url, _, rest = line[len(HTTP_READY):].partition(" ")
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
        body = hostile.completion_body(door)
        got = hostile.http_send(door, hostile.post_head("completions", "application/json", len(body)), body)
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
        normal = [threading.Thread(target=normal_client, args=(i, endpoint, prompts, args, until, streams))
                  for i in range(args.clients)]
        for t in normal:
            t.start()
        until.wait(min(args.calm, args.seconds / 2))
        while {r["client"] for r in streams} != set(range(args.clients)) and time.monotonic() - t0 < args.seconds:
            time.sleep(0.05)   # the calm phase lasts until each client has finished a stream
        hostile_start = time.monotonic()
        ctx = zmq.Context()
        doors = [(hostile.Door(endpoint, url, model, args.max_message_bytes, random.Random(args.seed), ctx),
                  hostile.ZMQ_KINDS)]
        if url is not None:
            doors.append((hostile.Door(endpoint, url, model, args.max_message_bytes, random.Random(args.seed + 1),
                                       ctx), hostile.HTTP_KINDS))
        tally = new_tally(k for _, kinds in doors for k in kinds)
        drivers = [threading.Thread(target=drive, args=(door, kinds, args.hostile_rate, until, tally))
                   for door, kinds in doors]
        for t in drivers:
            t.start()
        until.wait(max(0.0, t0 + args.seconds - time.monotonic()))
        until.set()
        hostile_s = time.monotonic() - hostile_start   # streams in flight then run on to their end
        for t in normal + drivers:
            t.join()
        for door, kinds in doors:
            if "http_stalled" in kinds:
                got = hostile.reap_stalled(door, final=True)
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
    res.update(calm_s=hostile_start - t0, hostile_s=hostile_s, tally=tally,
               calm_median_gap=statistics.median(calm_gaps) if calm_gaps else None,
               streams=[{k: v for k, v in r.items() if k not in ("stamps", "ids", "done_ids")} for r in streams])
    return res


def lines(res: dict) -> list[str]:
    """The report, from `run`'s result."""
    a, af = res["args"], res["after"]
    out = [f"soak: {a['seconds']:g} s asked; calm {res['calm_s']:.1f} s ({a['clients']} normal clients alone), hostile "
           f"{res['hostile_s']:.1f} s (beside them at most {a['hostile_rate']:g} hostile inputs/s a door); "
           f"{a['dtype']}, {a['max_tokens']} tokens a stream, speculation {'on' if a['spec'] else 'off'} for normal "
           f"streams, --max-message-bytes {a['max_message_bytes']}, HTTP {'off' if a['no_http'] else 'on'}",
           res["machine"], "",
           f"{'hostile kind':<18} {'sent':>5} {'replies':>7} {'unansw':>6} {'failed':>6} {'internal':>8}  "
           f"{'got (most common)':<42} expected"]
    for kind, r in res["tally"].items():
        got = ", ".join(f"{k} {n}" for k, n in r["got"].most_common(3)) or "-"
        internal = r["got"]["internal"] + r["got"]["500"]
        out.append(f"{kind:<18} {r['sent']:>5} {r['replies']:>7} {r['unanswered']:>6} {r['failed']:>6} "
                   f"{internal:>8}  {got:<42} {hostile.EXPECTED[kind]}")
        if r["failure"]:
            out.append(f"{'':<18} last unanswered or failed: {r['failure']}")
    sent = sum(r["sent"] for r in res["tally"].values())
    out += ["", f"faults survived: {sent} hostile inputs; server up at the end: {'yes' if af['alive'] else 'NO'}; "
            f"stats: {af['finished']}; a generate after: {af['generate']}"
            + (f"; an HTTP completion after: {af['http']}" if "http" in af else "")
            + f"; tracebacks in its log: {af['tracebacks']}; exit status after SIGTERM: {af['exit']}"]
    streams, calm = res["streams"], res["calm_median_gap"]
    exact = sum(r["exact"] for r in streams)
    out.append(f"normal streams exact: {exact} / {len(streams)} (token ids equal to the prompt's solo run); "
               f"failed: {sum(r['error'] is not None for r in streams)}")
    out.append(f"calm median gap: {calm * 1e3:.1f} ms" if calm else "calm median gap: none (no calm stream ended)")
    out.append(f"{'#':>3} {'client':>6} {'phase':<7} {'prompt':<12} {'tokens':>6} {'exact':<5} {'ttft s':>6} "
               f"{'gap med ms':>10} {'gap max ms':>10} {'max/calm med':>12}")
    ratios = {"calm": [], "hostile": []}
    for i, r in enumerate(streams):
        gaps = r["gaps"]
        med, top = (statistics.median(gaps), max(gaps)) if gaps else (float("nan"), float("nan"))
        ratio = top / calm if calm and gaps else float("nan")
        if gaps:
            ratios[r["phase"]].append(ratio)
        flag = "  past 3x" if ratio > FLAG_RATIO else ""
        ttft = f"{r['ttft']:6.2f}" if r["ttft"] is not None else f"{'-':>6}"
        out.append(f"{i:>3} {r['client']:>6} {r['phase']:<7} {r['prompt']:<12} {r['tokens']:>6} "
                   f"{'yes' if r['exact'] else 'NO':<5} {ttft} {med * 1e3:10.1f} {top * 1e3:10.1f} {ratio:12.2f}{flag}"
                   + (f"  error: {r['error']}" if r["error"] else ""))
    for phase, rs in ratios.items():
        if rs:
            out.append(f"{phase} streams with a max gap past {FLAG_RATIO:g}x the calm median: "
                       f"{sum(x > FLAG_RATIO for x in rs)} / {len(rs)}; max/calm median: median "
                       f"{statistics.median(rs):.2f}, largest {max(rs):.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=180.0, help="calm and hostile phases together (server start "
                   "and solo runs come on top)")
    p.add_argument("--calm", type=float, default=20.0, help="seconds of normal clients alone first (at most half "
                   "of --seconds; longer until each client has finished a stream)")
    p.add_argument("--clients", type=int, default=2, help="normal clients")
    p.add_argument("--prompts", type=int, default=3, help="normal prompts, taken in turn")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens of each normal stream (EOS ignored)")
    p.add_argument("--spec", action="store_true", help="normal streams with the server's drafter (several tokens "
                   "a round arrive back to back, so gaps mix rounds and bursts)")
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
    print("\n".join(lines(res)))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
