"""Optional triton import and the one dispatch rule shared by every kernel module.

Owns only: whether triton is importable, `use_triton(t)`, and `check` / `checks_values(t)`, the argument checks
before a launch. The kernels package must import with triton absent, so every kernel module guards its
`@triton.jit` definitions with `HAVE_TRITON`.
"""

from __future__ import annotations

import os

import torch

try:  # triton is an optional extra (`speclane[gpu]`); CPU-only installs run the torch twins.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised on installs without triton
    triton = None
    tl = None
    HAVE_TRITON = False


def interpreting() -> bool:
    """True when triton runs kernels on the CPU interpreter (tests only)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(t: torch.Tensor) -> bool:
    """The dispatch rule: the triton path needs triton and a CUDA tensor; everything else runs the torch twin."""
    return HAVE_TRITON and t.is_cuda


def check(cond: bool, msg: str) -> None:
    """Host-side argument check before a launch: a ValueError naming the argument, never an assert."""
    if not cond:
        raise ValueError(msg)


def checks_values(t: torch.Tensor) -> bool:
    """Whether a wrapper also checks its arguments' values (token ids in range, offsets consistent, uniforms in
    [0, 1)), not only their shapes and dtypes: on CPU tensors with `SPECLANE_CHECK_VALUES=1` (the test suite sets
    it). Those values are made by the engine's own stages, never by a client, and reading them costs host reads
    on every round (a few percent of a plain-decode round on a CPU); on a GPU each read would be a sync."""
    return t.device.type == "cpu" and os.environ.get("SPECLANE_CHECK_VALUES") == "1"
