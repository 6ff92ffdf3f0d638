"""The fitting data of `speclane fit-drafter`, built once and cached under the work directory.

Owns: the generated sets (the target's own greedy answers to chat prompts: train and held-out by document, and
the asks to write a function from its signature and docstring, the bench's code-generation ask), the
teacher-forced set (corpus text as the answer), their cache files and keys (every setting that changes the data,
and the target's taps), and trimming each sequence's taps to what the drafter reads. Not here: turning documents
into prompts and generating (`data.py`), the loop (`fit.py`).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from speclane.stages.fitting import data as fit_data

if TYPE_CHECKING:
    from speclane.stages.fitting.fit import FitSettings


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_data(s: FitSettings, target, tokenizer, work: Path) -> tuple[list[dict], list[dict]]:
    """Train and held-out sequences, generated once and cached as `data-<key>.pt` (reused by a rerun)."""
    key = json.dumps(
        {k: getattr(s, k) for k in ("model", "corpus", "seed", "prompts", "heldout_prompts", "max_prompt", "max_new")},
        sort_keys=True,
    )
    taps = tuple(target.hidden_taps)
    path = work / f"data-{hashlib.sha256((key + str(taps)).encode()).hexdigest()[:12]}.pt"
    if path.is_file():
        return torch.load(path)
    docs = fit_data.read_corpus(s.corpus)
    splits = []
    for heldout, count in ((False, s.prompts), (True, s.heldout_prompts)):
        prompts = fit_data.make_prompts(docs, count, s.seed, heldout)
        splits.append(_generated(s, target, tokenizer, prompts, "held-out" if heldout else "train"))
    _save(splits, path)
    return splits[0], splits[1]


def _save(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(tuple(obj), tmp)
    tmp.rename(path)  # a reader never sees half a file


def trim_taps(seq: dict, keep: slice) -> None:
    """Keep only the taps a drafter reads, as a copy so the rest is freed; all of them: nothing to do."""
    if keep != slice(None):
        seq["taps"] = seq["taps"][:, keep].clone()


FORCED_SHARD = 32  # teacher-forced items a cached shard (and a prefill group)


def build_forced(s: FitSettings, target, tokenizer, work: Path, keep_taps: slice = slice(None)) -> list[dict]:
    """Teacher-forced training sequences (`fit_data.forced`), cached in shards of FORCED_SHARD items under
    `forced-<key>/<shard>-<items>.pt` (the key leaves out the count: `make_forced` draws the same items first
    whatever the count, so a larger `--forced` reuses every full shard already built and prefills the rest).
    `keep_taps` trims each sequence's taps as it is loaded (mtp reads only the last), so a large set fits in memory."""
    if not s.forced:
        return []
    key = json.dumps(
        {k: getattr(s, k) for k in ("model", "corpus", "seed", "forced_len", "max_prompt")}, sort_keys=True
    ) + str(tuple(target.hidden_taps))
    folder = work / f"forced-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    items = fit_data.make_forced(fit_data.read_corpus(s.corpus), s.forced, s.seed, heldout=False)
    t0, seqs, built, n, agree, rows = time.time(), [], 0, 0, 0, 0
    for g in range(0, len(items), FORCED_SHARD):
        todo = items[g : g + FORCED_SHARD]
        shard = folder / f"{g // FORCED_SHARD:05d}-{len(todo)}.pt"  # a short last shard is not a full one
        if shard.is_file():
            group = torch.load(shard)
        else:
            group = fit_data.forced(target, fit_data.encode_forced(tokenizer, todo, s.max_prompt, s.forced_len))
            _save(group, shard)
            built += 1
        for q in group:
            n += len(q["tokens"])
            agree += int((q["tokens"][q["start"] + 1 :] == q["next"][q["start"] :]).sum())
            rows += len(q["next"]) - q["start"]
            trim_taps(q, keep_taps)
        seqs += group
        if built and (built % 4 == 0 or g + FORCED_SHARD >= len(items)):
            log(
                f"data teacher-forced: {len(seqs)} sequences ({built} shards prefilled), {n} tokens, the text "
                f"agreeing with the target at {agree / max(1, rows):.0%} of answer positions, "
                f"{time.time() - t0:.0f} s"
            )
    return seqs


def _generated(s: FitSettings, target, tokenizer, prompts: list[tuple[str, str]], label: str) -> list[dict]:
    """The target's greedy answers to (kind, user message) prompts, 64 lanes at a time, each tagged with its kind."""
    ids = fit_data.encode_prompts(tokenizer, prompts, s.max_prompt)
    eos = set(tokenizer.eos_token_ids)
    t0, seqs = time.time(), []
    for g in range(0, len(ids), 64):
        seqs += fit_data.generate(target, ids[g : g + 64], s.max_new, eos)
        n = sum(len(q["tokens"]) for q in seqs)
        log(f"data {label}: {len(seqs)}/{len(ids)} sequences, {n} tokens, {time.time() - t0:.0f} s")
    for q, (kind, _) in zip(seqs, prompts):
        q["kind"] = kind
    return seqs


def build_written(s: FitSettings, target, tokenizer, work: Path) -> list[dict]:
    """`s.write_prompts` more training sequences: the target's answers to asks to write a function from its
    signature and docstring (`fit_data.make_write_prompts`, train documents only), cached as `written-<key>.pt`
    apart from `build_data`'s file, so adding them reuses the answers already generated."""
    if not s.write_prompts:
        return []
    key = json.dumps(
        {k: getattr(s, k) for k in ("model", "corpus", "seed", "write_prompts", "max_prompt", "max_new")},
        sort_keys=True,
    ) + str(tuple(target.hidden_taps))
    path = work / f"written-{hashlib.sha256(key.encode()).hexdigest()[:12]}.pt"
    if path.is_file():
        return list(torch.load(path))
    prompts = fit_data.make_write_prompts(fit_data.read_corpus(s.corpus), s.write_prompts, s.seed, heldout=False)
    seqs = _generated(s, target, tokenizer, prompts, "write")
    _save(seqs, path)
    return seqs
