"""Peers on the same model, prompts and dtype: transformers `generate` (plain and with prompt lookup) and
llama.cpp through llama-cpp-python (plain and with its prompt-lookup drafting), greedy.

transformers loads the converted default artifact (`speclane.stages.models.artifact.resolve(None)`) with
`LlamaForCausalLM`; it gets the very prompt ids speclane gets, and a streamer stamps its first token so that time
to first token and decode speed are reported apart, as for speclane. llama.cpp runs the default GGUF twice: rewritten
by llama.cpp's own quantize tool in speclane's dtype (the same weights as speclane's artifact, which is the same GGUF
dequantized; "llama.cpp"), and as shipped, Q4_1 ("llama.cpp-q4_1", about a third of the bytes a token streams).
llama-cpp-python is an optional extra (it compiles from source): absent, its rows are skipped with the reason.
Not here: speclane's own runs (bench/measure.py) and the alternation (speclane.bench.measure.alternate).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from speclane.bench.measure import Run, alternate


class _Stamps:
    """A transformers streamer that only records when tokens arrive (the first `put` is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


class HFPeer:
    def __init__(self, dtype: torch.dtype, eos_ids: tuple[int, ...]):
        from transformers import LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        from speclane.stages.models.artifact import resolve

        hf_logging.disable_progress_bar()  # a progress bar in the middle of the tables
        self.model = LlamaForCausalLM.from_pretrained(resolve(None), torch_dtype=dtype).eval()
        self.eos = list(eos_ids)

    def run(self, ids: list[int], max_tokens: int, lookup: int = 0) -> Run:
        kw = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        stamps = _Stamps()
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                                      do_sample=False, eos_token_id=self.eos, pad_token_id=self.eos[0],
                                      streamer=stamps, **kw)
        t_end = time.perf_counter()
        toks = out[0, len(ids):].tolist()  # the EOS included, as in speclane's out_ids
        t_first = stamps.times[1] if len(stamps.times) > 1 else t_end
        return Run(toks, t_first - t0, t_end - t_first)


