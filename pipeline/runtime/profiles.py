"""Profiles: a machine's figures, each with the public specification (or the measurement) it comes from.

A profile is a small TOML file in specs/profiles/ (or any path). It states figures, never flags: `device` (cuda or
cpu), `[fast_memory]` (its size, `gb`), `[fast_bandwidth]` (`gb_per_s`), `[link]` (the slow tier's link into fast
memory: `pcie_generation` and `pcie_lanes`, or `gb_per_s`), optionally `[compute]` (`tflops`, the peak the model's
rows run at), and `max_lanes`; every figure carries `source` (the document it comes from) and may carry `note`
(what is uncertain about it). A CPU profile may give `[probe]` instead of the bandwidth and compute: its figures are
then measured on the machine it runs on (the pass-cost probe, stages/models/pass_cost.py), and its fast memory is
the machine's RAM unless it states one. The speculation settings are derived from the figures and the model
(pipeline/runtime/derivation.py); precedence: an explicit flag, then the derived setting, then the spec file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from speclane.pipeline.framework.spec import SPEC_DIR
from speclane.pipeline.runtime.request import SpecKnobs
from speclane.stages.contract.errors import ConfigError

PROFILE_DIR = SPEC_DIR / "profiles"
# PCI Express Base Specification: transfer rate a lane (GT/s) by generation; 3.0 to 5.0 encode 128b/130b
PCIE_GT_PER_S = {3: 8.0, 4: 16.0, 5: 32.0}


class Figure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1, description="the specification sheet or measurement the figure comes from")
    note: str = ""


class FastMemory(Figure):
    gb: float = Field(gt=0, description="fast memory in GB (10^9 bytes)")


class Bandwidth(Figure):
    gb_per_s: float = Field(gt=0, description="fast memory's read bandwidth in GB/s")


class Compute(Figure):
    tflops: float = Field(gt=0, description="peak dense FLOP/s of the model's dtype, in TFLOP/s")


class Probe(Figure):
    """The figures measured where the profile runs: pass seconds by rows, and the bandwidth and compute fitted."""


class Link(Figure):
    pcie_generation: Literal[3, 4, 5] | None = None
    pcie_lanes: Literal[1, 2, 4, 8, 16] | None = None
    gb_per_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_way(self) -> Link:
        pcie = (self.pcie_generation, self.pcie_lanes)
        if self.gb_per_s is None and None in pcie:
            raise ValueError("give pcie_generation and pcie_lanes, or gb_per_s")
        if self.gb_per_s is not None and pcie != (None, None):
            raise ValueError("give pcie_generation and pcie_lanes, or gb_per_s, not both")
        return self

    @property
    def bytes_per_s(self) -> float:
        """One direction's theoretical rate: GT/s a lane x 128/130 (the encoding) / 8 bits x lanes."""
        if self.gb_per_s is not None:
            return self.gb_per_s * 1e9
        return PCIE_GT_PER_S[self.pcie_generation] * 1e9 * 128 / 130 / 8 * self.pcie_lanes


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    device: Literal["cpu", "cuda"]
    max_lanes: int | None = Field(default=None, ge=1)
    fast_memory: FastMemory | None = None
    fast_bandwidth: Bandwidth | None = None
    link: Link | None = None
    compute: Compute | None = None
    probe: Probe | None = None

    @model_validator(mode="after")
    def _complete(self) -> Profile:
        if self.probe is not None and self.device != "cpu":
            raise ValueError("[probe]: the probe measures the CPU it runs on; a cuda profile states its figures")
        if self.probe is None:
            missing = [n for n in ("fast_memory", "fast_bandwidth") if getattr(self, n) is None]
            if missing:
                raise ValueError(
                    f"[{'] and ['.join(missing)}] missing: a profile without [probe] states the fast memory's "
                    "size and bandwidth"
                )
        return self

    def figures(self) -> dict[str, dict]:
        """Each stated figure with its source and note, in SI units (bytes, bytes/s, FLOP/s)."""
        out: dict[str, dict] = {}
        if self.fast_memory:
            out["fast_memory_bytes"] = _fig(self.fast_memory.gb * 1e9, self.fast_memory)
        if self.fast_bandwidth:
            out["fast_bandwidth_bytes_per_s"] = _fig(self.fast_bandwidth.gb_per_s * 1e9, self.fast_bandwidth)
        if self.link:
            out["link_bytes_per_s"] = _fig(self.link.bytes_per_s, self.link)
        if self.compute:
            out["compute_flop_per_s"] = _fig(self.compute.tflops * 1e12, self.compute)
        return out


def _fig(value: float, fig: Figure) -> dict:
    return {"value": value, "source": fig.source, **({"note": fig.note} if fig.note else {})}


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name: str | Path) -> Profile:
    """The profile `name` (a name in specs/profiles/ or a path); a ConfigError naming every bad field."""
    path = Path(name)
    if not path.suffix and not path.exists():
        path = PROFILE_DIR / f"{path.name}.toml"
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(
            f"--profile: cannot read {path}: {exc.strerror}; known profiles: {', '.join(known_profiles())}"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--profile: {path} is not valid TOML: {exc}") from exc
    if "spec" in data:
        raise ConfigError(
            f"--profile: {path}: 'spec': a profile states a machine's figures, not flags; the speculation settings "
            "are derived from the figures (`speclane plan --profile P --model M` shows how); pin a setting with "
            "the --spec-* flags"
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "profile"
            problems.append(f"'{where}': {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError(f"--profile: {path}: " + "; ".join(problems)) from exc


def merge(derived: SpecKnobs | None, flags: SpecKnobs) -> SpecKnobs:
    """The flags that were given win over the profile's derived settings."""
    if derived is None:
        return flags
    return derived.model_copy(update=flags.model_dump(exclude_none=True))
