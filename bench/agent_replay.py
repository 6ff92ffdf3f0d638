"""The agent replay: edit-and-rerun loops over one repository, drafters side by side in one run.

The repository is a few held-out files of the Python standard library (the drafter fitting's held-out rule,
bench/workloads.py). Each agent task edits one of them (several tasks share a file) over `--turns` turns: turn 1 asks
for an edit and appends a `read_file` tool result (the file's first lines); every later turn appends the result of
running Python's own compiler over the code of the agent's last answer (`compile`: "ok" or its real error message)
and the next lines of the file, and asks for the same edit there. The conversations are recorded once with
speculation off (the answers decide the compiler's output), then replayed turn by turn at each lane count (`--lanes`,
default 1 and 4; agents run `lanes` at a time): one fresh engine a backend (`--backends`, default none, ngram,
suffix, suffix+mtp; `NAME:OPTION=N,...` gives a backend options, e.g. `suffix:max_drafts=15`), every group of lanes
run on each engine in turn, the order reversed from one group to the next (and per repeat), so the backends share the
machine's load group by group; the pass-cost probe runs before any timing. Per configuration: tokens per round,
decode tokens per second (after the first token, per group), the share of rounds that draft, tokens per round per
turn, and each backend's speed over `none`'s and `ngram`'s (the ratio of the totals; the median and quartiles of the
per-group ratios). `--prose N` adds N held-out prose prompts (bench/prompts.jsonl), alternated the same way on
fresh engines, where the measured plan should keep drafting from costing. `--plot`: tokens per round by turn (SVG).
The `oracle` control drafts the recorded answers themselves (`oracle:max_drafts=15`: a drafter always right at
suffix's width), the ceiling any drafter can reach on this machine's passes; with it and ngram in the run, each
drafter's share of the oracle's gain over ngram is printed too: its speed against this machine's own ceiling.

    OMP_NUM_THREADS=1 python -m speclane.bench.agent_replay --agents 4 --turns 8 --max-tokens 64 \
        [--lanes 1 4] [--backends none ngram suffix suffix+mtp] [--prose 4] [--plot PATH.svg] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import traceback
import zlib
from pathlib import Path

import torch

from speclane.bench import workloads
from speclane.bench.agent_plot import report, svg_plot
from speclane.bench.backend_flags import backend_arg, backend_options
from speclane.kernels import cpu_build
from speclane.pipeline.framework.spec import load_spec, with_params
from speclane.pipeline.runtime import heap
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.contract.costs import RoundCosts
from speclane.stages.drafters import SPEC_BACKENDS
from speclane.stages.models.pass_cost import PROBE_ROWS, pass_costs

CHUNK = 24  # lines of a file a read_file result shows
SYSTEM = (
    "You are a coding agent working in a repository. Tools: read_file(path, lines) shows a file, run(cmd) runs a "
    "command. Answer each turn with the edited code in one ```python block."
)


def repository(files: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """(name, lines) of `files` held-out standard-library files of 200 to 2,000 lines with a def in them."""
    rng, out = random.Random(seed), []
    pool = workloads._stdlib_files()
    rng.shuffle(pool)
    for path in pool:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        if 200 <= len(lines) <= 2000 and workloads._defs("\n".join(lines[:CHUNK])):
            out.append((workloads._short(path), lines))
        if len(out) == files:
            break
    return out


def _code(answer: str) -> str:
    found = re.findall(r"```(?:python)?\n(.*?)(?:```|$)", answer, flags=re.S)
    return found[0] if found else answer


def run_result(answer: str, name: str) -> str:
    """What `run` says of the answer's code: Python's compiler's own verdict on it."""
    try:
        compile(_code(answer), name, "exec")
        return f"$ python -m py_compile {name}\n(no output: it compiles)"
    except (SyntaxError, ValueError) as exc:
        return f"$ python -m py_compile {name}\n" + "".join(traceback.format_exception_only(exc)).rstrip()


def first_turn(task: dict) -> str:
    name, lines = task["file"]
    body = "\n".join(lines[:CHUNK])
    return (
        f"Task: in `{name}`, {task['edit']}\n\nTool result (read_file {name}, lines 1-{CHUNK}):\n```python\n{body}\n```"
    )