# llama.cpp's file types for speclane's dtypes: the default GGUF's weights rewritten by llama.cpp's own quantize
# tool (dequantized, then stored in that type), so that both engines stream the same weights in the same format.
_LLAMA_FTYPES = {torch.bfloat16: ("bf16", "LLAMA_FTYPE_MOSTLY_BF16"), torch.float16: ("f16", "LLAMA_FTYPE_MOSTLY_F16"),
                 torch.float32: ("f32", "LLAMA_FTYPE_ALL_F32")}
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
    """Run `speclane.bench.peers.<call>` in a child process: (exit status or "a timeout", its last stderr line)."""
    try:
        r = subprocess.run([sys.executable, "-c", f"import speclane.bench.peers as p; p.{call}"], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"a timeout after {timeout:.0f} s", ""
    last = (r.stderr.strip().splitlines() or [""])[-1]
    return (f"{r.returncode} ({_SIGNALS[r.returncode]})" if r.returncode in _SIGNALS else r.returncode), last


def same_dtype_gguf(dtype: torch.dtype) -> Path:
    """The default GGUF rewritten in `dtype` by llama.cpp (cached beside speclane's own conversion of it)."""
    from speclane.stages.models.artifact import cache_root, default_gguf, fingerprint

    src = default_gguf()
    if dtype not in _LLAMA_FTYPES:
        raise RuntimeError(f"no llama.cpp file type for {dtype}; run the peers in bfloat16, float16 or float32")
    name, ftype = _LLAMA_FTYPES[dtype]
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
                raise RuntimeError(f"llama-cpp-python is installed but a one-token completion of {path.name} in a "
                                   f"child process exited with {rc} ({last or 'no message'}), and with {rc2} "
                                   f"({last2 or 'no message'}) with its extra buffer types off; rebuild or "
                                   f"reinstall it")
            self.note += (f"; llama.cpp's extra CPU buffer types (AMX, repacked weights) off: with them a "
                          f"completion exited with {rc}")

    def _model(self, lookup: int):
        if lookup not in self.models:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
            with _model_params(use_extra_bufts=self.extra_bufts):
                # n_threads_batch (prefill) defaults to every core; speclane's prefill gets `threads` too.
                self.models[lookup] = Llama(self.path, n_threads=self.threads, n_threads_batch=self.threads,
                                            n_ctx=self.n_ctx, verbose=False, draft_model=draft)
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


PEERS = ("transformers", "llama.cpp", "llama.cpp-q4_1")


def load_peers(dtype: torch.dtype, eos_ids: tuple[int, ...], threads: int, n_ctx: int,
               skipped: dict[str, str], notes: dict[str, str], wanted: tuple[str, ...] = PEERS) -> dict[str, object]:
    """transformers, llama.cpp on the default GGUF rewritten in `dtype` ("llama.cpp") and on the GGUF as shipped
    ("llama.cpp-q4_1": its own quantized weights, fewer bytes a token). Each one that cannot run is a skip with its
    reason in `skipped`; `notes` says how each llama.cpp peer runs. Only the peers in `wanted` are loaded."""
    peers: dict[str, object] = {}
    for name in PEERS:
        if name not in wanted:
            skipped[name] = "not asked for (the bench settings' peers)"
    if "transformers" in wanted:
        try:
            peers["transformers"] = HFPeer(dtype, eos_ids)
        except Exception as exc:  # noqa: BLE001 - a missing peer is a skip, not a failed benchmark
            skipped["transformers"] = f"{type(exc).__name__}: {exc}"
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        skipped["llama.cpp"] = (f"llama-cpp-python is not installed ({exc}); it is optional: "
                                "pip install -e '.[bench-llamacpp]' (compiles llama.cpp, about 10 minutes)")
        return peers
    from speclane.stages.models.artifact import default_gguf

    same = f"{_LLAMA_FTYPES[dtype][0]}, as speclane's" if dtype in _LLAMA_FTYPES else str(dtype)
    for name, path, weights in (("llama.cpp", lambda: same_dtype_gguf(dtype), same),
                                ("llama.cpp-q4_1", default_gguf, "Q4_1, the GGUF as shipped")):
        if name not in wanted:
            continue
        try:
            peer = LlamaCppPeer(path(), threads, eos_ids, n_ctx, weights)
        except RuntimeError as exc:
            skipped[name] = str(exc)
            continue
        peers[name], notes[name] = peer, peer.note
    return peers


def peer_section(engines: dict, peers: dict, prompts: list[dict], max_tokens: int, repeats: int,
                 lookup: int, tick=None, peer_lookup: bool = True) -> dict:
    """speclane off and ngram beside each peer plain and (with `peer_lookup`) with prompt lookup, alternated per
    prompt.
    `engines`: {"off": decode engine, "ngram": ngram engine}, optionally "int8" and "int8+ngram" on int8 weights.
    Ratios are paired against speclane's same mode (and its int8 twin's, where measured)."""
    from speclane.bench.measure import first_divergence, paired_ratio, run_batch, spread, tps

    configs = {"speclane": lambda p: run_batch(engines["off"], [(p["id"], p["ids"])], max_tokens)[0],
               "speclane+ngram": lambda p: run_batch(engines["ngram"], [(p["id"], p["ids"])], max_tokens,
                                                     draft_tokens=lookup)[0]}
    if "int8" in engines:  # int8 weights: what a quantized peer is compared with
        configs["speclane-int8"] = lambda p: run_batch(engines["int8"], [(p["id"], p["ids"])], max_tokens)[0]
        configs["speclane-int8+ngram"] = lambda p: run_batch(engines["int8+ngram"], [(p["id"], p["ids"])],
                                                             max_tokens, draft_tokens=lookup)[0]
    for name, peer in peers.items():
        configs[name] = lambda p, peer=peer: peer.run(p["ids"], max_tokens)
        if peer_lookup:
            configs[f"{name}+lookup"] = lambda p, peer=peer: peer.run(p["ids"], max_tokens, lookup=lookup)
    res = alternate(configs, prompts, repeats, tick)
    rows = {}
    for name, runs in res.items():
        mine = "speclane+ngram" if name.endswith(("+lookup", "+ngram")) else "speclane"
        mine8 = mine.replace("speclane", "speclane-int8")
        rows[name] = {"decode_tps": spread([x for xs in tps(runs) for x in xs]),
                      "int8_over_this": paired_ratio(tps(res[mine8]), tps(runs)) if mine8 in res else None,
                      "ttft_s": spread([r.ttft for rs in runs for r in rs]),
                      "speclane_over_this": paired_ratio(tps(res[mine]), tps(runs)),
                      "first_divergence_from_speclane": [first_divergence(a[0].tokens, b[0].tokens)
                                                         for a, b in zip(res["speclane"], runs)]}
    return rows
