"""Flags shared by the commands that run a model (generate, serve, bench), and building an engine from them.

The --spec-* flags go through `SpecKnobs`, the same pydantic model a request's `spec` and the benchmarks
use, so each default is written once. Importing this module imports neither torch nor the engine (the flags'
names and defaults come from modules that import neither): a command's parser, and so its --help, builds without
them; building an engine imports them.
"""

from __future__ import annotations

import argparse
import math
import os

from speclane.pipeline.framework.spec import SpecFile, load_spec, with_params
from speclane.pipeline.runtime.profiles import load_profile, merge
from speclane.pipeline.runtime.request import SpecKnobs
from speclane.stages.contract.errors import ConfigError
from speclane.stages.drafters import CACHE_TOKENS, CHAINS, SPEC_BACKENDS


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="HF-style directory, .gguf file, or ORG/NAME[@REV] found in the local Hugging Face cache (never "
        "downloaded; docs/models.md) (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="compute dtype (bfloat16: fast on CPU; float32: for exactness work)",
    )
    p.add_argument(
        "--quant",
        choices=("none", "int8"),
        default="none",
        help="weight-only quantization of the linear layers at load (int8: half of bf16's bytes a token; "
        "quality and speed: python -m speclane.bench.quant)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="torch device for the model and its state (cpu, cuda, cuda:1)")
    p.add_argument(
        "--expert-cache",
        type=float,
        default=None,
        metavar="MB",
        help="a MoE model's routed experts stay in its safetensors files, read in place, and run from "
        "this many MB of slots, copied in when a pass chooses them (least recently used leave first); "
        "output is bit-identical to every expert resident. Unset: every expert loaded; refused for a "
        "dense model and off a CPU",
    )


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    add_knob_flags(p)
    p.add_argument(
        "--max-lanes",
        type=int,
        default=None,
        help="lanes decoded together (default 4, or the profile's; generate: a lane a request, up to that)",
    )
    p.add_argument(
        "--max-len",
        type=int,
        default=4096,
        help="KV capacity of a lane: prompt + output tokens (default 4096; generate: its longest request's, at most "
        "that)",
    )
    p.add_argument(
        "--checkpoint-memory",
        type=int,
        default=512,
        metavar="MB",
        help="bytes (in MB) of prompt checkpoints kept: a request that repeats a kept prefix (a chat's next "
        "turn, a shared system prompt) prefills only the rest; least recently used go first; 0: off",
    )
    p.add_argument(
        "--checkpoint-host-memory",
        type=int,
        default=None,
        metavar="MB",
        help="with the model on a GPU: host memory (in MB) that the least recently used checkpoints move "
        "to when --checkpoint-memory on the device is full, before they are dropped (default 4096; on a "
        "CPU the two are one memory and this is 0)",
    )
    p.add_argument(
        "--checkpoint-interval",
        type=int,
        default=1024,
        metavar="TOKENS",
        help="also checkpoint at every multiple of this many tokens of a long prompt, so a request that "
        "shares only its beginning (a re-rendered earlier turn) still reuses it; they share the positions "
        "they have in common, so each costs what it adds; 0: only at prompt, chat head and answer ends",
    )
    add_memory_flags(p)
    p.add_argument(
        "--suffix-cache-tokens",
        type=int,
        default=None,
        metavar="TOKENS",
        help="--spec-backend suffix (and suffix+mtp, suffix+dflash2): tokens of finished requests (each answer "
        "after the end of its prompt) its shared suffix "
        f"tree keeps, the oldest requests dropped first (default {CACHE_TOKENS:,}; 0: each request drafts "
        "from its own tokens only)",
    )


def add_knob_flags(p: argparse.ArgumentParser) -> None:
    """--spec and the --spec-* knobs, for commands that resolve a spec without running a model (graph)."""
    p.add_argument("--spec", default="verify", help="the verify round's spec file (default specs/verify.toml)")
    p.add_argument(
        "--profile",
        default=None,
        help="a machine profile from specs/profiles/ (cpu, rtx5090, "
        "rtxpro6000) or a path; explicit --spec-* flags win over it",
    )
    p.add_argument(
        "--spec-backend",
        choices=SPEC_BACKENDS,
        default=None,
        help="draft backend (default: what the spec says; specs/verify.toml says ngram); suffix+mtp and "
        "suffix+dflash2 draft from the suffix trees where they are confident, from the network elsewhere",
    )
    p.add_argument("--spec-draft-tokens", type=int, default=None, help="draft tokens per lane, 1 to 7")
    p.add_argument(
        "--spec-draft-rows",
        type=int,
        default=None,
        help="row budget per round across lanes; 0 means the backend's default (8 for mtp, no cap otherwise)",
    )
    p.add_argument(
        "--spec-draft-head",
        choices=("full", "shortlist"),
        default=None,
        help="a model drafter's proposal head: shortlist (the spec's default: the int8 rows of the "
        "target's 8,192 most frequent answer tokens, where the drafter's file ranks them) or full",
    )
    p.add_argument(
        "--spec-draft-plan",
        choices=("measured", "fixed"),
        default=None,
        help="measured (specs/verify.toml's default): each lane takes the drafts that pay on this "
        "machine, from a pass-cost probe cached per machine and model and the lane's acceptance; "
        "fixed: every draft the tokens and rows allow",
    )


def add_memory_flags(p: argparse.ArgumentParser) -> None:
    """--memory and --host-memory, as sizes (`speclane.pipeline.cli.memory.parse_size` reads them)."""
    p.add_argument(
        "--memory",
        default=None,
        metavar="SIZE",
        help="fast memory the configuration must fit: the GPU's with --device cuda, else the RAM it may "
        "take (24GiB, 512MiB, 1.5GB); one that does not fit is refused before the weights load, naming "
        "what to change (`speclane plan` lays the bytes out)",
    )
    p.add_argument(
        "--host-memory",
        default=None,
        metavar="SIZE",
        help="with the model on a GPU: host memory the configuration must fit (the checkpoints' host "
        "tier); on a CPU the two are one memory: give --memory alone",
    )


def knobs_from_args(args: argparse.Namespace, target=None) -> SpecKnobs:
    """The --spec-* flags over --profile's derived settings (pipeline/cli/derive.py; `target`: the loaded model, which
    a profile whose figures the pass-cost probe measures needs)."""
    flags = SpecKnobs.from_flags(
        backend=args.spec_backend,
        draft_tokens=args.spec_draft_tokens,
        draft_rows=args.spec_draft_rows,
        draft_head=args.spec_draft_head,
        draft_plan=args.spec_draft_plan,
    )
    if not getattr(args, "profile", None):
        return flags
    from speclane.pipeline.cli.derive import derived_knobs  # the round model and the model's figures: torch

    return merge(derived_knobs(args, max_lanes_from_args(args), target), flags)


def _profile(args: argparse.Namespace):
    name = getattr(args, "profile", None)
    return load_profile(name) if name else None


def spec_from_args(args: argparse.Namespace) -> str | SpecFile:
    """--spec, with --suffix-cache-tokens written into the `suffix` options (and the chains': `suffix+mtp`,
    `suffix+dflash2`) of the stage that takes the backend knob (the draft stage), as a spec file's
    `options.suffix.cache_tokens` would be."""
    tokens = getattr(args, "suffix_cache_tokens", None)
    if tokens is None:
        return args.spec
    if tokens < 0:
        raise ConfigError(f"--suffix-cache-tokens must be >= 0 (0: no tokens of earlier requests), got {tokens}")
    from speclane.pipeline.framework.kinds import find  # the stage registry: torch

    spec = load_spec(args.spec)
    overrides = {}
    for s in spec.stages:
        cls = find(s.kind)
        if cls is not None and "backend" in cls.knobs:
            options = dict(s.params.get("options", {}))
            for name in ("suffix", *CHAINS):  # the chains read their suffix part's options from their own table
                options[name] = {**options.get(name, {}), "cache_tokens": tokens}
            overrides[s.name] = {"options": options}
    return with_params(spec, overrides) if overrides else spec


def max_lanes_from_args(args: argparse.Namespace) -> int:
    """--max-lanes, else the profile's, else 4."""
    if getattr(args, "max_lanes", None) is not None:
        if args.max_lanes < 1:
            raise ConfigError(f"--max-lanes must be >= 1, got {args.max_lanes}")
        return args.max_lanes
    profile = _profile(args)
    return profile.max_lanes if profile is not None and profile.max_lanes else 4


def set_threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))


