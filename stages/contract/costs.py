"""Round costs: what a verify round costs on this machine, for the stages that decide how many rows to spend.

`target_s(rows)` is the measured time of one target pass of `rows` rows (stages/models/pass_cost.py probes it once
per machine and model and caches it); `draft_s(width, lanes)` is the drafter's own time for a round in which
`lanes` lanes draft, the widest `width` tokens, learnt from the rounds that ran (the draft stage records it);
`attend_s(keys, rows)` what a lane's rows attending to more keys than the probe's lanes did add to that pass (the
probe's lanes attend to a short chat turn's keys, and an agent's lane to thousands: there a row's scores and weighted
values grow to cost as much as its share of the weights, so a table read at the probe's context priced an agent's
draft rows well below their cost); `catch_up_s(rows)` what bringing a lane's drafter state up to date costs when
`rows` observed rows wait for it (a model drafter's lazy window projects them before its proposal reads them),
learnt per row from the catch-ups that ran.
anchor_gather reads them to pick each lane's drafts (stages/draft_plan.py). The engine owns one `RoundCosts` and
hands it to every round as the `round_costs` round input; anchor_gather (the probe, `next_round`) and the draft
stage (its samples) declare it in their `touches`: a measurement taken again by a rerun round is still a measurement.

A draft time is the median of its key's last few samples, and a key not sampled for `STALE_ROUNDS` planning rounds
fades: its estimate halves every `STALE_ROUNDS` rounds more. Timing noise only adds: a collection of Python's full
heap that lands inside one proposal can make the plan's only sample of a proposal many times its cost, and since a
plan that never drafts never measures again, one such sample once stopped a whole run from drafting. A median is
not moved by one such sample, and a faded key is measured again by the next plan that drafts. It fades rather than
vanishes: a forgotten key reads as free, and with a model drafter whose lanes catch up their whole backlog when they
draft (its lazy window), the plan then tried a dear many-lane round about once a batch (the measurements:
docs/decisions/0004-draft-cost-record.md).
"""

from __future__ import annotations

import bisect
import collections
import statistics

import attrs

SAMPLES = 5  # draft-time samples kept per (lanes, width): the estimate is their median
FAIR_PASS = 1.5  # a step that also prefills: its prefill pass at most this many one-row passes (`fair_prefill_rows`)
PREFILL_ROWS = 16  # the most prompt rows a step takes while lanes decode, by default (docs/protocol.md, "Fairness")
CATCH_UP_ROWS = 32  # a catch-up of fewer rows is not a sample of its cost per row (its fixed ops would dominate)
STALE_ROUNDS = 64  # planning rounds after which a key not sampled again starts to fade (halving every as many)


