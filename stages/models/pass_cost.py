"""The pass-cost probe: how long one target pass of 1..64 rows takes on this machine, measured once and cached.

Speculation pays only where a k-row pass costs less than the tokens it wins, and that ratio is a property of the
machine: on a CPU with bf16 hardware an 8-row pass costs little more than a 1-row one, on an AVX2-only CPU it can cost
three times as much. So the default row plan is not a constant but this measurement. The probe runs the real
`Target.forward` on a scratch state (lanes of up to 8 rows at a mid-sized context), takes the fastest of a few passes
per row count, smoothed to rise with the rows, and caches the table under `~/.cache/speclane/pass_cost/` (or
`$SPECLANE_CACHE`), keyed by everything that changes the cost: CPU model and capability, threads, torch version, compute
path, the model's shapes, dtype, weight format and device. Delete the file to measure again.

A lane's rows attend to its keys, and an agent's lane holds thousands where the probe's hold CONTEXT: `measure_keys`
times one lane of 1 and KEY_ROWS rows at CONTEXT and at LONG_CONTEXT keys, which gives what a key past CONTEXT adds
for the lane (its keys and values read once) and for each of its rows (`RoundCosts.attend_s`), kept in the same file
(a table without them has them measured and added).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import torch

from speclane.kernels import cpu_build
from speclane.stages.contract.costs import FAIR_PASS, PREFILL_ROWS, RoundCosts
from speclane.stages.models.artifact import cache_root
from speclane.stages.models.state import RowBatch

log = logging.getLogger("speclane.pass_cost")

PROBE_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)
ROWS_PER_LANE = 8  # a verify round's widest lane: anchor + 7 drafts
CONTEXT = 192  # keys each probe lane attends to (a short chat turn)
LONG_CONTEXT = 2048  # keys of the long lane `measure_keys` times beside a CONTEXT one
KEY_ROWS = 16  # rows of its wide lane (a lane of the suffix drafter's widest default proposal)
VERSION = 2  # bump when the probe's method changes, so old tables are not reused


def cache_key(target) -> str:
    """What the pass cost depends on, hashed: the machine, the software and the model's shapes and format."""
    dev = target.device
    where = (
        torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"{cpu_build.cpu_name()}|{torch.backends.cpu.get_cpu_capability()}|{torch.get_num_threads()}|"
        f"{cpu_build.describe()}|{cpu_build.build_name()}"
    )
    head = target.weights.head  # None: the row-major head in the compute dtype; Int8Weight; PackedWeight (bf16, int8)
    fmt = type(head).__name__ + ("-int8" if getattr(head, "scale", None) is not None else "")
    slots = getattr(getattr(target, "experts", None), "slots", None)  # a MoE target's expert cache, if any
    parts = [VERSION, where, torch.__version__, str(dev.type), str(target.dtype), fmt, repr(target.cfg), slots]
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:20]


