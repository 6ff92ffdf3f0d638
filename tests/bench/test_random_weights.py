"""bench/random_weights.py: an artifact of a given shape with random values loads as a target and runs a pass."""

from __future__ import annotations

import json

import torch

from speclane.bench import cuda_graphs, random_weights
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts  # noqa: F401  (fixture)


def _runs(path) -> None:
    target = Target.load(path, dtype=torch.float32)
    with torch.no_grad():
        results = cuda_graphs.measure(target, lanes=1, rows=(1, 2), context=8, max_len=32, reps=1, dry=True)
    assert all(x["equal"] for x in results)


def test_like_keeps_the_shapes_names_and_config_with_new_values(artifacts, tmp_path):
    src = artifacts["llama"][0]
    assert random_weights.main(["--like", str(src), "--out", str(tmp_path)]) == 0
    assert random_weights.shapes_of(tmp_path).keys() <= random_weights.shapes_of(src).keys()
    assert random_weights.shapes_of(tmp_path) == {
        k: v for k, v in random_weights.shapes_of(src).items() if k in random_weights.shapes_of(tmp_path)
    }
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"
    _runs(tmp_path)


def test_hybrid_has_three_gated_deltanet_layers_to_one_attention_layer(tmp_path):
    assert (
        random_weights.main(["--hybrid", "--hidden", "128", "--layers", "4", "--vocab", "64", "--out", str(tmp_path)])
        == 0
    )
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    shapes = random_weights.shapes_of(tmp_path)
    assert shapes["model.layers.3.self_attn.q_proj.weight"][1] == 128 and "model.layers.0.linear_attn.A_log" in shapes
    _runs(tmp_path)


def test_a_shape_alone_travels_and_gives_the_same_artifact_shape(artifacts, tmp_path):
    src = artifacts["llama"][0]
    shape, made = tmp_path / "shape", tmp_path / "made"
    assert random_weights.main(["--like", str(src), "--out", str(shape), "--shape-only"]) == 0
    assert not list(shape.glob("*.safetensors")) and (shape / "shapes.json").is_file()
    assert random_weights.main(["--like", str(shape), "--out", str(made)]) == 0
    assert random_weights.shapes_of(made).items() <= random_weights.shapes_of(src).items()
    _runs(made)


def test_moe_is_a_qwen3_moe_target_of_the_experts_asked_for(tmp_path):
    args = ["--moe", "--hidden", "128", "--layers", "2", "--vocab", "64", "--experts", "8", "--top", "2"]
    assert random_weights.main([*args, "--out", str(tmp_path)]) == 0
    config = json.loads((tmp_path / "config.json").read_text())
    experts = config.get("num_experts", config.get("num_local_experts"))  # transformers' versions differ
    assert (config["model_type"], experts, config["num_experts_per_tok"]) == ("qwen3_moe", 8, 2)
    assert random_weights.shapes_of(tmp_path)["model.layers.1.mlp.experts.7.down_proj.weight"] == [128, 48]
    _runs(tmp_path)
