"""Where the model drafters' files live, and reading and writing them with every problem named.

Owns: the companion files of an artifact (`dflash2.safetensors` + `dflash2.json`, `mtp.safetensors` + `mtp.json`, beside
`config.json`; docs/artifacts.md), the fallback to the fitted files shipped for the embedded default model in
`stages/models/assets/` (used for any target whose shapes match the ones they were fitted to: a variant of the default
loads them, a mismatch in weights only lowers acceptance), checking a file against its config and the target (an
ArtifactError names the file, the key or tensor, and the expected shape), the shape a freshly fitted drafter takes for a
target, and the bf16 export. Not here: the nets' math (`*_net.py`), fitting (`stages/fitting/fit.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import safe_open
from safetensors.torch import save_file

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.dflash2_net import DFlash2Config, DFlash2Net, default_layers
from speclane.stages.models.mtp_net import MtpConfig, MtpNet

ASSETS = Path(__file__).parent / "assets"
CONFIGS = {"dflash2": (DFlash2Config, DFlash2Net), "mtp": (MtpConfig, MtpNet)}
FRESH_DFLASH2_VERSION = 5  # what fit-drafter makes; 2, 3 and 4 files still load and draft as they were fitted
EXTRA = {"dflash2": {"shortlist.ranks"}, "mtp": {"shortlist.ranks"}}  # tensors stored beside the net's own


def files(backend: str, directory: Path) -> tuple[Path, Path]:
    return directory / f"{backend}.safetensors", directory / f"{backend}.json"


def _shapes(tcfg: ModelConfig) -> dict:
    return dict(
        hidden_size=tcfg.hidden_size,
        num_heads=tcfg.num_heads,
        num_kv_heads=tcfg.num_kv_heads,
        head_dim=tcfg.head_dim,
        rms_norm_eps=tcfg.rms_norm_eps,
        rope_theta=tcfg.rope_theta,
        vocab_size=tcfg.vocab_size,
    )


def new_net(backend: str, tcfg: ModelConfig, **fields):
    """A freshly initialised drafter shaped for the target (fitting starts here); `fields` override dflash2's
    config (`version`, `window`, ...), so the modules are built for them. A fresh dflash2 is version 4 (its block
    input fused by `block_fc`; issue 18)."""
    if backend == "dflash2":
        inter = -(-tcfg.hidden_size * 4 // 3 // 64) * 64
        cfg = DFlash2Config(
            **{
                **_shapes(tcfg),
                "intermediate_size": inter,
                "version": FRESH_DFLASH2_VERSION,
                "target_layers": default_layers(tcfg.num_layers),
                **fields,
            }
        )
        net = DFlash2Net(cfg)
    else:
        net = MtpNet(MtpConfig(**_shapes(tcfg), intermediate_size=tcfg.intermediate_size))
    depth = getattr(net.cfg, "num_layers", 1)
    for name, p in net.named_parameters():
        if p.dim() == 2:
            std = 0.02 / (2 * depth) ** 0.5 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            torch.nn.init.normal_(p, std=std)
    if backend == "dflash2":
        torch.nn.init.normal_(net.mask_embedding, std=0.02)
    return net


@torch.no_grad()
def upgrade(net, version: int):
    """A dflash2 net as file `version`, to go on fitting: a version 4 net becomes version 5 with its prompt-lookup
    tensors zero, so it drafts exactly as before until the fit teaches it to read the candidates. Any other change
    of version is refused (the layouts differ)."""
    if net.cfg.version == version:
        return net
    if (net.cfg.version, version) != (4, 5):
        raise ArtifactError(
            f"dflash2: a version {net.cfg.version} file cannot go on fitting as version {version} "
            f"(only 4 -> 5 keeps the layout); pass --version {net.cfg.version} to go on fitting it "
            f"as it is, or fit version {version} from scratch (no --init)"
        )
    new = DFlash2Net(net.cfg.model_copy(update={"version": version}))
    missing = set(new.load_state_dict(net.state_dict(), strict=False).missing_keys)
    for name, p in new.named_parameters():
        if name in missing:
            p.zero_()
    return new.to(next(net.parameters()).dtype).train(net.training).requires_grad_(True)


def fit_taps(tcfg: ModelConfig) -> tuple[int, ...]:
    """Target layers recorded while fitting (both drafters share one data set): dflash2's, which end with the last
    layer, whose output is also mtp's input (`PassOutput.hidden`)."""
    return default_layers(tcfg.num_layers)


