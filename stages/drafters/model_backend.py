"""What the two model drafters (`dflash2`, `mtp`) share: their files, their per-slot state, and a proposal's end.

Owns: finding a drafter's files (`options.path`, else the target's artifact, else the shipped assets) and loading
them, the proposal head both draft through (the target's head, or the int8 shortlist of its frequent tokens:
`head = "shortlist"`, option `shortlist_tokens`), the per-slot state both keep (a `Window` of keys and values over
the committed positions, plus one carried vector per slot: the feature or trunk state of the slot's last committed
position), zeroing both when a lane takes a slot, and masking drafts past each lane's limit.

The window is kept lazily. A pass's rows are stored as they come (`raw_rows`, a copy-free reference) and projected
into keys and values (`project`) only when a proposal needs them or `PENDING_ROWS` have piled up, all pending rows
in one wide product. Where the measured draft plan finds that drafting does not pay (a CPU without bf16 hardware),
a model drafter then costs its user almost nothing per round instead of a few small products every round, and when
it drafts, the backlog goes through the weights once. The replay appends pass after pass exactly as the eager
upkeep did, so the window read by a proposal is the same. Not here: what each drafter computes (`dflash2.py`, `mtp.py`),
the networks and file checks (`stages/models`).
"""
from __future__ import annotations

import logging

import attrs
import torch

from kernels.decode_linear import cpu_kernel_serves
from kernels.quant import Int8Weight, quantize_int8
from kernels.sampling import row_argmax
from stages.contract.resources import Resources
from stages.drafters.base import DraftBackend, Proposal
from stages.models import drafter_weights as dw
from stages.models.drafter_window import PassRows, Window, WindowSnapshot
from stages.models.ops import draft_linear
from stages.models.shortlist import Shortlist

log = logging.getLogger("speclane.drafters")


def model_files(name: str, options: dict, resources: Resources):
    """(target, weights path, config path) for a model drafter: `options.path`, else the artifact, else assets."""
    target = resources.target
    where = options.get("path") or getattr(target, "artifact_dir", None)
    return (target, *dw.locate(name, where, target.cfg))


@attrs.frozen
class Pending:
    """One observed pass whose rows are not yet in the window."""
    slots: torch.Tensor            # [lanes]
    cu_rows: torch.Tensor          # [lanes + 1]
    lane_rows: tuple[int, ...]
    positions: torch.Tensor        # [rows]
    keep: torch.Tensor             # [lanes] rows each lane committed (every row of a prefill chunk)
    raw: torch.Tensor              # [rows, ...]: what `project` turns into keys and values


@attrs.frozen
class SlotState:
    window: Window
    carry: torch.Tensor            # [slots, hidden]: the vector of each slot's last committed position
    pending: list[Pending] = attrs.field(factory=list)   # oldest first
    lookups: dict = attrs.field(factory=dict)   # slot -> (lane, its prompt-lookup index): dflash2 version 5

    def claim(self, lanes) -> None:
        """A lane new to its slot starts from an empty window and a zero carry."""
        for slot in self.window.claim(lanes):
            self.carry[slot].zero_()

    def carry_last(self, slots, cu_rows, rows: torch.Tensor, keep) -> None:
        """Carry `rows`' vector [rows, hidden] of each lane's last committed row (row keep - 1 of the lane: the
        last of a prefill chunk, of the committed run otherwise); a lane that committed nothing keeps its carry."""
        first = cu_rows[:-1]
        n = keep
        last = rows.index_select(0, (first + n - 1).clamp(min=0)).to(self.carry.dtype)
        self.carry.index_copy_(0, slots, torch.where((n > 0)[:, None], last, self.carry.index_select(0, slots)))

    def carry_rows(self, rows: PassRows, vectors: torch.Tensor) -> None:
        """`carry_last` for several passes at once (`rows`, `vectors` [rows, hidden] flat in their order): each
        slot carries the vector of its last committed row, a slot that committed none keeps its carry."""
        flat = torch.arange(rows.count, device=vectors.device)
        last = torch.full((self.carry.shape[0],), -1, dtype=torch.int64, device=vectors.device).scatter_reduce_(
            0, rows.slot, torch.where(rows.committed, flat, -1), "amax")
        new = vectors.index_select(0, last.clamp(min=0)).to(self.carry.dtype)
        self.carry.copy_(torch.where((last >= 0)[:, None], new, self.carry))


def draft_head(target) -> torch.Tensor | Int8Weight:
    """The output head a model drafter proposes through: the target's int8 head where it has one (`--quant int8`),
    else an int8 copy of its head on a CPU where the C kernels read int8 (the head is most of a draft's cost, and
    int8 streams half of bf16's bytes: a proposal's tokens are verified by the target, never compared bit for bit),
    else the head itself."""
    if isinstance(target.weights.head, Int8Weight):
        return target.weights.head
    head = target.weights.lm_head
    if head.device.type == "cpu" and cpu_kernel_serves(head[:1]):
        return quantize_int8(head)
    return head


