"""`speclane.bench.serve_load --mixed --fixed`: the same work with and without the step budget, timed to its end
(issue 16: "at no more than 10 % loss of aggregate throughput").

A set number of decoding requests (one a client, `--max-tokens` each, EOS ignored) start together; a set number
of long prompts (`--long-count` of `--long-tokens` ids, `--long-answer` tokens each) arrive on a fixed schedule
(the first `--long-after` s in, then every `--long-every` s), whatever the server does with them. A run ends when
the last request has ended, so each run does exactly the same work and its wall time says what it cost. One
server per budget, all started up front (an idle server only polls), runs alternating between them, the order
flipped each repeat; the ratio against the largest budget (the old behaviour when it is at least the long
prompt) is paired per repeat. Each repeat also runs the decoders alone on the first budget's server (no long
prompt): `p99/alone` is the decoders' p99 gap against that run's, the issue's "under 3x" measure.

    OMP_NUM_THREADS=1 taskset -c 1 python -m speclane.bench.serve_load --mixed --fixed --budgets 32 2000 --repeats 2
"""

from __future__ import annotations

import statistics
import threading
import time

from speclane.bench.serve_load import budget_flags, budget_rows, code_prompts, run_all, start_server, write_rows
from speclane.pipeline.cli.serve import stop
from speclane.pipeline.net.client import Client


def label(budget: str) -> str:
    """A `--budgets` entry as the table shows it: 0 is the serve's default budget."""
    return budget if budget == "alone" or budget_rows(budget) else "default" + budget[1:]


def long_request(endpoint: str, tokens: int, answer: int, at: float, out: list, errors: list, index: int = 0) -> None:
    """The `index`th long prompt, sent at perf_counter time `at`: its send, first token and end times. Each one's
    tokens are its own from the first (no prompt reads another's kept checkpoint or shares its pass's rows)."""
    ids = [1000 + (index * 613 + i) % 5000 for i in range(tokens)]  # prefill cost does not depend on the text
    try:
        with Client(endpoint, timeout=1800) as client:
            time.sleep(max(0.0, at - time.perf_counter()))
            t0 = time.perf_counter()
            stamps = [time.perf_counter() for _ in client.generate(prompt_ids=ids, max_tokens=answer, ignore_eos=True)]
            out.append({"start": t0, "first": stamps[0], "end": stamps[-1], "tokens": len(stamps)})
    except Exception as exc:  # noqa: BLE001 - reported after the run
        errors.append(exc)


def decode_request(endpoint: str, prompt: str, max_tokens: int, out: list, errors: list) -> None:
    try:
        with Client(endpoint, timeout=1800) as client:
            t0 = time.perf_counter()
            stream = client.generate(prompt=prompt, max_tokens=max_tokens, ignore_eos=True)
            out.append([t0] + [time.perf_counter() for _ in stream])
    except Exception as exc:  # noqa: BLE001 - reported after the run
        errors.append(exc)


def fixed_run(endpoint: str, prompts: list[str], args, long_count: int | None = None) -> dict:
    """The whole fixed work once against `endpoint` (`long_count` long prompts, default `--long-count`; 0: the
    decoders alone); its wall time, throughput and the decoders' gaps."""
    decoded, longs, errors = [], [], []
    long_count = args.long_count if long_count is None else long_count
    t0 = time.perf_counter()
    threads = [
        threading.Thread(target=decode_request, args=(endpoint, p, args.max_tokens, decoded, errors)) for p in prompts
    ]
    threads += [
        threading.Thread(
            target=long_request,
            args=(
                endpoint,
                args.long_tokens,
                args.long_answer,
                t0 + args.long_after + i * args.long_every,
                longs,
                errors,
                i,
            ),
        )
        for i in range(long_count)
    ]
    run_all(threads, errors)
    end = max([s[-1] for s in decoded] + [r["end"] for r in longs])
    wall = end - t0
    generated = sum(len(s) - 1 for s in decoded) + sum(r["tokens"] for r in longs)
    # gaps after each decoder's first token (its own prompt's prefill is its time to first token)
    gaps = sorted(b - a for s in decoded for a, b in zip(s[1:], s[2:]))
    return {
        "wall": wall,
        "generated": generated,
        "tok_per_s": generated / wall,
        "decoders_done": max(s[-1] for s in decoded) - t0,
        "gap_median": statistics.median(gaps),
        "gap_p99": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
        "gap_max": gaps[-1],
        "long_ttft": statistics.median(r["first"] - r["start"] for r in longs) if longs else float("nan"),
        "long_prompts": len(longs),
    }


def run_fixed(args) -> int:
    if args.long_count < 1 or args.long_answer < 1:
        raise SystemExit("--long-count and --long-answer must be >= 1 with --fixed (the long prompts are the point)")
    lanes = args.clients[0] + args.long_count  # no request waits in the queue
    prompts = code_prompts(args.clients[0], args.prompt_lines)
    servers = {b: start_server(args, lanes, *budget_flags(b)) for b in args.budgets}
    rows = []
    try:
        for rep in range(args.repeats):
            for budget in args.budgets if rep % 2 == 0 else args.budgets[::-1]:
                rows.append({"budget": budget, "repeat": rep, **fixed_run(servers[budget][1], prompts, args)})
            alone = fixed_run(servers[args.budgets[0]][1], prompts, args, long_count=0)
            rows.append({"budget": "alone", "repeat": rep, **alone})
    finally:
        for proc, _ in servers.values():
            stop(proc)
    print("\n".join(table(rows, args)))
    return write_rows(args.json, rows)


def table(rows: list[dict], args) -> list[str]:
    ref = max(args.budgets, key=budget_rows)
    out = [
        f"fixed work: {args.clients[0]} decoding requests x {args.max_tokens} tokens, {args.long_count} prompts of "
        f"{args.long_tokens} tokens x {args.long_answer} answer token(s) (at {args.long_after:g} s, then every "
        f"{args.long_every:g} s); {args.dtype}; medians over {args.repeats} repeat(s); /{ref}: paired per repeat "
        f"against budget {ref}",
        f"{'budget':>7} {'wall s':>7} {'tok/s':>6} {f'wall/{ref} [min, max]':>22} {'decoders done s':>15} "
        f"{'gap med s':>9} {'p99 s':>6} {'max s':>6} {'p99/alone':>9} {'long ttft s':>11}",
    ]
    alone = [r for r in rows if r["budget"] == "alone"]
    for budget in [*args.budgets, "alone"]:
        sel = [r for r in rows if r["budget"] == budget]
        if not sel:
            continue
        pairs = [r["wall"] / o["wall"] for r in sel for o in rows if o["budget"] == ref and o["repeat"] == r["repeat"]]
        # the decoders' p99 against their own run alone in the same repeat
        p99 = [r["gap_p99"] / a["gap_p99"] for r in sel for a in alone if a["repeat"] == r["repeat"]]
        med = {k: statistics.median(r[k] for r in sel) for k in sel[0] if k not in ("budget", "repeat")}
        wall = (
            f"{statistics.median(pairs):10.3f} [{min(pairs):.2f}, {max(pairs):.2f}]"
            if budget != "alone"
            else f"{'-':>22}"
        )
        out.append(
            f"{label(budget):>7} {med['wall']:7.1f} {med['tok_per_s']:6.2f} {wall} {med['decoders_done']:15.1f} "
            f"{med['gap_median']:9.3f} {med['gap_p99']:6.2f} {med['gap_max']:6.2f} "
            f"{statistics.median(p99):9.2f} {med['long_ttft']:11.1f}"
        )
    return out
