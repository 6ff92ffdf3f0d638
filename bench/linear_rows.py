"""Cost of a linear layer per row count, relative to one row, measured side by side in one run.

Prints, per dtype and shape, the median time of plain `F.linear` on M rows, of the torch twin of the decode route
(`decode_linear_ref`: rows padded to 8-row chunks), of the C kernel (`decode_linear_cpu`, where it is built; and
its AVX2 build, `c-avx2`, where the CPU runs a better one) and of a loop of 1-row calls, each divided by plain
`F.linear` on 1 row. Calls are interleaved round-robin so that a
neighbour's load on the shared cores hits every configuration alike. `--wide` instead times one prefill-sized
product (256 rows) in the weight's dtype against widened to float32 (kernels/wide_linear.py's choice).

    OMP_NUM_THREADS=1 python -m speclane.bench.linear_rows [--reps 15] [--threads 1] [--wide]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from speclane.kernels import cpu_build
from speclane.kernels.decode_linear import decode_linear_cpu, decode_linear_ref

SHAPES = ((576, 1536), (1536, 576), (576, 49152))  # SmolLM2-135M: attention/MLP in/out, and the LM head
ROWS = (1, 2, 4, 8, 9, 16, 24, 32)


def measure(dtype: torch.dtype, k: int, n: int, reps: int) -> dict[tuple[str, int], float]:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    x = torch.randn(max(ROWS), k, generator=g).to(dtype)
    calls = {("plain", m): (lambda m=m: F.linear(x[:m], w)) for m in ROWS}
    calls.update({("decode", m): (lambda m=m: decode_linear_ref(x[:m], w)) for m in ROWS})
    if cpu_build.library() is not None:
        calls.update({("c", m): (lambda m=m: decode_linear_cpu(x[:m], w)) for m in ROWS})
        if cpu_build.isa() != "avx2" and "avx2" in cpu_build.isas():  # the AVX2 build beside the best one
            calls.update(
                {("c-avx2", m): (lambda m=m: _on_build("avx2", lambda: decode_linear_cpu(x[:m], w))) for m in ROWS}
            )
    # the alternative exact scheme: one gemv per row (what a 1-row decode call does)
    calls.update({("rowloop", m): (lambda m=m: [F.linear(x[i : i + 1], w) for i in range(m)]) for m in ROWS})
    return interleaved(calls, reps)


def _on_build(isa: str, fn):
    """fn() on another build of the C kernels (kernels/cpu_build.py), the best one restored after."""
    best = cpu_build.library()
    cpu_build._LIB = cpu_build.variant(isa)
    try:
        return fn()
    finally:
        cpu_build._LIB = best


def interleaved(calls: dict, reps: int) -> dict:
    """Median seconds of each call, the calls run round robin `reps` times after one warm-up call each (the
    first calls pay oneDNN/MKL kernel selection)."""
    times: dict = {key: [] for key in calls}
    for fn in calls.values():
        fn()
    for _ in range(reps):
        for key, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(v) for key, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wide", action="store_true", help="time a 256-row product native against widened to float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()}, threads "
        f"{torch.get_num_threads()}, reps {args.reps} (median); C kernels: {cpu_build.unavailable() or 'built'}"
        f" ({cpu_build.isa()})"
    )
    if args.wide:
        return wide(args.reps)
    for dtype in (torch.bfloat16, torch.float32):
        for k, n in SHAPES:
            med = measure(dtype, k, n, args.reps)
            base = med[("plain", 1)]
            print(f"\n{str(dtype).removeprefix('torch.')} {k}->{n}: plain 1 row = {base * 1e3:.3f} ms")
            names = [n for n in ("plain", "decode", "c", "c-avx2", "rowloop") if (n, 1) in med]
            print("rows   " + "   ".join(f"{n}/1row" for n in names))
            for m in ROWS:
                print(f"{m:4d}   " + "   ".join(f"{med[(n, m)] / base:{len(n) + 5}.2f}" for n in names))


def wide(reps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for k, n in SHAPES[:2]:
        x, w = torch.randn(256, k, generator=g).bfloat16(), (torch.randn(n, k, generator=g) * 0.05).bfloat16()
        med = interleaved(
            {"bf16": lambda: F.linear(x, w), "widened": lambda: F.linear(x.float(), w.float()).bfloat16()}, reps
        )
        print(
            f"256 x {k} -> {n}: bf16 {med['bf16'] * 1e3:.2f} ms, widened to float32 {med['widened'] * 1e3:.2f} ms "
            f"({med['bf16'] / med['widened']:.2f}x)"
        )


if __name__ == "__main__":
    main()
