"""Builds and loads the C kernels of `kernels/cpu/` once per machine, and says plainly when they cannot be had.

Owns: compiling `kernels/cpu/rows.c` with the system C compiler into a shared library cached under
`~/.cache/speclane/kernels/` (keyed by the source, the flags and the compiler, so an edit or another compiler
builds anew and two processes never load a half-written file), loading it with ctypes, and the reason it is
unavailable (no compiler, a CPU without AVX2/FMA, `SPECLANE_CPU_KERNELS=0`). Not here: when a kernel is used
or what it computes (kernels/decode_linear.py, kernels/decode_attention.py, the C source).

Three builds of the one source: `avx2` (AVX2 + FMA, every x86-64 CPU the kernels run on), `avx512bf16` (adds
AVX-512 F/BW/VL, AVX512-BF16, whose VDPBF16PS the bf16 linear uses, and AVX512-VNNI, whose VPDPBUSD a drafter's
int8 head uses) and `amx` (adds AMX-TILE and AMX-BF16: the packed bf16 linear on tiles, where many rows cost what
one does), picked from the CPU's flags in /proc/cpuinfo, never from its name; `SPECLANE_CPU_ISA=avx2` (or
`avx512bf16`) forces a lesser one. The cache key holds the flags, so
a home directory shared by machines of two kinds never loads a build the CPU cannot run.

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
_AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni")
ISA_FLAGS = {"avx2": (), "avx512bf16": _AVX512, "amx": (*_AVX512, "-mamx-tile", "-mamx-bf16")}
_CPU_NEEDS = {
    "avx2": {"avx2", "fma"},
    "avx512bf16": {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"},
}
_CPU_NEEDS["amx"] = _CPU_NEEDS["avx512bf16"] | {"amx_tile", "amx_bf16"}
_LIB: ctypes.CDLL | None = None
_WHY: str | None = None
_TRIED = False
_ISA: str | None = None
_VARIANTS: dict[str, ctypes.CDLL] = {}

_i64, _int, _ptr, _f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
_SIGNATURES = {
    "sl_linear": (_int, [_ptr, _int, _ptr, _int, _ptr, _int, _ptr, _int, _i64, _i64, _i64, _int]),
    "sl_linear_q": (_int, [_ptr, _int, _ptr, _int, _ptr, _ptr, _int, _ptr, _int, _i64, _i64, _i64, _int]),
    "sl_attend": (_int, [_ptr, _ptr, _ptr, _int, _ptr, _ptr, _ptr, _int, _i64, _i64, _i64, _i64, _i64, _f32, _int]),
    "sl_add_rmsnorm": (_int, [_ptr, _ptr, _int, _ptr, _ptr, _int, _i64, _i64, _f32]),
    "sl_dense_layer": (_int, [_ptr, _ptr, _int, _i64, _ptr, _ptr, _ptr, _ptr, _int, _i64, _ptr, _ptr, _ptr, _int]),
    "sl_silu_mul": (_int, [_ptr, _int, _ptr, _i64, _i64]),
    "sl_argmax": (_int, [_ptr, _i64, _i64, _ptr]),
    "sl_accept_greedy": (_int, [_ptr, _i64, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr]),
    "sl_accept_tokens": (_int, [_ptr, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr]),
    "sl_head_tokens": (_int, [_ptr, _int, _ptr, _int, _ptr, _ptr, _int, _i64, _i64, _i64, _ptr, _ptr, _ptr, _int]),
    "sl_dequant_i8": (_int, [_ptr, _ptr, _ptr, _int, _i64, _i64, _int]),
    "sl_linear_packed": (_int, [_ptr, _int, _ptr, _int, _ptr, _ptr, _int, _ptr, _int, _i64, _i64, _i64, _int]),
    "sl_pack_bf16": (_int, [_ptr, _i64, _i64, _ptr]),
    "sl_pack_i8": (_int, [_ptr, _i64, _i64, _ptr]),
    "sl_pack_q8": (_int, [_ptr, _i64, _i64, _ptr, _ptr]),
    "sl_mtp_chain": (
        _int,
        [_ptr, _ptr, _int, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _int, _i64, _ptr, _ptr, _ptr, _ptr, _int],
    ),
    "sl_mtp_project": (_int, [_ptr, _ptr, _int, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _int]),
    "sl_linear_q8": (_int, [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int]),
    "sl_qk_rope_write": (
        _int,
        [
            _ptr,
            _int,
            _i64,
            _i64,
            _i64,
            _i64,
            _i64,
            _i64,
            _i64,
            _i64,
            _i64,
            _ptr,
            _ptr,
            _ptr,
            _ptr,
            _f32,
            _ptr,
            _ptr,
            _ptr,
            _int,
            _ptr,
            _ptr,
            _i64,
        ],
    ),
}


def cache_dir() -> Path:
    root = os.environ.get("SPECLANE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "speclane")
    return Path(root) / "kernels"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def isas() -> list[str]:
    """The builds this CPU can run, best last (an empty list off Linux x86-64: AVX2 is then taken on torch's word)."""
    flags = _cpu_flags()
    if not flags:
        return ["avx2"] if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else []
    return [isa for isa, needs in _CPU_NEEDS.items() if needs <= flags]


def _build(cc: str, isa: str) -> Path:
    flags = FLAGS + ISA_FLAGS[isa]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode() + version.encode()).hexdigest()[:16]
    out = cache_dir() / f"rows-{isa}-{key}.so"
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
        res = subprocess.run(
            [cc, *flags, "-o", str(part), str(SOURCE), "-lm"], capture_output=True, text=True, timeout=300
        )
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE.name}: {res.stderr.strip()[-600:]}")
        os.replace(part, out)  # atomic: a concurrent process sees the whole file or none
    return out


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (see `unavailable()` for why). Built at the first call of a process."""
    if _TRIED:
        return _LIB
    return _load()


def variant(isa: str) -> ctypes.CDLL:
    """The build for `isa` (one of `isas()`), compiled at its first use; raises when it cannot be built."""
    lib = _VARIANTS.get(isa)
    if lib is None:
        cc = _compiler()
        if cc is None:
            raise RuntimeError("no C compiler found (set CC, or install gcc)")
        path = _build(cc, isa)
        lib = ctypes.CDLL(str(path))
        lib.speclane_build = path.name  # source, flags and compiler hashed: what a cached measurement keys on
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        if isa == "amx" and lib.sl_amx_init() != 0:  # Linux keeps the tile data off until a process asks
            raise RuntimeError("the kernel refused this process AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)")
        _VARIANTS[isa] = lib
    return lib


def _load() -> ctypes.CDLL | None:
    global _LIB, _WHY, _TRIED, _ISA
    _TRIED = True
    runnable = isas()
    forced = os.environ.get("SPECLANE_CPU_ISA")
    if os.environ.get("SPECLANE_CPU_KERNELS", "1") == "0":
        _WHY = "SPECLANE_CPU_KERNELS=0"
    elif not runnable or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        _WHY = f"this CPU has no AVX2/FMA (torch says {torch.backends.cpu.get_cpu_capability()})"
    elif forced is not None and forced not in runnable:
        _WHY = f"SPECLANE_CPU_ISA={forced} is not one this CPU runs (it runs: {', '.join(runnable)})"
    elif _compiler() is None:
        _WHY = "no C compiler found (set CC, or install gcc)"
    else:
        for isa in [forced] if forced else runnable[::-1]:  # best first; an older compiler may lack its flags
            try:
                _LIB, _ISA, _WHY = variant(isa), isa, None
                break
            except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as exc:
                _WHY = f"building the CPU kernels failed: {exc}"
    return _LIB


def build_name() -> str | None:
    """The file name of the build in use (its source, flags and compiler hashed), or None without the C kernels:
    a measurement of the kernels' speed cached across runs (stages/models/pass_cost.py) is keyed on it."""
    lib = library()
    return getattr(lib, "speclane_build", None)


def isa() -> str | None:
    """The build in use (`avx2`, `avx512bf16` or `amx`), or None without the C kernels."""
    library()
    return _ISA if _LIB is not None else None


def bf16_kernels() -> bool:
    """Whether the build in use has the AVX512-BF16 kernels (packed weights, int8 rows, 16-lane attention): the
    `avx512bf16` build and the `amx` build, which adds the tiles to it."""
    return isa() in ("avx512bf16", "amx")


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
    from speclane.kernels.wide_linear import widens

    cap = torch.backends.cpu.get_cpu_capability()
    why = unavailable()
    decode = f"C kernels (kernels/cpu/rows.c, {isa()})" if why is None else f"torch twins ({why})"
    prefill = "float32 (bf16 widened: no fast bf16 GEMM here)" if widens(torch.bfloat16) else "native dtype"
    return f"CPU {cap}, {torch.get_num_threads()} thread(s); decode route: {decode}; wide prefill GEMMs: {prefill}"


def dtype_code(dtype: torch.dtype) -> int | None:
    """The C side's dtype codes (rows.c): 0 float32, 1 bfloat16; None for anything else."""
    return {torch.float32: 0, torch.bfloat16: 1}.get(dtype)
