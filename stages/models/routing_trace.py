"""A MoE target's routing recorded on text, and replayed in place of a router's choice.

What it is for: the expert tier's benches on a target whose own router cannot give text's locality. Random weights
of a real MoE's shape (bench/random_weights.py), the only MoE that reaches a machine the real weights cannot, route
as no text does: favouring a few experts of each layer, so a cache's hits there say nothing of text's. A trace
recorded where a MoE decodes text (the MoEfied default model, bench/experts.py) and replayed through that target
gives its passes text's routing, so what a pass copies is what text makes it copy.

A trace holds, per MoE decoder layer in order, the experts each row chose ([rows, top_k] ids), rows in the order
the target ran them: a recording of greedy decoding (each prompt's prefill, then one row a pass) holds each text's
tokens in order. `recording(target)` collects it while its block runs; `replaying(trace, target)` makes each MoE
layer route its rows to the trace's next rows instead: each layer keeps its own place, moved on by the rows of each
call and wrapping at the end, so a pass of r rows takes r consecutive tokens of text, as a verify pass's rows are,
and two runs that start together route alike. The router's weights for its own choice are kept (they weigh the
chosen experts' outputs; they do not choose which experts run). A replay needs a target of the trace's experts and
top-k and at least as many MoE layers in the trace as in the target (the first ones are used). Both act through
`steer`, which `moe` calls once a MoE layer: nothing happens while neither runs. A cache's router look-ahead
(prefetch) still reads the target's own router, so under a replay its guesses know nothing of the trace.
Files: safetensors, a tensor per MoE layer (`layer.J`, int16) and metadata (the format's version, experts, top-k,
what was recorded). Not here: the router (moe.py), the cache (expert_cache.py), the benches (bench/routing_trace.py
records one, bench/expert_tier.py --routing replays one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import torch
from safetensors.torch import load_file, save_file

from speclane.stages.models.config import ModelConfig

VERSION = 1
Tensor = torch.Tensor
Steer = Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]]  # (decoder layer, top ids, top weights) -> the same

_ACTIVE: list[Steer] = []  # the recording or replay in force (one at a time)


def steer(layer: int, top_i: Tensor, top_w: Tensor) -> tuple[Tensor, Tensor]:
    """The experts (and their weights) decoder layer `layer` runs for its rows: the router's, unless a replay is in
    force; a recording takes note of them."""
    return _ACTIVE[-1](layer, top_i, top_w) if _ACTIVE else (top_i, top_w)


@contextlib.contextmanager
def _using(hook: Steer) -> Iterator[None]:
    if _ACTIVE:
        raise RuntimeError("a routing trace is already being recorded or replayed: one at a time")
    _ACTIVE.append(hook)
    try:
        yield
    finally:
        _ACTIVE.clear()


def _moe_layers(cfg: ModelConfig) -> list[int]:
    return [i for i, routed in enumerate(cfg.moe_layers) if routed]


@attrs.frozen
class RowRouting:
    """Which experts each row chose, per MoE layer (a routing trace as recorded and replayed here; the plan's
    round model reads the same as per-token expert sets: pipeline/runtime/routing_model.RoutingTrace.from_rows)."""

    experts: int  # routed experts a layer
    top_k: int  # experts a row
    layers: tuple[Tensor, ...]  # per MoE layer in order: [rows, top_k] expert ids (int64, on the host)
    source: str = ""  # what was recorded (model, prompts)

    @property
    def rows(self) -> int:
        return int(self.layers[0].shape[0]) if self.layers else 0

    def save(self, path: str | Path) -> None:
        tensors = {f"layer.{j}": ids.to(torch.int16).contiguous() for j, ids in enumerate(self.layers)}
        meta = {"format": "speclane-routing-trace", "version": str(VERSION), "experts": str(self.experts)}
        save_file(tensors, str(path), metadata={**meta, "top_k": str(self.top_k), "source": self.source})

    @classmethod
    def load(cls, path: str | Path) -> RowRouting:
        """Read a trace file; a file of another kind or version, or whose layers disagree, is refused naming it."""
        from safetensors import safe_open

        where = f"routing trace {path}"
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
            tensors = load_file(str(path))
        except (OSError, ValueError) as exc:  # missing, unreadable or not safetensors
            raise ValueError(f"{where}: cannot be read ({exc}); record one with python -m speclane.bench.routing_trace")
        if meta.get("format") != "speclane-routing-trace" or meta.get("version") != str(VERSION):
            raise ValueError(
                f"{where}: not a routing trace of format version {VERSION} (format {meta.get('format')!r}, version "
                f"{meta.get('version')!r}); record it again with python -m speclane.bench.routing_trace"
            )
        experts, top_k = int(meta["experts"]), int(meta["top_k"])
        layers = tuple(tensors[f"layer.{j}"].long() for j in range(len(tensors)) if f"layer.{j}" in tensors)
        if len(layers) != len(tensors) or not layers:
            raise ValueError(f"{where}: its tensors must be layer.0 .. layer.N-1, at least one")
        for j, ids in enumerate(layers):
            bad = ids.dim() != 2 or ids.shape != layers[0].shape or ids.shape[1] != top_k or not len(ids)
            if bad or int(ids.min()) < 0 or int(ids.max()) >= experts:
                raise ValueError(
                    f"{where}: layer.{j} must be [rows, {top_k}] expert ids under {experts}, with every layer's "
                    f"rows alike (got {tuple(ids.shape)})"
                )
        return cls(experts, top_k, layers, meta.get("source", ""))

    def check(self, cfg: ModelConfig, where: str = "--routing") -> None:
        """Refuse a target this trace cannot route, naming what differs and what to do."""
        moe = _moe_layers(cfg)
        if not moe:
            raise ValueError(f"{where}: {cfg.model_type} is dense; a routing trace steers a MoE target")
        if (cfg.num_experts, cfg.experts_per_token) != (self.experts, self.top_k):
            raise ValueError(
                f"{where}: the trace routes to {self.top_k} of {self.experts} experts a row, the target to "
                f"{cfg.experts_per_token} of {cfg.num_experts}; make the target with the trace's (bench.random_weights "
                f"--moe --experts {self.experts} --top {self.top_k}) or record a trace on a model of the target's"
            )
        if len(self.layers) < len(moe):
            raise ValueError(
                f"{where}: the trace has {len(self.layers)} MoE layers, the target {len(moe)}; use a target of at "
                f"most {len(self.layers)} (bench.random_weights --layers)"
            )


class Recorder:
    """The experts each MoE layer's rows chose while `recording` runs, in order; `trace()` once it is done."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self._got: dict[int, list[Tensor]] = {i: [] for i in _moe_layers(cfg)}

    def __call__(self, layer: int, top_i: Tensor, top_w: Tensor) -> tuple[Tensor, Tensor]:
        self._got[layer].append(top_i.detach().to("cpu", torch.long))
        return top_i, top_w

    def trace(self, source: str = "") -> RowRouting:
        layers = tuple(
            torch.cat(got) if got else torch.zeros(0, self.cfg.experts_per_token, dtype=torch.long)
            for got in self._got.values()
        )
        return RowRouting(self.cfg.num_experts, self.cfg.experts_per_token, layers, source)