def _batch(rows: int, device) -> RowBatch:
    lanes = -(-rows // ROWS_PER_LANE)
    per = [rows // lanes + (1 if i < rows % lanes else 0) for i in range(lanes)]
    return RowBatch.build([(i, CONTEXT, [0] * n) for i, n in enumerate(per)], device)


def measure(target, rows: tuple[int, ...] = PROBE_ROWS, repeats: int = 3) -> tuple[float, ...]:
    """Pass seconds at each row count: one warm-up sweep, then `repeats` timed sweeps over all the counts in turn
    (so a burst of load from elsewhere spoils one sample of several counts, not every sample of one), the fastest
    sample of each count, then made non-decreasing in rows (`monotone`): a wider pass does the narrower one's work."""
    lanes = -(-max(rows) // ROWS_PER_LANE)
    state = target.new_state(lanes, CONTEXT + ROWS_PER_LANE)
    return monotone(_fastest(target, state, [_batch(r, target.device) for r in rows], repeats))


def _fastest(target, state, batches: list[RowBatch], repeats: int) -> list[float]:
    """Each batch's fastest pass over `repeats` timed sweeps through all of them, after one warm-up sweep."""
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    best = [float("inf")] * len(batches)
    for sweep in range(repeats + 1):
        for i, batch in enumerate(batches):
            sync()
            t = time.perf_counter()
            target.forward(batch, state)
            sync()
            if sweep:
                best[i] = min(best[i], time.perf_counter() - t)
    return best


def measure_keys(target, repeats: int = 3) -> tuple[float, float]:
    """(seconds a key past CONTEXT adds for a lane, and for each of its rows): the fastest of a few passes of one
    lane of 1 and of KEY_ROWS rows at CONTEXT and at LONG_CONTEXT keys; the lane's share is what one row's growth
    leaves of the rows' common growth per row, neither below 0."""
    state = target.new_state(1, LONG_CONTEXT + KEY_ROWS)
    shapes = [(r, c) for r in (1, KEY_ROWS) for c in (CONTEXT, LONG_CONTEXT)]
    best = _fastest(target, state, [RowBatch.build([(0, c, [0] * r)], target.device) for r, c in shapes], repeats)
    one, wide = ((best[i + 1] - best[i]) / (LONG_CONTEXT - CONTEXT) for i in (0, 2))
    row = max(0.0, (wide - one) / (KEY_ROWS - 1))
    return max(0.0, one - row), row


def monotone(seconds: list[float]) -> tuple[float, ...]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators): a noisy sample above its
    wider neighbours is averaged with them instead of lifting every count after it."""
    blocks: list[list[float]] = []  # [mean, count]
    for s in seconds:
        blocks.append([s, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return tuple(m for m, n in blocks for _ in range(int(n)))


def probe_rows(max_rows: int) -> tuple[int, ...]:
    """The row counts probed for rounds of up to `max_rows` rows (at least 1, at most 64: the decode route)."""
    top = max(1, min(max_rows, PROBE_ROWS[-1]))
    return tuple(r for r in PROBE_ROWS if r < top) + (top,)


def pass_costs(target, costs: RoundCosts, max_rows: int) -> None:
    """Fill `costs` with the pass times of up to `max_rows` rows and the keys' costs: the cached table for this
    machine and model when it covers them, else a fresh probe (a table without the keys' costs has only those
    measured; then cached; an unwritable cache is not an error, the table is just measured again next time)."""
    rows = probe_rows(max_rows)
    path = cache_root() / "pass_cost" / f"{cache_key(target)}.json"
    try:
        data = json.loads(path.read_text())
        if data["rows"][-1] >= rows[-1]:
            costs.set_probe(tuple(data["rows"]), tuple(data["seconds"]), str(path))
            if {"key_s", "row_key_s"} <= data.keys():
                costs.set_keys(CONTEXT, float(data["key_s"]), float(data["row_key_s"]))
                return
        else:
            data = None  # too narrow: measured again, wider
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        data = None
    t0 = time.perf_counter()
    if data is None:
        log.info("measuring the target pass at 1..%d rows (once per machine and model)", rows[-1])
        data = {"rows": list(rows), "seconds": list(measure(target, rows))}
        costs.set_probe(rows, tuple(data["seconds"]), "measured now")
    data["key_s"], data["row_key_s"] = measure_keys(target)
    costs.set_keys(CONTEXT, data["key_s"], data["row_key_s"])
    log.info("pass-cost probe: %d row counts in %.1f s (cached in %s)", len(rows), time.perf_counter() - t0, path)
    data.update(cpu=cpu_build.cpu_name(), torch=torch.__version__, dtype=str(target.dtype))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError as exc:
        log.warning("pass-cost probe not cached (%s): it runs again next time", exc)


def fair_prefill_rows(
    target, most: int = PREFILL_ROWS, fair: float = FAIR_PASS, costs: RoundCosts | None = None
) -> int:
    """The step budget of prompt rows while lanes decode, from the probe's table on this machine (`costs`, else
    probed or read from the cache now): the most rows (up to `most`) whose pass costs at most `fair` one-row passes,
    at least 1. A step that prefills then delays the decoding lanes' next token by at most that much beyond their
    own round, whatever the dtype's cost per row (a bf16 pass of 16 rows costs little more than one row where the
    kernels have bf16 dot products; a float32 one several times as much)."""
    if costs is None:
        costs = RoundCosts()
        pass_costs(target, costs, most)
    fit = [r for r, s in zip(costs.rows, costs.seconds) if r <= most and s <= fair * costs.seconds[0]]
    return max(fit, default=1)
