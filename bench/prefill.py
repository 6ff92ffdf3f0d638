"""Prefill of a long prompt: speclane's chunked prefill against one transformers forward over the same prompt, and
the wide chunks' attention (one fused `scaled_dot_product_attention` a lane) against the per-row C kernel it
replaced, measured side by side in one run.

For each prompt length, the same random prompt is prefilled by: `speclane` (the engine's chunks of `--chunk`
rows through `Target.forward`, as `generate` does), the other route for wide chunks' attention (`speclane
rows-attention`: the C kernel, where the engine takes the fused SDPA; `speclane sdpa`: the fused SDPA, where the
engine takes the C kernel, `kernels/decode_attention.serves_wide`), and `transformers` (one `forward` of the whole
prompt, no cache kept, the converted default artifact, the same dtype). Runs alternate; median of `--repeats`.
Prints seconds and tokens per second per configuration, and the paired ratios.

    OMP_NUM_THREADS=1 python -m speclane.bench.prefill [--lengths 512 2048] [--chunk 512] [--repeats 3]
        [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from speclane.bench import installed_kernels_first
from speclane.kernels import cpu_build
from speclane.kernels.decode_attention import decode_attention_cpu, serves_wide
from speclane.stages.models import attention
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target


def _rows_attention(qf, cache, lay, dtype):
    """The route before: every row of a wide chunk on its own over its lane's keys (the C kernel)."""
    return decode_attention_cpu(qf, cache.k, cache.v, lay.write_slot, lay.row_keys, qf.shape[-1] ** -0.5, dtype)


def speclane_prefill(target: Target, ids: list[int], chunk: int) -> float:
    state = target.new_state(1, len(ids) + 1)
    t0 = time.perf_counter()
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        batch = RowBatch.build([(0, start, part)])
        out = target.forward(batch, state, record="last", logits="last")
        target.commit(state, batch, torch.tensor([len(part)]), out)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclane.bench.prefill", description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--chunk", type=int, default=512, help="prefill rows a pass (the prefill spec's default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--no-transformers", action="store_true")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    with torch.no_grad():  # not set globally: a test calls main() inside pytest's process
        return _run(args, dtype)


def _run(args, dtype) -> int:
    from speclane.stages.models.artifact import resolve

    target = Target.load(resolve(None), dtype=dtype)
    configs = {"speclane": lambda ids: speclane_prefill(target, ids, args.chunk)}

    def rows_route(ids):  # every row through the C kernel (where serves_wide, what runs anyway)
        wide, attention.wide_attention = attention.wide_attention, _rows_attention
        try:
            return speclane_prefill(target, ids, args.chunk)
        finally:
            attention.wide_attention = wide

    def sdpa_route(ids):  # one fused product a lane, even where the C kernel serves wide chunks
        serves, attention.serves_wide = attention.serves_wide, lambda head_dim: False
        try:
            return speclane_prefill(target, ids, args.chunk)
        finally:
            attention.serves_wide = serves

    if cpu_build.library() is not None:
        wide_c = serves_wide(target.cfg.head_dim)
        configs["speclane sdpa" if wide_c else "speclane rows-attention"] = sdpa_route if wide_c else rows_route
    if not args.no_transformers:
        installed_kernels_first()
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM.from_pretrained(resolve(None), torch_dtype=dtype).eval()

        def hf_forward(ids):
            t0 = time.perf_counter()
            hf(torch.tensor([ids]), use_cache=False, logits_to_keep=1)
            return time.perf_counter() - t0

        configs["transformers"] = hf_forward
    print(
        f"machine: {cpu_build.cpu_name()}; CPU {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), {args.dtype}; chunks of {args.chunk} rows; median of {args.repeats}"
    )
    gen = torch.Generator().manual_seed(0)
    for n in args.lengths:
        ids = torch.randint(100, target.cfg.vocab_size, (n,), generator=gen).tolist()
        for f in configs.values():  # warm-up: first-call probes, allocator
            f(ids[: min(n, args.chunk + 1)])
        times: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, f in configs.items():
                times[name].append(f(ids))
        for name, ts in times.items():
            med = statistics.median(ts)
            ratios = " ".join(
                f"{other}/this {statistics.median(a / b for a, b in zip(times[other], ts)):.2f}"
                for other in configs
                if other != name
            )
            print(f"{n:6d} tokens  {name:<24} {med:7.2f} s  {n / med:7.1f} tok/s  {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
