"""Prompt-length buckets: speculation against off on prompts of about 256, 1k and 4k tokens, at 128 and 512 new
tokens, one lane.

Each configuration runs once per prompt and repeat to the longest answer; the figures at fewer new tokens are read
from the same runs' step stamps (`Run.decode_tps_at`): greedy decoding makes a shorter answer the prefix of the
longer one, so this is what a shorter run measures, without paying for the prefill again. Answers ignore the end
of text (as vLLM's serving benchmark does with --ignore-eos), so every run reaches the longest bucket and every
configuration decodes the same number of tokens. Configurations alternate per prompt
(speclane.bench.measure.alternate) so they share the machine's noise; ratios are paired. A backend that does not
load is skipped with its reason. Not here: the other sections (bench/sweeps.py), printing (bench/report.py).
"""

from __future__ import annotations

import gc
from typing import Any

from speclane.bench.measure import alternate, make_engine, paired_ratio, run_batch, speculation, spread
from speclane.bench.settings import BUCKETS
from speclane.bench.sweeps import try_engine


def bucket_prompts(prompts_of, bucket: str, n: int) -> list[dict]:
    """`n` prompts of a bucket, code and prose alternating (`prompts_of(workload, count)` gives a workload's)."""
    sources = BUCKETS[bucket]
    if len(sources) == 1:
        return prompts_of(sources[0], n)
    per = [prompts_of(w, n) for w in sources]
    return [per[i % len(per)][i // len(per)] for i in range(n)]


def length_sweep(
    target,
    tokenizer,
    prompts: list[dict],
    configs: tuple[str, ...],
    new_tokens: tuple[int, ...],
    repeats: int,
    max_len: int,
    tick=None,
) -> dict[str, Any]:
    """Off against each `backend@k` of `configs` on one bucket's prompts: decode tokens per second at each of
    `new_tokens` (paired ratios against off), time to first token, tokens per round."""
    skipped: dict[str, str] = {}
    engines = {"off": make_engine(target, tokenizer, "none", spec="decode", max_len=max_len)}
    for name in configs:
        backend, _, k = name.partition("@")
        eng = try_engine(target, tokenizer, backend, skipped, k=int(k or 7), max_len=max_len)
        if eng is not None:
            engines[name] = eng
    longest = max(new_tokens)
    res = alternate(
        {
            name: (lambda p, e=eng: run_batch(e, [(p["id"], p["ids"])], longest, ignore_eos=True)[0])
            for name, eng in engines.items()
        },
        prompts,
        repeats,
        tick,
    )
    rows = {}
    for name, runs in res.items():
        at = {n: [[r.decode_tps_at(n) for r in rs] for rs in runs] for n in new_tokens}
        row: dict[str, Any] = {
            "ttft_s": spread([r.ttft for rs in runs for r in rs]),
            "answer_tokens": [len(rs[0].tokens) for rs in runs],
            "decode_tps": {str(n): spread([x for xs in at[n] for x in xs]) for n in new_tokens},
        }
        if name != "off":
            off = {n: [[r.decode_tps_at(n) for r in rs] for rs in res["off"]] for n in new_tokens}
            row["speedup"] = {str(n): paired_ratio(at[n], off[n]) for n in new_tokens}
            row.update(speculation(runs, int(name.partition("@")[2] or 7)))
        rows[name] = row
    del engines
    gc.collect()
    return {
        "rows": rows,
        "skipped": skipped,
        "prompts": [p["id"] for p in prompts],
        "prompt_tokens": [len(p["ids"]) for p in prompts],
    }
