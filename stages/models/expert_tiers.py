"""The slow tier of an expert cache: where every routed expert's weights stay while they are not in a slot.

Owns: `StackedTier` (each MoE layer's stacked tensors as loaded into memory), `MappedTier` (the artifact's
safetensors files memory-mapped, read in place: the routed experts are never loaded, a miss reads one expert's
pages straight into its slot) and `HostTier` (the slow tier of a model on a GPU: every routed expert read once from
the files into pinned host memory, so a miss is one asynchronous copy over the host link). Each gives one expert
as its gate [inter, hidden], up [inter, hidden] and down [hidden, inter], in whatever dtype it holds it; the slot's
copy converts (`speclane.kernels.expert_copy`). Each also gives, where it holds it so, an expert in a slot's own
layout (`fused`: gate_up [2 * inter, hidden] and down, contiguous, in the compute dtype), which can be computed
where it lies without a copy, and each MoE layer's router (`router`, [experts, hidden] in the compute dtype) for a
look-ahead.
A missing tensor, a wrong shape or an unreadable dtype is an ArtifactError naming the file and the tensor.
Not here: the slots (`expert_cache.py`), reading the rest of the model (`weights.py`).
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path
from typing import NamedTuple

import torch

from speclane.kernels.expert_copy import copy_expert
from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.weights import MoeWeights

Tensor = torch.Tensor

# safetensors dtype names a routed expert may be stored in
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


class StackedTier:
    """The slow tier as loaded: per MoE layer its stacked gate_up [experts, 2 * inter, hidden] and down
    [experts, hidden, inter]; `parts` gives one expert's gate, up and down as views."""

    def __init__(self, layers: dict[int, MoeWeights | _HostLayer]):
        self.layers = layers
        first = next(iter(layers.values()))
        self.experts, two_inter, self.hidden = first.gate_up.shape
        self.inter, self.dtype, self.device = two_inter // 2, first.gate_up.dtype, first.gate_up.device

    def parts(self, layer: int, expert: int) -> tuple[Tensor, Tensor, Tensor]:
        w = self.layers[layer]
        return w.gate_up[expert, : self.inter], w.gate_up[expert, self.inter :], w.down[expert]

    def fused(self, layer: int, expert: int) -> tuple[Tensor, Tensor]:
        w = self.layers[layer]
        return w.gate_up[expert], w.down[expert]

    def router(self, layer: int) -> Tensor:
        return self.layers[layer].router


class _HostLayer(NamedTuple):
    router: Tensor  # [experts, hidden] on the model's device (the look-ahead runs there)
    gate_up: Tensor  # [experts, 2 * inter, hidden] in host memory
    down: Tensor  # [experts, hidden, inter] in host memory


class HostTier(StackedTier):
    """The slow tier of a model on a GPU: per MoE layer its experts stacked in host memory in the compute dtype
    (pinned where a GPU is present, so a slot's copy is one DMA the host does not wait for), read once from the
    artifact's files; the routers on the model's device. Host memory must hold every routed expert."""

    @classmethod
    def read(cls, files: MappedTier, device: torch.device | str) -> HostTier:
        pin = torch.cuda.is_available()
        e, i, h = files.experts, files.inter, files.hidden
        layers = {}
        for layer in sorted(files.layers):
            gate_up = torch.empty(e, 2 * i, h, dtype=files.dtype, pin_memory=pin)
            down = torch.empty(e, h, i, dtype=files.dtype, pin_memory=pin)
            for j in range(e):
                copy_expert(gate_up[j], down[j], *files.parts(layer, j))
            layers[layer] = _HostLayer(files.router(layer).to(device), gate_up, down)
        return cls(layers)


