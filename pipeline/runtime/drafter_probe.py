"""The drafter probe: what a model drafter's proposal costs on this machine, measured once and cached, for the round
model of a profile whose figures are measured (a CPU's).

A drafter's proposal is not a target pass: its layers are few and small, so per-call overheads weigh more than its
bytes, and an estimate from bytes and bandwidth alone understates it. So, as the pass-cost probe does for the
target, the engine itself runs a few rounds: for each lane count asked and 1 and `WIDEST` draft tokens, short
greedy runs with the fixed plan (every lane drafts that many) on `PROMPTS`, and the draft stage's own record of its
proposals (`RoundCosts.draft_s`, the median of its last samples, the first proposal left out) is read back: the
fastest of `REPEATS` runs, every setting's first run before any second one, so a burst of load from elsewhere
spoils one sample of several settings rather than every sample of one. The table
(lanes, draft tokens) -> seconds is cached under `$SPECLANE_CACHE/drafter_cost/`, keyed by what the pass-cost probe's
table is keyed by and the backend. Delete the file to measure again. Not here: using the table (round_model.py).
"""

from __future__ import annotations

import json
import logging
import os

from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.artifact import cache_root
from speclane.stages.models.pass_cost import cache_key

log = logging.getLogger("speclane.profile")

WIDEST = 7
TOKENS = 32  # decoded tokens a lane in each probe run
REPEATS = 2
PROMPTS = (
    'def parse_args(argv):\n    """Parse the command line."""\n',
    "The river rose through the night, and by morning",
    "class Stack:\n    def __init__(self):\n",
    "Summarize the rules of chess in a few sentences.",
)
VERSION = 1
SOURCE = (
    "the drafter probe (pipeline/runtime/drafter_probe.py): the draft stage's proposals timed on this machine, cached"
)


def probe(target, tokenizer, backend: str, lanes: tuple[int, ...]) -> tuple[tuple[int, int, float], ...]:
    """(lanes, draft tokens, seconds) of `backend`'s proposals at each lane count of `lanes` and 1 and `WIDEST`
    draft tokens: cached, else measured now (then cached; an unwritable cache is not an error)."""
    path = cache_root() / "drafter_cost" / f"{cache_key(target)}-{backend}-{VERSION}.json"
    try:
        data = json.loads(path.read_text())
        table = {(n, w): s for n, w, s in data["table"]}
        if all((n, w) in table for n in lanes for w in (1, WIDEST)):
            return tuple((n, w, s) for (n, w), s in sorted(table.items()))
    except (OSError, ValueError, KeyError, TypeError):
        table = {}
    log.warning(
        "measuring %s's proposals at %s lane(s) (once per machine and model; cached in %s)", backend, lanes, path
    )
    todo = [(n, w) for n in lanes for w in (1, WIDEST) if (n, w) not in table]
    for _ in range(REPEATS):
        for n, w in todo:
            table[(n, w)] = min(table.get((n, w), float("inf")), _measure(target, tokenizer, backend, n, w))
    out = tuple((n, w, s) for (n, w), s in sorted(table.items()))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"table": out}))
        tmp.replace(path)
    except OSError as exc:
        log.warning("drafter probe not cached (%s): it runs again next time", exc)
    return out


def _measure(target, tokenizer, backend: str, lanes: int, width: int) -> float:
    from speclane.pipeline.runtime.engine import Engine

    knobs = SpecKnobs(backend=backend, draft_tokens=width, draft_rows=lanes * (width + 1), draft_plan="fixed")
    engine = Engine(target, tokenizer, knobs=knobs, max_lanes=lanes, max_len=256)
    for i in range(lanes):
        text = PROMPTS[i % len(PROMPTS)]
        engine.submit(parse_request({"id": i, "prompt": text, "max_tokens": TOKENS, "ignore_eos": True}))
    while engine.busy():
        engine.step()
    return engine.round_costs.draft_s(width, lanes)
