"""Peers on the same model, prompts and dtype: transformers `generate` (plain and with prompt lookup) and
llama.cpp through llama-cpp-python (plain and with its prompt-lookup drafting), greedy.

transformers loads the converted default artifact (`speclane.stages.models.artifact.resolve(None)`) with
`LlamaForCausalLM`; it gets the very prompt ids speclane gets, and a streamer stamps its first token so that time
to first token and decode speed are reported apart, as for speclane. llama.cpp runs the default GGUF twice: rewritten
by llama.cpp's own quantize tool in speclane's dtype (the same weights as speclane's artifact, which is the same GGUF
dequantized; "llama.cpp"), and as shipped, Q4_1 ("llama.cpp-q4_1", about a third of the bytes a token streams).
llama-cpp-python is an optional extra (it compiles from source): absent, its rows are skipped with the reason.

Owns the transformers peer, which peers load and the peers' section. Not here: the llama.cpp peer and its GGUF
rewrite (bench/llamacpp_peer.py), speclane's own runs (bench/measure.py) and the alternation
(speclane.bench.measure.alternate).
"""

from __future__ import annotations

import time

import torch

from speclane.bench import installed_kernels_first
from speclane.bench.llamacpp_peer import LLAMA_FTYPES, LlamaCppPeer, same_dtype_gguf
from speclane.bench.measure import Run, alternate
from speclane.bench.settings import PEERS


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
        installed_kernels_first()
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
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=self.eos,
                pad_token_id=self.eos[0],
                streamer=stamps,
                **kw,
            )
        t_end = time.perf_counter()
        toks = out[0, len(ids) :].tolist()  # the EOS included, as in speclane's out_ids
        t_first = stamps.times[1] if len(stamps.times) > 1 else t_end
        return Run(toks, t_first - t0, t_end - t_first)


def load_peers(
    dtype: torch.dtype,
    eos_ids: tuple[int, ...],
    threads: int,
    n_ctx: int,
    skipped: dict[str, str],
    notes: dict[str, str],
    wanted: tuple[str, ...] = PEERS,
) -> dict[str, object]:
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
        skipped["llama.cpp"] = (
            f"llama-cpp-python is not installed ({exc}); it is optional: "
            "pip install -e '.[bench-llamacpp]' (compiles llama.cpp, about 10 minutes)"
        )
        return peers
    from speclane.stages.models.artifact import default_gguf

    same = f"{LLAMA_FTYPES[dtype][0]}, as speclane's" if dtype in LLAMA_FTYPES else str(dtype)
    for name, path, weights in (
        ("llama.cpp", lambda: same_dtype_gguf(dtype), same),
        ("llama.cpp-q4_1", default_gguf, "Q4_1, the GGUF as shipped"),
    ):
        if name not in wanted:
            continue
        try:
            peer = LlamaCppPeer(path(), threads, eos_ids, n_ctx, weights)
        except RuntimeError as exc:
            skipped[name] = str(exc)
            continue
        peers[name], notes[name] = peer, peer.note
    return peers


def peer_section(
    engines: dict,
    peers: dict,
    prompts: list[dict],
    max_tokens: int,
    repeats: int,
    lookup: int,
    tick=None,
    peer_lookup: bool = True,
) -> dict:
    """speclane off and ngram beside each peer plain and (with `peer_lookup`) with prompt lookup, alternated per
    prompt.
    `engines`: {"off": decode engine, "ngram": ngram engine}, optionally "int8" and "int8+ngram" on int8 weights.
    Ratios are paired against speclane's same mode (and its int8 twin's, where measured)."""
    from speclane.bench.measure import first_divergence, paired_ratio, run_batch, spread, tps

    configs = {
        "speclane": lambda p: run_batch(engines["off"], [(p["id"], p["ids"])], max_tokens)[0],
        "speclane+ngram": lambda p: run_batch(engines["ngram"], [(p["id"], p["ids"])], max_tokens, draft_tokens=lookup)[
            0
        ],
    }
    if "int8" in engines:  # int8 weights: what a quantized peer is compared with
        configs["speclane-int8"] = lambda p: run_batch(engines["int8"], [(p["id"], p["ids"])], max_tokens)[0]
        configs["speclane-int8+ngram"] = lambda p: run_batch(
            engines["int8+ngram"], [(p["id"], p["ids"])], max_tokens, draft_tokens=lookup
        )[0]
    for name, peer in peers.items():
        configs[name] = lambda p, peer=peer: peer.run(p["ids"], max_tokens)
        if peer_lookup:
            configs[f"{name}+lookup"] = lambda p, peer=peer: peer.run(p["ids"], max_tokens, lookup=lookup)
    res = alternate(configs, prompts, repeats, tick)
    rows = {}
    for name, runs in res.items():
        mine = "speclane+ngram" if name.endswith(("+lookup", "+ngram")) else "speclane"
        mine8 = mine.replace("speclane", "speclane-int8")
        rows[name] = {
            "decode_tps": spread([x for xs in tps(runs) for x in xs]),
            "int8_over_this": paired_ratio(tps(res[mine8]), tps(runs)) if mine8 in res else None,
            "ttft_s": spread([r.ttft for rs in runs for r in rs]),
            # prompt tokens over time to first token: the prefill's rate, the first token's sampling included
            "prefill_tps": spread([len(p["ids"]) / r.ttft for p, rs in zip(prompts, runs) for r in rs if r.ttft > 0]),
            "speclane_over_this": paired_ratio(tps(res[mine]), tps(runs)),
            "first_divergence_from_speclane": [
                first_divergence(a[0].tokens, b[0].tokens) for a, b in zip(res["speclane"], runs)
            ],
        }
    return rows
