"""Where a target pass's time goes, route against route, and how far each row count is from the machine's limit.

Routes, each a target of its own, passes alternated so a neighbour's load hits all alike: `c-layer` (the C kernels,
a dense layer in one call: what runs), `c` (the same kernels called op by op, which is what the parts are timed
on), `c-rowmajor` (a dense layer in one call over row-major weights: the route before packed weights, where the
build packs; kernels/packed.py), `c-vdp` (on the amx build's CPU: `c-layer` on the avx512bf16 build, VDPBF16PS
where the tiles would sum), `c-avx2` (row-major, op by op, on the AVX2 build where the CPU runs a better
one) and `torch` (the twins a machine without a C compiler runs). One lane at a fixed committed length.

Per row count: the median pass time and its parts (the output head, the decoder's linears, attention over the
cache, and the rest: norms, RoPE, activations, cache writes, layout, Python), each pass's ratio to the 1-row pass
of its route, and the limit of the pass on this machine: max(bytes read / read bandwidth, FLOPs / compute peak),
both measured in the run (a large tensor copy; the packed kernel on an L1-resident weight at 8 rows). Then the
prefill of one long prompt per route.

    OMP_NUM_THREADS=1 python -m speclane.bench.pass_parts [--model DIR] [--dtype bfloat16] [--context 256] [--reps 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import attrs
import torch

from speclane.kernels import cpu_build
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

ROWS = (1, 2, 4, 8, 16, 32)
PARTS = ("head", "linears", "attention")
# entry point -> (part, index of its column-count argument, which tells the output head from the other linears)
_ENTRIES = {
    "sl_linear": ("linears", 10),
    "sl_linear_q": ("linears", 11),
    "sl_linear_packed": ("linears", 11),  # N, the output columns: the head where it is the vocabulary
    "sl_attend": ("attention", None),
}


class _Timed:
    """The C library with its entry points timed: the head, the other linears, attention; the rest untimed."""

    def __init__(self, lib, vocab: int = 0):
        self.lib, self.vocab, self.parts = lib, vocab, dict.fromkeys(PARTS, 0.0)

    def __getattr__(self, name):
        fn = getattr(self.lib, name)
        if name not in _ENTRIES:
            return fn
        part, cols = _ENTRIES[name]

        def timed(*args):
            t0 = time.perf_counter()
            rc = fn(*args)
            key = "head" if cols is not None and args[cols] == self.vocab else part
            self.parts[key] += time.perf_counter() - t0
            return rc

        return timed


def _set_route(lib) -> None:
    cpu_build._TRIED, cpu_build._LIB = True, lib


def _routes(vocab: int) -> dict[str, _Timed | None]:
    """route -> the (timed) library it runs on, None for the torch twins."""
    best = _Timed(cpu_build.library(), vocab)
    routes: dict[str, _Timed | None] = {"c-layer": best, "c": best}
    if cpu_build.bf16_kernels():
        routes["c-rowmajor"] = best
    if cpu_build.isa() == "amx":  # the same packed layers without the tiles: what the amx build adds
        routes["c-vdp"] = _Timed(cpu_build.variant("avx512bf16"), vocab)
    if cpu_build.isa() != "avx2" and "avx2" in cpu_build.isas():
        routes["c-avx2"] = _Timed(cpu_build.variant("avx2"), vocab)
    routes["torch"] = None
    return routes


def _targets(path: str, dtype: torch.dtype, routes: dict) -> dict[str, Target]:
    out = {}
    for route, lib in routes.items():
        _set_route(lib)
        out[route] = Target.load(path, dtype=dtype, pack=route in ("c-layer", "c", "c-vdp"))
        if route not in ("c-layer", "c-rowmajor", "c-vdp"):  # op by op, so that the parts can be timed per kernel call
            out[route]._dense = tuple(None for _ in out[route]._dense)
    return out


def read_bandwidth(mib: int = 512) -> float:
    """Bytes a second one core moves in a large copy (read and write both counted), best of three."""
    src = torch.ones(mib << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best


def compute_peak(rows: int = 256, k: int = 576, n: int = 1536, calls: int = 20) -> float:
    """FLOPs a second of the packed bf16 kernel at `rows` rows, where each 32-column block is read from memory
    once and reused from L1 for every 8 rows: the rate VDPBF16PS gives one core here, the call's Python cost a
    fraction of a percent. 0.0 where the build has no packed kernel."""
    from speclane.kernels.packed import pack_bf16, packed_linear, packs

    w = torch.randn(n, k).bfloat16()
    if not packs(w):
        return 0.0
    pw, x = pack_bf16(w), torch.randn(rows, k).bfloat16()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            packed_linear(x, pw, out_dtype=torch.float32)
        best = min(best, time.perf_counter() - t0)
    return 2 * rows * k * n * calls / best


def pass_work(target: Target) -> tuple[int, int]:
    """(weight bytes a pass reads, multiply-adds a row) of the linears and the head."""
    w = target.weights
    mats = [
        t
        for lw in w.layers
        for t in attrs.astuple(lw.mixer, recurse=False) + attrs.astuple(lw.mlp, recurse=False)
        if hasattr(t, "shape") and len(t.shape) == 2 and t.shape[0] > 1 and t.shape[1] > 1
    ]
    mats.append(w.head if w.head is not None else w.lm_head)
    nbytes = sum(
        t.nbytes if isinstance(t, torch.Tensor) else getattr(t, "q", getattr(t, "data", None)).nbytes for t in mats
    )
    macs = sum(t.shape[0] * t.shape[1] for t in mats)
    return nbytes, macs


def _prefilled(target: Target, context: int, max_len: int):
    state = target.new_state(1, max_len)
    toks = torch.randint(100, target.cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    b = RowBatch.build([(0, 0, toks)])
    target.commit(state, b, torch.tensor([context]), target.forward(b, state, record="last", logits="last"))
    return state


def parts_c(target, state, batch, timed) -> dict[str, float]:
    timed.parts.update(dict.fromkeys(PARTS, 0.0))
    t0 = time.perf_counter()
    target.forward(batch, state)
    total = time.perf_counter() - t0
    return {"pass": total, **timed.parts, "other": total - sum(timed.parts.values())}


def parts_torch(target, state, batch) -> dict[str, float]:
    t0 = time.perf_counter()
    target.forward(batch, state)
    total = time.perf_counter() - t0
    with torch.profiler.profile() as prof:
        target.forward(batch, state)
    ev = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    prof_total = sum(ev.values()) or 1.0
    # the matmul share of the profiled pass, applied to the unprofiled pass time
    mm = sum(v for k, v in ev.items() if k in ("aten::mm", "aten::addmm")) / prof_total * total
    attention_ops = ("aten::bmm", "aten::_softmax", "aten::masked_fill_")
    att = sum(v for k, v in ev.items() if k in attention_ops) / prof_total * total
    return {"pass": total, "head": 0.0, "linears": mm, "attention": att, "other": total - mm - att}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512, help="prefill length timed at the end")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    from speclane.stages.models.artifact import resolve

    if cpu_build.library() is None:
        raise SystemExit(f"the C kernels are unavailable here ({cpu_build.unavailable()}): nothing to compare")
    best, isa = cpu_build.library(), cpu_build.isa()
    from speclane.stages.models.config import ModelConfig

    path = resolve(args.model)
    routes = _routes(ModelConfig.load(path).vocab_size)
    targets = _targets(path, getattr(torch, args.dtype), routes)
    _set_route(best)
    bandwidth, peak = read_bandwidth(), compute_peak()
    nbytes, macs = pass_work(targets["c-layer"])
    print(
        f"limits measured now: copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write); packed bf16 kernel "
        f"{peak / 1e9:.0f} GFLOP/s (256 rows); a pass reads {nbytes / 1e6:.0f} MB of linear weights and "
        f"does {2 * macs / 1e6:.0f} MFLOP of them a row"
    )
    print(
        f"machine: {cpu_build.cpu_name()}; CPU {torch.backends.cpu.get_cpu_capability()}, best C build "
        f"{isa}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.dtype}, one lane "
        f"at {args.context} committed positions; median of {args.reps}"
    )
    states = {}
    for route, t in targets.items():
        _set_route(routes[route])
        states[route] = _prefilled(t, args.context, args.context + max(ROWS) + args.prompt + 1)
    res: dict[tuple[str, int], list[dict[str, float]]] = {(r, n): [] for r in targets for n in ROWS}
    for _ in range(args.reps):
        for n in ROWS:
            batch = RowBatch.build([(0, args.context, [7] * n)])
            for route, t in targets.items():
                _set_route(routes[route])
                fn = (
                    (lambda: parts_torch(t, states[route], batch))
                    if route == "torch"
                    else (lambda: parts_c(t, states[route], batch, routes[route]))
                )
                res[(route, n)].append(fn())
    print(
        "route       rows  pass ms  / 1 row  head ms  linears ms  attention ms  other ms  limit ms  "
        "torch / route (paired)"
    )
    for n in ROWS:
        limit = max(nbytes / bandwidth, 2 * macs * n / peak if peak else 0.0)
        for route in targets:
            med = {k: statistics.median(d[k] for d in res[(route, n)]) for k in ("pass", *PARTS, "other")}
            ratio = statistics.median(a["pass"] / b["pass"] for a, b in zip(res[("torch", n)], res[(route, n)]))
            per_one = statistics.median(a["pass"] / b["pass"] for a, b in zip(res[(route, n)], res[(route, 1)]))
            parts = (
                "            (one call a layer)           "
                if route in ("c-layer", "c-rowmajor")
                else f"{med['head'] * 1e3:7.1f}  {med['linears'] * 1e3:10.1f}  {med['attention'] * 1e3:12.1f}  "
                f"{med['other'] * 1e3:8.1f}"
            )
            print(
                f"{route:10s} {n:4d}  {med['pass'] * 1e3:7.1f}  {per_one:7.2f}  {parts}  {limit * 1e3:8.1f}  "
                f"{ratio:6.2f}"
            )
    toks = torch.randint(100, 40000, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    times: dict[str, list[float]] = {r: [] for r in targets}
    for _ in range(2):
        for route, t in targets.items():
            _set_route(routes[route])
            state = t.new_state(1, args.prompt + 1)
            t0 = time.perf_counter()
            t.forward(RowBatch.build([(0, 0, toks)]), state, record="last", logits="last")
            times[route].append(time.perf_counter() - t0)
    print(
        f"prefill of {args.prompt} tokens in one chunk: " + ", ".join(f"{r} {min(v):.2f} s" for r, v in times.items())
    )
    _set_route(best)


if __name__ == "__main__":
    main()
