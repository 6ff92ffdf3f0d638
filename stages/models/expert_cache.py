"""Expert tiers of a MoE target: routed experts held in a slow tier, computed from a fixed number of fast slots.

Owns: the fast tier (slot buffers gate_up [slots, 2 * inter, hidden] and down [slots, hidden, inter] in the compute
dtype, on the model's device) over a slow tier (`expert_tiers.py`: the artifact's files read in place, stacked
tensors in memory, or on a GPU pinned host memory),
running one layer's routed experts through the slots (`ExpertCache.run`), the budget-to-slots rule and its errors,
the router look-ahead and its prefetch, and the running counters (as `ExpertCounts`). Not here: which expert goes
to which slot and which leaves (`expert_slots.py`, `expert_policies.py`), the expert math and the copy
(`speclane.kernels.moe`, `speclane.kernels.expert_copy`), the router and the shared expert (`moe.py`).

A layer's pass: the distinct experts its rows chose are looked up once each; those in a slot are hits and are
computed at once, the missing ones are copied into slots (one copy a miss) and computed, in groups no larger than
the slots when the layer chose more experts than there are slots. Exactness: an expert's weights are the same
bytes whichever slot holds them, its term is computed by the twin's own `expert_rows`, and the terms are added by
`add_experts` in increasing expert index, so a layer's output is bit-identical to the twin over all experts.
The lookup reads the chosen experts on the host (the twin's one copy a MoE layer): free on a CPU; on a GPU it waits
for the layer's router, so a round with a cache is never captured as a graph.
On a GPU a layer whose experts all fit the slots runs the grouped triton kernels over them (`grouped`), exact
against those kernels over every expert resident, once its misses are in; a layer that chose more runs the twin's
products group by group, its first misses copied beside its resident experts' computation. The copies run on a
stream of their own: a computation waits for its slots' copies (an event), a copy into a slot waits for every
computation queued before it (so none reads a slot mid-overwrite), and a prefetch for the next MoE layer is queued
after this layer's experts, overlapping the next layer's attention or Gated DeltaNet part.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from speclane.kernels._triton import HAVE_TRITON
from speclane.kernels.expert_copy import copy_expert
from speclane.kernels.moe import add_experts, expert_rows, route_experts
from speclane.kernels.moe_triton import moe_experts_triton
from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_policies import DEFAULT_POLICY, POLICIES
from speclane.stages.models.expert_slots import ExpertCounts, SlotTable
from speclane.stages.models.expert_tiers import MappedTier, StackedTier
from speclane.stages.models.weights import ModelWeights, MoeWeights

__all__ = ["DEFAULT_POLICY", "ExpertCache", "check_budget", "expert_bytes"]

Tensor = torch.Tensor
MB = 1 << 20
AHEAD = 4  # look-ahead experts kept per row (the most a prefetch or a replay of one reads)


def expert_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """One routed expert's bytes in a slot: gate, up and down in `dtype`."""
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size * torch.empty(0, dtype=dtype).element_size()


