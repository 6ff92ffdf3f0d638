"""The figures the round model reads, gathered: the target's and the drafters' from the model's files, a CPU's from
the pass-cost probe, and a MoE target's routing, recorded once and cached.

Owns: `target_figures` (bytes a pass reads, FLOPs a row, one routed expert, from the config and the build, as
model_bytes counts them), `drafter_figures` (a backend's acceptance: a model drafter's held-out record from its file's
`fit.heldout.all.accept`, else the measured plan's prior, said as such; its bytes a step from its file's header and
the proposal head it drafts through), `probe_machine` (a Machine from the pass-cost probe: the probe's pass seconds,
with the read bandwidth and compute fitted to them: a pass of r rows takes about a + b r, bytes / a and FLOPs a row /
b; the link into the expert slots is the copy probe's, copy_probe.py), `routing` (a MoE target's routing trace: one
lane decoding `ROUTING_PROMPTS` with speculation off, cached under `$SPECLANE_CACHE/routing/` by the model's files).
Not here: the arithmetic (round_model.py), choosing (derivation.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

from speclane.kernels import cpu_build
from speclane.pipeline.runtime.model_bytes import Build, expert_bytes, file_header
from speclane.pipeline.runtime.round_model import DrafterFigures, Machine, TargetFigures
from speclane.pipeline.runtime.routing_model import RoutingTrace
from speclane.stages.contract.errors import ArtifactError, ConfigError
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.artifact import cache_root
from speclane.stages.models.config import FULL, ModelConfig

log = logging.getLogger("speclane.profile")

PRIOR_SOURCE = "assumed: the measured draft plan's prior, 1/2 a draft given the ones before (no measurement)"
# Text the routing is recorded on: code and prose, as a verify round sees both.
ROUTING_PROMPTS = (
    'def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n',
    "The history of the printing press begins in the fifteenth century, when",
    "import json\n\n\ndef load_config(path):\n    with open(path) as f:\n",
    "Explain, step by step, how a hash table handles collisions.",
)
ROUTING_TOKENS = 128  # decoded tokens a prompt
ROUTING_VERSION = 1  # bump when the recording changes, so old traces are not reused


def target_figures(cfg: ModelConfig, b: Build, routing: RoutingTrace | None = None) -> TargetFigures:
    """What one pass of this target reads whatever its rows (every linear, the output head, a MoE layer's router
    and shared expert, in the form `b` keeps them) and its FLOPs a row (two a weight a row touches, the chosen
    routed experts included)."""
    h, nh, kvh, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    linears = [(cfg.vocab_size, h)]  # the output head
    routed = 0
    for i, kind in enumerate(cfg.layer_types):
        if kind == FULL:
            qkv = nh * hd * (2 if cfg.attn_output_gate else 1) + 2 * kvh * hd
            linears += [(qkv, h), (h, nh * hd)]
        else:
            nv, dv = cfg.gdn_value_heads, cfg.gdn_value_dim
            linears += [(cfg.gdn_conv_dim + nv * dv + 2 * nv, h), (h, nv * dv)]
        if cfg.moe_layers[i]:
            shared = cfg.shared_expert_intermediate_size
            linears += [(cfg.num_experts, h)] + ([(2 * shared, h), (h, shared)] if shared else [])
            routed += cfg.experts_per_token * 3 * h * cfg.moe_intermediate_size
        else:
            linears += [(2 * cfg.intermediate_size, h), (h, cfg.intermediate_size)]
    read = sum(b.linear(o, i) for o, i in linears)
    flops = 2.0 * (sum(o * i for o, i in linears) + routed)
    one = expert_bytes(cfg, b) if any(cfg.moe_layers) else 0
    return TargetFigures(dense_bytes=read, row_flops=flops, expert_bytes=one, routing=routing)


def drafter_figures(
    backend: str, directory: Path, cfg: ModelConfig, b: Build, head: str, options: dict
) -> DrafterFigures | None:
    """A backend's figures; None for `none`. A backend without weights costs nothing to draft here (an n-gram
    lookup is a few microseconds) and, with no acceptance measured, takes the prior. An ArtifactError where a
    model drafter's files are missing."""
    if backend == "none":
        return None
    if backend not in dw.CONFIGS:
        return DrafterFigures(backend, (), PRIOR_SOURCE)
    weights, config = dw.locate(backend, Path(options.get("path") or directory), cfg)
    cfg_cls, _ = dw.CONFIGS[backend]
    try:
        dcfg = cfg_cls.model_validate(json.loads(config.read_text()))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{config}: not a valid {backend} config ({exc})") from exc
    accept = tuple(dcfg.fit.get("heldout", {}).get("all", {}).get("accept") or ())
    source = f"held-out acceptance in {config.name} (fit.heldout.all.accept)" if accept else PRIOR_SOURCE
    tensors = file_header(weights)
    params = sum(_numel(shape) for name, (_, shape, _) in tensors.items() if name not in dw.EXTRA[backend])
    h, rows = cfg.hidden_size, cfg.vocab_size
    if head == "shortlist" and "shortlist.ranks" in tensors:  # int8 rows of the most frequent answer tokens
        short = options.get("shortlist_tokens", getattr(dcfg, "shortlist_tokens", ModelBackend.SHORTLIST_TOKENS))
        rows = max(1, min(int(short), rows))
        head_bytes = rows * (h + 4)
    elif b.quant == "int8" or (b.device.type == "cpu" and cpu_build.library() is not None):
        head_bytes = rows * (h + 4)  # an int8 copy of the target's head, or the target's own int8 head
    else:
        head_bytes = rows * h * b.elem
    block = getattr(dcfg, "block_size", 0)
    return DrafterFigures(
        backend,
        accept,
        source,
        step_bytes=params * b.elem + head_bytes,
        step_flops=2.0 * (params + rows * h),
        chain=not block,
        block_rows=block,
    )


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def probe_machine(
    rows: tuple[int, ...], seconds: tuple[float, ...], t: TargetFigures, link: float | None = None
) -> Machine:
    """A Machine from a pass-cost probe of target `t`: the probe's table, with a pass of r rows fitted as a + b r
    (least squares over the probed counts): read bandwidth `t.dense_bytes / a`, compute `t.row_flops / b`; `link`
    the slow tier's bytes a second into the slots as the copy probe measured them (pipeline/runtime/copy_probe.py;
    None: no slow tier, a dense target or every expert resident)."""
    n = len(rows)
    if n < 2:
        raise ValueError("probe_machine: the probe needs at least two row counts")
    mx, my = sum(rows) / n, sum(seconds) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(rows, seconds)) / sum((x - mx) ** 2 for x in rows)
    slope = max(slope, 1e-12)
    fixed = max(my - slope * mx, 0.25 * seconds[0])
    return Machine(
        bandwidth=t.dense_bytes / fixed, link=link, compute=t.row_flops / slope, probe=(tuple(rows), tuple(seconds))
    )


