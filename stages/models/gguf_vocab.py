"""Rebuild a Hugging Face `tokenizer.json` and `tokenizer_config.json` from a GGUF's tokenizer metadata.

A GGUF carries no `tokenizer.json`: llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`), the merges,
the token types and the special ids as metadata, and names the pre-tokenizer (`tokenizer.ggml.pre`) it applies
in C++. This module turns that back into a `tokenizers.Tokenizer` that splits text the way llama.cpp does.
Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is rebuilt here, a sentencepiece one (`"llama"`) by `gguf_spm.py`;
any other kind is refused.

Reading the GGUF file and converting weights belong in `gguf.py`; using the tokenizer belongs in `tokenizer.py`.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.gguf_specials import add_bos_eos, add_whole_pieces, special_piece, tokenizer_config
from speclane.stages.models.gguf_spm import build_spm_tokenizer

# Split patterns llama.cpp applies before BPE, per `tokenizer.ggml.pre` (llama-vocab.cpp). The GPT-2 pattern is
# what tokenizers' ByteLevel(use_regex=True) already applies, so those groups need no Split of their own.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp splits every \p{N} character off first, then applies the GPT-2 pattern. tokenizers' Digits
# (individual_digits) isolates exactly the chars Rust calls numeric (Nd, Nl, No), i.e. \p{N}.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_GPT2 = ("gpt2", "default", "mpt", "olmo", "jais")
_LLAMA3 = ("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx")
_QWEN2 = ("qwen2", "deepseek-r1-qwen")
SUPPORTED_PRE = _DIGITS_THEN_GPT2 + _GPT2 + _LLAMA3 + _QWEN2


def _pre_tokenizer(pre: str, where: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2:
        return byte_level
    split = _LLAMA3_SPLIT if pre in _LLAMA3 else _QWEN2_SPLIT if pre in _QWEN2 else None
    if split is None:
        raise ArtifactError(
            f"{where}: tokenizer.ggml.pre = {pre!r} is a pre-tokenizer speclane does not know; "
            f"supported: {', '.join(SUPPORTED_PRE)}. Convert the model to a Hugging Face directory with its "
            "own tokenizer.json and pass that directory instead."
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_tokenizer(meta: dict[str, Any], where: str) -> tuple[Tokenizer, dict[str, Any]]:
    """`(tokenizer, tokenizer_config)` from GGUF metadata; `where` names the file in errors."""
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":  # sentencepiece: Llama 2, Mistral, Mixtral
        return build_spm_tokenizer(meta, where)
    if kind != "gpt2":
        raise ArtifactError(
            f"{where}: tokenizer.ggml.model = {kind!r}; only byte-level BPE ('gpt2') and sentencepiece ('llama') "
            "GGUF vocabularies are supported. Pass a Hugging Face directory with its own tokenizer.json instead."
        )
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        if key not in meta:
            raise ArtifactError(f"{where}: metadata key {key} is missing; the file carries no usable vocabulary.")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = []
    for i, merge in enumerate(meta["tokenizer.ggml.merges"]):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ArtifactError(f"{where}: tokenizer.ggml.merges[{i}] = {merge!r} is not two tokens split by a space.")
        merges.append((parts[0], parts[1]))

    vocab = {token: index for index, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")), where)
    tok.decoder = decoders.ByteLevel()
    add_whole_pieces(tok, tokens, types)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ArtifactError(
            f"{where}: the rebuilt tokenizer has {tok.get_vocab_size(with_added_tokens=True)} tokens, the file lists "
            f"{len(tokens)} (duplicate token strings?); pass a Hugging Face directory with its own tokenizer.json."
        )

    bos, eos = special_piece(meta, tokens, "bos"), special_piece(meta, tokens, "eos")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    add_bos_eos(tok, vocab, bos, eos, add_bos, add_eos, where)
    return tok, tokenizer_config(meta, tokens, bos, eos, add_bos, add_eos)
