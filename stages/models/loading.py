"""Loading a target and its tokenizer from an artifact path, a GGUF file, or the embedded default.

One loader for every caller that needs a model (the CLI, drafter fitting, bench, tests), so the device checks are
written once. Not here: resolving and converting artifacts (`artifact.py`), the model itself (`target.py`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.artifact import Progress, resolve
from speclane.stages.models.target import Target
from speclane.stages.models.tokenizer import Tokenizer


def load_model(
    model: str | None,
    dtype: str,
    device: str = "cpu",
    quant: str = "none",
    progress: Progress | None = None,
    expert_cache_bytes: int | None = None,
):
    """(target, tokenizer) for an artifact path, a GGUF file, or the embedded default; `quant="int8"` stores the
    linear layers as int8 (stages/models/quantize.py); `expert_cache_bytes` gives a MoE target an expert cache of
    that budget (stages/models/expert_cache.py). `progress(what, done, total)` hears of a GGUF conversion
    (tensor by tensor) and of the weights' load (0 of 1, then 1 of 1)."""
    directory = resolve(model, progress=progress)
    try:
        torch_device = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"--device: '{device}' is not a torch device (use cpu, cuda or cuda:N)") from exc
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this torch build or machine has no CUDA device; use --device cpu")
    name = Path(model).name if model else "the default model"
    what = f"loading {name} ({dtype}{', int8' if quant == 'int8' else ''}, {torch_device})"
    if progress is not None:
        progress(what, 0, 1)
    target = Target.load(
        directory, dtype=getattr(torch, dtype), device=torch_device, quant=quant, expert_cache_bytes=expert_cache_bytes
    )
    tokenizer = Tokenizer.load(directory)
    if progress is not None:
        progress(what, 1, 1)
    return target, tokenizer
