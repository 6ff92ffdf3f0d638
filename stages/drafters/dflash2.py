"""The `dflash2` backend: a five-layer block drafter grafted into the target's artifact.

It reads the target's own hidden states at several layers (it sets `target.hidden_taps` to the layers its file
names) over a window of the last 2,048 committed positions, and proposes up to k tokens after each anchor in one
non-causal pass over a block of mask positions (`stages/models/dflash2_net.py`). Proposals are greedy (a one-hot q:
the accept stage uses the exact sample-and-compare rule, so sampling keeps the target's distribution). The drafter is
loaded only when this backend is chosen, so speculation off costs nothing. Head `full` (default) proposes through the
target's own output head; `shortlist` through a 4-bit copy of the head's rows for the most frequent tokens
(`shortlist_tokens`, counted while fitting), whose bytes `memory_bytes` reports.
Options: `path` (a directory holding dflash2.safetensors/json instead of the artifact's), `window`,
`shortlist_tokens`. Not here: the network, file checks (`stages/models`), the fitting (`pipeline/fit.py`).
"""
from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from stages.drafters.base import DraftBackend, Proposal, empty_proposal
from stages.models import drafter_weights as dw
from stages.models.drafter_window import Window
from stages.models.shortlist import Shortlist

def model_files(name: str, options: dict, resources: dict):
    """(target, weights path, config path) for a model drafter: `options.path`, else the artifact, else assets."""
    target = resources["target"]
    where = options.get("path") or resources.get("artifact_dir") or getattr(target, "artifact_dir", None)
    return (target, *dw.locate(name, where, target.cfg))


def bytes_of(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@attrs.frozen
class DFlash2State:
    window: Window
    last: torch.Tensor             # [slots, hidden]: the feature of each slot's last committed position


class DFlash2(DraftBackend):
    name = "dflash2"
    default_rows = 0
    option_names = ("path", "window", "shortlist_tokens")

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        target, weights, config = model_files(self.name, self.options, resources)
        self.net, extra = dw.load(self.name, weights, config, target.cfg, target.dtype, target.device)
        self.files = (weights, config)
        self.taps = tuple(self.net.cfg.target_layers)
        target.hidden_taps = self.taps
        self.embed, self.lm_head = target.weights.embed, target.weights.lm_head
        self.window = int(self.options.get("window", self.net.cfg.window))
        self.shortlist = None
        if head == "shortlist":
            count = int(self.options.get("shortlist_tokens", self.net.cfg.shortlist_tokens))
            ranks = extra.get("shortlist.ranks")
            self.shortlist = Shortlist.build(self.lm_head, ranks, count)

    def new_state(self, slots, max_len):
        window = Window(slots, self.window, self.net.cfg.num_layers, self.net.kv_dim, self.embed.dtype,
                        self.embed.device)
        return DFlash2State(window, torch.zeros(slots, self.embed.shape[1], dtype=self.embed.dtype,
                                                device=self.embed.device))

    def _claim(self, state: DFlash2State, lanes) -> None:
        for slot in state.window.claim(lanes):
            state.last[slot].zero_()

    @torch.no_grad()
    def observe(self, state, lanes, batch, out, committed_len, prefill):
        self._claim(state, lanes)
        feats = self.net.features(out.taps)                                    # [rows, hidden]
        k, v = self.net.context_kv(feats, batch.positions)                    # [rows, layers, kv]
        state.window.append(batch.slots, k, v, batch.lane_rows, None if prefill else committed_len)
        first = batch.cu_rows[:-1]
        n = batch.cu_rows[1:] - first if prefill else committed_len
        last = torch.where((n > 0)[:, None], feats.index_select(0, (first + n - 1).clamp(min=0)),
                           state.last.index_select(0, batch.slots))
        state.last.index_copy_(0, batch.slots, last.to(state.last.dtype))

    @torch.no_grad()
    def propose(self, lanes, anchors, limits, state):
        width = max(limits, default=0)
        if width == 0:
            return empty_proposal(len(lanes), anchors.device)
        self._claim(state, lanes)
        slots = torch.tensor([lane.slot for lane in lanes], dtype=torch.int64).to(anchors.device)
        start = torch.tensor([lane.kv_len for lane in lanes], dtype=torch.int64).to(anchors.device)
        k, v, valid = state.window.read(slots, max(lane.kv_len for lane in lanes))
        states = self.net.block(self.embed[anchors], state.last.index_select(0, slots), start, k, v,
                                valid)[:, 1:width + 1]                         # [lanes, width, hidden]
        # Flat rows before the head: a bf16 linear of a [lanes, width, hidden] slice went through bmm and copied the
        # whole transposed head every round (222 ms of a 245 ms proposal, one thread, torch 2.13.0, this CPU).
        flat = states.reshape(-1, states.shape[-1]).contiguous()
        if self.shortlist is not None:
            drafts = self.shortlist.argmax(flat).view(len(lanes), width)
        else:
            drafts = F.linear(flat, self.lm_head).argmax(-1).view(len(lanes), width)
        keep = torch.arange(width, device=drafts.device)[None] < torch.tensor(limits).to(drafts.device)[:, None]
        return Proposal(drafts=torch.where(keep, drafts, torch.full_like(drafts, -1)), draft_len=tuple(limits))

    def memory_bytes(self) -> int:
        head = self.shortlist.memory_bytes() if self.shortlist is not None else 0
        return bytes_of(self.net.parameters()) + head


BACKEND = DFlash2
