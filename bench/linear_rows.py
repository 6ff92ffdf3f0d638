"""Cost of a linear layer per row count, relative to one row, measured side by side in one run.

Prints, per dtype and shape, the median time of plain `F.linear` on M rows and of `kernels.decode_linear`
(rows padded to 8-row chunks) on M rows and of a loop of 1-row calls, each divided by plain `F.linear` on 1 row. Calls are interleaved
round-robin so that a neighbour's load on the shared cores hits every configuration alike.

    OMP_NUM_THREADS=1 python -m bench.linear_rows [--reps 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kernels.decode_linear import decode_linear_ref

SHAPES = ((576, 1536), (1536, 576), (576, 49152))  # SmolLM2-135M: attention/MLP in/out, and the LM head
ROWS = (1, 2, 4, 8, 9, 16, 24, 32)


def measure(dtype: torch.dtype, k: int, n: int, reps: int) -> dict[tuple[str, int], float]:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    x = torch.randn(max(ROWS), k, generator=g).to(dtype)
    calls = {("plain", m): (lambda m=m: F.linear(x[:m], w)) for m in ROWS}
    calls.update({("decode", m): (lambda m=m: decode_linear_ref(x[:m], w)) for m in ROWS})
    # the alternative exact scheme: one gemv per row (what a 1-row decode call does)
    calls.update({("rowloop", m): (lambda m=m: [F.linear(x[i : i + 1], w) for i in range(m)]) for m in ROWS})
    times: dict[tuple[str, int], list[float]] = {key: [] for key in calls}
    for fn in calls.values():  # warm-up: first calls pay oneDNN/MKL kernel selection
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
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, reps {args.reps} (median)")
    for dtype in (torch.bfloat16, torch.float32):
        for k, n in SHAPES:
            med = measure(dtype, k, n, args.reps)
            base = med[("plain", 1)]
            print(f"\n{str(dtype).removeprefix('torch.')} {k}->{n}: plain 1 row = {base * 1e3:.3f} ms")
            print("rows   plain/1row   decode_linear/1row   rowloop/1row")
            for m in ROWS:
                r = [med[(name, m)] / base for name in ("plain", "decode", "rowloop")]
                print(f"{m:4d}   {r[0]:10.2f}   {r[1]:18.2f}   {r[2]:12.2f}")


if __name__ == "__main__":
    main()
