"""The target pass captured as a CUDA graph per row bucket, timed against the eager pass (issue 14).

For each row count r in `--rows` (every lane r rows: r = 1 is plain decode, r > 1 a verify pass of r - 1 drafts),
the pass's layout is built once with every shape fixed (`PassLayout.build(keys=capacity)`), the pass is captured
once, and each replay first copies another position's rows into the captured tensors (`RowBatch` tensors and
`PassLayout.refill_`), as an engine would every round. Printed per r: the eager pass (what runs today: it builds its
layout on the host every call), the replay, eager / replay, the replay's r-row pass against its 1-row pass, and
whether the replay's logits equal the eager pass's on the same rows (they must: the same kernels run).

    python -m speclane.bench.cuda_graphs [--model DIR] [--dtype bfloat16] [--lanes 1] [--rows 1 2 3 4 5 6 7 8]
        [--context 256] [--max-len 1024] [--reps 50] [--profile ROWS ...] [--json PATH]

Needs a CUDA device and claims nothing without one: it exits with code 2 saying so. `--dry-run` runs the same
steps on the CPU with the captured pass replaced by a call on the static tensors, which checks the script's
plumbing (refill, equality) and measures nothing about graphs (tests/bench/test_cuda_graphs.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from speclane.stages.models.layout import PassLayout
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target


def _batch(lanes: int, rows: int, start: int, vocab: int, seed: int, device) -> RowBatch:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (lanes, rows), generator=gen).tolist()
    return RowBatch.build([(lane, start, tokens[lane]) for lane in range(lanes)], device=device)


def _prefill(target: Target, state, lanes: int, context: int, device) -> None:
    batch = _batch(lanes, context, 0, target.cfg.vocab_size, seed=0, device=device)
    out = target.forward(batch, state, record="last", logits="last")
    target.commit(state, batch, torch.full((lanes,), context, dtype=torch.int64, device=device), out)


class Captured:
    """One row bucket's pass: static inputs, a fixed layout, and the graph (or, dry, a plain call on them)."""

    def __init__(self, target: Target, state, batch: RowBatch, dry: bool):
        self.target, self.state, self.batch, self.dry = target, state, batch, dry
        cap = Target.key_capacity(state)
        self.layout = PassLayout.build(batch, state.max_len, cap, keys=cap)
        self.graph, self.out = None, None
        if dry:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: kernel autotuning, the linear route's probes
            for _ in range(3):
                target.forward(batch, state, layout=self.layout)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = target.forward(batch, state, layout=self.layout)

    def load(self, batch: RowBatch) -> None:
        """Copy another pass's rows (same lanes and rows) into the captured tensors."""
        for name in ("tokens", "positions", "cu_rows", "slots"):
            getattr(self.batch, name).copy_(getattr(batch, name))
        cap = Target.key_capacity(self.state)
        self.layout.refill_(PassLayout.build(batch, self.state.max_len, cap, keys=cap))

    def run(self) -> torch.Tensor:
        if self.dry:
            return self.target.forward(self.batch, self.state, layout=self.layout).logits
        self.graph.replay()
        return self.out.logits