@contextlib.contextmanager
def recording(target) -> Iterator[Recorder]:
    """Record `target`'s routing while the block runs: every MoE layer's rows, pass by pass."""
    rec = Recorder(target.cfg)
    with _using(rec):
        yield rec


class Replay:
    """Routes each MoE layer's rows to the trace's next rows (see the module's docstring)."""

    def __init__(self, trace: RowRouting, target, start: int = 0):
        trace.check(target.cfg)
        moe = _moe_layers(target.cfg)
        self._ids = {layer: trace.layers[j].to(target.device) for j, layer in enumerate(moe)}
        self._at = dict.fromkeys(moe, start % trace.rows)
        self.rows = trace.rows

    def __call__(self, layer: int, top_i: Tensor, top_w: Tensor) -> tuple[Tensor, Tensor]:
        ids, at, n = self._ids[layer], self._at[layer], top_i.shape[0]
        self._at[layer] = (at + n) % self.rows
        if at + n <= self.rows:
            chosen = ids[at : at + n]
        else:  # wraps around the trace's end
            chosen = ids[(at + torch.arange(n, device=ids.device)) % self.rows]
        return chosen.to(top_i.dtype), top_w


@contextlib.contextmanager
def replaying(trace: RowRouting, target, start: int = 0) -> Iterator[Replay]:
    """Route `target`'s MoE layers by `trace` from its row `start` while the block runs."""
    rep = Replay(trace, target, start)
    with _using(rep):
        yield rep
