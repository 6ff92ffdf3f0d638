"""The settings of `speclane bench`: one pydantic model (unknown keys forbidden), the `--quick` preset of it, and
the command-line flags that override it (`add_arguments`, `settings_from_args`).

Owns what a run is asked to do: sections, workloads, dtype, threads, prompt and repeat counts, draft tokens, lanes
and row budgets, peers, length buckets. Not here: running the sections (bench/cmd_bench.py), measuring
(bench/measure.py), the sections' bodies (sweeps, controls, peers) and printing (bench/report.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from speclane.bench import workloads
from speclane.stages.drafters import SPEC_BACKENDS

SECTIONS = ("limits", "null", "draft_tokens", "lanes", "defaults", "lengths", "peers", "exactness")
OPT_IN = ("experts",)  # run only when named in --sections: it fits a MoE target once and takes minutes
# The peers a run can load (bench/peers.py) and the prompt-length buckets, each with the workloads its prompts come
# from (bench/workloads.py; the 256 bucket is the regular prompts): here, so that the flags build without importing
# the sections (and torch).
PEERS = ("transformers", "llama.cpp", "llama.cpp-q4_1")
BUCKETS = {"256": ("code_edit", "prose"), "1k": ("long_1k",), "4k": ("long_4k",)}


class BenchSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dtype: str = Field(default="bfloat16", pattern="^(bfloat16|float32)$")
    threads: int = Field(default=1, ge=1)
    prompts: int = Field(default=3, ge=1, description="prompts per workload")
    repeats: int = Field(default=2, ge=1, description="alternating repeats (A B A B) per prompt")
    max_tokens: int = Field(default=64, ge=2)
    draft_tokens: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
    # suffix learns from every finished request: sections that repeat their prompts (A B A B) would time memorized
    # answers, so it runs only where named (`--backends suffix`), and reads as what it is there
    backends: tuple[str, ...] = tuple(b for b in SPEC_BACKENDS if b != "none" and "suffix" not in b)
    lanes: tuple[int, ...] = (1, 2, 4, 8)
    row_budgets: tuple[int, ...] = (0, 3, 8, 16)
    lane_k: int = Field(default=7, ge=1, le=7, description="draft tokens in the lane sweep")
    pass_rows: tuple[int, ...] = tuple(range(1, 17))
    pass_context: int = 256
    lookup: int = Field(default=7, ge=1, le=7, description="draft tokens of the peers' prompt lookup")
    peer_int8: bool = Field(default=True, description="peers: also run speclane on int8 weights")
    peers: tuple[str, ...] = PEERS
    peer_lookup: bool = Field(default=True, description="peers: also run each peer with its prompt lookup")
    workloads: tuple[str, ...] = workloads.WORKLOADS
    buckets: tuple[str, ...] = tuple(BUCKETS)
    bucket_prompts: int = Field(default=2, ge=1, description="prompts per length bucket (code and prose alternate)")
    new_tokens: tuple[int, ...] = (128, 512)
    length_configs: tuple[str, ...] = ("ngram@7", "dflash2@7", "mtp@3")
    sections: tuple[str, ...] = SECTIONS


# A smoke run of every section in under two minutes on a 2-core AVX2 machine (docs/benchmarks.md has the
# measurement): one workload with short prompts (prefill is most of a short run's time; transformers' bf16
# prefill is the slowest part of all), one repeat, one k, a short answer, speclane's own int8, the
# second llama.cpp peer (its shipped Q4_1 file) and the peers' prompt lookup left out.
QUICK = {
    "prompts": 1,
    "repeats": 1,
    "max_tokens": 12,
    "draft_tokens": (3,),
    "workloads": ("code_gen",),
    "lanes": (1, 2),
    "row_budgets": (0, 3),
    "pass_rows": (1, 2, 8),
    "pass_context": 64,
    "buckets": ("256",),
    "bucket_prompts": 1,
    "new_tokens": (8, 16),
    "length_configs": ("ngram@3",),
    "peer_int8": False,
    "peers": ("transformers", "llama.cpp"),
    "peer_lookup": False,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="tiny settings: a smoke run of every section")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the results as JSON to PATH (no PATH: to stdout instead of the tables)",
    )
    p.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write PNG plots into DIR")
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="PATH",
        help="measure nothing: print the tables (and --plot) of a result written by --json",
    )
    p.add_argument("--sections", nargs="+", choices=SECTIONS + OPT_IN, default=None)
    p.add_argument("--workloads", nargs="+", choices=workloads.WORKLOADS, default=None)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default 1: shared machines)")
    for name in ("prompts", "repeats", "max_tokens"):
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None)
    p.add_argument("--draft-tokens", type=int, nargs="+", default=None)
    p.add_argument("--backends", nargs="+", default=None, help="drafters to sweep (default: ngram dflash2 mtp)")
    p.add_argument("--lanes", type=int, nargs="+", default=None)
    p.add_argument("--row-budgets", type=int, nargs="+", default=None)
    p.add_argument(
        "--buckets",
        nargs="+",
        choices=tuple(BUCKETS),
        default=None,
        help="prompt-length buckets of the lengths section (default: 256 1k 4k)",
    )
    p.add_argument("--bucket-prompts", type=int, default=None)
    p.add_argument("--new-tokens", type=int, nargs="+", default=None, help="answer lengths of the lengths section")
    p.add_argument(
        "--length-configs",
        nargs="+",
        default=None,
        metavar="BACKEND@K",
        help="configurations of the lengths section (default: ngram@7 dflash2@7 mtp@3)",
    )


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    data = dict(QUICK) if args.quick else {}
    for name in (
        "sections",
        "workloads",
        "dtype",
        "threads",
        "prompts",
        "repeats",
        "max_tokens",
        "draft_tokens",
        "backends",
        "lanes",
        "row_budgets",
        "buckets",
        "bucket_prompts",
        "new_tokens",
        "length_configs",
    ):
        value = getattr(args, name, None)
        if value is not None:
            data[name] = tuple(value) if isinstance(value, list) else value
    return BenchSettings(**data)
