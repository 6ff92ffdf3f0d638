"""The kernels package imports and runs its torch twins with triton absent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, torch
sys.modules['triton'] = None  # makes `import triton` raise ImportError
import speclane.kernels.accept, speclane.kernels.decode_linear, speclane.kernels.kv_commit, speclane.kernels.sampling
from speclane.kernels._triton import HAVE_TRITON
assert not HAVE_TRITON
print(speclane.kernels.decode_linear.decode_linear(torch.ones(1, 3), torch.ones(2, 3)).tolist())
"""


def test_imports_without_triton():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[[3.0, 3.0]]"
