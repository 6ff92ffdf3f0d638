"""Peers on the same model, prompts and dtype: transformers `generate` (plain and with prompt lookup) and
llama.cpp through llama-cpp-python (plain and with its prompt-lookup drafting), greedy.

transformers loads the converted default artifact (`stages.models.artifact.resolve(None)`) with
`LlamaForCausalLM`; it gets the very prompt ids speclane gets, and a streamer stamps its first token so that time
to first token and decode speed are reported apart, as for speclane. llama.cpp runs the original GGUF, whose
weights are Q4_1: the same model and prompts, not the same dtype, and the report says so. llama-cpp-python is an
optional extra (it compiles from source): absent, its rows are skipped with the reason.
Not here: speclane's own runs (bench/measure.py) and the alternation (bench.measure.alternate).
"""
from __future__ import annotations

import subprocess
import sys
import time

import torch

from bench.measure import Run, alternate


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

        from stages.models.artifact import resolve

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


class LlamaCppPeer:
    """llama-cpp-python on the default GGUF; `lookup` > 0 uses its prompt-lookup draft model."""

    def __init__(self, threads: int, eos_ids: tuple[int, ...], n_ctx: int):
        import llama_cpp  # noqa: F401 - the ImportError is the caller's skip message

        from stages.models.artifact import default_gguf

        self.path, self.threads, self.n_ctx, self.eos = str(default_gguf()), threads, n_ctx, set(eos_ids)
        self.models: dict[int, object] = {}
        # A crash in native code would take the whole benchmark down: try one greedy completion in a child first
        # (llama-cpp-python 0.3.36 built here segfaulted on its first completion, 2026-11-29).
        probe = (f"from llama_cpp import Llama; m = Llama({self.path!r}, n_threads=1, n_ctx=256, verbose=False); "
                 "m.create_completion('def f():', max_tokens=2, temperature=0.0)")
        try:
            rc = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=300).returncode
        except subprocess.TimeoutExpired:
            rc = "a timeout after 300 s"
        if rc != 0:
            raise RuntimeError(f"llama-cpp-python is installed but a one-token completion in a child process "
                               f"exited with {rc} (a crash in llama.cpp); rebuild or reinstall it")

    def _model(self, lookup: int):
        if lookup not in self.models:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
            self.models[lookup] = Llama(self.path, n_threads=self.threads, n_ctx=self.n_ctx, verbose=False,
                                        draft_model=draft)
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


def load_peers(dtype: torch.dtype, eos_ids: tuple[int, ...], threads: int, n_ctx: int,
               skipped: dict[str, str]) -> dict[str, object]:
    peers: dict[str, object] = {}
    try:
        peers["transformers"] = HFPeer(dtype, eos_ids)
    except Exception as exc:  # noqa: BLE001 - a missing peer is a skip, not a failed benchmark
        skipped["transformers"] = f"{type(exc).__name__}: {exc}"
    try:
        peers["llama.cpp"] = LlamaCppPeer(threads, eos_ids, n_ctx)
    except RuntimeError as exc:
        skipped["llama.cpp"] = str(exc)
    except ImportError as exc:
        skipped["llama.cpp"] = (f"llama-cpp-python is not installed ({exc}); it is optional: "
                                "pip install -e '.[bench-llamacpp]' (compiles llama.cpp, about 9 minutes)")
    return peers


def peer_section(engines: dict, peers: dict, prompts: list[dict], max_tokens: int, repeats: int,
                 lookup: int) -> dict:
    """speclane off and ngram beside each peer plain and with prompt lookup, alternated per prompt.
    `engines`: {"off": decode engine, "ngram": ngram engine}. Ratios are paired against speclane's same mode."""
    from bench.measure import first_divergence, paired_ratio, run_batch, spread, tps

    configs = {"speclane": lambda p: run_batch(engines["off"], [(p["id"], p["ids"])], max_tokens)[0],
               "speclane+ngram": lambda p: run_batch(engines["ngram"], [(p["id"], p["ids"])], max_tokens,
                                                     draft_tokens=lookup)[0]}
    for name, peer in peers.items():
        configs[name] = lambda p, peer=peer: peer.run(p["ids"], max_tokens)
        configs[f"{name}+lookup"] = lambda p, peer=peer: peer.run(p["ids"], max_tokens, lookup=lookup)
    res = alternate(configs, prompts, repeats)
    rows = {}
    for name, runs in res.items():
        mine = "speclane+ngram" if name.endswith(("+lookup", "+ngram")) else "speclane"
        rows[name] = {"decode_tps": spread([x for xs in tps(runs) for x in xs]),
                      "ttft_s": spread([r.ttft for rs in runs for r in rs]),
                      "speclane_over_this": paired_ratio(tps(res[mine]), tps(runs)),
                      "first_divergence_from_speclane": [first_divergence(a[0].tokens, b[0].tokens)
                                                         for a, b in zip(res["speclane"], runs)]}
    return rows
