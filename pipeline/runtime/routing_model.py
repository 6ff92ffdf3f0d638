"""What a verify round of a MoE target looks up and copies, from the model's measured routing.

Owns `RoutingTrace`: the routed experts each decoded token chose in each MoE layer, read from a recorded trace of one
lane decoding with speculation off (one row a pass; stages/models/expert_study.py records such traces), and
`RoutingTrace.round(lanes, drafts, tokens_per_round, slots)`: the distinct experts a round of `lanes` lanes of
1 + `drafts` rows each looks up per MoE layer, and the misses it copies in, on average, with `slots` fast slots.

A round is replayed, not assumed: lane i reads the trace from its own offset (the lanes a trace length / lanes apart,
so they decode different text), each round looks up, per MoE layer, the union of the experts of every lane's next
1 + d tokens (a drafter that drafts in a share of the rounds only: a lane's next token in the others), and each lane
then moves on by the expected tokens a round (the fraction carried to the next round).
The lookups go through the live cache's own bookkeeping (`SlotTable`) under the policy the cache runs (by default the
registry's `DEFAULT_POLICY`, the very class a live cache instantiates, so a change of the live policy changes the
replay with it), so hits and misses count as the cache counts them: a small fast tier that a wide round thrashes
shows it here. The first quarter of the rounds warms the slots and is not counted. A rejected draft's row is taken
to choose the experts of the text's true next token, which the next round then looks up again: where drafts are
often wrong this is optimistic.
Pure Python; not here: recording a trace (pipeline/runtime/plan_figures.py; a trace recorded on text by
bench.routing_trace converts with `RoutingTrace.from_rows`), the round's time (round_model.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import attrs

from speclane.stages.models.expert_policies import DEFAULT_POLICY, POLICIES
from speclane.stages.models.expert_slots import SlotTable

WARM_SHARE = 0.25  # of a replay's rounds: warm-up, not counted
SLOT_STEPS = 512  # slots are replayed in steps of this share of every expert (`RoutingTrace.round`)
SAMPLED_LAYERS = 8  # at most this many MoE layers are replayed (`RoutingTrace.round`)


@attrs.frozen
class RoundRouting:
    """A round's expert lookups on average: `distinct` experts per MoE layer, `misses` copied in over all layers."""

    distinct: float
    misses: float


