"""What the two model drafters (`dflash2`, `mtp`) share: their files, their per-slot state, and a proposal's end.

Owns: finding a drafter's files (`options.path`, else the target's artifact, else the shipped assets) and loading
them, the per-slot state both keep (a `Window` of keys and values over the committed positions, plus one carried
vector per slot: the feature or trunk state of the slot's last committed position), zeroing both when a lane takes
a slot, and masking drafts past each lane's limit. Not here: what each drafter computes (`dflash2.py`, `mtp.py`),
the networks and file checks (`stages/models`).
"""
from __future__ import annotations

import attrs
import torch

from stages.contract.resources import Resources
from stages.drafters.base import DraftBackend, Proposal
from stages.models import drafter_weights as dw
from stages.models.drafter_window import Window


def model_files(name: str, options: dict, resources: Resources):
    """(target, weights path, config path) for a model drafter: `options.path`, else the artifact, else assets."""
    target = resources.target
    where = options.get("path") or getattr(target, "artifact_dir", None)
    return (target, *dw.locate(name, where, target.cfg))


def bytes_of(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@attrs.frozen
class SlotState:
    window: Window
    carry: torch.Tensor            # [slots, hidden]: the vector of each slot's last committed position

    def claim(self, lanes) -> None:
        """A lane new to its slot starts from an empty window and a zero carry."""
        for slot in self.window.claim(lanes):
            self.carry[slot].zero_()

    def carry_last(self, batch, rows: torch.Tensor, committed_len) -> None:
        """Carry `rows`' vector [rows, hidden] of each lane's last committed row (row committed_len - 1 of the lane:
        the last of a prefill chunk, of the committed run otherwise); a lane that committed nothing keeps its carry."""
        first = batch.cu_rows[:-1]
        n = committed_len
        last = rows.index_select(0, (first + n - 1).clamp(min=0)).to(self.carry.dtype)
        self.carry.index_copy_(0, batch.slots, torch.where((n > 0)[:, None], last,
                                                           self.carry.index_select(0, batch.slots)))


class ModelBackend(DraftBackend):
    """A drafter with weights: loads its files at start (an ArtifactError names a missing or misshapen one)."""

    option_names = ("path", "window")

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        target, weights, config = model_files(self.name, self.options, resources)
        self.net, self.extra = dw.load(self.name, weights, config, target.cfg, target.dtype, target.device)
        self.files = (weights, config)
        self.target = target
        self.embed, self.lm_head = target.weights.embed, target.weights.lm_head
        self.window = int(self.options.get("window", self.net.cfg.window))

    def window_layers(self) -> int:
        return 1

    def new_state(self, slots, max_len) -> SlotState:
        window = Window(slots, self.window, self.window_layers(), self.net.kv_dim, self.embed.dtype,
                        self.embed.device)
        return SlotState(window, torch.zeros(slots, self.embed.shape[1], dtype=self.embed.dtype,
                                             device=self.embed.device))

    @staticmethod
    def within_limits(drafts: torch.Tensor, limits) -> Proposal:
        """Drafts [lanes, width] with everything past each lane's limit set to -1 (no draft)."""
        keep = torch.arange(drafts.shape[1], device=drafts.device)[None] < torch.tensor(limits).to(drafts.device)[:, None]
        return Proposal(drafts=torch.where(keep, drafts, torch.full_like(drafts, -1)), draft_len=tuple(limits))

    def memory_bytes(self) -> int:
        return bytes_of(self.net.parameters())
