"""What the two model drafters (`dflash2`, `mtp`) share: their files, their per-slot state, and a proposal's end.

Owns: finding a drafter's files (`options.path`, else the target's artifact, else the shipped assets) and loading
them, the proposal head both draft through (the target's head, or the int8 shortlist of its frequent tokens:
`head = "shortlist"`, option `shortlist_tokens`), the per-slot state both keep (a `Window` of keys and values over
the committed positions, plus one carried vector per slot: the feature or trunk state of the slot's last committed
position), zeroing both when a lane takes a slot, and masking drafts past each lane's limit.

The window is kept lazily. A pass's rows are stored as they come (`raw_rows`, a copy-free reference;
`stages/drafters/pending.py`) and projected into keys and values (`project`) only when a proposal reads them:
a proposal projects its drafting lanes' rows (all of them since the lane last drafted, in one wide product), a
slot that changes hands drops its old lane's rows, and a prompt checkpoint keeps its slot's rows unprojected
until it is restored. Where the measured draft plan finds that drafting does not pay (a CPU without bf16
hardware, many lanes), a model drafter then costs its user almost nothing per round, and a row no proposal
reads is never projected; `PENDING_ROWS` bounds the memory held. The replay appends pass after pass exactly as
the eager upkeep did, so the window read by a proposal is the same. Not here: what each drafter computes
(`dflash2.py`, `mtp.py`), the networks and file checks (`stages/models`).
"""

from __future__ import annotations

import logging

import attrs
import torch

from speclane.kernels.decode_linear import cpu_kernel_serves
from speclane.kernels.packed import PackedWeight
from speclane.kernels.q8 import Q8Weight
from speclane.kernels.quant import Int8Weight, quantize_int8
from speclane.kernels.sampling import row_argmax
from speclane.stages.contract.resources import Resources
from speclane.stages.drafters.base import DraftBackend, Proposal, empty_proposal
from speclane.stages.drafters.pending import Queue, Rows
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.draft_layer import DraftLayer
from speclane.stages.models.draft_route import layer_form
from speclane.stages.models.drafter_window import PassRows, Window
from speclane.stages.models.shortlist import Shortlist, for_proposals, proposal_logits
from speclane.stages.models.window_snapshot import Unprojected, WindowSnapshot

log = logging.getLogger("speclane.drafters")


def model_files(name: str, options: dict, resources: Resources):
    """(target, weights path, config path) for a model drafter: `options.path`, else the artifact, else assets."""
    target = resources.target
    where = options.get("path") or getattr(target, "artifact_dir", None)
    return (target, *dw.locate(name, where, target.cfg))


@attrs.frozen
class SlotState:
    window: Window
    carry: torch.Tensor  # [slots, hidden]: the vector of each slot's last committed position
    queue: Queue  # rows not yet in the window; every queued row's slot is its owner's
    lookups: dict = attrs.field(factory=dict)  # slot -> (lane, its prompt-lookup index): dflash2 version 5

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
            0, rows.slot, torch.where(rows.committed, flat, -1), "amax"
        )
        new = vectors.index_select(0, last.clamp(min=0)).to(self.carry.dtype)
        self.carry.copy_(torch.where((last >= 0)[:, None], new, self.carry))


def draft_head(target) -> torch.Tensor | Int8Weight | PackedWeight | Q8Weight:
    """The output head a model drafter proposes through: the target's int8 head where it has one (`--quant int8`,
    packed or not), else an int8 copy of its head on a CPU where the C kernels read int8 (the head is most of a
    draft's cost, and int8 streams half of bf16's bytes: a proposal's tokens are verified by the target, never
    compared bit for bit), packed where the build reads that layout, else the head itself."""
    own = target.weights.head
    if isinstance(own, Int8Weight) or (isinstance(own, PackedWeight) and own.scale is not None):
        return own
    head = target.weights.lm_head
    if head.device.type == "cpu" and cpu_kernel_serves(head[:1]):
        q = quantize_int8(head)
        return for_proposals(q) if head.dtype == torch.bfloat16 else q
    return head


