"""An expert cache over a MoE artifact's files whatever the family calls its expert tensors.

Owns: `mapped_cache`, the routed experts' slow tier read in place from the files (expert_tiers.MappedTier) with the
family's tensor names on disk mapped onto the names that tier reads (families.canonical_names: Mixtral's
`block_sparse_moe.experts.{j}.w1|w3|w2`), and the fast tier over it. Not here: the tiers and slots themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_cache import ExpertCache, check_budget
from speclane.stages.models.expert_tiers import MappedTier
from speclane.stages.models.families import canonical_names


class RenamedTier(MappedTier):
    """MappedTier over files whose tensor names `rename` maps onto Qwen's `mlp.experts.{j}.gate_proj|...`."""

    def __init__(self, path: str | Path, cfg: ModelConfig, dtype: torch.dtype, rename: Callable[[str], str]):
        self._rename = rename
        super().__init__(path, cfg, dtype)

    def _map(self, file: Path) -> dict:
        return {self._rename(name): info for name, info in super()._map(file).items()}


def mapped_cache(path: str | Path, cfg: ModelConfig, dtype: torch.dtype, budget_bytes: int) -> ExpertCache:
    """As `ExpertCache.mapped` (the slots `budget_bytes` buys, over the files read in place), for any MoE family."""
    rename = canonical_names(cfg.model_type)
    if rename is None:
        return ExpertCache.mapped(path, cfg, dtype, budget_bytes)
    slots = check_budget(cfg, budget_bytes, dtype, torch.device("cpu"))
    return ExpertCache(RenamedTier(path, cfg, dtype, rename), slots)