@attrs.define(eq=False)
class RoundCosts:
    rows: tuple[int, ...] = ()  # probed row counts, increasing, from 1; () until the probe has run
    seconds: tuple[float, ...] = ()  # one target pass of that many rows
    source: str = ""  # where the probe came from (a cache file, or "measured now")
    # what attending to keys past the probe's lanes' `context` adds (`attend_s`): seconds a key for a lane (its keys
    # and values read once for all its rows) and a key for a row (its scores and weighted values); 0: not probed
    context: int = 0
    key_s: float = 0.0
    row_key_s: float = 0.0
    # (lanes drafting, widest drafts) in a round -> its last SAMPLES seconds: a model drafter's step costs more with
    # more lanes (planned on its 1-lane cost, mtp at 4 lanes ran slower than speculation off)
    _draft: dict[tuple[int, int], collections.deque] = attrs.field(factory=dict)
    _sampled: dict[tuple[int, int], int] = attrs.field(factory=dict)  # key -> planning round of its last sample
    rounds: int = 0  # planning rounds so far (`next_round`)
    _per_row: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=SAMPLES))  # catch-up s/row
    # what draft_s gave since the samples or the round last changed, and target_s since the probe: a plan weighs
    # every prefix of a round's drafts (over a hundred at eight lanes), and each draft_s searched the keys and took
    # a median
    _memo: dict = attrs.field(factory=dict)
    _pass_memo: dict = attrs.field(factory=dict)
    rising: bool = attrs.field(init=False, default=False)  # no probed pass dearer than a wider one (`set_probe`)

    def __attrs_post_init__(self) -> None:
        self.set_probe(self.rows, self.seconds, self.source)

    def set_probe(self, rows: tuple[int, ...], seconds: tuple[float, ...], source: str) -> None:
        if len(rows) != len(seconds) or list(rows) != sorted(set(rows)) or (rows and rows[0] != 1):
            raise ValueError("RoundCosts: rows must rise from 1 and match seconds one to one")
        self.rows, self.seconds, self.source = tuple(rows), tuple(seconds), source
        # then target_s never falls as rows grow (between probed counts it is linear, past the last it keeps the
        # last step's slope), which lets a plan stop weighing longer prefixes early (draft_plan.py)
        self.rising = all(b >= a for a, b in zip(self.seconds, self.seconds[1:]))
        self._pass_memo.clear()

    def covers(self, rows: int) -> bool:
        """Whether the probe measured passes of up to `rows` rows."""
        return bool(self.rows) and self.rows[-1] >= rows

    def target_s(self, rows: int) -> float:
        """Seconds of a `rows`-row pass: linear between probed counts, extended by the last step's slope past
        the last."""
        out = self._pass_memo.get(rows)
        if out is None:
            out = self._pass_memo[rows] = self._target_s(rows)
        return out

    def _target_s(self, rows: int) -> float:
        r, s = self.rows, self.seconds
        if not r:
            raise ValueError("RoundCosts.target_s: the pass cost has not been probed")
        if rows <= r[0] or len(r) == 1:
            return s[0] if rows <= r[0] else s[0] * rows / r[0]
        i = bisect.bisect_left(r, rows)
        if i < len(r) and r[i] == rows:
            return s[i]
        lo, hi = (i - 1, i) if i < len(r) else (len(r) - 2, len(r) - 1)
        slope = (s[hi] - s[lo]) / (r[hi] - r[lo])
        return max(s[lo] + slope * (rows - r[lo]), s[0])

    def set_keys(self, context: int, key_s: float, row_key_s: float) -> None:
        if context < 0 or key_s < 0 or row_key_s < 0:
            raise ValueError("RoundCosts: the keys' costs must be >= 0")
        self.context, self.key_s, self.row_key_s = context, key_s, row_key_s

    def attend_s(self, keys: int, rows: int) -> float:
        """Seconds a lane of `rows` rows attending to `keys` keys adds to the probed pass: nothing up to the probe's
        context, then per key past it a read of the lane's keys and values and each row's arithmetic on them."""
        past = keys - self.context
        return past * (self.key_s + self.row_key_s * rows) if past > 0 and rows > 0 else 0.0

    def draft_s(self, width: int, lanes: int = 1) -> float:
        """The drafter's seconds for a round in which `lanes` lanes draft, the widest `width` tokens: 0 at width 0
        (the drafter is not called); else the nearest (lanes, width) measured so far, the lane count first, a
        measurement at fewer lanes scaled up by the lane ratio (0 until a round has run)."""
        if width <= 0 or not self._draft:
            return 0.0
        key = (max(lanes, 1), width)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = self._draft_s(key)
        return out

    def _draft_s(self, key: tuple[int, int]) -> float:
        width = key[1]
        if key in self._draft:
            return self._estimate(key)
        near = min(self._draft, key=lambda k: (abs(k[0] - key[0]), abs(k[1] - width), -k[1], -k[0]))
        scale = key[0] / near[0] if near[0] < key[0] else 1.0
        return self._estimate(near) * scale

    def _estimate(self, key) -> float:
        """The median of the key's samples (the lower middle one of an even count: noise only adds time), halved
        for every `STALE_ROUNDS` rounds it has gone unsampled past the first `STALE_ROUNDS`."""
        stale = max(0, self.rounds - self._sampled[key] - STALE_ROUNDS)
        return statistics.median_low(self._draft[key]) * 0.5 ** (stale / STALE_ROUNDS)

    def record_draft(self, width: int, seconds: float, lanes: int = 1) -> None:
        if width <= 0 or seconds < 0:
            return
        key = (max(lanes, 1), width)
        self._draft.setdefault(key, collections.deque(maxlen=SAMPLES)).append(seconds)
        self._sampled[key] = self.rounds
        self._memo.clear()

    def next_round(self) -> None:
        """A planning round begins: keys not sampled for a while fade (`_estimate`), so a sample spoilt by a pause
        cannot keep the plan from drafting (and so from measuring again) for good."""
        self.rounds += 1
        self._memo.clear()

    def catch_up_s(self, rows: int) -> float:
        """Seconds to catch up `rows` observed rows: the median cost per row of the last catch-ups of at least
        `CATCH_UP_ROWS` rows (0 before any: nothing is charged until a catch-up has been measured)."""
        return rows * statistics.median_low(self._per_row) if self._per_row and rows > 0 else 0.0

    def record_catch_up(self, rows: int, seconds: float) -> None:
        if rows >= CATCH_UP_ROWS and seconds >= 0:
            self._per_row.append(seconds / rows)
