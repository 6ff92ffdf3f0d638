"""Fitting data for the model drafters: chat prompts from offline text, the target's own greedy answers, its taps.

Owns: reading a corpus (directories of `*.py` files are code, other files prose, `py:module.attr` a Python string
or dict of strings such as `py:pydoc_data.topics.topics`), turning documents into chat-templated prompts (continue,
explain, rewrite, summarize), the held-out split (by document, so held-out prompts come from unseen files), and
running the target greedily over them in batched lanes while keeping the hidden states the drafters read. Each
sequence is prompt + answer; the answer is the target's greedy output, so every answer token is also the token the
target itself would choose there (the label a drafter must hit).
Teacher-forced sequences (`make_forced`, `forced`) are the cheap bulk: a chat prompt whose answer is real text
(the code that follows the prompt's chunk, the chunk itself rewritten, the next paragraph) run through the target in
one prefill pass (about 550 tokens/s on one core against 66 for generating), keeping at every position the target's
own greedy choice (`next`). Where the text agrees with those choices a chain of drafts sees exactly the prefix a
verify round would, so the losses label draft j with the target's choice and count it only while the text agreed
(`fit_losses`). Not here: the drafters' losses and the training loop (`stages/fitting/fit.py`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import random
import re
from pathlib import Path

import torch

from speclane.stages.models.chat import ChatTemplate
from speclane.stages.models.decode import greedy_decode, packs
from speclane.stages.models.state import RowBatch

CODE_ASKS = (
    "Continue this Python code:\n\n```python\n{chunk}\n```",
    "Explain what this Python code does:\n\n```python\n{chunk}\n```",
    "Rewrite this Python code with type hints and a docstring:\n\n```python\n{chunk}\n```",
    "Write a Python function like this one, but simpler:\n\n```python\n{chunk}\n```",
)
PROSE_ASKS = (
    "Summarize this text:\n\n{chunk}",
    "Continue this text:\n\n{chunk}",
    "Explain this in simple words:\n\n{chunk}",
)
# Teacher-forced asks: the answer is corpus text, so the ask must make that text a plausible answer.
FORCED_CONTINUE = "Continue this Python code:\n\n```python\n{chunk}\n```"
FORCED_REWRITE = (
    "Rewrite this Python code, keeping its behaviour:\n\n```python\n{chunk}\n```",
    "Fix the style of this Python code:\n\n```python\n{chunk}\n```",
    "Add comments to this Python code:\n\n```python\n{chunk}\n```",
)
FORCED_PROSE = "Continue this text:\n\n{chunk}"
# The bench's code-generation ask (bench/workloads.py): fitted on, the drafter meets at serving what it learnt from.
WRITE_ASK = "Write a Python function `{sig}`.\n\n{doc}\n\nGive only the code."


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
    starts = _def_starts(rows)
    if not starts:
        return None
    i = rng.choice(starts)
    chunk = "\n".join(rows[i : i + rng.randint(lines // 2, lines)]).strip("\n")
    return chunk if len(chunk) > 80 else None


def _code_pair(text: str, rng: random.Random, lines: int) -> tuple[str, str] | None:
    """A chunk starting at a def/class and the lines that follow it in the file."""
    rows = text.splitlines()
    starts = _def_starts(rows)
    if not starts:
        return None
    i = rng.choice(starts)
    cut = i + rng.randint(lines // 3, lines)
    head, tail = "\n".join(rows[i:cut]).strip("\n"), "\n".join(rows[cut : cut + 2 * lines]).strip("\n")
    return (head, tail) if len(head) > 80 and len(tail) > 80 else None


def _prose_pair(text: str, rng: random.Random, chars: int) -> tuple[str, str] | None:
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 100]
    if len(paras) < 2:
        return None
    i = rng.randrange(len(paras) - 1)
    return paras[i][:chars], "\n\n".join(paras[i + 1 : i + 4])


def make_forced(docs, count: int, seed: int, heldout: bool) -> list[tuple[str, str, str]]:
    """`count` (kind, user message, answer text) triples: 2 in 5 code continued by the file's next lines, 2 in 5
    code rewritten (the answer repeats the chunk, as code-editing answers do), 1 in 5 prose continued."""
    rng = random.Random(seed * 7919 + 17 + (1 if heldout else 0))
    pool = {
        "code": [d for d in docs if d[0] == "code" and held_out(d[1]) == heldout],
        "prose": [d for d in docs if d[0] == "prose" and held_out(d[1]) == heldout],
    }
    out, tries = [], 0
    while len(out) < count and tries < count * 50:
        tries += 1
        style = ("continue", "rewrite", "continue", "rewrite", "prose")[len(out) % 5]
        kind = "prose" if style == "prose" else "code"
        if not pool[kind]:
            kind, style = ("code", "continue") if kind == "prose" else ("prose", "prose")
            if not pool[kind]:
                break
        _, _, text = rng.choice(pool[kind])
        if style == "prose":
            pair = _prose_pair(text, rng, 900)
            if pair:
                out.append((kind, FORCED_PROSE.format(chunk=pair[0]), pair[1]))
        elif style == "continue":
            pair = _code_pair(text, rng, 30)
            if pair:
                out.append((kind, FORCED_CONTINUE.format(chunk=pair[0]), f"```python\n{pair[1]}\n```"))
        else:
            chunk = _code_chunk(text, rng, 40)
            if chunk:
                out.append((kind, rng.choice(FORCED_REWRITE).format(chunk=chunk), f"```python\n{chunk}\n```"))
    return out


def _prose_chunk(text: str, rng: random.Random, chars: int) -> str | None:
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 200]
    if not paras:
        return None
    return rng.choice(paras)[:chars]


def make_prompts(docs, count: int, seed: int, heldout: bool) -> list[tuple[str, str]]:
    """`count` (kind, user message) pairs from the train (or held-out) documents, three code to one prose."""
    rng = random.Random(seed + (1 if heldout else 0))
    pool = {
        "code": [d for d in docs if d[0] == "code" and held_out(d[1]) == heldout],
        "prose": [d for d in docs if d[0] == "prose" and held_out(d[1]) == heldout],
    }
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


def make_write_prompts(docs, count: int, seed: int, heldout: bool) -> list[tuple[str, str]]:
    """Up to `count` ("code", ask) pairs asking for a function from its signature and docstring, as the bench's
    code-generation workload asks (`WRITE_ASK`), from the train (or held-out) documents' public functions whose
    docstring is 120-900 characters long, each function once, in a seeded order."""
    found = []
    for kind, name, text in docs:
        if kind != "code" or held_out(name) != heldout:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        found += [
            (f"def {f.name}({ast.unparse(f.args)}):", doc)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef)
            and not f.name.startswith("_")
            and (doc := ast.get_docstring(f))
            and 120 < len(doc) < 900
        ]
    random.Random(seed + 2 + (1 if heldout else 0)).shuffle(found)
    return [("code", WRITE_ASK.format(sig=sig, doc=doc)) for sig, doc in found[:count]]


def encode_prompts(tokenizer, prompts, max_prompt: int) -> list[list[int]]:
    chat = ChatTemplate.from_tokenizer(tokenizer)
    return [tokenizer.encode(chat.render([{"role": "user", "content": text}]))[-max_prompt:] for _, text in prompts]


def _def_starts(rows: list[str]) -> list[int]:
    return [i for i, r in enumerate(rows) if re.match(r"\s*(def|class) ", r)]


def generate(
    target, prompts: list[list[int]], max_new: int, eos: set[int], lanes: int = 64, chunk_rows: int = 2048
) -> list[dict]:
    """Greedy answers of the target, lanes at a time; per sequence: tokens [L] int32, taps [L - 1, n, hidden]
    (the rows that ran: all but the last token), start (the prompt length). The loop is the shared plain one
    (`speclane.stages.models.decode.greedy_decode`), prompts packed into prefill passes of `chunk_rows` rows."""
    results = []
    for g in range(0, len(prompts), lanes):
        group = prompts[g : g + lanes]
        taps: list[list[torch.Tensor]] = [[] for _ in group]

        def keep(lane_ids, batch, out):
            for n, s in enumerate(lane_ids):
                taps[s].append(out.taps[batch.cu_rows[n] : batch.cu_rows[n + 1]].to(torch.bfloat16))

        answers = greedy_decode(target, group, max_new, eos=eos, pack_rows=chunk_rows, on_pass=keep)
        for s, (p, answer) in enumerate(zip(group, answers)):
            results.append(
                {
                    "tokens": torch.tensor(list(p) + answer, dtype=torch.int32),
                    "taps": torch.cat(taps[s]),
                    "start": len(p),
                }
            )
    return results


def encode_forced(tokenizer, items, max_prompt: int, max_len: int) -> list[tuple[str, list[int], list[int]]]:
    """(kind, chat prompt ids, prompt + answer ids up to `max_len`) per (kind, ask, answer) item."""
    chat = ChatTemplate.from_tokenizer(tokenizer)
    out = []
    for kind, ask, answer in items:
        prompt = tokenizer.encode(chat.render([{"role": "user", "content": ask}]))[-max_prompt:]
        ids = (prompt + tokenizer.encode(answer))[:max_len]
        if len(ids) > len(prompt) + 8:
            out.append((kind, prompt, ids))
    return out


@torch.no_grad()
def forced(target, seqs: list[tuple[str, list[int], list[int]]], chunk_rows: int = 1024) -> list[dict]:
    """Teacher-forced sequences from `encode_forced`'s triples: tokens [L] int32, taps [L - 1, n, hidden], next
    [L - 1] int32 (the target's greedy token after each row), start (the prompt length), kind; several sequences
    a prefill pass."""
    results = []
    for i, j in packs([len(s[2]) for s in seqs], chunk_rows):
        group = seqs[i:j]
        state = target.new_state(len(group), max(len(g[2]) for g in group) + 1)
        batch = RowBatch.build([(n, 0, g[2]) for n, g in enumerate(group)])
        out = target.forward(batch, state, record="last", logits="all")
        nxt = out.logits.argmax(-1).to(torch.int32)
        for n, (kind, prompt, ids) in enumerate(group):
            a, b = batch.cu_rows[n], batch.cu_rows[n + 1] - 1  # the last row has nothing after it to label
            results.append(
                {
                    "tokens": torch.tensor(ids, dtype=torch.int32),
                    "taps": out.taps[a:b].to(torch.bfloat16).clone(),
                    "next": nxt[a:b].clone(),
                    "start": len(prompt),
                    "kind": kind,
                }
            )
    return results