def next_turn(task: dict, turn: int, answer: str) -> str:
    name, lines = task["file"]
    start = (turn * CHUNK) % max(CHUNK, len(lines) - CHUNK)
    body = "\n".join(lines[start : start + CHUNK])
    return (
        f"Tool result (run):\n{run_result(answer, name)}\n\nTool result (read_file {name}, lines {start + 1}-"
        f"{start + CHUNK}):\n```python\n{body}\n```\nApply the same edit to these lines."
    )


def tasks(n: int, files: int) -> list[dict]:
    repo = repository(files)
    out = []
    for a in range(n):
        file = repo[a % len(repo)]
        defs = workloads._defs("\n".join(file[1][:CHUNK]))
        edit = workloads.EDITS[a % len(workloads.EDITS)].format(name=defs[a % len(defs)][1])
        out.append({"file": file, "edit": edit[0].lower() + edit[1:]})
    return out


def request_id(conv: list[dict]) -> int:
    """A request's id: a checksum of its conversation, by which the oracle's table names its answer (`record`)."""
    return zlib.crc32(json.dumps(conv).encode())


def _generate(engine: Engine, convs: list[list[dict]], max_tokens: int):
    reqs = [parse_request({"id": request_id(c), "messages": c, "max_tokens": max_tokens}) for c in convs]
    done = engine.generate(reqs, chat=True)
    return done, list(engine.retired)[-len(reqs) :]


def record(engine: Engine, work: list[dict], turns: int, max_tokens: int, answers: dict | None = None):
    """Per agent its conversation: system, then user and assistant messages of every turn (speculation off).
    `answers` (where given) gets each answer's tokens by its request's id: the `oracle` backend's drafts."""
    convs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": first_turn(t)}] for t in work]
    for turn in range(turns):
        done, lanes = _generate(engine, convs, max_tokens)
        if answers is not None:
            answers.update((lane.rid, list(lane.out_ids)) for lane in lanes)
        for task, conv, ev in zip(work, convs, done):
            conv.append({"role": "assistant", "content": ev.text})
            if turn + 1 < turns:
                conv.append({"role": "user", "content": next_turn(task, turn + 1, ev.text)})
    return convs


def _measure(engine: Engine, convs: list[list[dict]], lanes: int, max_tokens: int) -> dict:
    """Run `convs` (each up to its last user message) `lanes` at a time: decoded tokens, rounds, drafting rounds,
    decode seconds (per group, first token to last)."""
    out = {"decoded": 0, "rounds": 0, "drafting": 0, "seconds": 0.0}
    for g in range(0, len(convs), lanes):
        _, run = _generate(engine, convs[g : g + lanes], max_tokens)
        out["decoded"] += sum(max(0, len(x.out_ids) - 1) for x in run)
        out["rounds"] += sum(x.rounds for x in run)
        out["drafting"] += sum(x.offered_at[0] if x.offered_at else 0 for x in run)
        out["seconds"] += max(x.t_done for x in run) - min(x.t_first for x in run)
    return out


def replay(engines: dict, convs: list[list[dict]], lanes: int, max_tokens: int, flip: bool = False) -> dict:
    """Every turn of every agent, turn by turn, each group of lanes on every engine (`engines`: backend -> engine)
    in an order reversed from one group to the next; per backend: per turn, per group, and in all."""
    turns = sum(1 for m in convs[0] if m["role"] == "user")
    upto = [[c[: 2 + 2 * turn] for c in convs] for turn in range(turns)]  # ending at each turn's user message
    return _alternate(
        engines, [[turn[g : g + lanes] for g in range(0, len(turn), lanes)] for turn in upto], flip, max_tokens
    )


def _alternate(engines: dict, parts: list[list], flip: bool, max_tokens: int) -> dict:
    """`parts`: lists of groups of conversations; each group runs on every engine, alternating the order."""
    out = {b: {"per_turn": [], "groups": []} for b in engines}
    order = list(engines)
    for groups in parts:
        done = {b: [] for b in engines}
        for group in groups:
            for b in order[::-1] if flip else order:
                done[b].append(_measure(engines[b], group, len(group), max_tokens))
            flip = not flip
        for b in engines:
            out[b]["per_turn"].append(_total(done[b]))
            out[b]["groups"] += [{k: g[k] for k in ("decoded", "seconds")} for g in done[b]]
    return {b: {**o, **_total(o["per_turn"])} for b, o in out.items()}


def _total(parts: list[dict]) -> dict:
    s = {k: sum(p[k] for p in parts) for k in ("decoded", "rounds", "drafting", "seconds")}
    return {
        **s,
        "tokens_per_round": s["decoded"] / s["rounds"] if s["rounds"] else 0.0,
        "tokens_per_s": s["decoded"] / s["seconds"] if s["seconds"] else 0.0,
        "drafting_share": s["drafting"] / s["rounds"] if s["rounds"] else 0.0,
    }


