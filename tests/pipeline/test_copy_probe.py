"""The copy probe: every routed expert copied into slots once a sweep, as the cache copies a miss, the figure cached
per machine and model and handed to the round model as the CPU's link."""

import pytest
import torch

from speclane.pipeline.runtime import copy_probe
from speclane.pipeline.runtime.plan_figures import probe_machine
from speclane.pipeline.runtime.round_model import TargetFigures
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_cache import expert_bytes
from speclane.stages.models.expert_tiers import StackedTier
from speclane.stages.models.weights import MoeWeights
from tests.models.family_artifacts import family_artifacts  # noqa: F401  (fixtures)
from tests.models.target_artifacts import artifacts  # noqa: F401  (fixtures)


def _tier(layers: int, experts: int, inter: int, hidden: int) -> StackedTier:
    g = torch.Generator().manual_seed(0)
    return StackedTier(
        {
            i: MoeWeights(
                router=torch.randn(experts, hidden, generator=g),
                gate_up=torch.randn(experts, 2 * inter, hidden, generator=g),
                down=torch.randn(experts, hidden, inter, generator=g),
                shared=None,
                shared_gate=None,
            )
            for i in range(layers)
        }
    )


@pytest.mark.parametrize("slots", [1, 3, 40])
def test_a_sweep_copies_every_expert_once(slots):
    tier = _tier(layers=3, experts=5, inter=7, hidden=11)  # 15 experts, 3 x 7 x 11 float32 each
    seconds, written, copies = copy_probe.measure(tier, slots, repeats=2)
    assert copies == 15 and written == 15 * 3 * 7 * 11 * 4 and seconds > 0


def test_bad_slots_are_refused():
    with pytest.raises(ValueError, match="slots and repeats must be at least 1"):
        copy_probe.measure(_tier(1, 2, 3, 4), 0)


@pytest.mark.parametrize("family", ["qwen3_next", "mixtral"])
def test_the_probe_reads_the_files_and_is_cached(artifacts, family_artifacts, family, tmp_path, monkeypatch):  # noqa: F811
    directory = artifacts[family][0] if family in artifacts else family_artifacts[family][0]
    monkeypatch.setattr(copy_probe, "cache_root", lambda: tmp_path)
    cfg = ModelConfig.load(directory)
    first = copy_probe.probe(directory, cfg, "bfloat16")
    assert first.source == "measured now" and first.expert_bytes == expert_bytes(cfg, torch.bfloat16)
    assert first.bytes_per_s == pytest.approx(first.expert_bytes / first.seconds_per_copy)
    (cached,) = (tmp_path / "copy_cost").glob("*.json")

    def no_measuring(*a, **k):
        raise AssertionError("measured again: the cached figure was not read")

    monkeypatch.setattr(copy_probe, "measure", no_measuring)
    figures = {}
    assert copy_probe.link_figure(directory, cfg, "bfloat16", figures) == first.bytes_per_s
    assert (
        figures["link_bytes_per_s"]["value"] == first.bytes_per_s
        and str(cached) in figures["link_bytes_per_s"]["source"]
    )
    # the probe's figure is the machine's link; a dense model has no link at all
    t = TargetFigures(dense_bytes=10**6, row_flops=1e6, expert_bytes=first.expert_bytes)
    assert probe_machine((1, 8), (0.01, 0.02), t, first.bytes_per_s).link == first.bytes_per_s
    assert probe_machine((1, 8), (0.01, 0.02), t).link is None


def test_a_dense_model_has_nothing_to_copy(artifacts):  # noqa: F811
    directory = artifacts["llama"][0]
    with pytest.raises(ValueError, match="dense model; it has no routed experts"):
        copy_probe.probe(directory, ModelConfig.load(directory), "bfloat16")
