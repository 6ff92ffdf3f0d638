"""A sentencepiece GGUF vocabulary (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Mixtral files) rebuilds
into the tokenizer transformers builds from the same file: the same ids (BOS, "▁" prefix, byte fallback, control
and user-defined pieces whole) and the same text back."""

from __future__ import annotations

import gguf
import pytest

from speclane.stages.models.gguf import read_metadata
from speclane.stages.models.gguf_vocab import build_tokenizer

PIECES = ["▁", "a", "b", "c", "d", "e", "h", "l", "o", "w", "r", "▁a", "ab", "▁ab", "bc", "abc", "▁abc", "he", "ll"]
PIECES += ["llo", "hello", "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "▁▁", "▁b", "ca"]
TEXTS = [
    "abc",
    "hello world",
    " hello  world",
    "ab abc\nbc",
    "wörld ☃",
    "[INST] hello [/INST]",
    "<tool>abc",
    "a",
    "cab",
]


def write_spm_gguf(path, add_space_prefix: bool | None = None):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES + ["[INST]", "[/INST]", "<tool>"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES) + [3, 3, 4]
    # scores out of vocabulary order: the merge ranking must follow the scores, not the positions
    scores = [0.0] * 259 + [-float((7 * i) % len(PIECES)) for i in range(len(PIECES))] + [0.0] * 3
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_ids_and_text_equal_transformers_tokenizer_for_the_file(tmp_path):
    from transformers import AutoTokenizer

    path = write_spm_gguf(tmp_path / "spm.gguf")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ours, config = build_tokenizer(read_metadata(gguf.GGUFReader(path)), str(path))
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == ("<s>", "</s>", True)
    for text in TEXTS:
        want = theirs.encode(text)
        got = ours.encode(text).ids
        assert got == want, text
        assert ours.encode(text, add_special_tokens=False).ids == theirs.encode(text, add_special_tokens=False)
        assert ours.decode(got, skip_special_tokens=False) == theirs.decode(want), text
        assert ours.decode(got, skip_special_tokens=True) == theirs.decode(want, skip_special_tokens=True), text
    assert ours.encode("hello world").tokens == ["<s>", "▁hello", "▁world"]
    assert ours.encode("wörld").tokens == ["<s>", "▁w", "<0xC3>", "<0xB6>", "r", "ld"]  # byte fallback


def test_a_file_without_the_space_prefix_gets_none(tmp_path):
    """`add_space_prefix = false` as llama.cpp reads it (transformers' GGUF tokenizer ignores the key)."""
    path = write_spm_gguf(tmp_path / "spm.gguf", add_space_prefix=False)
    ours, _ = build_tokenizer(read_metadata(gguf.GGUFReader(path)), str(path))
    assert ours.encode("hello world").tokens == ["<s>", "hello", "▁world"]
    assert ours.decode(ours.encode("hello world").ids, skip_special_tokens=True) == "hello world"
