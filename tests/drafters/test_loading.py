"""Loading the model drafters: a missing companion or a wrong shape refuses the start with the file, the tensor
and the expected shape named; with speculation off nothing is loaded."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from speclane.pipeline.framework.spec import load_spec, with_params
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs
from speclane.stages.contract.errors import ArtifactError
from speclane.stages.contract.resources import Resources
from speclane.stages.draft import Draft
from speclane.stages.drafters import build_backend
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.target import Target
from tests.drafters.conftest import write_drafter
from tests.round.conftest import IdTokenizer


def backend(name, target, directory=None, head="full", **options):
    if directory is not None:
        options["path"] = str(directory)
    return build_backend(name, options, head, Resources(target=target))


@pytest.mark.parametrize("name", ["mtp", "dflash2"])
def test_a_missing_companion_is_refused_naming_the_file(tiny, tmp_path, name):
    with pytest.raises(
        ArtifactError,
        match=rf"{tmp_path}/{name}\.safetensors: missing; --spec-backend {name} "
        rf"needs its companion files",
    ):
        backend(name, tiny, tmp_path)


def test_the_artifact_directory_is_where_companions_are_looked_up(tiny):
    with pytest.raises(ArtifactError, match=rf"{tiny.artifact_dir}/mtp\.safetensors: missing"):
        backend("mtp", tiny)


@pytest.mark.parametrize("name", ["mtp", "dflash2"])
def test_a_tensor_of_the_wrong_shape_is_named_with_its_expected_shape(tiny, tmp_path, name):
    write_drafter(name, tiny, tmp_path)
    file = tmp_path / f"{name}.safetensors"
    tensors = load_file(file)
    victim = sorted(k for k in tensors if k.endswith("o_proj.weight"))[0]
    shape = list(tensors[victim].shape)
    tensors[victim] = torch.zeros(shape[0], shape[1] + 1, dtype=tensors[victim].dtype)
    save_file(tensors, str(file))
    with pytest.raises(ArtifactError) as err:
        backend(name, tiny, tmp_path)
    assert str(err.value) == (f"{file}: tensor '{victim}' has shape {[shape[0], shape[1] + 1]}, expected {shape}")


def test_a_missing_tensor_is_named(tiny, tmp_path):
    write_drafter("mtp", tiny, tmp_path)
    file = tmp_path / "mtp.safetensors"
    tensors = load_file(file)
    del tensors["mtp.fc.weight"]
    save_file(tensors, str(file))
    h = tiny.cfg.hidden_size
    with pytest.raises(
        ArtifactError, match=rf"tensor 'mtp\.fc\.weight' is missing \(expected shape \[{h}, {2 * h}\]\)"
    ):
        backend("mtp", tiny, tmp_path)


def test_a_drafter_fitted_to_another_shape_is_refused_naming_the_key(tiny, tmp_path):
    write_drafter("dflash2", tiny, tmp_path)
    config = tmp_path / "dflash2.json"
    raw = json.loads(config.read_text())
    raw["hidden_size"] += 2
    config.write_text(json.dumps(raw))
    with pytest.raises(
        ArtifactError,
        match=rf"{config}: key 'hidden_size' is {raw['hidden_size']}, the target has "
        rf"{tiny.cfg.hidden_size}",
    ):
        backend("dflash2", tiny, tmp_path)


def test_an_unknown_config_key_is_refused(tiny, tmp_path):
    write_drafter("mtp", tiny, tmp_path)
    config = tmp_path / "mtp.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_layerz": 2}))
    with pytest.raises(ArtifactError, match=r"(?s)mtp\.json: not a valid mtp config .*num_layerz"):
        backend("mtp", tiny, tmp_path)


def test_dflash2_sets_the_target_taps_and_reports_its_memory(tiny, tmp_path):
    net = write_drafter("dflash2", tiny, tmp_path)
    taps = tiny.hidden_taps
    try:
        full = backend("dflash2", tiny, tmp_path)
        assert full.taps == net.cfg.target_layers  # declared by the drafter ...
        options = {"dflash2": {"path": str(tmp_path)}}
        built = Draft(backend="dflash2", options=options).prepare(Resources(target=tiny))
        assert tiny.hidden_taps == taps and built["drafter"].taps == full.taps  # built by its stage, target untouched
        draft = {"draft": {"backend": "dflash2", "options": options, "head": "full"}}
        own = Target.load(tiny.artifact_dir, dtype=tiny.dtype)  # an engine of its own: the shared target stays as is
        spec = with_params(load_spec("verify"), {"draft": draft["draft"], "anchor_gather": {"plan": "fixed"}})
        eng = Engine(own, IdTokenizer(), spec=spec, max_lanes=1, max_len=64)
        assert own.hidden_taps == eng.drafter.taps == full.taps  # ... and applied to the target by the engine
        assert tiny.cfg.num_layers - 1 in full.taps  # the last layer: what the target's head reads
        params = sum(p.numel() for p in net.parameters())
        stacked = sum(2 * layer.self_attn.k_proj.weight.numel() for layer in net.layers)  # the window's k|v copy
        assert full.memory_bytes() == (params + stacked) * 4  # float32 target, float32 drafter
        short = backend("dflash2", tiny, tmp_path, head="shortlist", shortlist_tokens=64)
        h = tiny.cfg.hidden_size
        assert short.memory_bytes() - full.memory_bytes() == 64 * 8 + 64 * h + 64 * 4  # ids, int8 rows, scales
    finally:
        tiny.hidden_taps = taps


def test_unknown_options_are_refused(tiny, tmp_path):
    write_drafter("mtp", tiny, tmp_path)
    message = r"backend 'mtp' options are: path, window, shortlist_tokens, lookup_trust; not \['min_n'\]"
    with pytest.raises(ValueError, match=message):
        backend("mtp", tiny, tmp_path, min_n=5)


def test_speculation_off_loads_no_drafter(tiny):
    eng = Engine(tiny, IdTokenizer(), knobs=SpecKnobs(backend="none"), max_lanes=1, max_len=64)
    assert eng.drafter.memory_bytes() == 0 and eng.drafter_state is None


def test_the_shipped_drafters_match_the_embedded_default():
    """The files in stages/models/assets load against the default model's shapes (no model needed)."""
    for name in ("dflash2", "mtp"):
        weights, config = dw.files(name, dw.ASSETS)
        assert weights.is_file() and config.is_file(), f"{weights} is not shipped"
        raw = json.loads(config.read_text())
        assert (raw["hidden_size"], raw["vocab_size"]) == (576, 49152)
        assert weights.stat().st_size < 30 * 2**20
