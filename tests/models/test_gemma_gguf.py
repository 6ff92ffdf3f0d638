"""A Gemma 3 GGUF, written here with the `gguf` package's GGUFWriter the way llama.cpp's converter writes one (norms
stored as 1 + w, llama.cpp's tensor names, a sentencepiece vocabulary without merges, one Q8_0 tensor), converted by
speclane and compared with the transformers model it was written from and with transformers' reading of its
vocabulary."""

from __future__ import annotations

import json

import pytest
import torch
from gemma_artifacts import _rescale

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.artifact import resolve
from speclane.stages.models.chat import ChatTemplate
from speclane.stages.models.gemma_vocab import CHAT_TEMPLATE
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from speclane.stages.models.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

WINDOW = 5
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
WORDS = ["▁hello", "▁world", "▁the", "▁cat", "▁in", "▁a", "▁hat", "user", "model"]
# llama.cpp's names of one decoder layer's tensors -> transformers' Gemma 3 names
LAYER = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def vocabulary() -> tuple[list[str], list[int]]:
    """A small sentencepiece vocabulary: control pieces, "\\n" and two spaces (user-defined), bytes for fallback,
    single characters, then words and the pieces they merge through."""
    pieces = list(SPECIALS) + ["\n", "  "] + [f"<0x{b:02X}>" for b in (0xC3, 0xA9)] + ["▁"]
    pieces += list("abcdehilmnorstuw")
    for word in WORDS:  # every prefix, so BPE can reach the word
        pieces += [word[:j] for j in range(2, len(word) + 1) if word[:j] not in pieces]
    types = [3] * len(SPECIALS) + [4, 4, 6, 6] + [1] * (len(pieces) - len(SPECIALS) - 4)
    return pieces, types


def write_gguf(path, model, tokens, types, *, drop=(), chat_template=None) -> None:
    cfg, state = model.config, model.state_dict()
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(128)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    if "sliding_window" not in drop:
        w.add_sliding_window(cfg.sliding_window)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    for i in range(cfg.num_hidden_layers):
        names |= {f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight" for g, h in LAYER.items()}
    for name, hf in names.items():
        t = state[hf].float().numpy()
        if name == "token_embd.weight":
            w.add_tensor(
                name, gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0
            )
        elif name not in drop:
            w.add_tensor(name, t + 1.0 if hf.endswith("norm.weight") else t)  # llama.cpp stores 1 + w
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    """(the GGUF file, its converted directory, the transformers model it holds exactly, float32)."""
    tokens, types = vocabulary()
    cfg = transformers.Gemma3TextConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,  # llama.cpp's pattern: five local layers, then a global one
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,  # what llama.cpp uses: the head size
        sliding_window=WINDOW,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )
    torch.manual_seed(7)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    _rescale(model, seed=17)
    with torch.no_grad():  # the embedding as the Q8_0 file will hold it, so the file and the model agree exactly
        e = model.model.embed_tokens.weight
        q8 = gguf.quants.quantize(e.numpy(), gguf.GGMLQuantizationType.Q8_0)
        e.copy_(torch.from_numpy(gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)))
    root = tmp_path_factory.mktemp("gemma-gguf")
    path = root / "tiny-gemma3.gguf"
    write_gguf(path, model, tokens, types)
    return path, resolve(path, cache=root / "cache"), model


def test_config_comes_from_the_metadata(gemma_gguf):
    path, directory, _ = gemma_gguf
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["layer_types"] == ["sliding_attention"] * 5 + [
        "full_attention"
    ]
    assert config["sliding_window"] == WINDOW and config["query_pre_attn_scalar"] == 16
    assert config["eos_token_id"] == [1, SPECIALS.index("<end_of_turn>")]  # a turn's end stops generation too
    assert transformers.AutoConfig.from_pretrained(directory).model_type == "gemma3_text"  # a directory it reads


def test_converted_model_equals_the_model_it_was_written_from(gemma_gguf):
    _, directory, model = gemma_gguf
    tokens = torch.randint(0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        want = model(torch.tensor([tokens])).logits[0]
    target = Target.load(directory, dtype=torch.float32)
    state = target.new_state(slots=1, max_len=32)
    got = torch.cat(
        [target.forward(RowBatch.build([(0, i, tokens[i : i + 4])]), state).logits for i in range(0, 24, 4)]
    )
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)  # the bound of tests/models/test_gemma.py


@pytest.mark.parametrize(
    "text", ["hello world", "the  cat\n\nin a hat", "<start_of_turn>user\nhello<end_of_turn>\n", " café", "xyz"]
)
def test_vocabulary_encodes_as_transformers_reads_the_same_file(gemma_gguf, text):
    path, directory, _ = gemma_gguf
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = Tokenizer.load(directory)
    assert ours.encode(text, add_special=True) == theirs(text).input_ids
    ids = theirs(text).input_ids
    assert ours.decode(ids, skip_special=True) == theirs.decode(ids, skip_special_tokens=True)


def test_chat_template_is_gemmas_turn_format_when_the_file_has_none(gemma_gguf):
    _, directory, _ = gemma_gguf
    tok = Tokenizer.load(directory)
    assert tok.chat_template == CHAT_TEMPLATE
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " hello "},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "the cat"},
    ]
    text = ChatTemplate.from_tokenizer(tok).render(messages)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nhello<end_of_turn>\n<start_of_turn>model\nhi<end_of_turn>\n"
        "<start_of_turn>user\nthe cat<end_of_turn>\n<start_of_turn>model\n"
    )
    assert tok.encode(text)[:2] == [2, SPECIALS.index("<start_of_turn>")]  # whole control pieces, one <bos>


def test_the_files_own_chat_template_wins(gemma_gguf, tmp_path):
    _, _, model = gemma_gguf
    tokens, types = vocabulary()
    path = tmp_path / "templated.gguf"
    write_gguf(path, model, tokens, types, chat_template="{{ bos_token }}{{ messages[0]['content'] }}")
    assert Tokenizer.load(resolve(path, cache=tmp_path / "cache")).chat_template.endswith("['content'] }}")


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("sliding_window", "metadata keys missing: gemma3.attention.sliding_window"),
        ("blk.2.post_ffw_norm.weight", "1 tensor\\(s\\) missing .*model.layers.2.post_feedforward_layernorm"),
    ],
)
def test_incomplete_files_are_refused_naming_what_is_missing(gemma_gguf, tmp_path, drop, message):
    _, _, model = gemma_gguf
    tokens, types = vocabulary()
    path = tmp_path / "broken.gguf"
    write_gguf(path, model, tokens, types, drop=(drop,))
    with pytest.raises(ArtifactError, match=message):
        resolve(path, cache=tmp_path / "cache")


def test_vocabulary_must_be_sentencepiece():
    from speclane.stages.models.gemma_vocab import build_gemma_tokenizer

    with pytest.raises(ArtifactError, match="tokenizer.ggml.model = 'gpt2'.*sentencepiece"):
        build_gemma_tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]}, "x.gguf")
