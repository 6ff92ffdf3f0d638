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
