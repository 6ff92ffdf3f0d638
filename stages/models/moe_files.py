"""An expert cache over a MoE artifact's files whatever the family calls its expert tensors.

Owns: `mapped_cache`, the routed experts' slow tier read in place from the files (expert_tiers.MappedTier; on a
GPU read from them once into pinned host memory, expert_tiers.HostTier) with the family's tensor names on disk mapped
onto the names that tier reads (families.canonical_names: Mixtral's
`block_sparse_moe.experts.{j}.w1|w3|w2`), and the fast tier over it. Not here: the tiers and slots themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_cache import ExpertCache, check_budget
from speclane.stages.models.expert_tiers import HostTier, MappedTier
from speclane.stages.models.families import canonical_names


class RenamedTier(MappedTier):
    """MappedTier over files whose tensor names `rename` maps onto Qwen's `mlp.experts.{j}.gate_proj|...`."""

    def __init__(self, path: str | Path, cfg: ModelConfig, dtype: torch.dtype, rename: Callable[[str], str]):
        self._rename = rename
        super().__init__(path, cfg, dtype)

    def _map(self, file: Path) -> dict:
        return {self._rename(name): info for name, info in super()._map(file).items()}


def mapped_cache(
    path: str | Path, cfg: ModelConfig, dtype: torch.dtype, budget_bytes: int, device: torch.device | str = "cpu"
) -> ExpertCache:
    """As `ExpertCache.mapped` (the slots `budget_bytes` buys, over the files read in place), for any MoE family.
    With the model on a GPU the slots are on it and the slow tier is every expert read once into pinned host memory
    (`HostTier`): a GPU cannot compute from a file's pages, and a copy from pinned memory needs no host thread."""
    rename = canonical_names(cfg.model_type)
    slots = check_budget(cfg, budget_bytes, dtype, torch.device(device))
    files = MappedTier(path, cfg, dtype) if rename is None else RenamedTier(path, cfg, dtype, rename)
    if torch.device(device).type == "cpu":
        return ExpertCache(files, slots)
    return ExpertCache(HostTier.read(files, device), slots, device=device)
