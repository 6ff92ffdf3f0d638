"""`speclane bench` (and `python -m speclane.bench`): every speed figure as a ratio measured side by side in one run.

Runs the sections in order: limits (memory bandwidth, bytes per pass, verify pass time per row count), null
drafter (the machinery's overhead), draft tokens (speculation off against each drafter and the oracle at each k,
per workload), lanes (lane counts under each row budget), peers (transformers and llama.cpp), exactness (float32
token equality). Prints the tables, writes the JSON (`--json PATH`) and the plots (`--plot DIR`).
Not here: the settings, the `--quick` preset and the flags (bench/settings.py), the subcommand's parser
(pipeline/cli/bench.py), measuring (bench/measure.py), the sections' bodies (sweeps, controls, peers), tables
(bench/report.py) and plots (bench/report_plots.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from speclane.bench import controls, defaults, experts, experts_report, lengths, peers, sweeps, workloads
from speclane.bench.settings import BenchSettings, settings_from_args
from speclane.kernels import cpu_build
from speclane.pipeline.cli.progress import Progress
from speclane.pipeline.runtime import heap


def _commit() -> str:
    """The code measured: HEAD, marked dirty when tracked files differ from it; outside a git checkout, the
    installed package's version ("speclane 0.1.0")."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        from importlib.metadata import version

        return f"speclane {version('speclane')}"
    return head + ("+dirty" if dirty else "")