def _timed(fn, reps: int, sync) -> float:
    """Median ms of `reps` calls, each synchronised."""
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_table(fn, reps: int, device: torch.device, top: int = 12) -> str:
    """torch.profiler over `reps` calls of fn: the `top` operators and kernels by time on the device (by CPU time
    on a CPU), as torch prints them."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(reps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top)


def measure(
    target: Target,
    lanes: int,
    rows: tuple[int, ...],
    context: int,
    max_len: int,
    reps: int,
    dry: bool,
    profile_rows: tuple[int, ...] = (),
) -> list[dict]:
    device = target.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    state = target.new_state(slots=lanes, max_len=max_len)
    _prefill(target, state, lanes, context, device)
    vocab, results = target.cfg.vocab_size, []
    for r in rows:
        first = _batch(lanes, r, context, vocab, seed=r, device=device)
        graph = Captured(target, state, first, dry)
        other = _batch(lanes, r, context + r, vocab, seed=100 + r, device=device)  # another round's rows
        graph.load(other)
        replayed = graph.run().clone()
        eager_logits = target.forward(other, state).logits
        eager = _timed(lambda b=other: target.forward(b, state), reps, sync)
        replay = _timed(graph.run, reps, sync)
        results.append(
            {
                "rows": r,
                "lanes": lanes,
                "eager_ms": eager,
                "replay_ms": replay,
                "equal": bool(torch.equal(replayed, eager_logits)),
                "max_abs_diff": float((replayed - eager_logits).abs().max()),
            }
        )
        if r in profile_rows:  # where the replay's time goes, and the eager pass's beside it
            results[-1]["profile"] = {
                "replay": kernel_table(graph.run, 10, device),
                "eager": kernel_table(lambda b=other: target.forward(b, state), 10, device),
            }
        del graph
    one = next((x["replay_ms"] for x in results if x["rows"] == 1), None)
    for x in results:
        x["eager_over_replay"] = x["eager_ms"] / x["replay_ms"]
        x["replay_over_1row"] = x["replay_ms"] / one if one else None
    return results


def lines(results: list[dict], device: str, dry: bool) -> list[str]:
    kind = "DRY RUN on the CPU: no graph captured, nothing here is a GPU figure" if dry else f"device: {device}"
    out = [kind, "rows  lanes  eager ms  replay ms  eager/replay  replay/1-row  logits equal"]
    for x in results:
        rel = f"{x['replay_over_1row']:.2f}" if x["replay_over_1row"] is not None else "-"
        equal = "yes" if x["equal"] else f"NO (max {format(x['max_abs_diff'], '.3g')})"
        out.append(
            f"{x['rows']:>4}  {x['lanes']:>5}  {x['eager_ms']:8.3f}  {x['replay_ms']:9.3f}  "
            f"{x['eager_over_replay']:12.2f}  {rel:>12}  {equal}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclane.bench.cuda_graphs", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="target artifact (default: the embedded default model)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=list(range(1, 9)))
    ap.add_argument("--context", type=int, default=256, help="committed positions per lane before the passes")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None, help="also write the results to this path")
    ap.add_argument("--dry-run", action="store_true", help="the same steps on the CPU, no capture (a plumbing check)")
    ap.add_argument(
        "--profile",
        type=int,
        nargs="*",
        default=[],
        metavar="ROWS",
        help="for these row counts, torch.profiler's top operators and kernels over 10 replays and 10 eager passes",
    )
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "speclane.bench.cuda_graphs needs a CUDA device (torch.cuda.is_available() is False): nothing measured. "
            "--dry-run checks the script on the CPU.",
            file=sys.stderr,
        )
        return 2
    bad = [r for r in args.rows if not 1 <= r <= 64]
    if bad or args.lanes < 1 or args.context < 1 or args.context + 2 * max(args.rows) > args.max_len:
        ap.error(
            f"--rows must be 1..64 (got {bad or args.rows}), --lanes and --context >= 1, and --context + "
            f"2 x the widest row count within --max-len ({args.max_len})"
        )
    from speclane.stages.models.artifact import resolve

    device = "cpu" if args.dry_run else "cuda"
    target = Target.load(resolve(args.model), dtype=getattr(torch, args.dtype), device=device)
    with torch.no_grad():
        results = measure(
            target,
            args.lanes,
            tuple(args.rows),
            args.context,
            args.max_len,
            args.reps,
            args.dry_run,
            tuple(args.profile),
        )
    name = "cpu" if args.dry_run else torch.cuda.get_device_name()
    print("\n".join(lines(results, name, args.dry_run)))
    for x in results:
        for what, table in x.get("profile", {}).items():
            print(f"\n{x['rows']} row(s), {what}: the top operators and kernels over 10 calls\n{table}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": name,
                    "dry_run": args.dry_run,
                    "dtype": args.dtype,
                    "context": args.context,
                    "results": results,
                },
                f,
                indent=1,
            )
    return 0 if all(x["equal"] for x in results) else 1


if __name__ == "__main__":
    sys.exit(main())