def routing_key(directory: Path, dtype: str) -> str:
    """What a routing trace depends on: the model's files (names, sizes, config) and the compute dtype."""
    parts = [str(ROUTING_VERSION), dtype, (directory / "config.json").read_text()]
    parts += [f"{p.name}:{p.stat().st_size}" for p in sorted(directory.glob("*.safetensors"))]
    parts += list(ROUTING_PROMPTS) + [str(ROUTING_TOKENS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def routing(directory: Path, cfg: ModelConfig, dtype: str, policy: str, trace: str | None = None) -> RoutingTrace:
    """The MoE target's routing trace: cached, else recorded now (the model loaded on the CPU with an expert cache,
    one lane decoding each of `ROUTING_PROMPTS` greedily, speculation off) and cached. `trace`: a routing trace file
    recorded on text elsewhere (`bench.routing_trace`; `plan --routing`), read instead: a model whose own router does
    not route as text does (random weights of a real MoE's shape) is planned with text's routing."""
    if trace is not None:
        from speclane.stages.models.routing_trace import RowRouting

        try:
            rows = RowRouting.load(trace)
            rows.check(cfg)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        moe = [i for i, routed in enumerate(cfg.moe_layers) if routed]
        return RoutingTrace.from_rows(RowRouting(rows.experts, rows.top_k, rows.layers[: len(moe)]), moe, policy)
    path = cache_root() / "routing" / f"{routing_key(directory, dtype)}.json"
    try:
        data = json.loads(path.read_text())
        return RoutingTrace(
            tuple(tuple(map(tuple, t)) for t in data["tokens"]), tuple(data["layers"]), cfg.num_experts, policy
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    log.warning("recording %s's routing (once per model; cached in %s)", directory.name, path)
    lookups = _record(directory, cfg, dtype)
    trace = RoutingTrace.from_lookups(lookups, cfg.num_experts, policy)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"layers": trace.layers, "tokens": trace.tokens, "model": str(directory)}))
    except OSError as exc:
        log.warning("routing trace not cached (%s): it is recorded again next time", exc)
    return trace


def _record(directory: Path, cfg: ModelConfig, dtype: str) -> list:
    from speclane.pipeline.runtime.engine import Engine
    from speclane.pipeline.runtime.request import parse_request
    from speclane.stages.models.expert_study import recording
    from speclane.stages.models.loading import load_model

    every = sum(cfg.moe_layers) * cfg.num_experts * expert_bytes(cfg, Build(getattr(torch, dtype), torch.device("cpu")))
    target, tokenizer = load_model(str(directory), dtype, "cpu", expert_cache_bytes=min(every, 1 << 30))
    engine = Engine(target, tokenizer, spec="decode", max_lanes=1, max_len=512 + ROUTING_TOKENS)
    out: list = []
    with recording(target) as trace:
        for i, text in enumerate(ROUTING_PROMPTS):
            lane = engine.submit(
                parse_request({"id": i, "prompt": text, "max_tokens": ROUTING_TOKENS, "ignore_eos": True})
            )
            while engine.busy() and not lane.out_ids:
                engine.step()  # the prompt's prefill: many rows a pass, not a decode lookup
            start = len(trace)
            while engine.busy():
                engine.step()
            out += trace[start:]
    return out
