"""Find a Hugging Face repo id (`ORG/NAME`, optionally `ORG/NAME@REVISION`) in the local Hugging Face cache.

Owns: where the cache is (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
`~/.cache/huggingface/hub`, as huggingface_hub itself decides), its layout (`models--ORG--NAME/refs/REVISION` holds a
commit, `snapshots/COMMIT/` the files, links into `blobs/`), and choosing the artifact a snapshot holds: its
directory (config.json + *.safetensors) or its one GGUF file. Nothing is ever downloaded; a repo that is not there,
or only partly there, is an ArtifactError saying how to fetch it.
Not here: converting or checking the artifact (`artifact.py`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from speclane.stages.contract.errors import ArtifactError

_REPO_ID = re.compile(r"(?P<org>[A-Za-z0-9][\w.-]*)/(?P<name>[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?")


def is_repo_id(text: str) -> bool:
    """`ORG/NAME` or `ORG/NAME@REVISION`: the shape of a Hub repo id (a path that exists is never asked)."""
    return _REPO_ID.fullmatch(text) is not None


def hub_cache_dir() -> Path:
    """The directory huggingface_hub downloads models into on this machine."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache").expanduser() / "huggingface" / "hub"


def find_in_cache(repo_id: str, cache: Path | None = None) -> Path:
    """The cached artifact of `repo_id`: its snapshot directory, or the snapshot's one `.gguf` file when it holds
    GGUF files only. The revision is `main` unless `@REVISION` names a branch, a tag or a commit."""
    m = _REPO_ID.fullmatch(repo_id)
    if m is None:
        raise ArtifactError(f"'{repo_id}' is not a Hugging Face repo id (ORG/NAME or ORG/NAME@REVISION)")
    cache = cache or hub_cache_dir()
    repo, rev = f"{m['org']}/{m['name']}", m["rev"] or "main"
    folder = cache / f"models--{m['org']}--{m['name']}"
    command = f"hf download {repo}" + (f" --revision {m['rev']}" if m["rev"] else "")
    fetch = f"speclane never downloads: fetch it first with `{command}`"
    if not folder.is_dir():
        raise ArtifactError(
            f"{repo_id}: no such file or directory, and not in the local Hugging Face cache ({folder} is missing); "
            f"{fetch}, or pass a Hugging Face style directory or a .gguf file."
        )
    ref = folder / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        have = sorted(p.name for p in (folder / "snapshots").glob("*")) or ["none"]
        raise ArtifactError(
            f"{repo_id}: revision '{rev}' is not in the local Hugging Face cache (snapshots held: "
            f"{', '.join(have)}); {fetch}, or name a held one as {repo}@COMMIT."
        )
    broken = sorted(p.name for p in snapshot.iterdir() if p.is_symlink() and not p.exists())
    if broken:
        raise ArtifactError(
            f"{snapshot}: the cached download of {repo} is incomplete ({', '.join(broken)} missing); download it "
            f"again with `{command}`."
        )
    if (snapshot / "config.json").is_file():
        return snapshot
    ggufs = sorted(snapshot.rglob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise ArtifactError(
            f"{repo_id}: the cached snapshot holds {len(ggufs)} GGUF files ({', '.join(p.name for p in ggufs)}); "
            f"pass the one to load as --model {snapshot}/FILE.gguf"
        )
    raise ArtifactError(
        f"{snapshot}: the cached snapshot of {repo} holds neither config.json + *.safetensors nor a .gguf file; "
        f"fetch its weights with `{command}`."
    )
