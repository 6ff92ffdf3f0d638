"""The API key both doors of `speclane serve` ask for: where a command reads it, and how a given key is compared.

One key, one trust model: the HTTP door wants it as `Authorization: Bearer KEY`, the ZeroMQ door as the `key`
field of every message (docs/protocol.md, "Security"). A command reads it from a file (`--api-key-file`) or the
environment (`SPECLANE_API_KEY`), which other users of the machine cannot see, or from `--api-key`, which they
can (`ps` shows command lines). Checking messages is `pipeline/net/protocol.py`'s and `pipeline/net/http.py`'s.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from speclane.stages.contract.errors import ConfigError

ENV = "SPECLANE_API_KEY"


def read_key(key: str | None, key_file: Path | None, environ: dict[str, str] | None = None) -> str | None:
    """The key of `--api-key` or `--api-key-file` (at most one), else $SPECLANE_API_KEY; None when none is set."""
    if key is not None and key_file is not None:
        raise ConfigError("--api-key and --api-key-file: give one (the file is preferred: command lines show in ps)")
    if key_file is not None:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"--api-key-file {key_file}: cannot read it ({exc}); give a file holding the key"
            ) from exc
        if not key:
            raise ConfigError(f"--api-key-file {key_file}: the file is empty; write the key in it")
        return key
    source = "--api-key"
    if key is None:
        key, source = (os.environ if environ is None else environ).get(ENV) or None, f"${ENV}"
    if key is not None and not key.strip():
        raise ConfigError(f"{source}: the key is blank; give a key, or leave it unset to ask for none")
    return key


def matches(given: object, key: str) -> bool:
    """Whether `given` (whatever a client sent) is `key`, in time that does not depend on where they differ."""
    if not isinstance(given, str):
        return False
    return secrets.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode("utf-8", "surrogatepass"))
