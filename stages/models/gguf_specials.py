"""What every tokenizer rebuilt from GGUF metadata shares: its special pieces, the pieces matched whole, the BOS/EOS
post-processor and the `tokenizer_config` it is written with.

Byte-level BPE (`gguf_vocab.py`), sentencepiece (`gguf_spm.py`) and Gemma's sentencepiece (`gemma_vocab.py`) each
build their own model, splitting and decoding, then finish the tokenizer here. Not here: merges, pre-tokenizers,
normalizers and decoders, which differ between the three.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, processors

from speclane.stages.contract.errors import ArtifactError

# llama.cpp's token types (llama_token_type in llama.h): 3 marks a control token such as <|im_end|>,
# 4 a user-defined one such as <think>. Both are matched whole in raw text, never cut by BPE.
CONTROL, USER_DEFINED = 3, 4


def special_piece(meta: dict[str, Any], tokens: list[str], key: str) -> str | None:
    """The piece `tokenizer.ggml.<key>_token_id` names (key: bos, eos, unknown, padding); None when it names none."""
    token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
    return None if token_id is None else tokens[int(token_id)]


def add_whole_pieces(tok: Tokenizer, tokens: list[str], types: list[int], skip: frozenset[str] = frozenset()) -> None:
    """Control pieces become special tokens (skippable on decode), user-defined ones other than `skip` plain added
    tokens: both matched whole in raw text."""
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == CONTROL]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types)
            if k == USER_DEFINED and t not in skip
        ]
    )


def add_bos_eos(
    tok: Tokenizer, vocab: dict[str, int], bos: str | None, eos: str | None, add_bos: bool, add_eos: bool, where: str
) -> None:
    """Put BOS before and EOS after an encoding where asked (tokenizers adds them in its post-processor, when the
    caller asks for special tokens). A flag set without its piece is refused, naming `where`."""
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise ArtifactError(f"{where}: add_bos_token/add_eos_token is set but the matching token id is missing.")
    if add_bos or add_eos:
        single = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
        specials = [(t, vocab[t]) for t in dict.fromkeys(t for t, on in ((bos, add_bos), (eos, add_eos)) if on)]
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)


def tokenizer_config(
    meta: dict[str, Any], tokens: list[str], bos: str | None, eos: str | None, add_bos: bool, add_eos: bool
) -> dict[str, Any]:
    """`tokenizer_config.json` for a rebuilt tokenizer: its special pieces, the BOS/EOS flags, and the file's chat
    template when it carries one."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": special_piece(meta, tokens, "unknown"),
        "pad_token": special_piece(meta, tokens, "padding"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config
