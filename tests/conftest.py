"""Session-wide test settings, set before any test module imports speclane.

- TRITON_INTERPRET=1 where there is no GPU: triton decorates kernels at import, so this must precede the first
  `import kernels` in the session (tests/kernels runs its kernels on the CPU interpreter against their twins).
- HF_HUB_OFFLINE: transformers is only an oracle here and must never reach for a hub.
- SPECLANE_CHECK_VALUES=1: the kernel wrappers check their arguments' values too (kernels/_triton.py), which
  serving skips.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SPECLANE_CHECK_VALUES", "1")


import pytest  # noqa: E402


@pytest.fixture
def no_cpu_kernels(monkeypatch):
    """Run as on a machine where the C kernels cannot be built: every caller takes its torch twin."""
    from speclane.kernels import cpu_build

    monkeypatch.setattr(cpu_build, "_TRIED", True)
    monkeypatch.setattr(cpu_build, "_LIB", None)
    monkeypatch.setattr(cpu_build, "_WHY", "switched off by the test")


@pytest.fixture(autouse=True)
def _grad_mode_restored():
    """A test (or the code it calls, a bench's main) that turns autograd off for good breaks every later fit."""
    yield
    assert torch.is_grad_enabled(), "this test left autograd off (torch.set_grad_enabled(False) not undone)"


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when anything imported a folder by its bare name: with the checkout on sys.path that loads a
    second copy of a module beside `speclane.<folder>`, so a patch or a registry on one copy misses the other."""
    import sys

    stray = sorted(m for m in sys.modules if m.split(".")[0] in ("pipeline", "stages", "kernels", "bench", "specs"))
    # transformers probes for the hub's own `kernels` package by importing that name, and from a checkout finds
    # our folder's bare `__init__` (a docstring): harmless, and not ours to change
    stray = [m for m in stray if m != "kernels"]
    if stray:
        print(f"\nmodules imported by a bare folder name (import them as speclane.<folder>): {stray}")
        session.exitstatus = 1
