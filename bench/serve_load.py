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
    OMP_NUM_THREADS=1 python -m speclane.bench.serve_load --mixed --fixed --budgets 32 2000 --repeats 2  # timed

Owns the command line, the prompts, the server start and the on/off load. Not here: the `--mixed` workload
(bench/serve_mixed.py) and its `--fixed` mode (bench/serve_fixed.py).
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

STDLIB_FILES = (
    "json/encoder.py",
    "csv.py",
    "textwrap.py",
    "shlex.py",
    "fractions.py",
    "calendar.py",
    "heapq.py",
    "bisect.py",
)


def code_prompts(n: int, lines: int) -> list[str]:
    """`n` chunks of `lines` lines from stdlib modules: real code nobody here wrote."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for i in range(n):
        text = (root / STDLIB_FILES[i % len(STDLIB_FILES)]).read_text().splitlines()
        start = min(len(text) - lines, 40 + 17 * (i // len(STDLIB_FILES)))
        out.append("\n".join(text[max(0, start) : start + lines]) + "\n")
    return out


def one_request(endpoint: str, prompt: str, spec_on: bool, max_tokens: int, out: list, errors: list) -> None:
    try:
        with Client(endpoint, timeout=600) as client:
            t0 = time.perf_counter()
            stream = client.generate(prompt=prompt, max_tokens=max_tokens, ignore_eos=True, spec={"enabled": spec_on})
            stamps = [time.perf_counter() for _ in stream]
            out.append(
                {
                    "ttft": stamps[0] - t0,
                    "tokens": len(stamps),
                    "start": t0,
                    "end": stamps[-1],
                    "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
                    "tokens_per_round": stream.done.spec["tokens_per_round"],
                }
            )
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
    run_all(
        [threading.Thread(target=one_request, args=(endpoint, p, spec_on, max_tokens, out, errors)) for p in prompts],
        errors,
    )
    wall = max(r["end"] for r in out) - min(r["start"] for r in out)
    return {
        "aggregate_tps": sum(r["tokens"] for r in out) / wall,
        "ttft_median": statistics.median(r["ttft"] for r in out),
        "decode_tps_median": statistics.median(r["decode_tps"] for r in out),
        "tokens_per_round": statistics.mean(r["tokens_per_round"] for r in out),
    }


def budget_rows(budget: int | str) -> int:
    """The rows of a `--budgets` entry ("8", "0", "8/2": 8 rows, two passes a step)."""
    return int(str(budget).split("/")[0])


def budget_flags(budget: int | str) -> tuple[str, ...]:
    """The serve flags of a `--budgets` entry: that many rows a step, or 0 for the serve's default; a "/2" after
    the rows: a prefill pass and then the round each step (`--no-one-pass-steps`), else one pass."""
    rows = budget_rows(budget)
    two = ("--no-one-pass-steps",) if str(budget).endswith("/2") else ()
    return (("--prefill-rows", str(rows)) if rows else ()) + two


def start_server(args, lanes: int, *extra: str) -> tuple:
    flags = ["--max-lanes", str(lanes), "--dtype", args.dtype, "--spec-backend", args.spec_backend, *extra]
    if args.spec_draft_rows is not None:
        flags += ["--spec-draft-rows", str(args.spec_draft_rows)]
    log = Path(tempfile.mkdtemp(prefix="serve_load_")) / "serve.log"
    return spawn(log, *flags)


def write_rows(path: Path | None, rows: list[dict]) -> int:
    """Also write the rows as JSON lines where --json asks; the exit status."""
    if path is not None:
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


def add_mixed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mixed",
        action="store_true",
        help="the fairness workload (see the module's doc); starts its own server for each budget (no --connect)",
    )
    p.add_argument(
        "--budgets",
        nargs="+",
        default=["32", "2000"],
        help="--prefill-rows of each server (--mixed); one >= --long-tokens is the old behaviour; 0 the serve's "
        "default (the measured fair budget for each prompt being read); ROWS/2: that budget with a prefill pass "
        "and then the round each step (--no-one-pass-steps)",
    )
    p.add_argument("--long-tokens", type=int, default=2000, help="the long prompt's tokens (--mixed)")
    p.add_argument("--long-every", type=float, default=5.0, help="seconds between long prompts (--mixed)")
    p.add_argument("--long-after", type=float, default=2.0, help="seconds before the first long prompt (--mixed)")
    p.add_argument(
        "--fixed",
        action="store_true",
        help="with --mixed: a fixed amount of work timed to its end, every budget alternating (bench/serve_fixed.py)",
    )
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
        from speclane.bench.serve_mixed import run_mixed

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
                for spec_on in (True, False) if rep % 2 == 0 else (False, True):
                    rows.append(
                        {
                            "clients": n,
                            "spec": spec_on,
                            "repeat": rep,
                            **run_batch(endpoint, prompts, spec_on, args.max_tokens),
                        }
                    )
    finally:
        if proc is not None:
            stop(proc)
    print(
        f"{'clients':>7} {'spec':>4} {'agg tok/s':>9} {'ttft s':>7} {'decode tok/s':>12} {'tau':>5} "
        f"on/off paired: median [min, max] over repeats"
    )
    for n in args.clients:
        med = {
            on: statistics.median(r["aggregate_tps"] for r in rows if r["clients"] == n and r["spec"] is on)
            for on in (True, False)
        }
        # each repeat ran on and off back to back: its own ratio, so drift between repeats cancels
        pairs = [
            on["aggregate_tps"] / off["aggregate_tps"]
            for on, off in zip(*([r for r in rows if r["clients"] == n and r["spec"] is m] for m in (True, False)))
        ]
        for on in (True, False):
            sel = [r for r in rows if r["clients"] == n and r["spec"] is on]
            ratio = f"{statistics.median(pairs):6.2f} [{min(pairs):.2f}, {max(pairs):.2f}]" if on else ""
            print(
                f"{n:>7} {'on' if on else 'off':>4} {med[on]:9.1f} "
                f"{statistics.median(r['ttft_median'] for r in sel):7.2f} "
                f"{statistics.median(r['decode_tps_median'] for r in sel):12.1f} "
                f"{statistics.mean(r['tokens_per_round'] for r in sel):5.2f} {ratio}"
            )
    return write_rows(args.json, rows)


if __name__ == "__main__":
    sys.exit(main())
