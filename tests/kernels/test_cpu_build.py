"""The C kernels' build (kernels/cpu_build.py): cached per source, flags and compiler, and switched off by name.

Apart from tests/kernels/test_cpu_kernels.py, whose every test runs once per build this CPU runs: this one builds
from scratch in an empty cache, which does not depend on the build the other tests hold.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from speclane.kernels import cpu_build


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or shutil.which("cc") is None,
    reason="no AVX2 or no C compiler here",
)
def test_the_build_is_cached_and_reports_why_it_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_build, "_WHY", None)  # every module state this test changes is restored after it
    monkeypatch.setattr(cpu_build, "_TRIED", False)
    monkeypatch.setattr(cpu_build, "_LIB", None)
    monkeypatch.setattr(cpu_build, "_VARIANTS", {})
    assert cpu_build.library() is not None and len(list((tmp_path / "kernels").glob("rows-*.so"))) == 1
    monkeypatch.setenv("SPECLANE_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_build, "_TRIED", False)
    monkeypatch.setattr(cpu_build, "_LIB", None)
    assert cpu_build.library() is None and cpu_build.unavailable() == "SPECLANE_CPU_KERNELS=0"
    assert "torch twins (SPECLANE_CPU_KERNELS=0)" in cpu_build.describe()
