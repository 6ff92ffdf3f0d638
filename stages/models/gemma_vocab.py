"""Rebuild Gemma's Hugging Face tokenizer from a GGUF's sentencepiece vocabulary, and Gemma's chat template.

A Gemma GGUF (`tokenizer.ggml.model = "llama"`) lists its pieces, their scores and types, but no merges. The
tokenizer is sentencepiece BPE with byte fallback and no prefix space: spaces normalised to "▁", a BPE whose merges
are recovered from the vocabulary (`gguf_spm.recover_merges`: every split of a piece into two pieces of the
vocabulary), ranked by the merged piece's position in the file (Gemma's scores do not follow its merge order, its
order does); pieces of two or more spaces, which the file spells with real spaces, respelled with "▁".
Control pieces (type 3) are special tokens, user-defined ones (type 4, "\\n", "<start_of_image>") plain added
tokens, both matched whole. This is the tokenizer transformers builds for the same file.
When the file carries no `tokenizer.chat_template`, Gemma's own turn format is written (`CHAT_TEMPLATE`).
Not here: the tensors and config (gguf_gemma.py), using the tokenizer (tokenizer.py).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.gguf_specials import add_bos_eos, add_whole_pieces, special_piece, tokenizer_config
from speclane.stages.models.gguf_spm import recover_merges

# Gemma 3's instruction format: `<start_of_turn>user ... <end_of_turn>`, the assistant's turns as "model", a system
# message folded into the first user turn, roles alternating.
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\\n' }}
{%- endif -%}
"""


def build_gemma_tokenizer(meta: dict[str, Any], where: str) -> tuple[Tokenizer, dict[str, Any]]:
    """`(tokenizer, tokenizer_config)` from a Gemma GGUF's metadata; `where` names the file in errors."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "llama":
        raise ArtifactError(
            f"{where}: tokenizer.ggml.model = {kind!r}; a Gemma file carries a sentencepiece ('llama') vocabulary. "
            "Pass a Hugging Face directory with its own tokenizer.json instead."
        )
    if "tokenizer.ggml.tokens" not in meta:
        raise ArtifactError(f"{where}: metadata key tokenizer.ggml.tokens is missing; the file carries no vocabulary.")
    raw = list(meta["tokenizer.ggml.tokens"])
    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in raw]
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(set(tokens)) != len(tokens) or len(types) != len(tokens):
        raise ArtifactError(
            f"{where}: tokenizer.ggml.tokens has duplicate pieces or token_type another length; the vocabulary is "
            "inconsistent. Pass a Hugging Face directory with its own tokenizer.json."
        )

    unk = special_piece(meta, tokens, "unknown") or "<unk>"
    if unk not in tokens:
        raise ArtifactError(f"{where}: the unknown piece {unk!r} is not in the vocabulary; the file is inconsistent.")
    vocab = {t: i for i, t in enumerate(tokens)}
    by_order = [-float(i) for i in range(len(tokens))]  # Gemma merges in the file's order, not by its scores
    tok = Tokenizer(
        models.BPE(
            vocab=vocab, merges=recover_merges(tokens, by_order), unk_token=unk, fuse_unk=True, byte_fallback=True
        )
    )
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    # A piece of spaces respelled above is matched by BPE, not whole (the spelling in the file would never match).
    add_whole_pieces(tok, tokens, types, skip=frozenset(t for t, r in zip(tokens, raw) if t != r))
    bos, eos = special_piece(meta, tokens, "bos"), special_piece(meta, tokens, "eos")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))  # llama.cpp's default for sentencepiece
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    add_bos_eos(tok, vocab, bos, eos, add_bos, add_eos, where)
    config = tokenizer_config(meta, tokens, bos, eos, add_bos, add_eos)
    config.update(
        tokenizer_class="GemmaTokenizer",
        unk_token=unk,
        chat_template=meta.get("tokenizer.chat_template") or CHAT_TEMPLATE,
    )
    return tok, config
