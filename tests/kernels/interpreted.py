"""Shared by the kernel tests: skip unless triton runs these kernels on the CPU interpreter.

(A module of its own, not conftest.py: two test folders with a conftest.py and no __init__.py make
`from conftest import ...` ambiguous in a full run.)
"""

from __future__ import annotations

import pytest


def require_interpreted_triton(kernel_module):
    """Skip with a message unless triton is installed and the module's kernels run on the interpreter."""
    pytest.importorskip("triton", reason="triton is not installed: kernel-vs-reference tests need it")
    from triton.runtime.interpreter import InterpretedFunction

    kernels = [v for v in vars(kernel_module).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    if not kernels or not all(isinstance(k, InterpretedFunction) for k in kernels):
        pytest.skip("kernels were imported before TRITON_INTERPRET=1 was set; run tests/kernels on its own")