def prose(engines: dict, n: int, lanes: int, max_tokens: int, flip: bool = False) -> dict:
    """N held-out prose prompts, `lanes` at a time, alternated over `engines` as `replay` does."""
    asks = [[{"role": "user", "content": p["user"]}] for p in workloads.load() if p["workload"] == "prose"][:n]
    return _alternate(engines, [[asks[g : g + lanes] for g in range(0, len(asks), lanes)]], flip, max_tokens)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=4, help="agent tasks (they share the repository's files)")
    p.add_argument("--files", type=int, default=2, help="files in the repository")
    p.add_argument("--turns", type=int, default=8, help="turns a task, 8 to 20")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--lanes", type=int, nargs="+", default=[1, 4])
    p.add_argument(
        "--backends",
        nargs="+",
        default=["none", "ngram", "suffix", "suffix+mtp"],
        type=backend_arg,
        help=f"of {', '.join(SPEC_BACKENDS)}; NAME:OPTION=N,... runs it with those options (suffix:max_drafts=15); "
        "oracle drafts the recorded answers (oracle:max_drafts=15: a drafter always right, at that width)",
    )
    p.add_argument("--repeats", type=int, default=1, help="repeats, the configurations' order reversed each time")
    p.add_argument("--prose", type=int, default=4, metavar="N", help="held-out prose prompts a configuration (0: none)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--plot", default=None, metavar="SVG", help="tokens per round against turn, an SVG file")
    args = p.parse_args(argv)
    if not 8 <= args.turns <= 20:
        p.error(f"--turns must be from 8 to 20 (an agent task's edit-and-rerun loop), got {args.turns}")
    if args.agents < 1 or args.files < 1 or min(args.lanes) < 1:
        p.error("--agents, --files and --lanes must be >= 1")
    with heap.scope():
        return _run(args)


def _run(args) -> int:
    from speclane.stages.models.loading import load_model

    torch.set_num_threads(1)
    target, tokenizer = load_model(None, args.dtype)
    print(f"machine: {cpu_build.cpu_name()}; {cpu_build.describe()}; {args.dtype}; one thread", flush=True)
    pass_costs(target, RoundCosts(), PROBE_ROWS[-1])
    heap.freeze()  # start-up's objects out of the collector's scans: no full-heap pause inside a timed turn

    answers = {}  # request id -> its recorded answer's tokens, what `oracle` drafts from

    def fresh(backend, lanes):
        name, options = backend_options(backend)
        spec = with_params(load_spec("verify"), {"draft": {"backend": name, "options": {name: options}}})
        engine = Engine(target, tokenizer, spec=spec, knobs=SpecKnobs(), max_lanes=lanes, max_len=8192)
        if name == "oracle":
            engine.drafter.replay(answers)
        return engine

    work = tasks(args.agents, args.files)
    convs = record(fresh("none", max(args.lanes)), work, args.turns, args.max_tokens, answers)
    print(f"recorded {args.agents} agent task(s) x {args.turns} turns over {[t['file'][0] for t in work]}", flush=True)
    rows = []
    for r in range(args.repeats):
        for lanes in args.lanes:
            engines = {b: fresh(b, lanes) for b in args.backends}
            heap.freeze()  # and the recording's, and the engines'
            agents = replay(engines, convs, lanes, args.max_tokens, bool(r % 2))
            asks = args.prose and prose({b: fresh(b, lanes) for b in args.backends}, args.prose, lanes, args.max_tokens)
            for b in args.backends:
                row = {"backend": b, "lanes": lanes, "repeat": r, "agents": agents[b]}
                row.update({"prose": asks[b]} if args.prose else {})
                rows.append(row)
                a, q = row["agents"], row.get("prose")
                more = f"; prose {q['tokens_per_s']:.2f} tok/s, {q['drafting_share']:.0%} drafting" if q else ""
                print(
                    f"{b:>14} {lanes} lane(s): agents {a['tokens_per_round']:.2f} tok/round, "
                    f"{a['tokens_per_s']:.2f} tok/s, {a['drafting_share']:.0%} of rounds drafting{more}",
                    flush=True,
                )
    report(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "conversations": convs, "rows": rows}, indent=1))
    if args.plot:
        svg_plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
