"""Measuring one configuration on one prompt, and alternating configurations so they share the machine's noise.

Owns: building an engine for a benchmark configuration (backend, draft tokens, row budget, lanes; the `oracle`
control through the spec, as tests do), running a batch of prompts through it and reading each lane's times
(`Lane.t_submit`, `t_first`, `t_done`: time to first token apart from decode tokens per second, so prefill does not
dilute the ratios), the A B A B alternation, and the summaries (median, min, max; paired ratios). What is run in
which section lives in bench/sweeps.py and bench/controls.py; peers in bench/peers.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from speclane.pipeline.framework.spec import load_spec, with_params
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.contract.lanes import spec_stats


@attrs.define
class Run:
    """One request's result: its tokens and timings, and its lane (for speculation counters)."""

    tokens: list[int]
    ttft: float  # submit -> first token (prefill)
    decode_s: float  # first token -> last token
    lane: Any = None
    stage_s: dict[str, float] = attrs.field(factory=dict)  # per-stage seconds of the timed rounds
    timed_rounds: int = 0  # rounds after the first step (the first one carries prefill)
    first_tokens: int = 1  # tokens already out when the first token was stamped
    stamps: list[tuple[float, int]] = attrs.field(factory=list)  # (clock, tokens out) after each step from the first

    def decode_tps_at(self, n: int) -> float:
        """Decode tokens per second over the first `n` tokens: what a run with max_tokens = n measures (greedy
        decoding makes its tokens the prefix of a longer run's), read from the step stamps of this longer run."""
        if not self.stamps or len(self.tokens) < n:
            return float("nan")
        t0, c0 = self.stamps[0]
        t, c = next((t, c) for t, c in self.stamps if c >= n)
        return (c - c0) / (t - t0) if c > c0 and t > t0 else float("nan")

    @property
    def decode_tps(self) -> float:
        """Tokens after the first stamp over the time after it. The engine stamps the first token at the end of
        the step that prefilled, and that step also ran a verify round: its tokens are not counted, or a
        round yielding tau tokens would be counted without its time (a bias of about 1/rounds, larger with
        speculation than without)."""
        n = len(self.tokens) - self.first_tokens
        return n / self.decode_s if n > 0 and self.decode_s > 0 else float("nan")


def make_engine(
    target,
    tokenizer,
    backend: str,
    k: int = 7,
    rows: int = 0,
    lanes: int = 1,
    max_len: int = 2048,
    spec: str = "verify",
    weights: str | None = None,
    plan: str = "fixed",
) -> Engine:
    """An engine for one configuration. `backend="oracle"` replays what the caller hands `engine.drafter.replay`;
    `dflash2:shortlist` is dflash2 drafting through its 4-bit shortlist head (--spec-draft-head shortlist);
    `weights`: a directory of drafter files to use instead of the artifact's (the draft stage's `path` option).
    `plan="fixed"` (sweeps: every draft k and the row budget allow) or "measured" (the default settings')."""
    backend, _, head = backend.partition(":")
    base = load_spec(spec)
    if weights is not None:
        base = with_params(base, {"draft": {"options": {backend: {"path": weights}}}})
    if backend == "oracle":  # a control, not a --spec-backend: named in the spec, as tests/round/conftest.py does
        base = with_params(base, {"draft": {"backend": "oracle", "options": {"oracle": {"corrupt": 0.0}}}})
        knobs = SpecKnobs(draft_tokens=k, draft_rows=rows, draft_plan=plan)
    else:
        knobs = SpecKnobs(backend=backend, draft_tokens=k, draft_rows=rows, draft_head=head or None, draft_plan=plan)
    return Engine(target, tokenizer, spec=base, knobs=knobs, max_lanes=lanes, max_len=max_len)


