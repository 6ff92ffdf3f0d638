"""What int8 weights cost in quality and buy in speed, against the compute dtype, measured side by side in one run.

Per bench prompt (bench/prompts.jsonl, chat mode): the compute-dtype model decodes `--max-tokens` greedy tokens;
both models then score that same text teacher-forced, and the report gives the int8 model's top-1 agreement with
the reference's tokens, the mean log-probability gap of those tokens (int8 minus reference, nats a token), and
where free-running greedy int8 output first differs. Speed: plain decode tokens per second of each, alternated
per prompt (the paired ratio is the claim).

    OMP_NUM_THREADS=1 python -m speclane.bench.quant [--prompts 4] [--max-tokens 64] [--dtype bfloat16] [--model DIR]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from speclane.bench import workloads
from speclane.bench.controls import plain_loop
from speclane.kernels import cpu_build
from speclane.stages.models.chat import ChatTemplate
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from speclane.stages.models.tokenizer import Tokenizer


def _scored(target: Target, ids: list[int], answer: list[int]) -> torch.Tensor:
    """Log-softmax rows predicting each answer token, teacher-forced: [len(answer), vocab]."""
    state = target.new_state(1, len(ids) + len(answer) + 1)
    seq = ids + answer
    out = target.forward(RowBatch.build([(0, 0, seq)]), state, record="last", logits="all")
    return out.logits[len(ids) - 1 : len(seq) - 1].log_softmax(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--prompts", type=int, default=4, help="prompts per workload")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    from speclane.stages.models.artifact import resolve

    path = resolve(args.model)
    dtype = getattr(torch, args.dtype)
    ref, q8 = Target.load(path, dtype=dtype), Target.load(path, dtype=dtype, quant="int8")
    tok = Tokenizer.load(path)
    chat = ChatTemplate.from_tokenizer(tok)
    print(f"{cpu_build.describe()}; {args.dtype} against int8 weights ({args.dtype} activations)")
    print("workload      prompt          top-1 agree   logprob gap   first greedy diff   tok/s ref   tok/s int8   x")
    ratios, agrees, gaps = [], [], []
    for w in workloads.WORKLOADS:
        for p in workloads.pick(workloads.load(), w, args.prompts):
            ids = tok.encode(chat.render([{"role": "user", "content": p["user"]}]))
            max_len = len(ids) + args.max_tokens + 1
            a = plain_loop(ref, ids, args.max_tokens, max_len)
            b = plain_loop(q8, ids, args.max_tokens, max_len)
            lp_ref, lp_q = _scored(ref, ids, a.tokens), _scored(q8, ids, a.tokens)
            answer = torch.tensor(a.tokens)[:, None]
            agree = (lp_q.argmax(-1) == answer[:, 0]).float().mean().item()
            gap = (lp_q.gather(1, answer) - lp_ref.gather(1, answer)).mean().item()
            diff = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
            n = len(a.tokens) - 1
            tps_a, tps_b = n / a.decode_s, n / b.decode_s
            ratios.append(tps_b / tps_a)
            agrees.append(agree)
            gaps.append(gap)
            print(
                f"{w:12s}  {p['id']:14s}  {agree:11.3f}   {gap:+11.4f}   {str(diff):>17s}   {tps_a:9.1f}   "
                f"{tps_b:10.1f}   {tps_b / tps_a:.2f}"
            )
    print(
        f"median: top-1 agreement {statistics.median(agrees):.3f}, log-prob gap {statistics.median(gaps):+.4f} "
        f"nats/token, int8 / {args.dtype} decode speed {statistics.median(ratios):.2f} "
        f"[{min(ratios):.2f}, {max(ratios):.2f}]"
    )


if __name__ == "__main__":
    main()
