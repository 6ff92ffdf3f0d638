"""Kernel tests: triton runs on the CPU interpreter, and every `torch.empty` is poisoned.

TRITON_INTERPRET must be set before triton decorates the kernels (at import of `kernels.*`), so it is set here,
the first file pytest loads in this directory; modules also skip cleanly if the kernels were decorated for a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"

_empty = torch.empty


def _poisoned_empty(*args, **kwargs):
    t = _empty(*args, **kwargs)
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool:
        t.fill_(torch.iinfo(t.dtype).min)  # an index no kernel may leave behind
    return t


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """An output a kernel forgets to write reads as NaN (floats) or iinfo.min (ints)."""
    monkeypatch.setattr(torch, "empty", _poisoned_empty)


def require_interpreted_triton(kernel_module):
    """Skip with a message unless triton is installed and the module's kernels run on the interpreter."""
    pytest.importorskip("triton", reason="triton is not installed: kernel-vs-reference tests need it")
    from triton.runtime.interpreter import InterpretedFunction

    kernels = [v for v in vars(kernel_module).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    if not kernels or not all(isinstance(k, InterpretedFunction) for k in kernels):
        pytest.skip("kernels were imported before TRITON_INTERPRET=1 was set; run tests/kernels on its own")
