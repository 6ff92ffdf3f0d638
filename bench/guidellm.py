"""GuideLLM, the serving benchmark the vLLM project recommends, against a real `speclane serve --http`.

Writes a Hugging Face tokenizer directory for the embedded default model (transformers reads the GGUF's tokenizer),
starts its own server on loopback (one torch thread, a lane a stream), sends one warm-up request, runs
`guidellm run` at its defaults (the `openai_http` backend: streamed `/v1/chat/completions`, the `/health` check
before the run, the model name read from `/v1/models`; `json` and `csv` outputs) with a concurrent profile, synthetic
prompts and a time bound, stops the server, prints GuideLLM's tables and checks its `benchmarks.json`: every
benchmark completed requests, none errored, and the tables are not zero-filled. Exit status 1 otherwise.

GuideLLM is not a dependency of speclane: its dependencies pull their own torch, so install it into a virtual
environment of its own (torch pinned to a CPU build there) and name its executable with --guidellm or $GUIDELLM.

    OMP_NUM_THREADS=1 python -m speclane.bench.guidellm                          # guidellm on PATH; 4 streams, 60 s
    OMP_NUM_THREADS=1 python -m speclane.bench.guidellm --guidellm /path/to/venv/bin/guidellm --streams 1 4

Owns the command line, the tokenizer directory, the server's start and stop and the checks. Not here: the server
(pipeline/cli/serve.py), the HTTP door (pipeline/net/http.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from speclane.bench import installed_kernels_first
from speclane.pipeline.cli.serve import HTTP_READY, spawn, stop

SUMMARY_START = "Run Summary Info"  # GuideLLM's first results table; what comes before it is its set-up log
# Past the benchmarks' own bound: GuideLLM's start (worker processes, tokenizer, synthetic data) and its report.
SLACK_S = 600


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m speclane.bench.guidellm", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--guidellm",
        default=os.environ.get("GUIDELLM") or shutil.which("guidellm"),
        metavar="PATH",
        help="the guidellm executable (default: $GUIDELLM, else the one on PATH)",
    )
    p.add_argument("--seconds", type=float, default=60.0, help="each benchmark's time bound (default 60)")
    p.add_argument(
        "--requests", type=int, default=None, help="also end each benchmark after this many requests (default: none)"
    )
    p.add_argument(
        "--streams", type=int, nargs="+", default=[4], help="concurrent streams, a benchmark each (default 4)"
    )
    p.add_argument("--prompt-tokens", type=int, default=128, help="synthetic prompt length in tokens (default 128)")
    p.add_argument("--output-tokens", type=int, default=64, help="answer length in tokens (default 64)")
    p.add_argument("--dtype", default=None, help="the server's --dtype (default: the server's own)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the tokenizer directory, the server's log and GuideLLM's log, benchmarks.json and benchmarks.csv "
        "go (default: a new temporary folder)",
    )
    args = p.parse_args(argv)
    if args.guidellm is None:
        p.error(
            "no guidellm executable: pass --guidellm PATH or set $GUIDELLM (`pip install guidellm` in its own venv)"
        )
    if args.seconds <= 0 or min(args.streams) < 1 or args.prompt_tokens < 1 or args.output_tokens < 1:
        p.error("--seconds, --streams, --prompt-tokens and --output-tokens must be positive")
    if args.requests is not None and args.requests < 1:
        p.error("--requests must be >= 1")
    return args


def write_tokenizer(folder: Path) -> Path:
    """`folder` as a Hugging Face tokenizer directory for the embedded default model (kept if already there)."""
    if (folder / "tokenizer.json").is_file():
        return folder
    installed_kernels_first()
    try:
        from transformers import AutoTokenizer
    except ModuleNotFoundError as exc:
        raise SystemExit(f"writing the tokenizer directory needs transformers ({exc.name} is missing)") from exc
    from speclane.stages.models.artifact import default_gguf

    gguf = default_gguf()
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(folder))
    return folder


def guidellm_command(args: argparse.Namespace, target: str, tokenizer: Path) -> list[str]:
    """`guidellm run` with its defaults but for what it requires (target, data, profile) and the bounds."""
    streams = ",".join(f"streams[{i}]={s}" for i, s in enumerate(args.streams))  # GuideLLM's list syntax
    bounds = [f"kind=max_duration,seconds={args.seconds:g}"]
    if args.requests is not None:
        bounds.append(f"kind=max_requests,count={args.requests}")
    return [
        args.guidellm,
        "run",
        "--backend",
        f"kind=openai_http,target={target}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
        "--profile",
        f"kind=concurrent,{streams}",
        *[x for bound in bounds for x in ("--constraint", bound)],
        "--disable-progress",
    ]


def _total(metric: dict, status: str = "successful") -> float:
    return float((metric or {}).get(status, {}).get("total_sum") or 0.0)


def _median(metric: dict, status: str = "successful") -> float:
    return float((metric or {}).get(status, {}).get("median") or 0.0)


def _mean(metric: dict, status: str = "successful") -> float:
    return float((metric or {}).get(status, {}).get("mean") or 0.0)


def check(report: dict) -> list[str]:
    """What is wrong with GuideLLM's `benchmarks.json`, one line a problem; [] when every benchmark completed
    requests, none errored, and its token counts, time to first token and throughput are above zero."""
    benchmarks = report.get("benchmarks") or []
    if not benchmarks:
        return ["no benchmark in the report"]
    problems = []
    for b in benchmarks:
        strategy = b.get("config", {}).get("strategy", {})
        name = f"{strategy.get('type_', '?')}@{strategy.get('streams', '?')}"
        m = b.get("metrics", {})
        totals = m.get("request_totals", {})
        if totals.get("errored", 0):
            problems.append(f"{name}: {totals['errored']} request(s) errored")
        if not totals.get("successful", 0):
            problems.append(f"{name}: no request completed")
        zero = [
            label
            for label, value in (
                ("output tokens", _total(m.get("output_token_count"))),
                ("prompt tokens", _total(m.get("prompt_token_count"))),
                ("time to first token", _median(m.get("time_to_first_token_ms"))),
                ("output tokens per second", _mean(m.get("output_tokens_per_second"))),
            )
            if value <= 0
        ]
        if zero:
            problems.append(f"{name}: zero {', '.join(zero)}")
    return problems


def summary(text: str) -> str:
    """GuideLLM's results tables (its output from the first one on), or its last lines if it printed none."""
    at = text.find(SUMMARY_START)
    return text[at:].rstrip() if at >= 0 else "\n".join(text.rstrip().splitlines()[-40:])


