"""The llama.cpp peer (bench/peers.py's): llama-cpp-python on one GGUF, greedy, plain or with its prompt-lookup
drafting; and the default GGUF rewritten in speclane's dtype by llama.cpp's own quantize tool, so that both
engines stream the same weights in the same format.

Native code runs in child processes first (a one-token probe, the rewrite): a crash there is reported by its
signal, not taken by the benchmark. llama-cpp-python is an optional extra; its ImportError is the caller's skip.
Not here: the transformers peer, which peers to load and the peers' section (bench/peers.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from speclane.bench.measure import Run

# llama.cpp's file types for speclane's dtypes: the default GGUF's weights rewritten by llama.cpp's own quantize
# tool (dequantized, then stored in that type), so that both engines stream the same weights in the same format.
LLAMA_FTYPES = {
    torch.bfloat16: ("bf16", "LLAMA_FTYPE_MOSTLY_BF16"),
    torch.float16: ("f16", "LLAMA_FTYPE_MOSTLY_F16"),
    torch.float32: ("f32", "LLAMA_FTYPE_ALL_F32"),
}
_SIGNALS = {-11: "SIGSEGV", -6: "SIGABRT", -4: "SIGILL", -7: "SIGBUS"}


@contextlib.contextmanager
def _model_params(**fields):
    """llama-cpp-python builds its model parameters from `llama_model_default_params()` and exposes only some of
    them as arguments; this sets others (`use_extra_bufts`) for the models built inside the block."""
    import llama_cpp.llama as ll

    known = {f[0] for f in ll.llama_cpp.llama_model_params._fields_}
    if not set(fields) <= known:
        raise RuntimeError(f"this llama-cpp-python has no model parameter {sorted(set(fields) - known)}")
    default = ll.llama_cpp.llama_model_default_params

    def params():
        p = default()
        for name, value in fields.items():
            setattr(p, name, value)
        return p

    ll.llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        ll.llama_cpp.llama_model_default_params = default


def _probe(path: str, extra_bufts: bool) -> None:
    """One greedy two-token completion (run in a child process by `LlamaCppPeer`: a crash must not take the
    benchmark down)."""
    from llama_cpp import Llama

    with _model_params(use_extra_bufts=extra_bufts):
        m = Llama(path, n_threads=1, n_threads_batch=1, n_ctx=256, verbose=False)
    m.create_completion("def f():", max_tokens=2, temperature=0.0)


def _rewrite(src: str, dst: str, ftype: str) -> None:
    """llama.cpp's quantize tool on `src` into file type `ftype` (a llama_cpp constant name), in a child process."""
    import ctypes

    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.allow_requantize, p.pure, p.nthread = getattr(llama_cpp, ftype), True, True, 1
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) != 0:
        raise SystemExit(f"llama_model_quantize {src} -> {dst} failed")


def _child(call: str, timeout: float) -> tuple[int | str, str]:
    """Run `speclane.bench.llamacpp_peer.<call>` in a child process: (exit status or "a timeout", its last stderr
    line)."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", f"import speclane.bench.llamacpp_peer as p; p.{call}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"a timeout after {timeout:.0f} s", ""
    last = (r.stderr.strip().splitlines() or [""])[-1]
    return (f"{r.returncode} ({_SIGNALS[r.returncode]})" if r.returncode in _SIGNALS else r.returncode), last


def same_dtype_gguf(dtype: torch.dtype) -> Path:
    """The default GGUF rewritten in `dtype` by llama.cpp (cached beside speclane's own conversion of it)."""
    from speclane.stages.models.artifact import cache_root, default_gguf, fingerprint

    src = default_gguf()
    if dtype not in LLAMA_FTYPES:
        raise RuntimeError(f"no llama.cpp file type for {dtype}; run the peers in bfloat16, float16 or float32")
    name, ftype = LLAMA_FTYPES[dtype]
    dst = cache_root() / "gguf" / f"{src.stem}-{fingerprint(src)}-{name}.gguf"
    if not dst.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(f".tmp{os.getpid()}")
        rc, last = _child(f"_rewrite({str(src)!r}, {str(tmp)!r}, {ftype!r})", 600)
        if rc != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"llama.cpp could not rewrite {src.name} in {name} (exit {rc}: {last})")
        tmp.rename(dst)
    return dst


class LlamaCppPeer:
    """llama-cpp-python on one GGUF; `lookup` > 0 uses its prompt-lookup draft model.

    A crash in native code would take the whole benchmark down, so one greedy completion runs in a child process
    first. llama-cpp-python 0.3.36 built on this machine (a CPU with AMX) crashed there with SIGSEGV inside
    `ggml_backend_amx_mul_mat` (gdb backtrace, 2026-11-30): llama.cpp's extra CPU buffer types (AMX and repacked
    weight layouts) are then turned off and the probe repeated; `note` says which way it runs."""

    def __init__(self, path: Path, threads: int, eos_ids: tuple[int, ...], n_ctx: int, weights: str):
        import llama_cpp  # noqa: F401 - the ImportError is the caller's skip message

        self.path, self.threads, self.n_ctx, self.eos = str(path), threads, n_ctx, set(eos_ids)
        self.models: dict[int, object] = {}
        rc, last = _child(f"_probe({self.path!r}, True)", 300)
        self.extra_bufts = rc == 0
        self.note = f"{path.name}: weights {weights}"
        if rc != 0:
            rc2, last2 = _child(f"_probe({self.path!r}, False)", 300)
            if rc2 != 0:
                raise RuntimeError(
                    f"llama-cpp-python is installed but a one-token completion of {path.name} in a "
                    f"child process exited with {rc} ({last or 'no message'}), and with {rc2} "
                    f"({last2 or 'no message'}) with its extra buffer types off; rebuild or "
                    f"reinstall it"
                )
            self.note += (
                f"; llama.cpp's extra CPU buffer types (AMX, repacked weights) off: with them a "
                f"completion exited with {rc}"
            )

    def _model(self, lookup: int):
        if lookup not in self.models:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
            with _model_params(use_extra_bufts=self.extra_bufts):
                # n_threads_batch (prefill) defaults to every core; speclane's prefill gets `threads` too.
                self.models[lookup] = Llama(
                    self.path,
                    n_threads=self.threads,
                    n_threads_batch=self.threads,
                    n_ctx=self.n_ctx,
                    verbose=False,
                    draft_model=draft,
                )
        return self.models[lookup]

    def run(self, ids: list[int], max_tokens: int, lookup: int = 0) -> Run:
        llm = self._model(lookup)
        llm.reset()
        toks, t0, t_first = [], time.perf_counter(), None
        # Greedy: temp 0 takes the argmax; the other samplers are set to pass-through explicitly.
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if t_first is None:
                t_first = time.perf_counter()
            toks.append(int(tok))
            if tok in self.eos or len(toks) >= max_tokens:
                break
        t_end = time.perf_counter()
        return Run(toks, (t_first or t_end) - t0, t_end - (t_first or t_end))
