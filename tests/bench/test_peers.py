"""The llama.cpp peer's crash handling, without llama.cpp: a native crash in a child process is reported by signal,
and a peer whose first completion crashes with llama.cpp's extra buffer types retries without them (or is a skip).
"""

import sys
import types
from pathlib import Path

import pytest

from speclane.bench import llamacpp_peer


def test_child_reports_a_native_crash_by_signal():
    rc, _ = llamacpp_peer._child("os.kill(p.os.getpid(), 11)", 60)
    assert rc == "-11 (SIGSEGV)"
    assert llamacpp_peer._child("os.getpid()", 60)[0] == 0


@pytest.fixture
def fake_llama(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))


def _children(monkeypatch, codes: list[int]):
    calls = []

    def child(call, timeout):
        calls.append(call)
        return codes[len(calls) - 1], "boom"

    monkeypatch.setattr(llamacpp_peer, "_child", child)
    return calls


def test_crash_with_extra_buffer_types_retries_without(fake_llama, monkeypatch):
    calls = _children(monkeypatch, ["-11 (SIGSEGV)", 0])
    peer = llamacpp_peer.LlamaCppPeer(Path("/m/x.gguf"), 1, (2,), 256, "Q4_1")
    assert [c.endswith("True)") for c in calls] == [True, False]
    assert peer.extra_bufts is False
    assert "extra CPU buffer types" in peer.note and "SIGSEGV" in peer.note and "Q4_1" in peer.note


def test_no_crash_keeps_extra_buffer_types(fake_llama, monkeypatch):
    calls = _children(monkeypatch, [0])
    peer = llamacpp_peer.LlamaCppPeer(Path("/m/x.gguf"), 1, (2,), 256, "bf16")
    assert len(calls) == 1 and peer.extra_bufts is True and "off" not in peer.note


def test_crash_both_ways_is_a_skip_with_the_reason(fake_llama, monkeypatch):
    _children(monkeypatch, ["-11 (SIGSEGV)", "-6 (SIGABRT)"])
    with pytest.raises(RuntimeError, match=r"x.gguf.*-11 \(SIGSEGV\).*-6 \(SIGABRT\)"):
        llamacpp_peer.LlamaCppPeer(Path("/m/x.gguf"), 1, (2,), 256, "bf16")


def test_run_from_the_checkout_root_the_transformers_peer_still_imports():
    """Python puts the working directory first on sys.path, where this repository's kernels/ folder would hide the
    `kernels` distribution transformers 5 imports, and the peer would be skipped; importing the benches puts the
    installed one first where they import transformers."""
    import importlib.metadata
    import subprocess

    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("no `kernels` distribution installed here")
    root = Path(__file__).resolve().parents[2]
    probe = "import speclane.bench as b; b.installed_kernels_first(); import kernels; print(kernels.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve().parent != root / "kernels", out.stdout