def locate(backend: str, artifact_dir: Path | None, tcfg: ModelConfig) -> tuple[Path, Path]:
    """The drafter's files: in the artifact directory, else the shipped ones when fitted to these shapes."""
    if artifact_dir is not None:
        weights, config = files(backend, Path(artifact_dir))
        if weights.is_file() or config.is_file():
            return weights, config
    weights, config = files(backend, ASSETS)
    if config.is_file():
        fitted = _shapes_of(config)
        if fitted == {k: v for k, v in _shapes(tcfg).items() if k in fitted}:
            return weights, config
    where = Path(artifact_dir) if artifact_dir is not None else Path("<artifact>")
    raise ArtifactError(
        f"{files(backend, where)[0]}: missing; --spec-backend {backend} needs its companion files "
        f"{backend}.safetensors and {backend}.json beside the artifact's config.json (make them with "
        f"`speclane fit-drafter --backend {backend} --out {where}`), or choose another --spec-backend."
    )


def _shapes_of(config: Path) -> dict:
    raw = json.loads(config.read_text())
    return {k: raw[k] for k in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim") if k in raw}


def load(backend: str, weights: Path, config: Path, tcfg: ModelConfig, dtype: torch.dtype, device):
    """(net in eval mode, extra tensors) from the two files, checked against each other and the target."""
    cfg_cls, net_cls = CONFIGS[backend]
    if not config.is_file():
        raise ArtifactError(f"{config}: missing; it holds the shape of {weights.name}")
    try:
        cfg = cfg_cls.model_validate(json.loads(config.read_text()))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ArtifactError(f"{config}: not a valid {backend} config ({exc})") from exc
    problems = [
        f"{config}: key '{k}' is {getattr(cfg, k)}, the target has {v}"
        for k, v in _shapes(tcfg).items()
        if k in ("hidden_size", "vocab_size") and getattr(cfg, k) != v
    ]
    bad = [i for i in getattr(cfg, "target_layers", ()) if not 0 <= i < tcfg.num_layers]
    if bad:
        problems.append(f"{config}: target_layers {bad} out of range: the target has {tcfg.num_layers} layers")
    if problems:
        raise ArtifactError("; ".join(problems), problems)
    net = net_cls(cfg)
    expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    if not weights.is_file():
        raise ArtifactError(f"{weights}: missing; --spec-backend {backend} needs it beside {config.name}")
    state, extra = {}, {}
    with safe_open(weights, "pt") as h:
        names = set(h.keys())
        for name, shape in expected.items():
            if name not in names:
                raise ArtifactError(f"{weights}: tensor '{name}' is missing (expected shape {list(shape)})")
            got = tuple(h.get_slice(name).get_shape())
            if got != shape:
                raise ArtifactError(f"{weights}: tensor '{name}' has shape {list(got)}, expected {list(shape)}")
            state[name] = h.get_tensor(name)
        unknown = sorted(names - set(expected) - EXTRA[backend])
        if unknown:
            raise ArtifactError(f"{weights}: unknown tensors {unknown[:5]}; is this a {backend} file?")
        extra = {n: h.get_tensor(n) for n in names & EXTRA[backend]}
    net.load_state_dict({k: v.float() for k, v in state.items()})
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False), extra


def export(backend: str, net, out: Path, provenance: dict, extra: dict | None = None) -> Path:
    """Write `<backend>.safetensors` (bf16; extra tensors as they are) and `<backend>.json` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    weights, config = files(backend, out)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in net.state_dict().items()}
    tensors.update(extra or {})
    save_file(tensors, str(weights))
    cfg = net.cfg.model_copy(update={"fit": provenance})
    config.write_text(json.dumps(cfg.model_dump(mode="json"), indent=1) + "\n")
    return weights