def engine_from_args(args: argparse.Namespace, check_contracts: bool = False, progress=None):
    """The engine the flags describe; `progress` (speclane.pipeline.cli.progress.Progress) draws the load and
    conversion."""
    from speclane.pipeline.cli.memory import check_fits, return_freed
    from speclane.pipeline.cli.progress import Progress
    from speclane.pipeline.runtime import heap
    from speclane.pipeline.runtime.engine import Engine
    from speclane.stages.models.loading import load_model

    progress = progress or Progress(enabled=False)
    if getattr(args, "checkpoint_memory", 0) < 0:  # before the model loads
        raise ConfigError(f"--checkpoint-memory must be >= 0 (0: off), got {args.checkpoint_memory}")
    host_mb = getattr(args, "checkpoint_host_memory", None)
    if host_mb is not None and host_mb < 0:
        raise ConfigError(f"--checkpoint-host-memory must be >= 0 (0: none), got {host_mb}")
    if getattr(args, "checkpoint_interval", 0) < 0:
        raise ConfigError(
            f"--checkpoint-interval must be >= 0 (0: only at prompt and answer ends), got {args.checkpoint_interval}"
        )
    expert_mb = getattr(args, "expert_cache", None)
    if expert_mb is not None and not (expert_mb > 0 and math.isfinite(expert_mb)):
        raise ConfigError(f"--expert-cache must be > 0 MB (unset: every expert resident), got {expert_mb}")
    set_threads(args.threads)
    knobs, spec = knobs_from_args(args), spec_from_args(args)
    lanes = max_lanes_from_args(args)
    expert_bytes = None if expert_mb is None else int(expert_mb * (1 << 20))
    if getattr(args, "memory", None) is not None or getattr(args, "host_memory", None) is not None:
        expert_bytes = check_fits(args, spec, knobs, lanes)  # refused before any weight loads
    target, tokenizer = load_model(
        args.model, args.dtype, args.device, args.quant, progress=progress.loader(), expert_cache_bytes=expert_bytes
    )
    return_freed()  # the load's transient goes back before the engine allocates beside it
    knobs = knobs_from_args(args, target)  # a profile the pass-cost probe measures derives its settings now
    with progress.task("planning the prefill and verify rounds", done="planned the rounds in {s} s"):
        engine = Engine(
            target,
            tokenizer,
            spec=spec,
            knobs=knobs,
            max_lanes=lanes,
            max_len=args.max_len,
            check_contracts=check_contracts,
            checkpoint_bytes=getattr(args, "checkpoint_memory", 0) << 20,
            checkpoint_every=getattr(args, "checkpoint_interval", 0),
            checkpoint_host_bytes=None if host_mb is None else host_mb << 20,
            snapshot_dir=getattr(args, "snapshot_dir", None),
        )
    heap.freeze()  # what follows is the command's loop: no full-heap collection pauses inside it
    return engine
