"""The round probe: what a speculation setting's verify round costs on this machine, and what its drafts accept on
the text the plan is asked about, measured once by running the engine itself and cached, for the round model of a
profile whose figures are measured (a CPU's).

A round is not just a target pass: each lane's attention over its own context, the stages' bookkeeping and a model
drafter's proposal (few small layers, where per-call overheads weigh more than bytes) all add time the pass-cost
probe's one-lane table does not hold, and they grow with the lanes. Nor is acceptance a property of the drafter
alone: it depends on the text and on the target as it is (a drafter fitted to another target accepts less). So the
probe runs short greedy decodes with the fixed plan (every lane drafts the width asked, within the row budget
lanes x (width + 1)): for a backend, at each lane count asked and widths 1 and `WIDEST` (speculation off: width 0,
the decode spec), and reads back
- `rounds`: (lanes, width, seconds) of a round, the decode time over the rounds in which every lane decodes
  divided by their count (the mean, so a lane's one-off costs inside a request, a model drafter's catch-up of its
  prompt, are counted as a request of that length meets them), the fastest of `REPEATS` runs after an untimed
  warm-up run, every setting's first run before any second one, so a burst of load from elsewhere spoils one
  sample of several settings;
- `proposals`: (lanes, width, seconds) of the drafter's proposals as the draft stage records them
  (`RoundCosts.draft_s`), the same fastest run's;
- `accept`: P(drafts 1..j accepted), j = 1..`WIDEST`: the rounds that accepted draft j over all rounds (a round
  that drafted fewer, an n-gram lookup that found no match, counts as not accepting it), over every prompt decoded
  at width `WIDEST` (all the prompts, in batches of the most lanes asked);
- `offered`: P(a round drafts j drafts or more), j = 1..`WIDEST`, over the same rounds: a drafter that does not always
  draft (an n-gram lookup finds no match) verifies fewer rows than its width, which the round model prices.
The prompts are the caller's (chat token ids of the workload the plan is for) or `PROMPTS`; each lane decodes
`tokens`. The result is cached under `$SPECLANE_CACHE/drafter_cost/`, keyed by what the pass-cost probe's table is
keyed by, the backend, the prompts and the tokens. Delete the file to measure again. Not here: using the tables
(round_model.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import attrs

from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.artifact import cache_root
from speclane.stages.models.pass_cost import cache_key

log = logging.getLogger("speclane.profile")

WIDEST = 7
TOKENS = 32  # decoded tokens a lane in each probe run, by default
REPEATS = 3
PROMPTS = (
    'def parse_args(argv):\n    """Parse the command line."""\n',
    "The river rose through the night, and by morning",
    "class Stack:\n    def __init__(self):\n",
    "Summarize the rules of chess in a few sentences.",
)
VERSION = 4  # 4: `offered`
SOURCE = "the round probe (pipeline/runtime/drafter_probe.py): the engine's rounds timed on this machine, cached"


@attrs.frozen
class Probed:
    """A backend's measured rounds and proposals as (lanes, width, seconds), its acceptance P(drafts 1..j accepted)
    and how often it drafts, P(a round drafts j drafts or more) (both () for speculation off), and `where`:
    the prompts and tokens measured on, in words."""

    rounds: tuple[tuple[int, int, float], ...]
    proposals: tuple[tuple[int, int, float], ...] = ()
    accept: tuple[float, ...] = ()
    where: str = ""
    offered: tuple[float, ...] = ()


def widths(backend: str) -> tuple[int, ...]:
    return (0,) if backend == "none" else (1, WIDEST)


def probe(
    target, tokenizer, backend: str, lanes: tuple[int, ...], prompts: list[list[int]] | None = None, tokens: int = 0
) -> Probed:
    """`backend`'s rounds at each lane count of `lanes` (see the module docstring), on `prompts` (token ids; None:
    `PROMPTS`), `tokens` decoded a lane (0: `TOKENS`): cached, else measured now (then cached; an unwritable cache
    is not an error)."""
    if not lanes or min(lanes) < 1:
        raise ValueError(f"round probe: lanes must be lane counts of at least 1 (got {lanes})")
    ids = [list(p) for p in prompts] if prompts else [tokenizer.encode(p) for p in PROMPTS]
    tokens = tokens or TOKENS
    tag = hashlib.sha256(json.dumps([ids, tokens]).encode()).hexdigest()[:12]
    path = cache_root() / "drafter_cost" / f"{cache_key(target)}-{backend}-{tag}-{VERSION}.json"
    want = [(n, w) for n in sorted(set(lanes)) for w in widths(backend)]
    try:
        data = json.loads(path.read_text())
        got = Probed(*(tuple(map(tuple, data[k])) for k in ("rounds", "proposals")), tuple(data["accept"]))
        if all((n, w) in {(a, b) for a, b, _ in got.rounds} for n, w in want):
            return attrs.evolve(got, where=data["where"], offered=tuple(data["offered"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    log.warning(
        "measuring %s's rounds at %s lane(s) (once per machine, model and text; cached in %s)", backend, lanes, path
    )
    _run(target, tokenizer, backend, 1, widths(backend)[-1], ids[:1], tokens)  # warm-up: first calls, page-ins
    best: dict[tuple[int, int], tuple[float, float]] = {}
    for _ in range(REPEATS):
        for n, w in want:
            batch = [ids[i % len(ids)] for i in range(n)]
            round_s, draft_s, _ = _run(target, tokenizer, backend, n, w, batch, tokens)
            if round_s < best.get((n, w), (float("inf"), 0.0))[0]:
                best[(n, w)] = (round_s, draft_s)
    accept: tuple[float, ...] = ()
    offered: tuple[float, ...] = ()
    if backend != "none":
        most, runs = max(lanes), []
        for i in range(0, len(ids), most):
            runs += _run(target, tokenizer, backend, most, WIDEST, ids[i : i + most], tokens)[2]
        rounds = sum(x.rounds for x in runs)
        accept = tuple(sum(x.accepted_at[j] for x in runs if j < len(x.accepted_at)) / rounds for j in range(WIDEST))
        offered = tuple(sum(x.drafted_at[j] for x in runs if j < len(x.drafted_at)) / rounds for j in range(WIDEST))
    where = f"{len(ids)} prompt(s), {tokens} tokens a lane"
    out = Probed(
        tuple((n, w, s) for (n, w), (s, _) in sorted(best.items())),
        tuple((n, w, d) for (n, w), (_, d) in sorted(best.items()) if w > 0),
        accept,
        where,
        offered,
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**attrs.asdict(out)}))
        tmp.replace(path)
    except OSError as exc:
        log.warning("round probe not cached (%s): it runs again next time", exc)
    return out


def _run(target, tokenizer, backend: str, lanes: int, width: int, batch: list[list[int]], tokens: int) -> tuple:
    """(seconds a round with every lane decoding, the drafter's proposal seconds, the lanes) of one decode."""
    from speclane.pipeline.runtime.engine import Engine

    room = max(map(len, batch)) + tokens + WIDEST + 16
    if backend == "none":
        knobs, spec = SpecKnobs(backend="none"), "decode"
    else:
        knobs = SpecKnobs(backend=backend, draft_tokens=width, draft_rows=lanes * (width + 1), draft_plan="fixed")
        spec = "verify"
    engine = Engine(target, tokenizer, spec=spec, knobs=knobs, max_lanes=lanes, max_len=room)
    reqs = [{"id": i, "prompt_ids": ids, "max_tokens": tokens, "ignore_eos": True} for i, ids in enumerate(batch)]
    runs = [engine.submit(parse_request(r)) for r in reqs]
    seconds, rounds = 0.0, 0
    while engine.busy():
        every = all(x.out_ids and x.finish_reason is None for x in runs)
        t = time.perf_counter()
        engine.step()
        if every:
            seconds, rounds = seconds + time.perf_counter() - t, rounds + 1
    draft = engine.round_costs.draft_s(width, lanes) if width else 0.0
    return (seconds / rounds if rounds else float("inf")), draft, runs
