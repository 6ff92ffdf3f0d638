"""Memory sizes as users write them, and the memory plan a command's flags describe.

Owns: `parse_size` (a number and a unit, binary or decimal: 24GiB, 512MiB, 1.5GB; nothing else), which reads
--memory and --host-memory, the runtime's `Setting` built from the shared model and spec flags (`plan_from_args`),
with the process's own bytes measured (`runtime_bytes`), the plan as `speclane plan` prints it (`table`,
`as_json`), the plan of the configuration an engine runs (`plan_of`), `check_fits`, which the commands that run a
model call before any weight loads, and `return_freed`, which hands what a load freed back to the system. Not
here: the accounting (pipeline/runtime/memory_plan.py), and the --memory and --host-memory flags
(pipeline/cli/common.py: a command's parser builds without this module, which imports torch).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import math
import re
import resource
import sys
from decimal import Decimal
from pathlib import Path

import attrs
import torch

from speclane.pipeline.framework.kinds import find
from speclane.pipeline.framework.knobs import knob_value
from speclane.pipeline.framework.spec import SpecFile, load_spec
from speclane.pipeline.runtime.memory_plan import (
    FLAGS,
    LINES,
    MB,
    MemoryPlan,
    Model,
    Setting,
    advise,
    fmt,
    lay_out,
    refusal,
)
from speclane.pipeline.runtime.model_bytes import Build
from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.artifact import resolve
from speclane.stages.models.tokenizer import Tokenizer

UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(B|[KMGT]i?B)")
# the engine commands' names for what `speclane plan` calls --lanes and --context
ENGINE_FLAGS = {**FLAGS, "lanes": "--max-lanes", "max_len": "--max-len"}


def parse_size(text: str, flag: str) -> int:
    """Bytes of a size such as 24GiB, 512MiB or 1.5GB (KiB = 1024 bytes, KB = 1000); a ConfigError naming `flag`
    for anything else, or for a size under one byte."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ConfigError(
            f"{flag}: '{text}' is not a size; write a number and a unit without a space, like 24GiB, "
            f"512MiB or 1.5GB (units: {', '.join(UNITS)})"
        )
    value = int(Decimal(m[1]) * UNITS[m[2]])
    if value < 1:
        raise ConfigError(f"{flag}: '{text}' is less than one byte; give a size of at least 1B")
    return value


_RUNTIME: dict[Path, int] = {}


def runtime_bytes(directory: Path) -> int:
    """This process's resident bytes once it has imported what the engine imports (the interpreter, torch, the
    engine's modules) and loaded the tokenizer of the model in `directory` (where it has one): what a command that
    runs the model holds before its weights load. From /proc/self/status where there is one, else the peak
    `getrusage` reports.
    Measured once a process and model: a later call, after a profile's probes or the weights loaded, gets the
    first measurement, so a command measures it before it loads anything."""
    key = Path(directory).resolve()
    if key not in _RUNTIME:
        _RUNTIME[key] = _measure_runtime(directory)
    return _RUNTIME[key]


def _measure_runtime(directory: Path) -> int:
    for name in ("speclane.pipeline.runtime.engine", "speclane.stages.models.loading", "speclane.pipeline.cli.drive"):
        importlib.import_module(name)
    # alive while this process is measured; an artifact without one (random weights for benches, which only a bench
    # runs) is measured without it
    _tokenizer = Tokenizer.load(directory) if (Path(directory) / "tokenizer.json").is_file() else None
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak << 10  # bytes on macOS, KiB elsewhere


def return_freed() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim), so that what a load freed is not
    resident while the engine allocates beside it; nothing where the C library has no such call."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _drafter_options(spec: SpecFile, backend: str) -> dict:
    """The backend's options from the spec's stage that takes the `backend` knob."""
    for s in spec.stages:
        cls = find(s.kind)
        if cls is not None and "backend" in cls.knobs:
            return dict((s.params.get("options") or {}).get(backend) or {})
    return {}


def setting(args: argparse.Namespace, spec: SpecFile, lanes: int, max_len: int, directory: Path) -> Setting:
    """The runtime's Setting for the model (in `directory`), spec and checkpoint flags (`spec` resolved with the
    knobs)."""
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise ConfigError(f"--device: '{args.device}' is not a torch device (use cpu, cuda or cuda:N)") from exc
    backend = knob_value(spec, "backend") or "none"
    prefill = int(knob_value(load_spec("prefill"), "prefill_rows") or 0)
    host_mb = getattr(args, "checkpoint_host_memory", None)
    expert_mb = getattr(args, "expert_cache", None)
    if expert_mb is not None and not (expert_mb > 0 and math.isfinite(expert_mb)):
        raise ConfigError(f"--expert-cache must be > 0 MB (unset: every expert resident), got {expert_mb}")
    return Setting(
        build=Build(getattr(torch, args.dtype), device, args.quant),
        lanes=lanes,
        max_len=max_len,
        backend=backend,
        draft_tokens=int(knob_value(spec, "draft_tokens") or 0),
        row_budget=int(knob_value(spec, "draft_rows") or 0),
        head=knob_value(spec, "draft_head") or "full",
        options=_drafter_options(spec, backend),
        prefill_rows=max(prefill, getattr(args, "prefill_rows", 0) or 0),
        checkpoint_bytes=max(getattr(args, "checkpoint_memory", 0), 0) << 20,
        checkpoint_host_bytes=None if host_mb is None else host_mb << 20,
        expert_cache_bytes=None if expert_mb is None else int(expert_mb * MB),
        checkpoint_every=max(getattr(args, "checkpoint_interval", 0) or 0, 0),
        runtime=runtime_bytes(directory),
    )


