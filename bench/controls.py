"""The controls that keep the benchmark honest: the machine's limits and the machinery's cost.

- roofline: memory bandwidth measured by a large tensor copy in the same run, and the bytes one decode pass
  streams (weights + KV at the prompt's length): the floor time of a plain decode pass.
- null drafter: the engine's plain round (`decode` spec) and the verify graph with the `none` backend, each against
  the minimal decode loop (`speclane.stages.models.decode.greedy_decode`: `Target.forward` and `Target.commit` called
  directly, no stage graph).
- verify pass time for 1 to 16 rows of one lane against a 1-row pass, at a fixed committed length.
- exactness in float32: speculative greedy tokens against plain ones, token for token.
Not here: the sweeps (bench/sweeps.py) and the predicted speedup's arithmetic (bench/report.py).
"""

from __future__ import annotations

import statistics
import time

import torch

from speclane.bench.measure import (
    Run,
    alternate,
    first_divergence,
    make_engine,
    paired_ratio,
    run_batch,
    spread,
    tensor_bytes,
    tps,
)
from speclane.stages.models.config import FULL
from speclane.stages.models.decode import greedy_decode
from speclane.stages.models.state import RowBatch


def bandwidth(mib: int = 256, reps: int = 7) -> dict[str, float]:
    """Bytes moved per second by `dst.copy_(src)` of a `mib` MiB tensor (read + write counted)."""
    src = torch.ones(mib << 18, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    best, med = min(times), statistics.median(times)
    moved = 2 * src.numel() * src.element_size()
    return {"bytes_per_s_median": moved / med, "bytes_per_s_best": moved / best, "mib": mib}


def pass_bytes(target, context: int) -> dict[str, int]:
    """Bytes a 1-row decode pass reads: every weight once (a tied embedding once, as the output head) and the
    keys and values of `context` positions in each attention layer."""
    weights = tensor_bytes(target.weights)
    cfg = target.cfg
    attn_layers = sum(1 for t in cfg.layer_types if t == FULL)
    per_pos = 2 * attn_layers * cfg.num_kv_heads * cfg.head_dim * torch.finfo(target.dtype).bits // 8
    return {"weights": weights, "kv": per_pos * context, "total": weights + per_pos * context}


def plain_loop(target, ids: list[int], max_tokens: int, max_len: int) -> Run:
    """The smallest greedy decode: prefill, then one `forward` + `commit` + argmax a token, no stage graph (the
    shared loop, `greedy_decode`); the first pass's end is the time to the first token."""
    state = target.new_state(1, max_len)
    passes: list[float] = []
    t0 = time.perf_counter()
    (toks,) = greedy_decode(
        target, [ids], max_tokens, state=state, on_pass=lambda *_: passes.append(time.perf_counter())
    )
    return Run(toks, passes[0] - t0, time.perf_counter() - passes[0])


def null_drafter(
    target, tokenizer, prompts: list[dict], max_tokens: int, repeats: int, max_len: int, tick=None
) -> dict:
    """The machinery's cost: engine rounds without drafts against the minimal loop (fixed length: EOS ignored)."""
    decode = make_engine(target, tokenizer, "none", spec="decode", max_len=max_len)
    null = make_engine(target, tokenizer, "none", spec="verify", k=7, max_len=max_len)
    configs = {
        "loop": lambda p: plain_loop(target, p["ids"], max_tokens, max_len),
        "decode": lambda p: run_batch(decode, [(p["id"], p["ids"])], max_tokens, ignore_eos=True)[0],
        "null": lambda p: run_batch(null, [(p["id"], p["ids"])], max_tokens, ignore_eos=True)[0],
    }
    res = alternate(configs, prompts, repeats, tick)
    out = {name: {"decode_tps": spread([x for xs in tps(runs) for x in xs])} for name, runs in res.items()}
    for name in ("decode", "null"):
        out[name]["vs_loop"] = paired_ratio(tps(res[name]), tps(res["loop"]))
        out[name]["same_tokens_as_loop"] = all(
            a.tokens == b.tokens for xs, ys in zip(res[name], res["loop"]) for a, b in zip(xs, ys)
        )
    return out


def verify_pass_times(target, rows: tuple[int, ...], context: int, reps: int) -> dict[int, dict[str, float]]:
    """Median seconds of one lane's `forward` with n rows at committed length `context`, interleaved round robin;
    no commit, so every call sees the same state."""
    state = target.new_state(1, context + max(rows) + 1)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(100, target.cfg.vocab_size, (context + max(rows),), generator=g).tolist()
    pre = RowBatch.build([(0, 0, toks[:context])])
    target.commit(state, pre, torch.tensor([context]), target.forward(pre, state, record="last", logits="last"))
    batches = {n: RowBatch.build([(0, context, toks[context : context + n])]) for n in rows}
    times: dict[int, list[float]] = {n: [] for n in rows}
    for b in batches.values():  # warm-up: kernel selection per shape
        target.forward(b, state)
    for _ in range(reps):
        for n, b in batches.items():
            t0 = time.perf_counter()
            target.forward(b, state)
            times[n].append(time.perf_counter() - t0)
    one = statistics.median(times[rows[0]])
    return {n: {"seconds": statistics.median(t), "vs_one_row": statistics.median(t) / one} for n, t in times.items()}


def exactness_fp32(
    target32,
    tokenizer,
    prompts: list[dict],
    backends: tuple[str, ...],
    k: int,
    max_tokens: int,
    max_len: int,
    tick=None,
) -> dict[str, list]:
    """Per backend, per prompt: the first token where speculative greedy output differs from plain (None: equal)."""
    off = make_engine(target32, tokenizer, "none", spec="decode", max_len=max_len)
    ref = {p["id"]: run_batch(off, [(p["id"], p["ids"])], max_tokens)[0].tokens for p in prompts}
    out = {}
    for i, b in enumerate(backends):
        if tick is not None:
            tick(i, len(backends))
        try:
            eng = make_engine(target32, tokenizer, b, k=k, max_len=max_len)
        except Exception as exc:  # noqa: BLE001 - reported as skipped by the caller
            out[b] = f"skipped: {type(exc).__name__}: {exc}"
            continue
        if b == "oracle":
            eng.drafter.replay(ref)
        out[b] = [
            first_divergence(ref[p["id"]], run_batch(eng, [(p["id"], p["ids"])], max_tokens)[0].tokens) for p in prompts
        ]
    return out
