"""Session-wide test settings, set before any test module imports speclane.

- TRITON_INTERPRET=1 where there is no GPU: triton decorates kernels at import, so this must precede the first
  `import kernels` in the session (tests/kernels runs its kernels on the CPU interpreter against their twins).
- HF_HUB_OFFLINE: transformers is only an oracle here and must never reach for a hub.
- SPECLANE_CHECK_VALUES=1: the kernel wrappers check their arguments' values too (kernels/_triton.py), which
  serving skips.
- The top-level name `kernels` is the installed distribution's (Hugging Face's, which transformers imports), not
  this repository's kernels/ folder (`speclane.kernels`), which the repository's root on sys.path (`python -m
  pytest`, and pytest's own rootdir insertion) would otherwise put first.
"""

import os
import sys
from pathlib import Path

import torch

from speclane.bench import installed_kernels_first

installed_kernels_first()  # as the benches do before transformers: bench/__init__.py

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
    root = Path(__file__).resolve().parents[1]

    def ours(name: str) -> bool:
        where = getattr(sys.modules.get(name), "__file__", None)
        return where is not None and Path(where).resolve().is_relative_to(root / name.split(".")[0])

    # the installed `kernels` distribution (transformers imports it: `_installed_kernels`) is not our folder; where
    # it is not installed, transformers' probe of that name finds our folder's bare `__init__` (a docstring): harmless
    stray = sorted(
        m
        for m in list(sys.modules)
        if m != "kernels" and m.split(".")[0] in ("pipeline", "stages", "kernels", "bench", "specs") and ours(m)
    )
    if stray:
        print(f"\nmodules imported by a bare folder name (import them as speclane.<folder>): {stray}")
        session.exitstatus = 1