def run_batch(
    engine: Engine,
    prompts: list[tuple[str, list[int]]],
    max_tokens: int,
    draft_tokens: int | None = None,
    enabled: bool = True,
    ignore_eos: bool = False,
    timed: bool = False,
) -> list[Run]:
    """Run (id, prompt ids) pairs together as lanes to completion; one Run per prompt, in order.
    `timed`: per-stage wall time of every round after the first step (which carries the prefill pass), for the
    predicted speedup; the timer costs two clock reads a stage."""
    spec: dict[str, Any] = {"enabled": enabled}
    if draft_tokens:
        spec["draft_tokens"] = draft_tokens
    lanes = [
        engine.submit(
            parse_request(
                {"id": rid, "prompt_ids": ids, "max_tokens": max_tokens, "ignore_eos": ignore_eos, "spec": spec}
            )
        )
        for rid, ids in prompts
    ]
    first: dict[int, int] = {}
    stamps: list[list[tuple[float, int]]] = [[] for _ in lanes]

    def stamp():
        t = time.perf_counter()
        for i, lane in enumerate(lanes):
            if i not in first and lane.t_first:
                first[i] = len(lane.out_ids)
            if i in first and (not stamps[i] or stamps[i][-1][1] < len(lane.out_ids)):
                stamps[i].append((t, len(lane.out_ids)))

    engine.time_stages = False
    engine.step()
    stamp()
    before, rounds = dict(engine.times.seconds), 0
    engine.time_stages = timed
    while engine.busy():
        engine.step()
        stamp()
        rounds += 1
    engine.time_stages = False
    stage_s = {k: v - before.get(k, 0.0) for k, v in engine.times.seconds.items()} if timed else {}
    for lane in lanes:
        if lane.finish_reason == "error":
            raise RuntimeError(f"bench: request {lane.rid} failed: {lane.error}")
    return [
        Run(
            list(l.out_ids),
            l.t_first - l.t_submit,
            l.t_done - l.t_first,
            l,
            stage_s,
            rounds,
            first.get(i, 1),
            stamps[i],
        )
        for i, l in enumerate(lanes)
    ]


def forget(engine: Engine) -> Engine:
    """`engine` with what its drafter learnt from earlier requests dropped (`DraftBackend.forget`), for a run that
    must start as on a fresh server."""
    if engine.drafter is not None:
        engine.drafter.forget(engine.drafter_state)
    return engine


def alternate(
    configs: dict[str, Callable[[Any], Any]], items: list, repeats: int, tick: Callable[[int, int], None] | None = None
) -> dict[str, list[list[Any]]]:
    """Run every config on every item `repeats` times, A B A B: per item, configs in order on even repeats and
    reversed on odd ones, so drift and a neighbour's load hit all configs alike. `tick(done, total)` after each
    run (the section's progress bar). Returns name -> [item index][repeat] -> result."""
    names = list(configs)
    out: dict[str, list[list[Any]]] = {n: [[] for _ in items] for n in names}
    total, done = len(names) * len(items) * repeats, 0
    for i, item in enumerate(items):
        for r in range(repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                out[name][i].append(configs[name](item))
                done += 1
                if tick is not None:
                    tick(done, total)
    return out


def spread(values: list[float]) -> dict[str, float]:
    vals = [v for v in values if v == v]  # drop NaN (a run too short to time)
    if not vals:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def paired_ratio(num: list[list[float]], den: list[list[float]]) -> dict[str, float]:
    """Median (min, max) over items and repeats of num/den measured in the same pair of alternating runs."""
    return spread([a / b for xs, ys in zip(num, den) for a, b in zip(xs, ys) if b == b and b > 0])


def tps(runs: list[list[Run]]) -> list[list[float]]:
    return [[r.decode_tps for r in rs] for rs in runs]


def speculation(runs: list[list[Run]], k: int) -> dict[str, Any]:
    """Tokens per round and acceptance per position over every lane of `runs`
    (speclane.stages.contract.lanes.spec_stats)."""
    lanes = [r.lane for rs in runs for r in rs if r.lane is not None]
    return spec_stats(lanes, k)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def tensor_bytes(*objs: Any) -> int:
    """Bytes of the distinct tensors reachable from attrs objects, tuples, lists and dicts (tied weights once)."""
    seen, total, stack = set(), 0, list(objs)
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            key = (o.untyped_storage().data_ptr(), o.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += o.untyped_storage().nbytes()
        elif attrs.has(type(o)):
            stack.extend(getattr(o, f.name) for f in attrs.fields(type(o)))
        elif isinstance(o, (tuple, list)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
    return total


def engine_bytes(engine: Engine) -> int:
    """Weights + target state + drafter weights: the memory an engine holds (the process peak is reported apart)."""
    drafter = engine.drafter
    return tensor_bytes(engine.target.weights, engine.state) + (drafter.memory_bytes() if drafter else 0)


def now() -> float:
    return time.perf_counter()
