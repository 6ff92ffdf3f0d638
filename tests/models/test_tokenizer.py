"""The tokenizer rebuilt from GGUF metadata splits text as transformers' GGUF tokenizer does (and as llama.cpp's
`smollm` pre-tokenizer does where the two differ), and the streaming detokenizer survives split UTF-8."""

from __future__ import annotations

import json

import pytest

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.gguf_vocab import build_tokenizer
from speclane.stages.models.tokenizer import Tokenizer

VARIED = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "    \tindented\t\ttabs   and   runs of spaces    \n\n\n  trailing  ",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, العربية, emoji 🙂👍🏽🇫🇷",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|endoftext|><file_sep>",
    "Numbers 12345 and 3.14159, x=-7e10; don't we'll I'M they've",
    '{"json": [1, 2, {"k": null}], \'quote\'}\r\nwindows\r\nline',
    "",
]


@pytest.mark.parametrize("text", VARIED)
def test_same_ids_as_transformers_gguf_tokenizer(smollm_tokenizer, hf_gguf_tokenizer, text):
    assert smollm_tokenizer.encode(text) == hf_gguf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert smollm_tokenizer.decode(smollm_tokenizer.encode(text)) == text


def test_special_tokens_stay_whole(smollm_tokenizer):
    assert smollm_tokenizer.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
    assert smollm_tokenizer.decode([1, 4093, 2], skip_special=True) == "user"


def test_non_ascii_numerals_split_like_llama_cpp(smollm_tokenizer, hf_gguf_tokenizer):
    # llama.cpp's `smollm` pre-tokenizer splits every \p{N} char off first (as SmolLM2's own tokenizer.json
    # does with Digits); transformers' GGUF loader omits that step. Only non-ASCII numerals show it: "²" is
    # one vocabulary token ("Â²") that transformers glues to the preceding space instead.
    assert smollm_tokenizer.backend.encode(" x ²").tokens == ["Ġx", "Ġ", "Â²"]
    assert hf_gguf_tokenizer.backend_tokenizer.encode(" x ²").tokens == ["Ġx", "ĠÂ", "²"]


def test_specials_and_stop_ids(smollm_tokenizer):
    assert (smollm_tokenizer.bos_token, smollm_tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert smollm_tokenizer.eos_token_ids == (2,)
    assert smollm_tokenizer.vocab_size == 49152
    # SmolLM2's GGUF says add_bos_token = false: asking for specials adds nothing.
    assert smollm_tokenizer.encode("hi", add_special=True) == smollm_tokenizer.encode("hi")


def test_add_bos_token_goes_into_the_post_processor():
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": ["<s>", "</s>", "a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.token_type": [3, 3, 1, 1, 1],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    tok, config = build_tokenizer(meta, "tiny.gguf")
    assert tok.encode("ab").ids == [0, 4] and tok.encode("ab", add_special_tokens=False).ids == [4]
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == ("<s>", "</s>", True)


def _stream(tokenizer, ids):
    detok = tokenizer.detokenizer()
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


def test_streaming_holds_back_split_utf8(smollm_tokenizer):
    text = "Café 日本語 🙂👍🏽 done"
    ids = smollm_tokenizer.encode(text)
    # The case under test exists: some token alone is only part of a character.
    assert any("\ufffd" in smollm_tokenizer.decode([i]) for i in ids)
    pieces, rest = _stream(smollm_tokenizer, ids)
    assert "".join(pieces) + rest == text and rest == ""
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p == "") > 0  # held back at least once


def test_flush_gives_up_on_an_incomplete_character(smollm_tokenizer):
    ids = smollm_tokenizer.encode("ok 👍🏽")  # 👍 is three byte tokens here
    partial = next(n for n in range(1, len(ids)) if smollm_tokenizer.decode(ids[:n]).endswith("\ufffd"))
    pieces, rest = _stream(smollm_tokenizer, ids[:partial])
    # The held token ("Ġ" + a lead byte) carries its space with it: both come out at the flush.
    assert "".join(pieces) + rest == smollm_tokenizer.decode(ids[:partial]) == "ok \ufffd"
    assert not any("\ufffd" in p for p in pieces) and rest == " \ufffd"


def test_streaming_skips_specials_when_asked(smollm_tokenizer):
    ids = smollm_tokenizer.encode("<|im_start|>assistant\nHi!<|im_end|>")
    detok = smollm_tokenizer.detokenizer(skip_special=True)
    assert "".join(detok.push(i) for i in ids) + detok.flush() == "assistant\nHi!"


def test_load_errors_name_the_file(tmp_path, smollm_dir):
    with pytest.raises(ArtifactError, match=r"tokenizer.json: missing; the artifact needs a tokenizer.json"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((smollm_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|nope|>"}))
    with pytest.raises(ArtifactError, match=r"eos_token '<\|nope\|>' is not in the vocabulary of tokenizer.json"):
        Tokenizer.load(tmp_path)


def test_unsupported_gguf_vocabularies_are_refused():
    with pytest.raises(ArtifactError, match=r"x.gguf: tokenizer.ggml.model = 'bert'; only byte-level BPE"):
        build_tokenizer({"tokenizer.ggml.model": "bert"}, "x.gguf")
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "mystery",
        "tokenizer.ggml.tokens": ["a"],
        "tokenizer.ggml.merges": [],
    }
    with pytest.raises(ArtifactError, match=r"tokenizer.ggml.pre = 'mystery' is a pre-tokenizer speclane does not"):
        build_tokenizer(meta, "x.gguf")
