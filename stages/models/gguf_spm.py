"""Rebuild a Hugging Face tokenizer from a GGUF's sentencepiece vocabulary (`tokenizer.ggml.model = "llama"`).

Llama 2, Mistral and Mixtral files store sentencepiece BPE pieces with their scores and types, and usually no
merges. The tokenizer is BPE with byte fallback (`<0x41>` pieces for bytes no piece covers): spaces written as "▁",
one "▁" put before the text unless `tokenizer.ggml.add_space_prefix` is false, merges as the file lists them or,
when it lists none, recovered from the vocabulary (every split of a piece into two pieces, ranked by the merged
piece's score: sentencepiece merges the highest-scored pair first). Control pieces (type 3) are special tokens,
user-defined ones (type 4) plain added tokens, both matched whole; a BOS is added unless the file says not to, as
llama.cpp does. This is the tokenizer transformers builds for the same file.
Not here: byte-level BPE vocabularies (`gguf_vocab.py`), Gemma's sentencepiece quirks (`gemma_vocab.py`).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.gguf_specials import add_bos_eos, add_whole_pieces, special_piece, tokenizer_config


def recover_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) split of a piece into two pieces of the vocabulary, the highest-scored merged piece
    first (then the longer left part, then the longer right part); splits of one piece in vocabulary order."""
    index = {t: i for i, t in enumerate(tokens)}
    found = []
    for piece, score in zip(tokens, scores):
        local = [
            (piece[:k], piece[k:], score) for k in range(1, len(piece)) if piece[:k] in index and piece[k:] in index
        ]
        found += sorted(local, key=lambda m: (index[m[0]], index[m[1]]))
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def build_spm_tokenizer(meta: dict[str, Any], where: str) -> tuple[Tokenizer, dict[str, Any]]:
    """`(tokenizer, tokenizer_config)` from a sentencepiece GGUF's metadata; `where` names the file in errors."""
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or ())
    scores: list[float] = list(meta.get("tokenizer.ggml.scores") or ())
    if not tokens or (len(scores) != len(tokens) and "tokenizer.ggml.merges" not in meta):
        raise ArtifactError(
            f"{where}: a sentencepiece vocabulary needs tokenizer.ggml.tokens and one tokenizer.ggml.scores entry a "
            f"token (got {len(tokens)} tokens, {len(scores)} scores); the file carries no usable vocabulary."
        )
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if "tokenizer.ggml.merges" in meta:
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    else:
        merges = recover_merges(tokens, scores)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if prefix else []))
    add_whole_pieces(tok, tokens, types)
    bos, eos = special_piece(meta, tokens, "bos"), special_piece(meta, tokens, "eos")
    # A flag whose piece the file does not name is dropped, not refused: llama.cpp adds BOS by default.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    add_bos_eos(tok, vocab, bos, eos, add_bos, add_eos, where)
    return tok, tokenizer_config(meta, tokens, bos, eos, add_bos, add_eos)