class MappedTier:
    """The slow tier read in place from an artifact directory's `*.safetensors` (HF names, `mlp.experts.{j}.
    gate_proj | up_proj | down_proj`): every routed expert's three tensors as views of the mapped files, checked
    against the config at construction. `dtype` is the slots' (the compute dtype), whatever the files hold."""

    def __init__(self, path: str | Path, cfg: ModelConfig, dtype: torch.dtype):
        path = Path(path)
        self.experts, self.hidden, self.inter = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.dtype, self.device = dtype, torch.device("cpu")
        self._maps: list[mmap.mmap] = []  # kept open: the views below read from them
        where: dict[str, tuple[Path, int, dict]] = {}
        for file in sorted(path.glob("*.safetensors")):
            for name, info in self._map(file).items():
                where.setdefault(name, info)
        self.layers: dict[int, list[tuple[Tensor, Tensor, Tensor]]] = {}
        self._routers: dict[int, Tensor] = {}
        self._fused: dict[int, list[tuple[Tensor, Tensor] | None]] = {}
        h, i = self.hidden, self.inter
        for layer in (n for n, moe in enumerate(cfg.moe_layers) if moe):
            mp = f"{cfg.tensor_prefix}layers.{layer}.mlp."
            names = [
                [f"{mp}experts.{j}.{part}_proj.weight" for part in ("gate", "up", "down")] for j in range(self.experts)
            ]
            self.layers[layer] = [
                (self._view(where, g, (i, h)), self._view(where, u, (i, h)), self._view(where, d, (h, i)))
                for g, u, d in names
            ]
            self._fused[layer] = [
                self._span(where, g, u, parts[2]) for (g, u, _), parts in zip(names, self.layers[layer])
            ]
            self._routers[layer] = self._view(where, f"{mp}gate.weight", (self.experts, h))

    def parts(self, layer: int, expert: int) -> tuple[Tensor, Tensor, Tensor]:
        return self.layers[layer][expert]

    def fused(self, layer: int, expert: int) -> tuple[Tensor, Tensor] | None:
        """The expert as gate_up [2 * inter, hidden] and down, views of the mapped file, when the file holds it in
        the compute dtype with up's bytes right after gate's (as safetensors lays out `gate_proj`, `up_proj`);
        None otherwise (then only a copy gives it in a slot's layout)."""
        return self._fused[layer][expert]

    def router(self, layer: int) -> Tensor:
        """Layer `layer`'s router [experts, hidden] in the compute dtype (converted once, on first use)."""
        w = self._routers[layer]
        if w.dtype != self.dtype:
            w = self._routers[layer] = w.to(self.dtype)
        return w

    def _map(self, file: Path) -> dict[str, tuple[Path, int, dict]]:
        """name -> (file, first data byte, header entry) for every tensor of one safetensors file."""
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
            self._maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))  # private: never written back
        header.pop("__metadata__", None)
        return {name: (file, len(self._maps) - 1, {**info, "start": 8 + size}) for name, info in header.items()}

    def _view(self, where: dict, name: str, shape: tuple[int, int]) -> Tensor:
        if name not in where:
            raise ArtifactError(f"{self._dir(where)}: tensor '{name}' is missing (expected shape {list(shape)})")
        file, m, info = where[name]
        if tuple(info["shape"]) != shape:
            raise ArtifactError(f"{file}: tensor '{name}' has shape {info['shape']}, expected {list(shape)}")
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ArtifactError(
                f"{file}: tensor '{name}' is {info['dtype']}; a routed expert read in place must be "
                f"one of {', '.join(_DTYPES)} (or leave --expert-cache unset)"
            )
        begin = info["start"] + info["data_offsets"][0]
        return torch.frombuffer(self._maps[m], dtype=dtype, count=shape[0] * shape[1], offset=begin).view(shape)

    def _span(self, where: dict, gate: str, up: str, down: Tensor) -> tuple[Tensor, Tensor] | None:
        """gate and up as one [2 * inter, hidden] view, with down, where the file allows it (see `fused`)."""
        (_, m, g), (_, mu, u) = where[gate], where[up]
        if m != mu or _DTYPES[g["dtype"]] != self.dtype or down.dtype != self.dtype:
            return None
        if g["data_offsets"][1] != u["data_offsets"][0]:
            return None
        count, begin = 2 * self.inter * self.hidden, g["start"] + g["data_offsets"][0]
        gate_up = torch.frombuffer(self._maps[m], dtype=self.dtype, count=count, offset=begin)
        return gate_up.view(2 * self.inter, self.hidden), down

    @staticmethod
    def _dir(where: dict) -> Path | str:
        return next(iter(where.values()))[0].parent if where else "the artifact"
