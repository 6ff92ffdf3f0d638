"""Serving load: aggregate tokens per second and time to first token at 1, 2, 4 and 8 concurrent clients, with
speculation on (the server's drafter) and off, measured side by side in one run against one server; on/off is
the median of each repeat's own ratio (paired).

`--mixed`: fairness under long prompts instead. Decoding clients stream answers while one more client sends a
long prompt every few seconds; the decoding clients' gaps between tokens (median, p99, max), their aggregate
tokens/s and the long prompts' time to first token, side by side for each step budget (`serve --prefill-rows`)
and the old behaviour (the budget as long as the prompt), each against the same clients with no long prompts.

Speculation is switched per request (`"spec": {"enabled": false}`), so both modes share the process, model,
prompts and sampling; at each client count the modes alternate, on first in even repeats and off first in odd
ones. Prompts are chunks of the Python standard library's own source (predictable code).

    OMP_NUM_THREADS=1 python -m speclane.bench.serve_load                       # starts its own server
    OMP_NUM_THREADS=1 python -m speclane.bench.serve_load --connect tcp://127.0.0.1:5557 --clients 1 2
    OMP_NUM_THREADS=1 python -m speclane.bench.serve_load --mixed --budgets 32 2000   # one server per budget
    OMP_NUM_THREADS=1 python -m speclane.bench.serve_load --mixed --fixed --budgets 32 2000 --repeats 2  # same work, timed
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from speclane.pipeline.cli.serve import spawn, stop
from speclane.pipeline.net.client import Client

STDLIB_FILES = ("json/encoder.py", "csv.py", "textwrap.py", "shlex.py", "fractions.py", "calendar.py",
                "heapq.py", "bisect.py")


def code_prompts(n: int, lines: int) -> list[str]:
    """`n` chunks of `lines` lines from stdlib modules: real code nobody here wrote."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for i in range(n):
        text = (root / STDLIB_FILES[i % len(STDLIB_FILES)]).read_text().splitlines()
        start = min(len(text) - lines, 40 + 17 * (i // len(STDLIB_FILES)))
        out.append("\n".join(text[max(0, start):start + lines]) + "\n")
    return out


def one_request(endpoint: str, prompt: str, spec_on: bool, max_tokens: int, out: list, errors: list) -> None:
    try:
        with Client(endpoint, timeout=600) as client:
            t0 = time.perf_counter()
            stream = client.generate(prompt=prompt, max_tokens=max_tokens, ignore_eos=True,
                                     spec={"enabled": spec_on})
            stamps = [time.perf_counter() for _ in stream]
            out.append({"ttft": stamps[0] - t0, "tokens": len(stamps), "start": t0, "end": stamps[-1],
                        "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
                        "tokens_per_round": stream.done.spec["tokens_per_round"]})
    except Exception as exc:  # noqa: BLE001 - reported after the batch
        errors.append(exc)


def run_all(threads: list[threading.Thread], errors: list) -> None:
    """Start the request threads, wait for all of them, and raise the first failure (after the batch)."""
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed: {errors[0]!r}")


def run_batch(endpoint: str, prompts: list[str], spec_on: bool, max_tokens: int) -> dict:
    out, errors = [], []
    run_all([threading.Thread(target=one_request, args=(endpoint, p, spec_on, max_tokens, out, errors))
             for p in prompts], errors)
    wall = max(r["end"] for r in out) - min(r["start"] for r in out)
    return {"aggregate_tps": sum(r["tokens"] for r in out) / wall,
            "ttft_median": statistics.median(r["ttft"] for r in out),
            "decode_tps_median": statistics.median(r["decode_tps"] for r in out),
            "tokens_per_round": statistics.mean(r["tokens_per_round"] for r in out)}


def start_server(args, lanes: int, *extra: str) -> tuple:
    flags = ["--max-lanes", str(lanes), "--dtype", args.dtype,
             "--spec-backend", args.spec_backend, *extra]
    if args.spec_draft_rows is not None:
        flags += ["--spec-draft-rows", str(args.spec_draft_rows)]
    log = Path(tempfile.mkdtemp(prefix="serve_load_")) / "serve.log"
    return spawn(log, *flags)


def write_rows(path: Path | None, rows: list[dict]) -> int:
    """Also write the rows as JSON lines where --json asks; the exit status."""
    if path is not None:
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


# --- --mixed: long prompts arriving while other clients stream ----------------------------------------------
def decode_client(endpoint: str, prompt: str, max_tokens: int, out: list, errors: list) -> None:
    try:
        with Client(endpoint, timeout=600) as client:
            stream = client.generate(prompt=prompt, max_tokens=max_tokens, ignore_eos=True)
            out.append([time.perf_counter() for _ in stream])
    except Exception as exc:  # noqa: BLE001 - reported after the batch
        errors.append(exc)


def long_sender(endpoint: str, tokens: int, every: float, until: threading.Event, ttfts: list, errors: list) -> None:
    """A prompt of `tokens` ids (a repeating run of ordinary ids: prefill cost does not depend on the text), one
    answer token each, sent `every` seconds (or as soon as the last one ended) until the decoders are done."""
    ids = [1000 + i % 5000 for i in range(tokens)]
    try:
        with Client(endpoint, timeout=600) as client:
            while not until.wait(0.0 if not ttfts else max(0.0, every - ttfts[-1])):
                t0 = time.perf_counter()
                client.generate(prompt_ids=ids, max_tokens=1).wait()
                ttfts.append(time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


def mixed_batch(endpoint: str, args, with_long: bool) -> dict:
    prompts = code_prompts(args.clients[0], args.prompt_lines)
    out, errors, ttfts, until = [], [], [], threading.Event()
    threads = [threading.Thread(target=decode_client, args=(endpoint, p, args.max_tokens, out, errors))
               for p in prompts]
    sender = threading.Thread(target=long_sender, args=(endpoint, args.long_tokens, args.long_every, until,
                                                         ttfts, errors))
    for t in threads:
        t.start()
    if with_long:
        time.sleep(args.long_after)  # the decoders are streaming when the first long prompt comes
        sender.start()
    for t in threads:
        t.join()
    until.set()
    if with_long:
        sender.join()
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed: {errors[0]!r}")
    # gaps after each decoder's first token (its own prompt's prefill is time to first token, not a gap)
    gaps = sorted(b - a for stamps in out for a, b in zip(stamps, stamps[1:]))
    wall = max(s[-1] for s in out) - min(s[0] for s in out)
    return {"gap_median": statistics.median(gaps), "gap_p99": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
            "gap_max": gaps[-1], "decode_tps": sum(len(s) - 1 for s in out) / wall,
            # all the work done in the window: decoded tokens and the long prompts' rows
            "rows_per_s": (sum(len(s) - 1 for s in out) + len(ttfts) * args.long_tokens) / wall,
            "long_ttft": statistics.median(ttfts) if ttfts else float("nan"), "long_prompts": len(ttfts)}


def run_mixed(args) -> int:
    rows = []
    for budget in args.budgets:
        # a lane for each decoder and one for the long prompts: no one waits in the queue
        proc, endpoint = start_server(args, args.clients[0] + 1, "--prefill-rows", str(budget))
        try:
            for rep in range(args.repeats):
                for with_long in ((False, True) if rep % 2 == 0 else (True, False)):
                    rows.append({"budget": budget, "long": with_long, "repeat": rep,
                                 **mixed_batch(endpoint, args, with_long)})
        finally:
            stop(proc)
    whole = [b for b in args.budgets if b >= args.long_tokens]
    print(f"{args.clients[0]} decoding clients x {args.max_tokens} tokens; a {args.long_tokens}-token prompt every "
          f"{args.long_every:g} s; {args.dtype}; medians over {args.repeats} repeat(s); /alone: against the same "
          f"server's run without long prompts; /whole: against the largest budget's run with them")
    print(f"{'budget':>14} {'long':>4} {'gap med s':>9} {'p99 s':>7} {'max s':>7} {'p99/alone':>9} "
          f"{'tok/s':>6} {'tok/s/alone':>11} {'rows/s':>7} {'rows/s/whole':>12} {'long ttft s':>11} {'#long':>5}")
    ref = [r for r in rows if r["long"] and r["budget"] == max(args.budgets)]
    for budget in args.budgets:
        alone = [r for r in rows if r["budget"] == budget and not r["long"]]
        for with_long in (False, True):
            sel = [r for r in rows if r["budget"] == budget and r["long"] is with_long]
            med = {k: statistics.median(r[k] for r in sel) for k in sel[0]}
            base = {k: statistics.median(r[k] for r in alone) for k in ("gap_p99", "decode_tps")}
            name = f"{budget}" + (" (whole)" if budget in whole else "")
            print(f"{name:>14} {'yes' if with_long else 'no':>4} {med['gap_median']:9.3f} {med['gap_p99']:7.3f} "
                  f"{med['gap_max']:7.3f} {med['gap_p99'] / base['gap_p99']:9.2f} {med['decode_tps']:6.2f} "
                  f"{med['decode_tps'] / base['decode_tps']:11.2f} {med['rows_per_s']:7.1f} "
                  f"{med['rows_per_s'] / statistics.median(r['rows_per_s'] for r in ref):12.2f} {med['long_ttft']:11.2f} "
                  f"{sum(r['long_prompts'] for r in sel):5d}")
    return write_rows(args.json, rows)


def add_mixed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mixed", action="store_true", help="the fairness workload (see the module's doc); starts "
                   "its own server for each budget (no --connect)")
    p.add_argument("--budgets", type=int, nargs="+", default=[32, 2000],
                   help="--prefill-rows of each server (--mixed); one >= --long-tokens is the old behaviour")
    p.add_argument("--long-tokens", type=int, default=2000, help="the long prompt's tokens (--mixed)")
    p.add_argument("--long-every", type=float, default=5.0, help="seconds between long prompts (--mixed)")
    p.add_argument("--long-after", type=float, default=2.0, help="seconds before the first long prompt (--mixed)")
    p.add_argument("--fixed", action="store_true", help="with --mixed: a fixed amount of work timed to its end, "
                   "every budget alternating (bench/serve_fixed.py)")
    p.add_argument("--long-count", type=int, default=3, help="long prompts in all (--mixed --fixed)")
    p.add_argument("--long-answer", type=int, default=1, help="each long prompt's answer tokens (--mixed --fixed)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connect", default=None, help="an already running server (default: start one)")
    p.add_argument("--clients", type=int, nargs="+", default=None, help="default 1 2 4 8 (--mixed: 4)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 32 (--mixed: 128)")
    p.add_argument("--prompt-lines", type=int, default=30)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--spec-backend", default="ngram")
    p.add_argument("--spec-draft-rows", type=int, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    add_mixed_flags(p)
    args = p.parse_args(argv)
    if args.fixed and not args.mixed:
        p.error("--fixed is a mode of --mixed: pass both")
    if args.mixed:
        args.clients, args.max_tokens = args.clients or [4], args.max_tokens or 128
        if args.fixed:
            from speclane.bench.serve_fixed import run_fixed

            return run_fixed(args)
        return run_mixed(args)
    args.clients, args.max_tokens = args.clients or [1, 2, 4, 8], args.max_tokens or 32
    proc = None
    endpoint = args.connect
    if endpoint is None:
        proc, endpoint = start_server(args, max(args.clients))
    rows = []
    try:
        for n in args.clients:
            prompts = code_prompts(n, args.prompt_lines)
            for rep in range(args.repeats):
                for spec_on in ((True, False) if rep % 2 == 0 else (False, True)):
                    rows.append({"clients": n, "spec": spec_on, "repeat": rep,
                                 **run_batch(endpoint, prompts, spec_on, args.max_tokens)})
    finally:
        if proc is not None:
            stop(proc)
    print(f"{'clients':>7} {'spec':>4} {'agg tok/s':>9} {'ttft s':>7} {'decode tok/s':>12} {'tau':>5} "
          f"on/off paired: median [min, max] over repeats")
    for n in args.clients:
        med = {on: statistics.median(r["aggregate_tps"] for r in rows if r["clients"] == n and r["spec"] is on)
               for on in (True, False)}
        # each repeat ran on and off back to back: its own ratio, so drift between repeats cancels
        pairs = [on["aggregate_tps"] / off["aggregate_tps"] for on, off in
                 zip(*([r for r in rows if r["clients"] == n and r["spec"] is m] for m in (True, False)))]
        for on in (True, False):
            sel = [r for r in rows if r["clients"] == n and r["spec"] is on]
            ratio = (f"{statistics.median(pairs):6.2f} [{min(pairs):.2f}, {max(pairs):.2f}]" if on else "")
            print(f"{n:>7} {'on' if on else 'off':>4} {med[on]:9.1f} "
                  f"{statistics.median(r['ttft_median'] for r in sel):7.2f} "
                  f"{statistics.median(r['decode_tps_median'] for r in sel):12.1f} "
                  f"{statistics.mean(r['tokens_per_round'] for r in sel):5.2f} {ratio}")
    return write_rows(args.json, rows)


if __name__ == "__main__":
    sys.exit(main())
