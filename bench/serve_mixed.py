"""`speclane.bench.serve_load --mixed`: fairness under long prompts. Decoding clients stream answers while one more
client sends a long prompt every few seconds; the decoding clients' gaps between tokens (median, p99, max), their
aggregate tokens/s and the long prompts' time to first token, side by side for each step budget
(`serve --prefill-rows`) and the old behaviour (the budget as long as the prompt), each against the same clients
with no long prompts. One server per budget; in each repeat the runs with and without long prompts alternate.

Not here: the command line, the prompts and the server start (bench/serve_load.py), the same work timed to its
end (`--fixed`, bench/serve_fixed.py).
"""

from __future__ import annotations

import statistics
import threading
import time

from speclane.bench.serve_load import budget_flags, budget_rows, code_prompts, start_server, write_rows
from speclane.pipeline.cli.serve import stop
from speclane.pipeline.net.client import Client


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
    threads = [
        threading.Thread(target=decode_client, args=(endpoint, p, args.max_tokens, out, errors)) for p in prompts
    ]
    sender = threading.Thread(
        target=long_sender, args=(endpoint, args.long_tokens, args.long_every, until, ttfts, errors)
    )
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
    return {
        "gap_median": statistics.median(gaps),
        "gap_p99": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
        "gap_max": gaps[-1],
        "decode_tps": sum(len(s) - 1 for s in out) / wall,
        # all the work done in the window: decoded tokens and the long prompts' rows
        "rows_per_s": (sum(len(s) - 1 for s in out) + len(ttfts) * args.long_tokens) / wall,
        "long_ttft": statistics.median(ttfts) if ttfts else float("nan"),
        "long_prompts": len(ttfts),
    }


def run_mixed(args) -> int:
    rows = []
    for budget in args.budgets:
        # a lane for each decoder and one for the long prompts: no one waits in the queue
        proc, endpoint = start_server(args, args.clients[0] + 1, *budget_flags(budget))
        try:
            for rep in range(args.repeats):
                for with_long in (False, True) if rep % 2 == 0 else (True, False):
                    rows.append(
                        {"budget": budget, "long": with_long, "repeat": rep, **mixed_batch(endpoint, args, with_long)}
                    )
        finally:
            stop(proc)
    whole = [b for b in args.budgets if budget_rows(b) >= args.long_tokens]
    print(
        f"{args.clients[0]} decoding clients x {args.max_tokens} tokens; a {args.long_tokens}-token prompt every "
        f"{args.long_every:g} s; {args.dtype}; medians over {args.repeats} repeat(s); /alone: against the same "
        f"server's run without long prompts; /whole: against the largest budget's run with them"
    )
    print(
        f"{'budget':>14} {'long':>4} {'gap med s':>9} {'p99 s':>7} {'max s':>7} {'p99/alone':>9} "
        f"{'tok/s':>6} {'tok/s/alone':>11} {'rows/s':>7} {'rows/s/whole':>12} {'long ttft s':>11} {'#long':>5}"
    )
    ref = [r for r in rows if r["long"] and r["budget"] == max(args.budgets, key=budget_rows)]
    for budget in args.budgets:
        alone = [r for r in rows if r["budget"] == budget and not r["long"]]
        for with_long in (False, True):
            sel = [r for r in rows if r["budget"] == budget and r["long"] is with_long]
            med = {k: statistics.median(r[k] for r in sel) for k in sel[0]}
            base = {k: statistics.median(r[k] for r in alone) for k in ("gap_p99", "decode_tps")}
            name = f"{budget}" + (" (whole)" if budget in whole else "")
            print(
                f"{name:>14} {'yes' if with_long else 'no':>4} {med['gap_median']:9.3f} {med['gap_p99']:7.3f} "
                f"{med['gap_max']:7.3f} {med['gap_p99'] / base['gap_p99']:9.2f} {med['decode_tps']:6.2f} "
                f"{med['decode_tps'] / base['decode_tps']:11.2f} {med['rows_per_s']:7.1f} "
                f"{med['rows_per_s'] / statistics.median(r['rows_per_s'] for r in ref):12.2f} {med['long_ttft']:11.2f} "
                f"{sum(r['long_prompts'] for r in sel):5d}"
            )
    return write_rows(args.json, rows)
