"""Profiles: named sets of speculation settings for a machine (seed: "The profiles set them per card").

A profile is a small TOML file in specs/profiles/ (or any path): a `[spec]` table with the same keys as the
--spec-* flags (validated by the same `SpecKnobs` model) and optionally `max_lanes`. Precedence: an explicit flag,
then the profile, then the spec file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from speclane.pipeline.framework.spec import SPEC_DIR
from speclane.pipeline.runtime.request import SpecKnobs
from speclane.stages.contract.errors import ConfigError

PROFILE_DIR = SPEC_DIR / "profiles"


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    spec: SpecKnobs = Field(default_factory=SpecKnobs)
    max_lanes: int | None = Field(default=None, ge=1)


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name: str | Path) -> Profile:
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
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"--profile: {path}: '{where}': {err['msg']}") from exc


def merge(profile: Profile | None, flags: SpecKnobs) -> SpecKnobs:
    """The flags that were given win over the profile's."""
    if profile is None:
        return flags
    given = flags.model_dump(exclude_none=True)
    return profile.spec.model_copy(update=given)
