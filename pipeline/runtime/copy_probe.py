"""The copy probe: what bringing one routed expert into a fast-tier slot costs on this machine, measured once by
copying the way the CPU expert cache copies, and cached: the link figure of a CPU profile's round model.

On a CPU the cache's slow tier is the model's safetensors files memory-mapped (stages/models/expert_tiers.py
`MappedTier`) and a miss is one `copy_expert` call (kernels/expert_copy.py) from those pages into a slot: three copies,
each with its call's overhead, from memory no CPU cache holds. That is neither the rate a pass streams its weights at
nor a large copy's, so the round model's link is this measurement. It times the copies only, not the slot table's and
the policy's work a lookup (stages/models/expert_slots.py), which a miss also costs. The probe builds the same tier over
the model's files and slot buffers for `SLOT_SHARE` of its routed experts (at least one slot), then copies every routed
expert once, in a shuffled order (a miss is an expert nobody used lately), into the slots in turn: one untimed sweep
first (it maps the pages: the first-touch faults a run pays once an expert, and, for a file not in the page cache, the
disk's reads), then `REPEATS` timed sweeps, keeping the fastest. The figure is therefore the page cache's: a model whose
files do not stay in RAM copies slower than it says.

`probe` returns a `CopyCost` (bytes written a second, seconds a copy, one expert's bytes, where the figure comes
from), cached under `$SPECLANE_CACHE/copy_cost/`, keyed by the machine as the pass-cost probe keys it (CPU model,
capability, threads), torch, the dtype and the model's files. Delete the file to measure again.
Not here: the round model that reads it (round_model.py), the cache itself (stages/models/expert_cache.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from pathlib import Path

import attrs
import torch

from speclane.kernels import cpu_build
from speclane.kernels.expert_copy import copy_expert
from speclane.stages.models.artifact import cache_root
from speclane.stages.models.config import ModelConfig

log = logging.getLogger("speclane.profile")

SLOT_SHARE = 0.25  # the slot buffers' share of the routed experts (an expert cache's size, not the whole model)
REPEATS = 3
VERSION = 1  # bump when the probe's method changes, so old figures are not reused
SOURCE = (
    "the copy probe (pipeline/runtime/copy_probe.py): every routed expert copied from the memory-mapped files into "
    "slots once a sweep, as the cache copies a miss, the fastest of 3 sweeps, cached"
)


@attrs.frozen
class CopyCost:
    """One expert copy on this machine: `bytes_per_s` written into the slots, `seconds_per_copy`, `expert_bytes` one
    expert in a slot, `source` the cache file it was read from or "measured now"."""

    bytes_per_s: float
    seconds_per_copy: float
    expert_bytes: int
    source: str


def measure(tier, slots: int, repeats: int = REPEATS, seed: int = 0) -> tuple[float, int, int]:
    """(seconds, bytes, copies) of the fastest of `repeats` timed sweeps after an untimed one, each copying every
    expert of `tier` (a `MappedTier` or `StackedTier`) once, in one shuffled order, into `slots` slot buffers in
    turn, with `copy_expert` as the cache does."""
    if slots < 1 or repeats < 1:
        raise ValueError(f"copy probe: slots and repeats must be at least 1 (got {slots}, {repeats})")
    keys = [(layer, e) for layer in sorted(tier.layers) for e in range(tier.experts)]
    random.Random(seed).shuffle(keys)
    gate_up = torch.empty(slots, 2 * tier.inter, tier.hidden, dtype=tier.dtype)
    down = torch.empty(slots, tier.hidden, tier.inter, dtype=tier.dtype)
    best, written = float("inf"), 0
    for sweep in range(repeats + 1):
        written = 0
        t = time.perf_counter()
        for i, (layer, e) in enumerate(keys):
            s = i % slots
            written += copy_expert(gate_up[s], down[s], *tier.parts(layer, e))
        if sweep:
            best = min(best, time.perf_counter() - t)
    return best, written, len(keys)


def cache_key(directory: Path, dtype: str) -> str:
    """What a copy costs depends on: the machine, torch's threads and version, the dtype and the model's files."""
    where = f"{cpu_build.cpu_name()}|{torch.backends.cpu.get_cpu_capability()}|{torch.get_num_threads()}"
    parts = [str(VERSION), where, torch.__version__, dtype, (directory / "config.json").read_text()]
    parts += [f"{p.name}:{p.stat().st_size}" for p in sorted(directory.glob("*.safetensors"))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def probe(directory: Path, cfg: ModelConfig, dtype: str) -> CopyCost:
    """The MoE model at `directory`'s expert copy on this machine in `dtype` (a torch dtype's name): cached, else
    measured now (then cached; an unwritable cache is not an error, the probe runs again next time). A ValueError
    for a dense model (it has no experts to copy)."""
    from speclane.stages.models.expert_tiers import MappedTier
    from speclane.stages.models.families import canonical_names
    from speclane.stages.models.moe_files import RenamedTier

    if not any(cfg.moe_layers):
        raise ValueError(f"copy probe: {directory} is a dense model; it has no routed experts to copy")
    path = cache_root() / "copy_cost" / f"{cache_key(directory, dtype)}.json"
    try:
        data = json.loads(path.read_text())
        return CopyCost(data["bytes_per_s"], data["seconds_per_copy"], data["expert_bytes"], str(path))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rename, torch_dtype = canonical_names(cfg.model_type), getattr(torch, dtype)
    tier = (
        MappedTier(directory, cfg, torch_dtype) if rename is None else RenamedTier(directory, cfg, torch_dtype, rename)
    )
    every = len(tier.layers) * tier.experts
    log.info("measuring an expert copy from %s's files into slots (once per machine and model)", directory.name)
    seconds, written, copies = measure(tier, max(1, round(SLOT_SHARE * every)))
    cost = CopyCost(written / seconds, seconds / copies, written // copies, "measured now")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fields = attrs.asdict(cost, filter=lambda a, _: a.name != "source")
        tmp.write_text(json.dumps({**fields, "cpu": cpu_build.cpu_name(), "torch": torch.__version__}))
        tmp.replace(path)
    except OSError as exc:
        log.warning("copy probe not cached (%s): it runs again next time", exc)
    return cost


def link_figure(directory: Path, cfg: ModelConfig, dtype: str, figures: dict) -> float:
    """The round model's link for the MoE model at `directory` (`probe`'s bytes a second), its figure and where it
    comes from entered in `figures` as `link_bytes_per_s`."""
    cost = probe(directory, cfg, dtype)
    figures["link_bytes_per_s"] = {"value": cost.bytes_per_s, "source": f"{SOURCE}; this figure: {cost.source}"}
    return cost.bytes_per_s
