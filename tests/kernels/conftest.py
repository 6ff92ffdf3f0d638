"""Kernel tests: triton runs on the CPU interpreter (where there is no GPU), and every `torch.empty` is poisoned.

TRITON_INTERPRET must be set before triton decorates the kernels (at import of `kernels.*`), so it is set here,
the first file pytest loads in this directory; modules also skip cleanly if the kernels were decorated for a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # on a GPU the kernels compile for it, and the interpreted tests skip
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
