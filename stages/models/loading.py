"""Loading a target and its tokenizer from an artifact path, a GGUF file, or the embedded default.

One loader for every caller that needs a model (the CLI, drafter fitting, bench, tests), so the device checks are
written once. Not here: resolving and converting artifacts (`artifact.py`), the model itself (`target.py`).
"""
from __future__ import annotations

import torch

from stages.contract.errors import ConfigError
from stages.models.artifact import resolve
from stages.models.target import Target
from stages.models.tokenizer import Tokenizer


def load_model(model: str | None, dtype: str, device: str = "cpu", quant: str = "none"):
    """(target, tokenizer) for an artifact path, a GGUF file, or the embedded default; `quant="int8"` stores the
    linear layers as int8 (stages/models/quantize.py)."""
    directory = resolve(model)
    try:
        torch_device = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"--device: '{device}' is not a torch device (use cpu, cuda or cuda:N)") from exc
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this torch build or machine has no CUDA device; use --device cpu")
    target = Target.load(directory, dtype=getattr(torch, dtype), device=torch_device, quant=quant)
    return target, Tokenizer.load(directory)