class ModelBackend(DraftBackend):
    """A drafter with weights: loads its files at start (an ArtifactError names a missing or misshapen one).
    Subclasses say what a pass leaves to project (`raw_rows`) and how (`project`)."""

    option_names = ("path", "window", "shortlist_tokens")
    PENDING_ROWS = 256   # observed rows that may wait for their projection
    SHORTLIST_TOKENS = 16384   # rows of the shortlist head (`head = "shortlist"`) unless the options say

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        target, weights, config = model_files(self.name, self.options, resources)
        self.net, self.extra = dw.load(self.name, weights, config, target.cfg, target.dtype, target.device)
        self.net.prepare_drafting()
        self.files = (weights, config)
        self.target = target
        self.embed, self.lm_head = target.weights.embed, target.weights.lm_head
        self.window = int(self.options.get("window", self.net.cfg.window))
        self.shortlist, self.draft_head = None, None
        ranks = self.extra.get("shortlist.ranks")
        if head == "shortlist" and ranks is None:
            log.warning("%s has no shortlist.ranks (fit-drafter writes them): drafting through the full head",
                        weights)
        if head == "shortlist" and ranks is not None:
            count = int(self.options.get("shortlist_tokens", getattr(self.net.cfg, "shortlist_tokens",
                                                                     self.SHORTLIST_TOKENS)))
            self.shortlist = Shortlist.build(self.lm_head, ranks, count)
        else:
            self.draft_head = draft_head(target)

    def head_argmax(self, states: torch.Tensor) -> torch.Tensor:
        """The greedy draft of each row of `states` [rows, hidden] (already through the drafter's final norm):
        through the shortlist head where chosen, else the (int8 copy of the) target's head."""
        if self.shortlist is not None:
            return self.shortlist.argmax(states)
        return row_argmax(draft_linear(states.contiguous(), self.draft_head, logits=True))

    def window_layers(self) -> int:
        return 1

    def new_state(self, slots, max_len) -> SlotState:
        window = Window(slots, self.window, self.window_layers(), self.net.kv_dim, self.embed.dtype,
                        self.embed.device)
        return SlotState(window, torch.zeros(slots, self.embed.shape[1], dtype=self.embed.dtype,
                                             device=self.embed.device))

    def raw_rows(self, state: SlotState, batch, out, keep: torch.Tensor) -> torch.Tensor:
        """What of this pass the window will need, one entry per row (`keep`: rows each lane committed); may
        update the carry at once."""
        raise NotImplementedError

    def project(self, raw: torch.Tensor, positions: torch.Tensor):
        """Rows of `raw_rows` -> (keys, values [rows, layers, kv], the rows' carry vectors or None)."""
        raise NotImplementedError

    @torch.no_grad()
    def observe(self, state, lanes, batch, out, committed_len):
        if any(state.window.owners[lane.slot] not in (None, lane) for lane in lanes):
            self.flush(state)  # a slot changes hands: its old lane's rows go in before the slot is emptied
        state.claim(lanes)
        state.pending.append(Pending(batch.slots, batch.cu_rows, batch.lane_rows, batch.positions, committed_len,
                                     self.raw_rows(state, batch, out, committed_len)))
        if sum(p.raw.shape[0] for p in state.pending) >= self.PENDING_ROWS:
            self.flush(state)

    def catch_up(self, state: SlotState) -> None:
        self.flush(state)

    @torch.no_grad()
    def flush(self, state: SlotState) -> None:
        """Project every pending row in one product, then append them all at once as pass after pass would
        (`Window.append_rows`: a fixed number of ops, not a dozen small ones per queued pass)."""
        if not state.pending:
            return
        k, v, carry = self.project(torch.cat([p.raw for p in state.pending]),
                                   torch.cat([p.positions for p in state.pending]))
        rows = PassRows.of([(p.slots, p.lane_rows, p.keep) for p in state.pending], state.carry.shape[0])
        state.window.append_rows(rows, k, v)
        if carry is not None:
            state.carry_rows(rows, carry)
        state.pending.clear()

    @torch.no_grad()
    def snapshot(self, state: SlotState, slot: int, base: WindowSnapshot | None = None) -> WindowSnapshot:
        """The slot's window and carried vector; with `base` (the slot history's previous snapshot), only what
        was appended since it is copied (`Window.snapshot`)."""
        self.flush(state)
        return state.window.snapshot(slot, state.carry[slot], base)

    @torch.no_grad()
    def restore(self, state: SlotState, lane, snap: WindowSnapshot) -> None:
        self.flush(state)  # rows still pending belong to the slot's previous lanes
        state.window.restore(lane.slot, snap, lane)
        state.carry[lane.slot].copy_(snap.carry)

    @staticmethod
    def within_limits(drafts: torch.Tensor, limits) -> Proposal:
        """Drafts [lanes, width] with everything past each lane's limit set to -1 (no draft)."""
        keep = torch.arange(drafts.shape[1], device=drafts.device)[None] < torch.tensor(limits).to(drafts.device)[:, None]
        return Proposal(drafts=torch.where(keep, drafts, torch.full_like(drafts, -1)), draft_len=tuple(limits))

    def memory_bytes(self) -> int:
        """The drafter's weights, and its shortlist head's rows where it has one."""
        short = self.shortlist.memory_bytes() if self.shortlist is not None else 0
        return self.net.memory_bytes() + short

    def prior_acceptance(self) -> float | None:
        """The first-draft acceptance its fit record measured on held-out text (`fit.heldout.all.accept[0]` in its
        json, docs/artifacts.md), kept within [0.05, 0.95]; None when the record has none. A weak drafter is then
        not tried on the plan's default guess of 1/2, whose misses cost a draft each."""
        accept = self.net.cfg.fit.get("heldout", {}).get("all", {}).get("accept")
        if not accept:
            return None
        return min(max(float(accept[0]), 0.05), 0.95)