class ModelBackend(DraftBackend):
    """A drafter with weights: loads its files at start (an ArtifactError names a missing or misshapen one).
    Subclasses say what a pass leaves to project (`raw_rows`) and how (`project`)."""

    option_names = ("path", "window", "shortlist_tokens")
    PENDING_ROWS = 8192  # observed rows that may wait for their projection (dflash2: 5,760 B a row in bf16)
    SHORTLIST_TOKENS = 8192  # rows of the shortlist head (`head = "shortlist"`) unless the options say

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        target, weights, config = model_files(self.name, self.options, resources)
        self.net, self.extra = dw.load(self.name, weights, config, target.cfg, target.dtype, target.device)
        self.net.prepare_drafting()
        self.forms = tuple(layer_form(layer) for layer in self.net.modules() if isinstance(layer, DraftLayer))
        self.files = (weights, config)
        self.target = target
        self.embed, self.lm_head = target.weights.embed, target.weights.lm_head
        self.window = int(self.options.get("window", self.net.cfg.window))
        self.shortlist, self.draft_head = None, None
        ranks = self.extra.get("shortlist.ranks")
        if head == "shortlist" and ranks is None:
            log.warning("%s has no shortlist.ranks (fit-drafter writes them): drafting through the full head", weights)
        if head == "shortlist" and ranks is not None:
            count = int(
                self.options.get("shortlist_tokens", getattr(self.net.cfg, "shortlist_tokens", self.SHORTLIST_TOKENS))
            )
            self.shortlist = Shortlist.build(self.lm_head, ranks, count)
        else:
            self.draft_head = draft_head(target)

    def head_argmax(self, states: torch.Tensor) -> torch.Tensor:
        """The greedy draft of each row of `states` [rows, hidden] (already through the drafter's final norm):
        through the shortlist head where chosen, else the (int8 copy of the) target's head."""
        if self.shortlist is not None:
            return self.shortlist.argmax(states)
        return row_argmax(proposal_logits(states.contiguous(), self.draft_head))

    def window_layers(self) -> int:
        return 1

    DRAFT_ROWS = 8  # rows a proposal writes into its slot's window unless the backend says (`draft_rows`)

    def draft_rows(self) -> int:
        """The most rows of its own a proposal writes into a slot's window (`Window.scratch`)."""
        return self.DRAFT_ROWS

    def new_state(self, slots, max_len) -> SlotState:
        cfg = self.net.cfg
        window = Window(
            slots,
            self.window,
            self.window_layers(),
            self.net.kv_dim,
            self.embed.dtype,
            self.embed.device,
            heads=cfg.num_kv_heads,
            scratch=self.draft_rows(),
        )
        return SlotState(
            window,
            torch.zeros(slots, self.embed.shape[1], dtype=self.embed.dtype, device=self.embed.device),
            Queue(slots),
        )

    def raw_rows(self, state: SlotState, batch, out, keep: torch.Tensor) -> torch.Tensor:
        """What of this pass the window will need, one entry per row (`keep`: rows each lane committed); may
        update the carry at once."""
        raise NotImplementedError

    def project(self, raw: torch.Tensor, positions: torch.Tensor):
        """Rows of `raw_rows` -> (keys, values [rows, layers, kv], the rows' carry vectors or None)."""
        raise NotImplementedError

    def rows_project(self) -> bool:
        """Whether `project` takes each row alone (so a slot's rows may be projected apart from the others' and
        later: a checkpoint keeps them unprojected); a backend whose rows depend on the rows before them in the
        queue (dflash2 version 3 pairs each with the feature before it) says False."""
        return True

    def carry_in_rows(self) -> bool:
        """Whether the carried vector comes out of `project` (else the backend moves it as rows are observed)."""
        return False

    def claim(self, state: SlotState, lanes) -> None:
        """A lane new to its slot starts from an empty window and a zero carry; the rows still queued for the
        slot's previous lane are dropped unprojected (that lane has ended: a checkpoint of it copied them)."""
        state.queue.drop(lane.slot for lane in lanes if state.window.owners[lane.slot] not in (None, lane))
        state.claim(lanes)

    @torch.no_grad()
    def observe(self, state, lanes, batch, out, committed_len):
        self.claim(state, lanes)
        state.queue.add(
            [lane.slot for lane in lanes],
            batch.lane_rows,
            committed_len,
            batch.positions,
            self.raw_rows(state, batch, out, committed_len),
        )
        if state.queue.held_rows >= self.PENDING_ROWS:
            self.flush(state)

    def backlog(self, state: SlotState, lanes) -> tuple[int, ...]:
        """Rows queued for each lane's slot (rows of a slot's previous lane do not count: claiming drops them)."""
        return tuple(
            state.queue.queued_rows(lane.slot) if state.window.owners[lane.slot] in (None, lane) else 0
            for lane in lanes
        )

    def catch_up(self, state: SlotState, lanes=None) -> None:
        """Project the queued rows of `lanes` (None: every lane), as their next proposal would first."""
        if lanes is None:
            self.flush(state)
        elif lanes:
            self.claim(state, lanes)
            self.flush(state, {lane.slot for lane in lanes})

    @torch.no_grad()
    def flush(self, state: SlotState, slots=None) -> None:
        """Project the pending rows of `slots` (None: all) in one product, then append them all at once as pass
        after pass would (`Window.append_rows`: a fixed number of ops, not a dozen small ones per queued pass)."""
        rows = state.queue.take(slots)
        if rows is not None:
            self.append(state, rows)

    def append(self, state: SlotState, p: Rows) -> None:
        """Project `p`'s rows and append them to the window (and move the carry where projecting gives it)."""
        k, v, carry = self.project(p.raw, p.positions)
        rows = PassRows.of([(p.slots, p.lane_rows, p.keep)], state.carry.shape[0])
        state.window.append_rows(rows, k, v)
        if carry is not None:
            state.carry_rows(rows, carry)

    def project_at(self, raw: torch.Tensor, positions: torch.Tensor):
        """`project` for rows held anywhere (a checkpoint on the host tier): run on the drafter's device."""
        dev = self.embed.device
        return self.project(raw.to(dev), positions.to(dev))

    @torch.no_grad()
    def snapshot(self, state: SlotState, slot: int, base: WindowSnapshot | None = None) -> WindowSnapshot:
        """The slot's window and carried vector, its rows still queued kept unprojected (`Window.snapshot`);
        with `base` (the slot history's previous snapshot), only what was appended since it is copied."""
        if not self.rows_project():
            self.flush(state, (slot,))
            return state.window.snapshot(slot, state.carry[slot], base)
        queued = state.queue.committed(slot)
        tail = Unprojected(*queued, self.project_at) if queued is not None else None
        return state.window.snapshot(slot, state.carry[slot], base, tail, self.carry_in_rows())

    @torch.no_grad()
    def restore(self, state: SlotState, lane, snap: WindowSnapshot) -> None:
        state.queue.drop((lane.slot,))  # rows still queued for the slot belong to its previous lanes
        state.window.restore(lane.slot, snap, lane)
        state.carry[lane.slot].copy_(snap.carry)

    @torch.no_grad()
    def propose(self, lanes, anchors, limits, state) -> Proposal:
        """Drafts for the lanes with a limit above 0 (`draft`), the others' rows -1: a lane that does not draft
        costs nothing and its queued rows stay unprojected."""
        live = [i for i, n in enumerate(limits) if n > 0]
        if not live:
            return empty_proposal(len(lanes), anchors.device)
        if len(live) == len(lanes):
            self.catch_up(state, lanes)
            return self.within_limits(self.draft(lanes, anchors, limits, state), limits)
        at = torch.tensor(live, dtype=torch.int64).to(anchors.device)
        some = [lanes[i] for i in live]
        self.catch_up(state, some)
        drafts = self.draft(some, anchors.index_select(0, at), tuple(limits[i] for i in live), state)
        return self.within_limits(drafts.new_full((len(lanes), drafts.shape[1]), -1).index_copy_(0, at, drafts), limits)

    def draft(self, lanes, anchors, limits, state) -> torch.Tensor:
        """Drafts [lanes, max(limits)] of lanes that each draft, their windows caught up."""
        raise NotImplementedError

    @staticmethod
    def within_limits(drafts: torch.Tensor, limits) -> Proposal:
        """Drafts [lanes, width] with everything past each lane's limit set to -1 (no draft)."""
        keep = (
            torch.arange(drafts.shape[1], device=drafts.device)[None] < torch.tensor(limits).to(drafts.device)[:, None]
        )
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
