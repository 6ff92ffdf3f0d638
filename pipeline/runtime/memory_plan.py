"""The memory plan: what a configuration holds, line by line in bytes, and whether it fits a memory.

Owns: the lines (`lay_out`) and the rules that join them. `runtime`: what the process holds before any model (the
interpreter, torch, the engine's modules), measured by the caller; host memory, so in the total on a CPU only (a CUDA
context is not counted). `dense`: every weight but the routed experts, packed copies included; `experts_fast`: the
routed experts in fast memory (all, or an expert cache's slots); `experts_slow`: with an expert cache, the routed
experts in the artifact's files, memory-mapped and read in place, not counted; `kv` and `recurrent`: every lane's
state; `drafter`: a model drafter's weights, drafting copies, proposal head, window a lane and unprojected rows (none
with speculation off or a drafter without weights); `activations`: the widest pass's rows times what a row holds
(model_bytes.row_bytes, an estimate); `checkpoints`: what a run of one request a lane, each of `max_len` tokens,
fills (their keys, each snapshot's own states), at most the --checkpoint-memory budget, and on a GPU
`checkpoints_host` in host memory; `loading`: the part of a load's transient (model_bytes.load_transient) past what
the run allocates after the load. `total` is then a run's peak (`rss` that peak as the OS counts it, the mapped
expert pages a run reads included); `bound` counts the budget full, as a long run (serve,
chat) comes to hold it, and is what `fits` checks. With an expert cache the drafter and the reserve only a verify
round past 8 rows needs are taken from the cache's budget (`taken`): the slots are what is left. `advise` finds the
single changes that make a configuration fit. Not here: the bytes of each tensor (model_bytes.py), sizes as users
write them and the table (pipeline/cli).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import attrs

from speclane.pipeline.runtime.keeper import HOST_CHECKPOINT_BYTES
from speclane.pipeline.runtime.model_bytes import (
    Build,
    DrafterBytes,
    drafter_bytes,
    expert_bytes,
    file_expert_bytes,
    header,
    load_transient,
    row_bytes,
    state_bytes,
    target_bytes,
)
from speclane.stages.anchor_gather import drafts_per_lane
from speclane.stages.drafters import backend_class
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_cache import check_budget
from speclane.stages.models.state import KEY_BLOCK

_HELD = ("runtime", "dense", "experts_fast", "experts_slow", "kv", "recurrent", "drafter", "activations")
LINES = (*_HELD, "checkpoints", "loading", "checkpoints_host")  # in the order `speclane plan` prints them
HOST = ("experts_slow", "checkpoints_host")  # lines outside fast memory (and `runtime` with the model on a GPU)
NARROW_ROWS = 8  # the default row budget: the reserve a verify round past it adds comes from the expert cache
MB = 1 << 20


@attrs.frozen
class Setting:
    """A configuration, as the flags give it. `draft_tokens` and `row_budget` are the resolved knobs (row budget 0:
    no cap); `options` the draft backend's own; `prefill_rows` the prefill pass's rows; the byte budgets as given
    (`checkpoint_host_bytes` None: the engine's default; `expert_cache_bytes` None: every expert resident);
    `checkpoint_every` the checkpoint interval in tokens (0: none); `runtime` the process's bytes before any model."""

    build: Build
    lanes: int
    max_len: int
    backend: str = "none"
    draft_tokens: int = 0
    row_budget: int = 0
    head: str = "full"
    options: dict = attrs.field(factory=dict, hash=False)
    prefill_rows: int = 512
    checkpoint_bytes: int = 0
    checkpoint_host_bytes: int | None = None
    expert_cache_bytes: int | None = None
    checkpoint_every: int = 0
    runtime: int = 0

    @property
    def verify_rows(self) -> int:
        """The widest verify round: every lane's anchor and the drafts the row budget allows it."""
        k = self.draft_tokens if self.backend != "none" else 0
        return self.lanes * (drafts_per_lane(k, self.row_budget, self.lanes) + 1)


class Model:
    """What the plan reads of an artifact, once: its config, its files' headers, its drafters' shapes."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.cfg = ModelConfig.load(self.directory)
        self._drafters: dict[tuple, DrafterBytes] = {}

    @cached_property
    def expert_file_bytes(self) -> int:
        return file_expert_bytes(self.cfg, header(self.directory), self.directory) if any(self.cfg.moe_layers) else 0

    def drafter(self, s: Setting) -> DrafterBytes | None:
        """A model drafter's bytes (None: the backend keeps no weights: none, ngram)."""
        if not issubclass(backend_class(s.backend), ModelBackend):
            return None
        key = (s.backend, s.build, s.head, repr(sorted(s.options.items())))
        if key not in self._drafters:
            where = s.options.get("path") or self.directory
            self._drafters[key] = drafter_bytes(s.backend, Path(where), self.cfg, s.build, s.head, s.options)
        return self._drafters[key]


@attrs.frozen
class MemoryPlan:
    """The lines in bytes; `taken`: what the drafter and the wide rounds take from the expert cache's budget;
    `expert_slots`: the slots left (None without a cache); `memory`, `host_memory`: what the configuration must
    fit (None: not asked)."""

    setting: Setting
    lines: dict[str, int]
    taken: int
    expert_slots: int | None
    one_expert: int
    memory: int | None = None
    host_memory: int | None = None
    bound: int = 0  # the total with the checkpoints' budget full

    @property
    def total(self) -> int:
        """Fast memory a run of this shape holds at its peak: every line but the host ones."""
        host = HOST if self.setting.build.device.type == "cpu" else (*HOST, "runtime")
        return sum(v for k, v in self.lines.items() if k not in host)

    @property
    def rss(self) -> int:
        """The peak RSS the OS shows for a run of this shape: `total`, plus on a CPU the mapped expert pages a run
        reads (each counts in RSS until the page cache drops it under pressure; `fits` does not count them)."""
        return self.total + (self.lines["experts_slow"] if self.setting.build.device.type == "cpu" else 0)

    @property
    def free(self) -> int | None:
        """What --memory leaves with the checkpoints' budget full."""
        return None if self.memory is None else self.memory - self.bound

    @property
    def expert_budget(self) -> int | None:
        """The expert cache's budget for its slots, what `Target.load(expert_cache_bytes=...)` is given."""
        s = self.setting
        return None if s.expert_cache_bytes is None else s.expert_cache_bytes - self.taken

    @property
    def problems(self) -> list[str]:
        """What does not fit, in words; empty when it fits (or when no memory was given)."""
        out = []
        if self.expert_slots == 0:
            out.append(
                f"the expert cache holds no expert: {fmt(self.setting.expert_cache_bytes)} less the "
                f"{fmt(self.taken)} the drafter and the wide rounds take from it leaves "
                f"{fmt(max(self.expert_budget, 0))}, and one expert is {fmt(self.one_expert)}"
            )
        if self.free is not None and self.free < 0:
            out.append(f"fast memory: it needs {fmt(self.bound)}, {fmt(self.memory)} is {fmt(-self.free)} short")
        host = self.lines["checkpoints_host"]
        if self.host_memory is not None and host > self.host_memory:
            out.append(
                f"host memory: the checkpoints' host tier is {fmt(host)}, {fmt(self.host_memory)} is "
                f"{fmt(host - self.host_memory)} short"
            )
        return out

    @property
    def fits(self) -> bool | None:
        asked = self.memory is not None or self.host_memory is not None or self.expert_slots is not None
        return not self.problems if asked else None


def lay_out(model: Model, s: Setting, memory: int | None = None, host_memory: int | None = None) -> MemoryPlan:
    """The memory plan of `s` for `model`, checked against `memory` (fast) and `host_memory` where given."""
    cfg, b = model.cfg, s.build
    dense, routed = target_bytes(cfg, b)
    kv, recurrent = state_bytes(cfg, b, s.lanes, s.max_len)
    d = model.drafter(s)
    drafter = 0 if d is None else d.weights + s.lanes * d.window + d.pending
    taps = 0 if d is None else d.taps
    verify_row = row_bytes(cfg, b, taps, kept=True)
    prefill = s.prefill_rows * row_bytes(cfg, b, taps, kept=False) + verify_row  # its last row kept
    verify = s.verify_rows * verify_row
    activations = max(prefill, verify)
    wide = activations - max(prefill, min(s.verify_rows, NARROW_ROWS) * verify_row)
    one = expert_bytes(cfg, b) if any(cfg.moe_layers) else 0
    taken, slots, slow = 0, None, 0
    fast = routed
    if s.expert_cache_bytes is not None and (not one or b.device.type != "cpu"):
        check_budget(cfg, s.expert_cache_bytes, b.dtype, b.device)  # refuses, naming --expert-cache
    if s.expert_cache_bytes is not None:
        taken = drafter + wide
        slots = max(0, min((s.expert_cache_bytes - taken) // one, sum(cfg.moe_layers) * cfg.num_experts))
        fast, slow = slots * one, model.expert_file_bytes
    host = HOST_CHECKPOINT_BYTES if s.checkpoint_host_bytes is None else s.checkpoint_host_bytes
    host = 0 if b.device.type == "cpu" else host
    snaps = 4 + (s.max_len // s.checkpoint_every if s.checkpoint_every else 0)  # chat head, marks, prompt, answer
    per_lane = s.max_len * state_bytes(cfg, b, 1, KEY_BLOCK)[0] // KEY_BLOCK + (d.window if d else 0)
    fill = min(s.checkpoint_bytes, s.lanes * per_lane + snaps * recurrent)
    transient = load_transient(cfg, b) - (kv + recurrent + drafter + activations)  # past what is allocated after it
    lines = {
        "runtime": s.runtime,
        "dense": dense,
        "experts_fast": fast,
        "experts_slow": slow,
        "kv": kv,
        "recurrent": recurrent,
        "drafter": drafter,
        "activations": activations,
        "checkpoints": fill,
        "loading": max(0, transient - fill),
        "checkpoints_host": host,
    }
    full = {**lines, "checkpoints": s.checkpoint_bytes, "loading": max(0, transient - s.checkpoint_bytes)}
    plan = MemoryPlan(s, lines, taken, slots, one, memory, host_memory)
    return attrs.evolve(plan, bound=attrs.evolve(plan, lines=full).total)


FLAGS = {
    "lanes": "--lanes",
    "max_len": "--context",
    "expert_cache": "--expert-cache",
    "backend": "--spec-backend",
    "checkpoints": "--checkpoint-memory",
    "checkpoints_host": "--checkpoint-host-memory",
    "quant": "--quant",
    "memory": "--memory",
}


def advise(model: Model, plan: MemoryPlan, flags: dict[str, str] = FLAGS) -> list[str]:
    """Single changes of the setting under which `plan`'s configuration fits, each as the flag to give."""
    s = plan.setting

    def fits(**change) -> bool:
        return bool(lay_out(model, attrs.evolve(s, **change), plan.memory, plan.host_memory).fits)

    out = []
    lanes = _largest(1, s.lanes - 1, lambda n: fits(lanes=n))
    if lanes:
        out.append(f"{flags['lanes']} {lanes}")
    blocks = _largest(1, (s.max_len - 1) // KEY_BLOCK, lambda n: fits(max_len=n * KEY_BLOCK))
    if blocks:
        out.append(f"{flags['max_len']} {blocks * KEY_BLOCK}")
    if plan.one_expert and s.build.device.type == "cpu":  # whole slots over what the cache gives up
        taken = lay_out(model, attrs.evolve(s, expert_cache_bytes=plan.one_expert)).taken
        every = sum(model.cfg.moe_layers) * model.cfg.num_experts
        n = _largest(1, every, lambda n: fits(expert_cache_bytes=taken + n * plan.one_expert))
        if n:
            out.append(f"{flags['expert_cache']} {_mb(taken + n * plan.one_expert)}")
    if s.backend != "none" and fits(backend="none", draft_tokens=0):
        out.append(f"{flags['backend']} none")
    checkpoints = _largest(0, s.checkpoint_bytes // MB - 1, lambda n: fits(checkpoint_bytes=n * MB), empty=None)
    if checkpoints is not None:
        out.append(f"{flags['checkpoints']} {checkpoints}")
    if s.build.quant == "none" and fits(build=attrs.evolve(s.build, quant="int8")):
        out.append(f"{flags['quant']} int8")
    host = plan.lines["checkpoints_host"] // MB
    host = _largest(0, host - 1, lambda n: fits(checkpoint_host_bytes=n * MB), empty=None) if host else None
    if host is not None:
        out.append(f"{flags['checkpoints_host']} {host}")
    return out


def _largest(low: int, high: int, ok, empty=0):
    """The largest n in [low, high] with ok(n), for ok true up to some n and false past it; `empty` if none."""
    if high < low or not ok(low):
        return empty
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    return low


def _mb(n: int) -> str:
    """A budget of `n` bytes as --expert-cache's MB, rounded up by a few bytes (far less than a slot)."""
    return f"{n // MB}" if n % MB == 0 else f"{(n + 2) / MB + 5e-7:.6f}".rstrip("0")


def refusal(model: Model, plan: MemoryPlan, flags: dict[str, str] = FLAGS) -> str:
    """Why `plan` does not fit and what to change, for an error message."""
    lines = ", ".join(f"{k} {fmt(v)}" for k, v in plan.lines.items() if v and k not in ("experts_slow",))
    fixes = advise(model, plan, flags)
    what = (
        ("any one of these fits: " + "; ".join(fixes))
        if fixes
        else f"no one change fits: give more {flags['memory']}, or a smaller model"
    )
    return f"{flags['memory']}: this configuration does not fit ({'; '.join(plan.problems)}); it holds {lines}; {what}"


def fmt(n: int | None) -> str:
    """Bytes for people: 512 B, 3.5 KiB, 1.25 GiB."""
    if n is None:
        return "-"
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{int(size)} B" if unit == "B" else f"{size:.3g} {unit}" if abs(size) < 1000 else f"{size:.0f} {unit}"