def check_budget(cfg: ModelConfig, budget_bytes: int, dtype: torch.dtype, device: torch.device) -> int:
    """The slots `budget_bytes` buys (at most every routed expert of the model), or a ConfigError naming
    --expert-cache: for a dense model, a device other than a CPU or a CUDA GPU, or a budget below one expert."""
    moe_layers = sum(cfg.moe_layers)
    if moe_layers == 0:
        raise ConfigError(
            f"--expert-cache: this model ({cfg.model_type}) is dense, it has no routed experts to "
            "cache; leave --expert-cache unset"
        )
    if torch.device(device).type not in ("cpu", "cuda"):
        raise ConfigError(
            f"--expert-cache runs with --device cpu or cuda (got {device}): its slow tier is host memory or the "
            "files, and its copies are a CPU's or CUDA's; leave it unset on this device"
        )
    one = expert_bytes(cfg, dtype)
    if budget_bytes < one:
        raise ConfigError(
            f"--expert-cache: {budget_bytes / MB:.4g} MB holds no expert; one expert of this model is "
            f"{one / MB:.4g} MB in {str(dtype).removeprefix('torch.')}, give at least that"
        )
    return min(budget_bytes // one, moe_layers * cfg.num_experts)


class ExpertCache:
    """The fast tier over a slow one: `slots` slot buffers, a `SlotTable` with its policy, the running counters.
    Mutated by every MoE layer of every pass (`run`). `trace`, when a list, receives (layer, experts) per lookup:
    the routing trace the policy study replays (`expert_study.py`); `ahead`, when a list, receives per lookup the
    router look-ahead: the next MoE layer's router applied to this layer's input, its `AHEAD` best experts per row
    (() for the last MoE layer). `prefetch` m > 0: after a layer, the union of the next MoE layer's m best
    look-ahead experts per row is brought in (`SlotTable.prefetch`; its copies count in `bytes_copied`).
    `in_place`: nothing is copied; each expert the slow tier holds in a slot's layout (`fused`) is computed where it
    lies, while the table still counts the hits and misses a copying cache of this size would have (a measurement of
    what the copies cost; `bytes_copied` then counts only the experts that had to be copied after all; a CPU
    cache only). `device`: where the slots are (default: the slow tier's). `grouped`: a layer whose experts all fit
    the slots runs the grouped triton kernels over the slots (its rows' choices mapped to slot indices, kept in
    expert order), bit-identical to those kernels over every expert resident; default: on a CUDA device."""

    def __init__(
        self,
        slow: StackedTier | MappedTier,
        slots: int,
        policy: str = DEFAULT_POLICY,
        trace: list | None = None,
        prefetch: int = 0,
        in_place: bool = False,
        device: torch.device | str | None = None,
        grouped: bool | None = None,
    ):
        self.slow, self.trace, self.ahead, self._slots = slow, trace, None, slots
        self.device = slow.device if device is None else torch.device(device)
        self.grouped = HAVE_TRITON and self.device.type == "cuda" if grouped is None else grouped
        self.policy, self.prefetch, self.in_place = DEFAULT_POLICY, 0, False
        self.reset(policy, prefetch, in_place)
        self.gate_up = torch.empty(slots, 2 * slow.inter, slow.hidden, dtype=slow.dtype, device=self.device)
        self.down = torch.empty(slots, slow.hidden, slow.inter, dtype=slow.dtype, device=self.device)
        self.bytes_copied = 0
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None  # the copies' own
        self._ready = None  # the event after the copies queued last, until a computation waits for it
        layers = sorted(slow.layers)
        self._next = dict(zip(layers, layers[1:]))  # MoE layer -> the next one a pass runs

    @classmethod
    def mapped(
        cls, path: str | Path, cfg: ModelConfig, dtype: torch.dtype, budget_bytes: int, policy: str = DEFAULT_POLICY
    ) -> ExpertCache:
        """As many slots as `budget_bytes` buys (`check_budget`) over the artifact's files at `path`, read in place
        (the weights were loaded without their routed experts)."""
        slots = check_budget(cfg, budget_bytes, dtype, torch.device("cpu"))
        return cls(MappedTier(path, cfg, dtype), slots, policy)

    @classmethod
    def stacked(
        cls,
        cfg: ModelConfig,
        weights: ModelWeights,
        budget_bytes: int,
        device: torch.device,
        policy: str = DEFAULT_POLICY,
    ) -> ExpertCache:
        """As many slots as `budget_bytes` buys over the loaded weights' stacked experts (`check_budget`)."""
        layers = {i: lw.mlp for i, lw in enumerate(weights.layers) if isinstance(lw.mlp, MoeWeights)}
        dtype = next(iter(layers.values())).gate_up.dtype if layers else torch.float32
        return cls(StackedTier(layers), check_budget(cfg, budget_bytes, dtype, device), policy)

    @property
    def slots(self) -> int:
        return self._slots

    def reset(self, policy: str | None = None, prefetch: int | None = None, in_place: bool | None = None) -> None:
        """Every slot emptied, as after load (a cold cache); the hit and miss counters restart from 0. `policy` (a key
        of `POLICIES`), `prefetch`, `in_place`: the settings from now on (None keeps the current one)."""
        policy = self.policy if policy is None else policy
        prefetch = self.prefetch if prefetch is None else prefetch
        if policy not in POLICIES:
            raise ConfigError(f"expert cache: unknown policy '{policy}'; use one of {', '.join(POLICIES)}")
        if not 0 <= prefetch <= AHEAD:
            raise ConfigError(f"expert cache: prefetch must be 0 to {AHEAD} experts a row, got {prefetch}")
        if in_place and self.device != self.slow.device:
            raise ConfigError(
                "expert cache: in_place computes each expert where the slow tier holds it; only a "
                "cache whose slots share the slow tier's memory (a CPU cache) can"
            )
        self.table, self.policy, self.prefetch = SlotTable(self.slots, POLICIES[policy]()), policy, prefetch
        self.in_place = self.in_place if in_place is None else in_place

    def counts(self) -> ExpertCounts:
        one = self.gate_up[0].nbytes + self.down[0].nbytes
        return ExpertCounts(
            hits=self.table.hits,
            misses=self.table.misses,
            bytes_copied=self.bytes_copied,
            slots=self.slots,
            resident_bytes=self.slots * one,
        )

    def run(
        self, layer: int, x: Tensor, top_i: Tensor, top_w: Tensor, linear: Callable[[Tensor, Tensor], Tensor]
    ) -> Tensor:
        """The routed experts of MoE layer `layer` for x [rows, hidden] with top_i, top_w [rows, k] (top_w in x's
        dtype): [rows, hidden], bit-identical to `moe_experts_ref` over the slow tier's stacked tensors."""
        choices = top_i.tolist()  # the lookup's one host copy a layer
        experts = sorted({e for row in choices for e in row})
        if self.trace is not None:
            self.trace.append((layer, tuple(experts)))
        guess = self._look_ahead(layer, x, linear) if self.prefetch or self.ahead is not None else ()
        plan = self.table.schedule(layer, experts)
        terms: dict[int, Tensor] = {}
        routes = None  # the twin's rows per expert, built only where the twin computes
        if self.in_place:
            routes = route_experts(top_i, choices)
            where = {e: self.slow.fused(layer, e) for e in experts}
            terms = {e: expert_rows(x, *w, *routes[e], top_w, linear) for e, w in where.items() if w is not None}
        loads = [[(e, s) for e, s in group if e not in terms] for group in plan.loads]
        self._await()  # a prefetch may still be filling a slot this layer reads
        if self.grouped and not terms and len(experts) <= self.slots:  # one group, every expert in a slot at once
            for group in loads:
                self._copy(layer, group)
            self._await()
            out = self._grouped(x, top_i, top_w, dict(plan.resident) | {e: s for g in loads for e, s in g})
            self._prefetch(layer, guess)
            return out
        if routes is None:
            routes = route_experts(top_i, choices)
        # the first misses go in beside the resident experts' computation (on a GPU the two overlap) when the slots
        # hold the whole layer, so no resident expert is their victim; otherwise after it
        early = bool(loads) and len(experts) <= self.slots
        if early:
            self._copy(layer, loads[0])
        terms.update((e, self._term(s, x, routes[e], top_w, linear)) for e, s in plan.resident if e not in terms)
        for n, group in enumerate(loads):
            if n or not early:
                self._copy(layer, group)  # into slots a queued computation may read: queued after it
            self._await()
            terms.update((e, self._term(s, x, routes[e], top_w, linear)) for e, s in group)
        out = add_experts(x, routes, terms)
        self._prefetch(layer, guess)
        return out

    def _grouped(self, x: Tensor, top_i: Tensor, top_w: Tensor, slot_of: dict[int, int]) -> Tensor:
        """The grouped kernels over the slots: each row's choices sorted by expert (the order the terms are added
        in), then mapped to their slots."""
        table = torch.zeros(self.slow.experts, dtype=torch.int64)
        table[list(slot_of)] = torch.tensor(list(slot_of.values()), dtype=torch.int64)
        chosen, order = top_i.sort(dim=-1, stable=True)
        slots = table.to(top_i.device, non_blocking=True)[chosen]
        return moe_experts_triton(x, self.gate_up, self.down, slots, top_w.gather(1, order), presorted=True)

    def _prefetch(self, layer: int, guess: tuple[tuple[int, ...], ...]) -> None:
        """The next MoE layer's `prefetch` best look-ahead experts a row brought into slots (copies queued)."""
        if not (self.prefetch and guess):
            return
        following = self._next[layer]
        wanted = sorted({e for row in guess for e in row[: self.prefetch]})
        picked = self.table.prefetch(following, wanted)
        self._copy(following, [(e, s) for e, s in picked if not self.in_place or self.slow.fused(following, e) is None])

    def _copy(self, layer: int, pairs: list[tuple[int, int]]) -> None:
        """Each (expert, slot) of MoE layer `layer` copied from the slow tier into its slot. On a GPU queued on the
        copy stream after everything queued so far on the computing one, its end recorded for `_await`."""
        if self._stream is None:
            for e, s in pairs:
                self.bytes_copied += copy_expert(self.gate_up[s], self.down[s], *self.slow.parts(layer, e))
            return
        if not pairs:
            return
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for e, s in pairs:
                parts = self.slow.parts(layer, e)
                self.bytes_copied += copy_expert(self.gate_up[s], self.down[s], *parts, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record(self._stream)

    def _await(self) -> None:
        """The computing stream waits for the copies queued last (nothing to wait for on a CPU)."""
        if self._ready is not None:
            torch.cuda.current_stream(self.device).wait_event(self._ready)
            self._ready = None

    def _term(self, slot: int, x: Tensor, route: tuple[Tensor, Tensor], top_w: Tensor, linear) -> Tensor:
        return expert_rows(x, self.gate_up[slot], self.down[slot], *route, top_w, linear)

    def _look_ahead(self, layer: int, x: Tensor, linear) -> tuple[tuple[int, ...], ...]:
        """Per row of x, the next MoE layer's `AHEAD` best experts by its router on x (the residual stream changes
        little in one layer); () after the last MoE layer. Appended to `ahead` when it records."""
        following = self._next.get(layer)
        guess: tuple[tuple[int, ...], ...] = ()
        if following is not None:
            scores = linear(x, self.slow.router(following)).float()  # [rows, experts]
            guess = tuple(map(tuple, scores.topk(min(AHEAD, self.slow.experts), dim=-1).indices.tolist()))
        if self.ahead is not None:
            self.ahead.append(guess)
        return guess