def warm_up(url: str, model: str) -> None:
    """One short chat completion: the server's first-pass costs are not GuideLLM's first request's."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    req = urllib.request.Request(
        f"{url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        resp.read()


def run(args: argparse.Namespace) -> int:
    from speclane.bench.soak import machine_line

    out = args.out or Path(tempfile.mkdtemp(prefix="guidellm_"))
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(out / "tokenizer")
    print(machine_line(), flush=True)
    flags = [
        "--http",
        "127.0.0.1:0",
        "--max-lanes",
        str(max(args.streams)),
        *(["--dtype", args.dtype] if args.dtype else []),
    ]
    lines: list[str] = []
    proc, _ = spawn(out / "serve.log", *flags, lines=lines, timeout=600)
    try:
        ready = next(line[len(HTTP_READY) :] for line in lines if line.startswith(HTTP_READY))
        url, _, rest = ready.strip().partition(" ")
        warm_up(url, rest.removeprefix("(model ").removesuffix(")"))
        cmd = guidellm_command(args, url.removesuffix("/v1"), tokenizer)
        print("guidellm:", " ".join(cmd[1:]), flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        report = out / "benchmarks.json"
        report.unlink(missing_ok=True)  # an earlier run's report must not pass for this one's
        bound = len(args.streams) * args.seconds + SLACK_S
        with (out / "guidellm.log").open("w") as log:
            try:
                code = subprocess.run(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=bound)
                problems = [] if code.returncode == 0 else [f"guidellm exited with {code.returncode}"]
            except subprocess.TimeoutExpired:
                problems = [f"guidellm still ran after {bound:g} s and was killed"]
    finally:
        stop(proc)
    print(summary((out / "guidellm.log").read_text(errors="replace")))
    problems += check(json.loads(report.read_text())) if report.is_file() else ["guidellm wrote no benchmarks.json"]
    tracebacks = (out / "serve.log").read_text(errors="replace").count("Traceback")
    if tracebacks:
        problems.append(f"{tracebacks} traceback(s) in the server's log")
    print(f"outputs: {out} (benchmarks.json, benchmarks.csv, guidellm.log, serve.log)")
    print("checks: " + ("ok" if not problems else "FAILED: " + "; ".join(problems)))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