def plan_from_args(args: argparse.Namespace, spec: SpecFile, lanes: int, max_len: int) -> tuple[Model, MemoryPlan]:
    """The memory plan the flags describe, checked against --memory and --host-memory where given."""
    memory = None if args.memory is None else parse_size(args.memory, "--memory")
    host = None if args.host_memory is None else parse_size(args.host_memory, "--host-memory")
    model = Model(resolve(args.model))
    s = setting(args, spec, lanes, max_len, model.directory)
    if host is not None and s.build.device.type == "cpu":
        raise ConfigError(
            "--host-memory: with --device cpu the model's memory is host memory; give its size as --memory alone"
        )
    return model, lay_out(model, s, memory, host)


def plan_of(
    args: argparse.Namespace, spec: str | SpecFile, knobs, lanes: int, slots: int | None = None
) -> tuple[Model, MemoryPlan]:
    """The plan of the configuration the engine runs: `spec` (--spec: a name, a path or a loaded spec) resolved with
    `knobs` as the engine resolves it, `lanes` lanes of --max-len, checked against --memory and --host-memory.
    `slots`: an expert cache already loaded with that many slots (the plan then holds those slots, and the drafter
    and a wide round's reserve beside them rather than out of them); None: the cache gets what the plan leaves."""
    from speclane.pipeline.runtime.engine import resolve_spec

    resolved = resolve_spec(spec if isinstance(spec, SpecFile) else load_spec(spec), knobs)
    model, plan = plan_from_args(args, resolved, lanes, args.max_len)
    if slots is not None and plan.one_expert and plan.expert_slots is not None:
        held = attrs.evolve(plan.setting, expert_cache_bytes=slots * plan.one_expert + plan.taken)
        plan = lay_out(model, held, plan.memory, plan.host_memory)
    return model, plan


def check_fits(args: argparse.Namespace, spec: str | SpecFile, knobs, lanes: int) -> int | None:
    """Refuse (a ConfigError naming what to change) a configuration that does not fit --memory and --host-memory;
    else the budget an expert cache's slots get (what the plan leaves them), None without a cache (`plan_of`)."""
    model, plan = plan_of(args, spec, knobs, lanes)
    if plan.fits is False:
        raise ConfigError(refusal(model, plan, ENGINE_FLAGS))
    return plan.expert_budget


def as_json(model: Model, plan: MemoryPlan) -> dict:
    out = {
        "model": str(model.directory),
        "memory": plan.memory,
        "host_memory": plan.host_memory,
        "bytes": {**plan.lines, "total": plan.total, "rss": plan.rss, "bound": plan.bound, "free": plan.free},
        "checkpoint_budget": plan.setting.checkpoint_bytes,
        "fits": plan.fits,
        "expert_slots": plan.expert_slots,
        "taken_from_expert_cache": plan.taken,
    }
    if plan.fits is False:
        out["problems"], out["advice"] = plan.problems, advise(model, plan)
    return out


NOTES = {
    "runtime": "this process before the weights: python, torch, the engine, its tokenizer if any (measured)",
    "experts_slow": "in the files, memory-mapped: not in total (rss below counts the pages a run reads)",
    "loading": "what a load holds for a moment past the lines allocated after it",
    "checkpoints_host": "host memory",
    "activations": "the widest pass's rows, estimated",
    "drafter": "weights, window and unprojected rows",
}


def table(model: Model, plan: MemoryPlan) -> list[str]:
    """The plan as the lines `speclane plan` prints after the round plan."""
    cfg, s = model.cfg, plan.setting
    notes = dict(NOTES)
    if plan.expert_slots is not None:
        notes["experts_fast"] = (
            f"{plan.expert_slots} slots; the drafter and wide rounds take {fmt(plan.taken)} of --expert-cache"
        )
    dtype = str(s.build.dtype).removeprefix("torch.")
    what = f"{cfg.model_type}, {dtype}, {s.build.device}, {s.lanes} lanes of {s.max_len} tokens"
    out = [f"{'memory plan':<16} {model.directory} ({what})"]
    notes["checkpoints"] = (
        f"{s.lanes} request(s) of {s.max_len} tokens fill this of the {fmt(s.checkpoint_bytes)} budget"
        if s.checkpoint_bytes
        else "off"
    )
    if s.build.quant == "int8":
        notes["loading"] = "packing's transient only: int8 quantization's, larger, is not counted"
    if s.build.device.type != "cpu":
        notes["runtime"] = "host memory: this process before the weights (measured); a CUDA context is not counted"
    for key in LINES:
        out.append(f"  {key:<16} {fmt(plan.lines[key]):>10}  {notes.get(key, '')}".rstrip())
    out.append(f"  {'total':<16} {fmt(plan.total):>10}  fast memory: this run's peak")
    if plan.rss != plan.total:
        out.append(
            f"  {'rss':<16} {fmt(plan.rss):>10}  the peak RSS a run shows: total plus the expert pages it reads from"
            " the mapped files (page cache the kernel drops under pressure; not counted in fits)"
        )
    out.append(f"  {'bound':<16} {fmt(plan.bound):>10}  with the checkpoints' budget full (a long run)")
    if plan.memory is not None:
        out.append(f"  {'free':<16} {fmt(plan.free):>10}  of --memory {fmt(plan.memory)}, at the bound")
    if plan.fits is not None:
        fixes = advise(model, plan) if not plan.fits else []
        verdict = "yes" if plan.fits else "no: " + "; ".join(plan.problems)
        out.append(f"{'fits':<16} {verdict}")
        if not plan.fits:
            out.append(
                f"{'to fit':<16} "
                + (
                    "any one of: " + "; ".join(fixes)
                    if fixes
                    else "no one change fits: give more --memory, or a smaller model"
                )
            )
    return out
