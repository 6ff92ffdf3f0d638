"""Fitting data for the model drafters: chat prompts from offline text, the target's own greedy answers, its taps.

Owns: reading a corpus (directories of `*.py` files are code, other files prose, `py:module.attr` a Python string
or dict of strings such as `py:pydoc_data.topics.topics`), turning documents into chat-templated prompts (continue,
explain, rewrite, summarize), the held-out split (by document, so held-out prompts come from unseen files), and
running the target greedily over them in batched lanes while keeping the hidden states the drafters read. Each
sequence is prompt + answer; the answer is the target's greedy output, so every answer token is also the token the
target itself would choose there (the label a drafter must hit). Shards are written as they finish, so an
interrupted run resumes. Not here: the drafters' losses and the training loop (`pipeline/fit.py`).
"""
from __future__ import annotations

import hashlib
import importlib
import random
import re
from pathlib import Path

import torch

from stages.models.chat import ChatTemplate
from stages.models.state import RowBatch

CODE_ASKS = ("Continue this Python code:\n\n```python\n{chunk}\n```",
             "Explain what this Python code does:\n\n```python\n{chunk}\n```",
             "Rewrite this Python code with type hints and a docstring:\n\n```python\n{chunk}\n```",
             "Write a Python function like this one, but simpler:\n\n```python\n{chunk}\n```")
PROSE_ASKS = ("Summarize this text:\n\n{chunk}", "Continue this text:\n\n{chunk}",
              "Explain this in simple words:\n\n{chunk}")


def read_corpus(paths: list[str]) -> list[tuple[str, str, str]]:
    """(kind, name, text) per document, in a stable order."""
    docs = []
    for spec in paths:
        if spec.startswith("py:"):
            module, _, attr = spec[3:].rpartition(".")
            value = getattr(importlib.import_module(module), attr)
            items = sorted(value.items()) if isinstance(value, dict) else [(attr, value)]
            docs += [("prose", f"{spec}:{k}", str(v)) for k, v in items]
            continue
        p = Path(spec)
        # A directory is read for its own Python source: installed packages under it are not the corpus.
        files = sorted(f for f in p.rglob("*.py") if "site-packages" not in f.parts) if p.is_dir() else [p]
        for f in files:
            try:
                text = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            docs.append(("code" if f.suffix == ".py" else "prose", str(f), text))
    return docs


def held_out(name: str, every: int = 10) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % every == 0


def _code_chunk(text: str, rng: random.Random, lines: int) -> str | None:
    rows = text.splitlines()
    starts = [i for i, r in enumerate(rows) if re.match(r"\s*(def|class) ", r)]
    if not starts:
        return None
    i = rng.choice(starts)
    chunk = "\n".join(rows[i:i + rng.randint(lines // 2, lines)]).strip("\n")
    return chunk if len(chunk) > 80 else None


def _prose_chunk(text: str, rng: random.Random, chars: int) -> str | None:
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 200]
    if not paras:
        return None
    return rng.choice(paras)[:chars]


def make_prompts(docs, count: int, seed: int, heldout: bool) -> list[tuple[str, str]]:
    """`count` (kind, user message) pairs from the train (or held-out) documents, three code to one prose."""
    rng = random.Random(seed + (1 if heldout else 0))
    pool = {"code": [d for d in docs if d[0] == "code" and held_out(d[1]) == heldout],
            "prose": [d for d in docs if d[0] == "prose" and held_out(d[1]) == heldout]}
    out, tries = [], 0
    while len(out) < count and tries < count * 50:
        tries += 1
        kind = "prose" if (len(out) % 4 == 3 and pool["prose"]) or not pool["code"] else "code"
        if not pool[kind]:
            break
        _, _, text = rng.choice(pool[kind])
        chunk = _code_chunk(text, rng, 30) if kind == "code" else _prose_chunk(text, rng, 900)
        if chunk is not None:
            asks = CODE_ASKS if kind == "code" else PROSE_ASKS
            out.append((kind, rng.choice(asks).format(chunk=chunk)))
    return out


def encode_prompts(tokenizer, prompts, max_prompt: int) -> list[list[int]]:
    chat = ChatTemplate.from_tokenizer(tokenizer)
    return [tokenizer.encode(chat.render([{"role": "user", "content": text}]))[-max_prompt:] for _, text in prompts]


@torch.no_grad()
def generate(target, prompts: list[list[int]], max_new: int, eos: set[int], lanes: int = 64,
             chunk_rows: int = 2048) -> list[dict]:
    """Greedy answers of the target, lanes at a time; per sequence: tokens [L] int32, taps [L - 1, n, hidden]
    (the rows that ran: all but the last token), start (the prompt length)."""
    results = []
    for g in range(0, len(prompts), lanes):
        group = prompts[g:g + lanes]
        state = target.new_state(len(group), max(len(p) for p in group) + max_new + 1)
        taps: list[list[torch.Tensor]] = [[] for _ in group]
        toks = [list(p) for p in group]
        nxt = [0] * len(group)
        i = 0
        while i < len(group):  # prefill, several lanes a pass
            j, rows = i, 0
            while j < len(group) and (j == i or rows + len(group[j]) <= chunk_rows):
                rows += len(group[j])
                j += 1
            batch = RowBatch.build([(s, 0, group[s]) for s in range(i, j)])
            out = target.forward(batch, state, record="last", logits="last")
            target.commit(state, batch, torch.tensor(batch.lane_rows), out)
            for n, s in enumerate(range(i, j)):
                taps[s].append(out.taps[batch.cu_rows[n]:batch.cu_rows[n + 1]].to(torch.bfloat16))
            for n, t in enumerate(out.logits.argmax(-1).tolist()):
                nxt[i + n] = t
            i = j
        live = list(range(len(group)))
        for s in live:
            toks[s].append(nxt[s])
        for _ in range(max_new - 1):
            live = [s for s in live if toks[s][-1] not in eos]
            if not live:
                break
            batch = RowBatch.build([(s, len(toks[s]) - 1, [toks[s][-1]]) for s in live])
            out = target.forward(batch, state, record="rows")
            target.commit(state, batch, torch.ones(len(live), dtype=torch.int64), out)
            for n, (s, t) in enumerate(zip(live, out.logits.argmax(-1).tolist())):
                taps[s].append(out.taps[n:n + 1].to(torch.bfloat16))
                toks[s].append(t)
        for s, p in enumerate(group):
            results.append({"tokens": torch.tensor(toks[s], dtype=torch.int32), "taps": torch.cat(taps[s]),
                            "start": len(p)})
    return results
