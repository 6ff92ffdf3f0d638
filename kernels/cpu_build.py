"""Builds and loads the C kernels of `kernels/cpu/` once per machine, and says plainly when they cannot be had.

Owns: compiling `kernels/cpu/rows.c` with the system C compiler into a shared library cached under
`~/.cache/speclane/kernels/` (keyed by the source, the flags and the compiler, so an edit or another compiler
builds anew and two processes never load a half-written file), loading it with ctypes, and the reason it is
unavailable (no compiler, a CPU without AVX2/FMA, `SPECLANE_CPU_KERNELS=0`). Not here: when a kernel is used
or what it computes (kernels/decode_linear.py, kernels/decode_attention.py, the C source).

Why C through ctypes rather than a torch extension: the kernels need no torch headers, so a build takes about a
second instead of the minute `torch.utils.cpp_extension` spends on them, and a call costs a few microseconds.
Where the library cannot be built, every caller keeps its torch twin, which is exact too (padded rows), slower.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "cpu" / "rows.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno")
_LIB: ctypes.CDLL | None = None
_WHY: str | None = None
_TRIED = False

_i64, _int, _ptr, _f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
_SIGNATURES = {
    "sl_linear": (_int, [_ptr, _int, _ptr, _int, _ptr, _int, _ptr, _int, _i64, _i64, _i64, _int]),
    "sl_linear_q": (_int, [_ptr, _int, _ptr, _int, _ptr, _ptr, _int, _ptr, _int, _i64, _i64, _i64, _int]),
    "sl_attend": (_int, [_ptr, _ptr, _ptr, _int, _ptr, _ptr, _ptr, _int, _i64, _i64, _i64, _i64, _i64, _f32, _int]),
    "sl_add_rmsnorm": (_int, [_ptr, _ptr, _int, _ptr, _ptr, _int, _i64, _i64, _f32]),
    "sl_dense_layer": (_int, [_ptr, _ptr, _int, _i64, _ptr, _ptr, _ptr, _ptr, _int, _i64, _ptr, _ptr, _ptr, _int]),
    "sl_silu_mul": (_int, [_ptr, _int, _ptr, _i64, _i64]),
    "sl_qk_rope_write": (_int, [_ptr, _int, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr,
                                _ptr, _f32, _ptr, _ptr, _ptr, _int, _ptr, _ptr, _i64]),
}


def cache_dir() -> Path:
    root = os.environ.get("SPECLANE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "speclane")
    return Path(root) / "kernels"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode()).hexdigest()[:16]
    out = cache_dir() / f"rows-{key}.so"
    if out.exists():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(out.parent, os.W_OK):
            raise PermissionError(out.parent)
    except OSError:  # a read-only home: build per user in the temp directory instead
        out = Path(tempfile.gettempdir()) / f"speclane-kernels-{os.getuid()}" / out.name
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        res = subprocess.run([cc, *FLAGS, "-o", str(part), str(SOURCE), "-lm"], capture_output=True, text=True,
                             timeout=300)
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE.name}: {res.stderr.strip()[-600:]}")
        os.replace(part, out)  # atomic: a concurrent process sees the whole file or none
    return out


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (see `unavailable()` for why). Built at the first call of a process."""
    if _TRIED:
        return _LIB
    return _load()


def _load() -> ctypes.CDLL | None:
    global _LIB, _WHY, _TRIED
    _TRIED = True
    cc = _compiler()
    if os.environ.get("SPECLANE_CPU_KERNELS", "1") == "0":
        _WHY = "SPECLANE_CPU_KERNELS=0"
    elif torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        _WHY = f"this CPU has no AVX2/FMA (torch says {torch.backends.cpu.get_cpu_capability()})"
    elif cc is None:
        _WHY = "no C compiler found (set CC, or install gcc)"
    else:
        try:
            lib = ctypes.CDLL(str(_build(cc)))
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            _LIB = lib
        except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as exc:
            _WHY = f"building the CPU kernels failed: {exc}"
    return _LIB


def unavailable() -> str | None:
    """Why the C kernels are not in use, or None when they are."""
    library()
    return _WHY


def cpu_name() -> str:
    """The CPU's model name, as /proc/cpuinfo says it (the machine kind every figure is tied to)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def describe() -> str:
    """One line for a run's closing output and a benchmark's header: the CPU kind and the compute path taken."""
    from kernels.wide_linear import widens

    cap = torch.backends.cpu.get_cpu_capability()
    why = unavailable()
    decode = "C kernels (kernels/cpu/rows.c)" if why is None else f"torch twins ({why})"
    prefill = "float32 (bf16 widened: no fast bf16 GEMM here)" if widens(torch.bfloat16) else "native dtype"
    return f"CPU {cap}, {torch.get_num_threads()} thread(s); decode route: {decode}; wide prefill GEMMs: {prefill}"


def dtype_code(dtype: torch.dtype) -> int | None:
    """The C side's dtype codes (rows.c): 0 float32, 1 bfloat16; None for anything else."""
    return {torch.float32: 0, torch.bfloat16: 1}.get(dtype)
