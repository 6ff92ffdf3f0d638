"""Bad artifacts are refused with an ArtifactError that names the file, the key or tensor, and the expected shape.
One defect per fixture."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from target_artifacts import artifacts  # noqa: F401  (fixture)

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.target import Target


@pytest.fixture
def llama_copy(artifacts, tmp_path):
    path = tmp_path / "llama"
    shutil.copytree(artifacts["llama"][0], path)
    return path


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del cfg[key]
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(path, drop=(), replace=None):
    file = path / "model.safetensors"
    tensors = {k: v for k, v in load_file(file).items() if k not in drop}
    tensors.update(replace or {})
    save_file(tensors, file, metadata={"format": "pt"})


def test_unknown_model_type(llama_copy):
    _edit_config(llama_copy, model_type="lama")
    with pytest.raises(ArtifactError) as e:
        Target.load(llama_copy)
    assert str(e.value) == (
        f"{llama_copy}/config.json: unknown model_type 'lama' (did you mean \"llama\"?); "
        "supported: llama, qwen3_5_text, qwen3_5, qwen3_next, qwen3, qwen2, mistral, qwen3_moe, mixtral, qwen2_moe, "
        "gemma3_text, gemma3"
    )


def test_missing_config_key(llama_copy):
    _edit_config(llama_copy, hidden_size=None)
    with pytest.raises(ArtifactError, match="^" + str(llama_copy) + "/config.json: missing key 'hidden_size'$"):
        Target.load(llama_copy)


def test_missing_tensor(llama_copy):
    _edit_tensors(llama_copy, drop={"model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(ArtifactError) as e:
        Target.load(llama_copy)
    assert (
        str(e.value) == f"{llama_copy}: tensor 'model.layers.1.mlp.up_proj.weight' is missing (expected shape [72, 42])"
    )


def test_wrong_shape(llama_copy):
    _edit_tensors(llama_copy, replace={"model.norm.weight": torch.ones(41)})
    with pytest.raises(ArtifactError) as e:
        Target.load(llama_copy)
    assert str(e.value) == f"{llama_copy}/model.safetensors: tensor 'model.norm.weight' has shape [41], expected [42]"


def test_good_copy_loads(llama_copy):
    """The fixtures above differ from a loadable artifact by their one defect only."""
    assert Target.load(llama_copy).cfg.hidden_size == 42