@attrs.frozen(eq=False)
class RoutingTrace:
    """`tokens[t][i]`: the sorted experts token t chose in the i-th MoE layer; `layers` the MoE layers' indices,
    `experts` routed experts a layer, `policy` the cache's replacement policy (a key of expert_policies.POLICIES;
    by default the one a live cache runs, `DEFAULT_POLICY`)."""

    tokens: tuple[tuple[tuple[int, ...], ...], ...]
    layers: tuple[int, ...]
    experts: int
    policy: str = DEFAULT_POLICY
    _memo: dict = attrs.field(factory=dict, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if len(self.tokens) < 2:
            raise ValueError("RoutingTrace: a trace needs at least 2 decoded tokens")
        if self.policy not in POLICIES:
            raise ValueError(f"RoutingTrace: unknown policy '{self.policy}'; known: {', '.join(POLICIES)}")
        if any(len(t) != len(self.layers) for t in self.tokens):
            raise ValueError("RoutingTrace: every token must have one expert set per MoE layer")

    @classmethod
    def from_lookups(cls, lookups: Sequence[tuple[int, Sequence[int]]], experts: int, policy: str = DEFAULT_POLICY):
        """From one-row lookups in the order a pass makes them, (layer, experts) per MoE layer and token: a token
        ends where the layer index stops rising."""
        tokens: list[list[tuple[int, ...]]] = []
        layers: list[int] = []
        last = None
        for layer, chosen in lookups:
            if last is None or layer <= last:
                tokens.append([])
            tokens[-1].append(tuple(sorted(int(e) for e in chosen)))
            if len(tokens) == 1:
                layers.append(int(layer))
            last = layer
        if tokens and len(tokens[-1]) != len(layers):
            tokens.pop()  # a token cut short where the recording ended
        return cls(tuple(tuple(t) for t in tokens), tuple(layers), experts, policy)

    @classmethod
    def from_rows(cls, rows, layers: Sequence[int], policy: str = DEFAULT_POLICY) -> RoutingTrace:
        """From a `RowRouting` (stages/models/routing_trace.py: each row's chosen experts per MoE layer, in order),
        whose MoE layers are the decoder layers `layers`: each row a token."""
        if len(layers) != len(rows.layers):
            raise ValueError(f"RoutingTrace.from_rows: {len(rows.layers)} MoE layers in the rows, {len(layers)} named")
        per_layer = [ids.tolist() for ids in rows.layers]
        tokens = tuple(tuple(tuple(sorted(per_layer[i][t])) for i in range(len(layers))) for t in range(rows.rows))
        return cls(tokens, tuple(layers), rows.experts, policy)

    @property
    def moe_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def top_k(self) -> float:
        """Experts one row chooses in a layer, on average."""
        return sum(len(e) for t in self.tokens for e in t) / (len(self.tokens) * self.moe_layers)

    def round(self, lanes: int, drafts: int, tokens_per_round: float, slots: int, share: float = 1.0) -> RoundRouting:
        """Distinct experts per MoE layer and misses per round (all layers) for rounds of `lanes` lanes of 1 +
        `drafts` rows (in a `share` of the rounds, spread evenly; 1 row in the others: a drafter that does not
        always draft), each lane moving on by `tokens_per_round` (at least 1) a round, with `slots` fast slots
        (every expert resident: no misses). Slots are counted in steps of 1/`SLOT_STEPS` of every expert, rounded
        down; past `SAMPLED_LAYERS` MoE layers, that many evenly spaced ones are replayed with their share of the
        slots and the misses scaled back up (the layers compete for the slots alike)."""
        if lanes < 1 or drafts < 0 or slots < 0:
            raise ValueError(
                f"RoutingTrace.round: lanes >= 1, drafts >= 0, slots >= 0 (got {lanes}, {drafts}, {slots})"
            )
        every = self.experts * self.moe_layers
        step = max(1, every // SLOT_STEPS)
        slots = every if slots >= every else slots - slots % step
        key = (lanes, drafts, round(max(1.0, tokens_per_round), 3), slots, round(min(max(share, 0.0), 1.0), 3))
        if key not in self._memo:
            self._memo[key] = self._replay(*key)
        return self._memo[key]

    def _replay(self, lanes: int, drafts: int, step: float, slots: int, share: float) -> RoundRouting:
        n, total = len(self.tokens), self.moe_layers
        picked = sorted({i * total // min(total, SAMPLED_LAYERS) for i in range(min(total, SAMPLED_LAYERS))})
        resident = slots >= self.experts * total
        slots = slots * len(picked) // total if not resident else slots
        table = None if resident or slots == 0 else SlotTable(slots, POLICIES[self.policy]())
        pos = [i * n / lanes for i in range(lanes)]
        rounds = max(4, int(n / (lanes * step)))  # one pass over the trace, spread over the lanes
        warm = int(rounds * WARM_SHARE)
        distinct = misses = 0
        owed = [i / lanes for i in range(lanes)]  # each lane drafts when its share of the rounds comes due
        for r in range(rounds):
            owed = [o + share for o in owed]
            width = [drafts + 1 if o >= 1.0 - 1e-9 else 1 for o in owed]
            owed = [o - 1.0 if w > 1 else o for o, w in zip(owed, width)]
            rows = [int(p) + j for p, w in zip(pos, width) for j in range(w)]
            before = table.misses if table is not None else 0
            seen = 0
            for i in picked:
                union = sorted({e for t in rows for e in self.tokens[t % n][i]})
                seen += len(union)
                if table is not None:
                    table.schedule(self.layers[i], union)
            if r >= warm:
                distinct += seen
                misses += seen if slots == 0 else (table.misses - before if table is not None else 0)
            pos = [p + step for p in pos]
        counted = rounds - warm
        return RoundRouting(distinct / (counted * len(picked)), misses * total / (counted * len(picked)))
