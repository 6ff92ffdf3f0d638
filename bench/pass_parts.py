"""Where a target pass's time goes, on the C kernels against the torch route, measured side by side in one run.

For each route (`c-layer`: kernels/cpu/rows.c with a dense layer in one call, what runs; `c`: the same kernels
called op by op from Python, which is what the parts are timed on; `c-avx2`: the same op by op on the AVX2 build,
where the CPU runs a better one (kernels/cpu_build.py), so the two builds are compared in one run; `torch`: the
torch twins a machine without a C compiler runs, which is the route every pass took before the C kernels), one
lane at a fixed committed length,
prints per row count the median pass time and its parts: the weight matmuls, attention over the cache, and
everything else (norms, RoPE, activations, cache writes, layout, Python). Then the prefill of one long prompt per
route. Passes alternate between the routes, so a neighbour's load on the shared cores hits both alike. Matmul and
attention come from timing the kernels' entry points (C route) and from torch's profiler's shares applied to the
unprofiled pass (torch route); "other" is the rest of the pass.

    OMP_NUM_THREADS=1 python -m speclane.bench.pass_parts [--model DIR] [--dtype bfloat16] [--context 256] [--reps 9]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from speclane.kernels import cpu_build
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

ROWS = (1, 2, 4, 8)


class _Timed:
    """The C library with its entry points timed: linear, attention, the rest (norms, RoPE, silu, whole layers)."""

    def __init__(self, lib):
        self.lib, self.parts = lib, {"matmul": 0.0, "attention": 0.0}

    def __getattr__(self, name):
        fn = getattr(self.lib, name)
        part = {"sl_linear": "matmul", "sl_linear_q": "matmul", "sl_attend": "attention"}.get(name)
        if part is None:
            return fn

        def timed(*args):
            t0 = time.perf_counter()
            rc = fn(*args)
            self.parts[part] += time.perf_counter() - t0
            return rc
        return timed


def _set_route(lib) -> None:
    cpu_build._TRIED, cpu_build._LIB = True, lib


def _routes() -> dict[str, _Timed | None]:
    """route -> the (timed) library it runs on, None for the torch twins."""
    best = _Timed(cpu_build.library())
    routes: dict[str, _Timed | None] = {"c-layer": best, "c": best}
    if cpu_build.isa() != "avx2" and "avx2" in cpu_build.isas():
        routes["c-avx2"] = _Timed(cpu_build.variant("avx2"))
    routes["torch"] = None
    return routes


def _targets(path: str, dtype: torch.dtype, routes: dict) -> dict[str, Target]:
    out = {}
    for route, lib in routes.items():
        _set_route(lib)
        out[route] = Target.load(path, dtype=dtype)
        if route != "c-layer":  # op by op, so that the parts can be timed per kernel call
            out[route]._dense = tuple(None for _ in out[route]._dense)
    return out


def _prefilled(target: Target, context: int, max_len: int):
    state = target.new_state(1, max_len)
    toks = torch.randint(100, target.cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    b = RowBatch.build([(0, 0, toks)])
    target.commit(state, b, torch.tensor([context]), target.forward(b, state, record="last", logits="last"))
    return state


def parts_c(target, state, batch, timed) -> dict[str, float]:
    timed.parts.update(matmul=0.0, attention=0.0)
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
    return {"pass": total, "matmul": mm, "attention": att, "other": total - mm - att}


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
    routes = _routes()
    targets = _targets(resolve(args.model), getattr(torch, args.dtype), routes)
    print(f"machine: {cpu_build.cpu_name()}; CPU {torch.backends.cpu.get_cpu_capability()}, best C build "
          f"{isa}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.dtype}, one lane "
          f"at {args.context} committed positions; median of {args.reps}")
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
                fn = (lambda: parts_torch(t, states[route], batch)) if route == "torch" else \
                    (lambda: parts_c(t, states[route], batch, routes[route]))
                res[(route, n)].append(fn())
    print("route     rows   pass ms   matmul ms   attention ms   other ms   torch / route (paired)")
    for n in ROWS:
        for route in targets:
            med = {k: statistics.median(d[k] for d in res[(route, n)])
                   for k in ("pass", "matmul", "attention", "other")}
            ratio = statistics.median(a["pass"] / b["pass"] for a, b in zip(res[("torch", n)], res[(route, n)]))
            parts = "        (one call a layer)          " if route == "c-layer" else \
                f"{med['matmul'] * 1e3:9.1f}   {med['attention'] * 1e3:12.1f}   {med['other'] * 1e3:8.1f}"
            print(f"{route:8s} {n:4d}   {med['pass'] * 1e3:7.1f}   {parts}   {ratio:6.2f}")
    toks = torch.randint(100, 40000, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    times: dict[str, list[float]] = {r: [] for r in targets}
    for _ in range(2):
        for route, t in targets.items():
            _set_route(routes[route])
            state = t.new_state(1, args.prompt + 1)
            t0 = time.perf_counter()
            t.forward(RowBatch.build([(0, 0, toks)]), state, record="last", logits="last")
            times[route].append(time.perf_counter() - t0)
    print(f"prefill of {args.prompt} tokens in one chunk: " + ", ".join(
        f"{r} {min(v):.2f} s" for r, v in times.items()))
    _set_route(best)


if __name__ == "__main__":
    main()