def machine(s: BenchSettings) -> dict:
    return {
        "cpu": cpu_build.cpu_name(),
        "commit": _commit(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": s.dtype,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
        "compute": cpu_build.describe(),
    }


def run(args: argparse.Namespace) -> int:
    from speclane.bench import report, report_plots

    missing = report_plots.plotting_missing() if args.plot is not None else None
    if missing is not None:  # said before a run of many minutes, not as a traceback at its end
        print(f"speclane bench: error: {missing}", file=sys.stderr)
        return 2
    if args.from_json is not None:
        result = json.loads(args.from_json.read_text())
        print(report.tables(result))
        if "experts" in result:
            print("\n".join(experts_report.lines(result["experts"])))
        if args.plot is not None:
            report_plots.plots(result, args.plot)
            if "experts" in result:
                experts_report.plot(result["experts"], args.plot)
        return 0
    s = settings_from_args(args)
    torch.set_num_threads(s.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(s.threads))
    result = measure(
        s,
        log=(lambda m: None) if args.json == "-" else print,
        progress=Progress(enabled=False) if args.json == "-" else Progress(),
    )
    result["command"] = "speclane bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:])

    if args.json == "-":
        print(json.dumps(result, indent=1))
    else:
        print(report.tables(result))
        if "experts" in result:
            print("\n".join(experts_report.lines(result["experts"])))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot is not None:
        report_plots.plots(result, args.plot)
        if "experts" in result:
            experts_report.plot(result["experts"], args.plot)
    return 0


def _chat_prompts(target, tokenizer, s: BenchSettings) -> tuple[dict, dict]:
    """Each workload's prompts and, with the lengths section, each length bucket's, as chat token ids; the engine
    that renders them is dropped on return."""
    eng = sweeps.make_engine(target, tokenizer, "none", spec="decode")
    every_prompt = workloads.load()

    def prompts_of(w: str, n: int) -> list[dict]:
        return [
            {**p, "ids": eng.apply_chat([{"role": "user", "content": p["user"]}])}
            for p in workloads.pick(every_prompt, w, n)
        ]

    prompts = {w: prompts_of(w, s.prompts) for w in s.workloads}
    if "lengths" not in s.sections:
        return prompts, {}
    return prompts, {b: lengths.bucket_prompts(prompts_of, b, s.bucket_prompts) for b in s.buckets}


def measure(s: BenchSettings, log=print, progress: Progress | None = None) -> dict:
    """Every section of `s`, in order. `log` gets one line a section; `progress` draws a bar inside each (on
    stderr, on a terminal only). The result's `section_seconds` says what each took."""
    from speclane.stages.models.loading import load_model

    progress = progress or Progress(enabled=False)
    t_start = time.perf_counter()
    target, tokenizer = load_model(None, s.dtype, progress=progress.loader())
    heap.freeze()  # start-up's objects out of the collector's scans: no 100 ms pause inside a timed run
    prompts, buckets = _chat_prompts(target, tokenizer, s)
    longest = max(len(p["ids"]) for ps in prompts.values() for p in ps)
    max_len = longest + s.max_tokens + 16
    everything = [p for ps in prompts.values() for p in ps]
    seconds: dict[str, float] = {}
    out: dict = {
        "settings": s.model_dump(),
        "machine": machine(s),
        "section_seconds": seconds,
        "prompt_tokens": {w: [len(p["ids"]) for p in ps] for w, ps in prompts.items()},
    }

    @contextlib.contextmanager
    def section(name: str, what: str):
        """One section's log line, progress bar (`tick(done, total)`) and wall time."""
        log(f"bench: {what}")
        t0 = time.perf_counter()
        with progress.task(f"bench {name}", done=f"bench {name}: {{s}} s") as advance:
            yield lambda done, total: advance(done, total)
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - t0, 2)

    log(f"bench: {len(everything)} prompts ({', '.join(s.workloads)}), {s.dtype}, {s.threads} thread(s)")
    with section("reference", "greedy reference (and warm-up)") as tick:
        ref = sweeps.reference(target, tokenizer, everything, s.max_tokens, max_len, tick)
    if "limits" in s.sections:
        with section("limits", "limits (bandwidth, bytes per pass, verify pass per row count)") as tick:
            ctx = sum(len(p["ids"]) for p in everything) // len(everything) + s.max_tokens // 2
            tick(0, 3)
            bandwidth = controls.bandwidth()
            tick(1, 3)
            pass_bytes = controls.pass_bytes(target, ctx)
            tick(2, 3)
            out["limits"] = {
                "bandwidth": bandwidth,
                "pass_bytes": pass_bytes,
                "context": ctx,
                "verify_pass": controls.verify_pass_times(target, s.pass_rows, s.pass_context, 9),
            }
    if "null" in s.sections:
        with section("null", "null drafter against the minimal decode loop") as tick:
            first = [ps[0] for ps in prompts.values()]  # one prompt a workload: the loop is the same on any text
            out["null"] = controls.null_drafter(target, tokenizer, first, s.max_tokens, s.repeats, max_len, tick)
    if "draft_tokens" in s.sections:
        out["draft_tokens"] = {}
        for i, w in enumerate(s.workloads):
            # The oracle's ceiling depends on pass costs, not on text: measured on the first workload only.
            backends = s.backends + (("oracle",) if i == 0 else ())
            with section(
                "draft_tokens", f"draft tokens on {w}: off, {', '.join(backends)} at k = {s.draft_tokens}"
            ) as tick:
                out["draft_tokens"][w] = sweeps.draft_token_sweep(
                    target, tokenizer, prompts[w], ref, s.draft_tokens, backends, s.max_tokens, s.repeats, max_len, tick
                )
    if "lanes" in s.sections:
        w = s.workloads[0]
        with section("lanes", f"lanes {s.lanes} x row budgets {s.row_budgets} on {w} (ngram, k = {s.lane_k})") as tick:
            out["lanes"] = {
                "workload": w,
                **sweeps.lane_sweep(
                    target,
                    tokenizer,
                    prompts[w],
                    s.lanes,
                    s.row_budgets,
                    "ngram",
                    s.lane_k,
                    s.max_tokens,
                    s.repeats,
                    max_len,
                    tick,
                ),
            }
    if "defaults" in s.sections:
        mixed = [p for group in zip(*prompts.values()) for p in group]  # workloads interleaved across lanes
        shipped = tuple(b for b in s.backends if b != "oracle")
        with section("defaults", f"defaults, lanes {s.lanes}: off against {', '.join(shipped)} as shipped") as tick:
            out["defaults"] = {
                "workload": "+".join(s.workloads),
                **defaults.defaults_sweep(
                    target, tokenizer, mixed, s.lanes, shipped, s.max_tokens, s.repeats, max_len, tick
                ),
            }
    if buckets:
        out["lengths"] = {}
        for b, ps in buckets.items():
            with section(
                "lengths",
                f"lengths, bucket {b} ({', '.join(str(len(p['ids'])) for p in ps)} prompt "
                f"tokens): off, {', '.join(s.length_configs)} to {max(s.new_tokens)} new tokens",
            ) as tick:
                blen = max(len(p["ids"]) for p in ps) + max(s.new_tokens) + 16
                out["lengths"][b] = lengths.length_sweep(
                    target, tokenizer, ps, s.length_configs, s.new_tokens, s.repeats, blen, tick
                )
    if "peers" in s.sections:
        with section("peers", "peers: loading transformers and llama.cpp") as tick:
            skipped: dict[str, str] = {}
            notes: dict[str, str] = {}
            found = peers.load_peers(
                target.dtype, tuple(tokenizer.eos_token_ids), s.threads, max_len, skipped, notes, s.peers
            )
            engines = {
                "off": sweeps.make_engine(target, tokenizer, "none", spec="decode", max_len=max_len),
                "ngram": sweeps.make_engine(target, tokenizer, "ngram", k=s.lookup, max_len=max_len),
            }
            if s.peer_int8:
                target8, _ = load_model(None, s.dtype, quant="int8")
                engines["int8"] = sweeps.make_engine(target8, tokenizer, "none", spec="decode", max_len=max_len)
                engines["int8+ngram"] = sweeps.make_engine(target8, tokenizer, "ngram", k=s.lookup, max_len=max_len)
            out["peers"] = {"skipped": skipped, "notes": notes, "lookup": s.lookup}
        # code edits and prose: where prompt lookup has something to find, and does not; else the first workload
        for w in [w for w in ("code_edit", "prose") if w in s.workloads] or [s.workloads[0]]:
            with section("peers", f"peers on {w}: {', '.join(found) or 'none'}") as tick:
                out["peers"][w] = peers.peer_section(
                    engines, found, prompts[w], s.max_tokens, s.repeats, s.lookup, tick, s.peer_lookup
                )
        del found, engines
    if "exactness" in s.sections:
        with section("exactness", "float32 exactness") as tick:
            target32, _ = load_model(None, "float32")
            out["exactness"] = {
                "float32": controls.exactness_fp32(
                    target32, tokenizer, everything, s.backends + ("oracle",), 7, s.max_tokens, max_len, tick
                )
            }
    if "experts" in s.sections:
        with section("experts", "experts: an expert cache on the MoEfied default model, by fast-tier size") as tick:
            mixed = [p for group in zip(*prompts.values()) for p in group]  # workloads interleaved across lanes
            lanes = tuple(n for n in s.lanes if n <= 4) or (1,)
            out["experts"] = experts.experts_section(tokenizer, mixed, min(s.max_tokens, 20), lanes, tick, log)
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["seconds"] = time.perf_counter() - t_start
    return out
