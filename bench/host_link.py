"""The slow tier's link on a GPU machine: host-to-device copies from pinned memory at an expert's sizes, and whether
a copy on a side stream overlaps a matrix product on the default stream.

What an expert cache on a GPU pays a miss is one such copy (gate, up and down of one expert: a few MB for the MoE
models people run), so a machine profile's link rate should be this figure, not the bus's nominal one.

    python -m speclane.bench.host_link [--sizes-mb 0.5 1.5 6 24 96]

Needs a CUDA device and claims nothing without one (exit code 2).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

POOL = 1 << 30  # bytes of pinned host memory the copies walk through, so no copy reads what the last one read


def copy_rates(sizes_mb: list[float]) -> list[tuple[float, int, float]]:
    """(MB, copies, GB/s) per size: back-to-back asynchronous copies from pinned memory, after three warm-ups."""
    host = torch.empty(POOL, dtype=torch.uint8).pin_memory()
    dst = torch.empty(POOL, dtype=torch.uint8, device="cuda")
    out = []
    for mb in sizes_mb:
        n, reps = int(mb * (1 << 20)), max(4, int(512 / mb))
        for _ in range(3):
            dst[:n].copy_(host[:n], non_blocking=True)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(reps):
            off = (i * n) % (POOL - n)
            dst[off : off + n].copy_(host[off : off + n], non_blocking=True)
        torch.cuda.synchronize()
        out.append((mb, reps, reps * n / (time.perf_counter() - t) / 1e9))
    return out


def overlap(copy_mb: int = 256, products: int = 20) -> tuple[float, float, float]:
    """(compute ms, copy ms, both ms): `products` 8192^3 bf16 products alone, one copy alone, then the copy on a
    side stream issued before the products. both close to max(compute, copy) means the copy engine overlaps."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    host = torch.empty(copy_mb << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(host, device="cuda")

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    def compute():
        for _ in range(products):
            a @ a

    def both():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            dst.copy_(host, non_blocking=True)
        compute()

    compute()  # warm-up: cuBLAS picks its kernel
    return timed(compute), timed(lambda: dst.copy_(host, non_blocking=True)), timed(both)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclane.bench.host_link", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[0.5, 1.5, 6, 24, 96])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("speclane.bench.host_link needs a CUDA device: nothing measured.", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    for mb, reps, rate in copy_rates(args.sizes_mb):
        each_us = mb * (1 << 20) / rate / 1e3
        print(f"host to device, pinned, {mb:6.1f} MB x {reps}: {rate:6.1f} GB/s, {each_us:8.1f} us each")
    c, x, both = overlap()
    print(f"compute {c:.1f} ms, copy 256 MB {x:.1f} ms, the copy on a side stream beside the compute {both:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
