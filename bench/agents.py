"""A multi-turn agent replay: prompt checkpoints on against off, in one run.

Each agent is a code-editing session built from the held-out prompts of bench/prompts.jsonl (text nobody here
wrote): turn 1 is a code-edit request; every later turn appends the answer, then a "tool result" (another held-out
file's code, as an agent's file read would return it) and asks for the next edit. Between turns an agent waits
`--tool-wait` seconds, as agents wait on tools. With `--system-chars N` every agent's conversation begins with the
same system message, N characters of CPython's own documentation (`pydoc_data.topics`) standing in for an agent's
instructions and tool descriptions, which every agent shares and each first turn can take from a checkpoint. All
agents run in one engine (one lane each), with checkpoints on
(the engine's default budget) and off, alternating which goes first per repeat. Reported per configuration: time
to first token per turn (submit to first token, tokenizing included), total time, decode tokens per second, and
the prompt tokens restored instead of prefilled.

    OMP_NUM_THREADS=1 python -m speclane.bench.agents --agents 1 4 8 --turns 8 --max-tokens 24 --tool-wait 0.5 \
        [--system-chars 2000] [--model DIR] [--device cuda] [--plot ttft.png] [--json PATH]

`--plot` draws time to first token against turn number, on and off, one line each per agent count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from speclane.bench import workloads
from speclane.kernels import cpu_build
from speclane.pipeline.runtime import heap
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SPEC_BACKENDS, SpecKnobs, parse_request
from speclane.stages.contract.events import DoneEvent

TOOL_CHARS = 500  # a tool result: about 150 tokens of held-out code


def sessions(n: int, turns: int) -> list[list[str]]:
    """Per agent, the user message of each turn (the first a code-edit request, then tool results and asks)."""
    edits = [p for p in workloads.load() if p["workload"] == "code_edit"]
    out = []
    for a in range(n):
        msgs = [edits[a % len(edits)]["user"]]
        for t in range(1, turns):
            tool = edits[(a * turns + t + n) % len(edits)]["user"].split("```")[1][:TOOL_CHARS]
            msgs.append(f"Tool result (read_file):\n```{tool}```\nApply the same kind of edit to this file too.")
        out.append(msgs)
    return out


def system_prompt(chars: int) -> list[dict[str, str]]:
    """The shared system message of `--system-chars` (none at 0): the start of CPython's documentation topics."""
    if chars <= 0:
        return []
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return [{"role": "system", "content": "You edit code with the tools below.\n" + text[:chars]}]


def replay(
    engine: Engine,
    users: list[list[str]],
    max_tokens: int,
    tool_wait: float,
    system: list[dict[str, str]] | None = None,
) -> dict:
    agents = [{"messages": list(system or []), "turn": 0, "ready": 0.0, "lane": None, "ttft": []} for _ in users]
    decoded, t0 = 0, time.perf_counter()
    while any(a["turn"] < len(u) for a, u in zip(agents, users)):
        now = time.perf_counter() - t0
        for i, (a, u) in enumerate(zip(agents, users)):
            if a["lane"] is None and a["turn"] < len(u) and now >= a["ready"]:
                a["messages"].append({"role": "user", "content": u[a["turn"]]})
                req = parse_request({"id": f"{i}-{a['turn']}", "messages": a["messages"], "max_tokens": max_tokens})
                a["lane"] = engine.submit(req)
        if not engine.busy():
            waits = [a["ready"] - now for a, u in zip(agents, users) if a["turn"] < len(u) and a["lane"] is None]
            time.sleep(max(0.0, min(waits, default=0.0)))
            continue
        for ev in engine.step():
            if isinstance(ev, DoneEvent):
                a = agents[int(str(ev.rid).split("-")[0])]
                lane = a["lane"]
                a["ttft"].append(lane.t_first - lane.t_submit)
                decoded += max(0, len(ev.tokens) - 1)
                a["messages"].append({"role": "assistant", "content": ev.text})
                a["turn"] += 1
                a["lane"] = None
                a["ready"] = time.perf_counter() - t0 + tool_wait
    total = time.perf_counter() - t0
    per_turn = [statistics.median(a["ttft"][t] for a in agents) for t in range(len(users[0]))]
    return {
        "seconds": total,
        "ttft_per_turn": per_turn,
        "decode_tokens": decoded,
        "checkpoints": engine.checkpoints.stats() if engine.checkpoints is not None else None,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, nargs="+", default=[1, 4])
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--tool-wait", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--system-chars",
        type=int,
        default=0,
        metavar="N",
        help="a system message of N characters every agent's conversation begins with (0: none)",
    )
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--model", default=None, help="target artifact (default: the embedded default model)")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda or cuda:N (checkpoints past the device's share go to pinned host memory)",
    )
    p.add_argument(
        "--backend",
        default=None,
        choices=SPEC_BACKENDS,
        help="the drafter (default: the verify spec's, ngram); a model drafter's window is checkpointed too",
    )
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--plot", default=None, metavar="PNG", help="TTFT against turn number, on and off")
    args = p.parse_args(argv)
    with heap.scope():
        return _run(args)


