"""Shared fixtures for the model tests: the embedded SmolLM2 GGUF, converted once per session into a temp cache.

transformers is an oracle here only (test extra); `HF_HUB_OFFLINE` keeps it from reaching the network.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm_gguf():
    from speclane.stages.models.artifact import default_gguf

    return default_gguf()


@pytest.fixture(scope="session")
def smollm_cache():
    # Not under pytest's basetemp: a parallel pytest run by someone else prunes old basetemps, which could
    # delete this 540 MB conversion mid-session.
    path = Path(tempfile.mkdtemp(prefix="speclane-test-cache-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm_dir(smollm_gguf, smollm_cache):
    """The converted directory of the embedded default (converted here, once)."""
    from speclane.stages.models.artifact import resolve

    start = time.perf_counter()
    path = resolve(None, cache=smollm_cache)
    print(f"\nconverted {smollm_gguf.name} in {time.perf_counter() - start:.1f}s")
    return path


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_dir):
    from speclane.stages.models.tokenizer import Tokenizer

    return Tokenizer.load(smollm_dir)


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(smollm_gguf):
    """transformers' own tokenizer for the GGUF (the oracle)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name)
