"""Round costs: what a verify round costs on this machine, for the stages that decide how many rows to spend.

`target_s(rows)` is the measured time of one target pass of `rows` rows (stages/models/pass_cost.py probes it once
per machine and model and caches it); `draft_s(width, lanes)` is the drafter's own time for a round in which
`lanes` lanes draft, the widest `width` tokens, learnt from the rounds that ran (the draft stage records it).
anchor_gather reads both to pick each lane's drafts (stages/draft_plan.py). A declared, typed resource
(`Resources.round_costs`), not a side channel.
"""
from __future__ import annotations

import bisect

import attrs

# Weight of a new draft-time sample in its running mean: recent rounds count most, one outlier does not rule.
_EWMA = 0.2


@attrs.define(eq=False)
class RoundCosts:
    rows: tuple[int, ...] = ()      # probed row counts, increasing, from 1; () until the probe has run
    seconds: tuple[float, ...] = () # one target pass of that many rows
    source: str = ""                # where the probe came from (a cache file, or "measured now")
    # (lanes drafting, widest drafts) in a round -> running mean seconds: a model drafter's step costs more with
    # more lanes (mtp at 4 lanes was planned on its 1-lane cost and ran at 0.93x off, bench defaults)
    _draft: dict[tuple[int, int], float] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        self.set_probe(self.rows, self.seconds, self.source)

    def set_probe(self, rows: tuple[int, ...], seconds: tuple[float, ...], source: str) -> None:
        if len(rows) != len(seconds) or list(rows) != sorted(set(rows)) or (rows and rows[0] != 1):
            raise ValueError("RoundCosts: rows must rise from 1 and match seconds one to one")
        self.rows, self.seconds, self.source = tuple(rows), tuple(seconds), source

    def covers(self, rows: int) -> bool:
        """Whether the probe measured passes of up to `rows` rows."""
        return bool(self.rows) and self.rows[-1] >= rows

    def target_s(self, rows: int) -> float:
        """Seconds of a `rows`-row pass: linear between probed counts, extended by the last step's slope past
        the last."""
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

    def draft_s(self, width: int, lanes: int = 1) -> float:
        """The drafter's seconds for a round in which `lanes` lanes draft, the widest `width` tokens: 0 at width 0
        (the drafter is not called); else the nearest (lanes, width) measured so far, the lane count first, a
        measurement at fewer lanes scaled up by the lane ratio (0 until a round has run)."""
        if width <= 0 or not self._draft:
            return 0.0
        key = (max(lanes, 1), width)
        if key in self._draft:
            return self._draft[key]
        near = min(self._draft, key=lambda k: (abs(k[0] - key[0]), abs(k[1] - width), -k[1], -k[0]))
        scale = key[0] / near[0] if near[0] < key[0] else 1.0
        return self._draft[near] * scale

    def record_draft(self, width: int, seconds: float, lanes: int = 1) -> None:
        if width <= 0 or seconds < 0:
            return
        key = (max(lanes, 1), width)
        old = self._draft.get(key)
        self._draft[key] = seconds if old is None else old + _EWMA * (seconds - old)