def _run(args) -> int:
    from speclane.stages.models.loading import load_model

    torch.set_num_threads(1)
    target, tokenizer = load_model(args.model, args.dtype, device=args.device)
    heap.freeze()  # start-up's objects out of the collector's scans: no full-heap pause inside a timed turn
    where = torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else cpu_build.describe()
    print(f"machine: {cpu_build.cpu_name()}; {where}; {args.dtype}; drafter {args.backend or 'the spec default'}")
    # one short conversation first, measured by nobody: the first pass of each shape pays for kernel builds and
    # (on a GPU) the libraries' own set-up, which would otherwise land on whichever mode happens to run first
    warm = Engine(
        target, tokenizer, knobs=SpecKnobs(backend=args.backend), max_lanes=1, max_len=8192, checkpoint_bytes=0
    )
    replay(warm, sessions(1, 2), min(args.max_tokens, 8), 0.0)
    del warm
    rows = []
    for n in args.agents:
        users = sessions(n, args.turns)
        for r in range(args.repeats):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                eng = Engine(
                    target,
                    tokenizer,
                    knobs=SpecKnobs(backend=args.backend),
                    max_lanes=n,
                    max_len=8192,
                    checkpoint_bytes=(1 << 30) if mode == "on" else 0,
                )
                res = replay(eng, users, args.max_tokens, args.tool_wait, system_prompt(args.system_chars))
                rows.append({"agents": n, "mode": mode, "repeat": r, **res})
                ttft = " ".join(f"{x:.2f}" for x in res["ttft_per_turn"])
                ck = res["checkpoints"] or {}
                print(
                    f"{n} agent(s), checkpoints {mode:<3}: {res['seconds']:.1f} s, "
                    f"{res['decode_tokens'] / res['seconds']:.1f} decode tok/s over the run; TTFT per turn {ttft} s; "
                    f"reused {ck.get('tokens_reused', 0)} prompt tokens, {ck.get('bytes_held', 0) / 1e6:.0f} MB "
                    f"held",
                    flush=True,
                )
        on = [x for x in rows if x["agents"] == n and x["mode"] == "on"]
        off = [x for x in rows if x["agents"] == n and x["mode"] == "off"]
        late = lambda xs: statistics.median([t for x in xs for t in x["ttft_per_turn"][2:]])  # noqa: E731
        total = statistics.median(x["seconds"] for x in off) / statistics.median(x["seconds"] for x in on)
        first = lambda xs: statistics.median(x["ttft_per_turn"][0] for x in xs)  # noqa: E731
        third = f"TTFT from turn 3 off/on {late(off) / late(on):.2f}x; " if args.turns >= 3 else ""
        print(
            f"{n} agent(s): TTFT of turn 1 off/on {first(off) / first(on):.2f}x; {third}total time off/on {total:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0


def plot(rows: list[dict], path: str) -> None:
    """TTFT per turn (median over agents, then over repeats), log scale, on solid and off dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for color, n in enumerate(sorted({x["agents"] for x in rows})):
        for mode, style in (("on", "-"), ("off", "--")):
            runs = [x["ttft_per_turn"] for x in rows if x["agents"] == n and x["mode"] == mode]
            if runs:
                per = [statistics.median(r[t] for r in runs) for t in range(len(runs[0]))]
                ax.plot(
                    range(1, len(per) + 1),
                    per,
                    style,
                    color=f"C{color}",
                    marker="o",
                    label=f"{n} agent(s), checkpoints {mode}",
                )
    ax.set_xlabel("turn")
    ax.set_ylabel("time to first token, s (median over agents)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
