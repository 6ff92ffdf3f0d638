"""One import name: an install puts only `speclane` into site-packages, its folders mapped under it.

The folders keep the names the project was designed with (pipeline/, stages/, kernels/, bench/, specs/); code
reaches them as `speclane.<folder>`. A module that still imports a folder by its bare name (`from stages ...`) would
work from a checkout and fail after `pip install`, so every module is imported here from outside the checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("pipeline", "stages", "kernels", "bench", "specs")
# Modules whose import needs an optional extra or a GPU-only package; they are still held to the naming rule by
# the source scan below.
OPTIONAL = {
    "speclane.pipeline.net.http",
    "speclane.pipeline.net.openai_api",
    "speclane.bench.cuda_graphs",
    "speclane.pipeline.net.replica_router",  # subclasses Ray Serve's RequestRouter: the ray extra
}


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _modules() -> list[str]:
    out = []
    for folder in FOLDERS[:-1]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out.append(".".join(("speclane", *parts)))
    return out


def test_every_package_is_listed_under_speclane():
    config = _setuptools()
    listed = set(config["packages"])
    assert all(name.startswith("speclane.") for name in listed), sorted(listed)
    assert config["package-dir"] == {f"speclane.{f}": f for f in FOLDERS}
    on_disk = {
        ".".join(("speclane", *p.parent.relative_to(ROOT).parts))
        for f in FOLDERS[:-1]
        for p in (ROOT / f).rglob("__init__.py")
    }
    on_disk |= {"speclane.specs", "speclane.specs.profiles"}
    assert on_disk == listed, (
        f"packages on disk but not installed: {sorted(on_disk - listed)}; "
        f"listed but missing: {sorted(listed - on_disk)}"
    )


def test_no_module_imports_a_folder_by_its_bare_name():
    bare = []
    for folder in FOLDERS[:-1]:
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                words = line.split()
                if len(words) >= 2 and words[0] in ("from", "import") and words[1].split(".")[0] in FOLDERS:
                    bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bare, "import through `speclane.`:\n" + "\n".join(bare)


def test_every_module_imports_from_outside_the_checkout(tmp_path):
    """Run where the checkout is not on sys.path: only the installed `speclane` can answer."""
    script = (
        "import importlib, sys\n"
        f"names = {[m for m in _modules() if m not in OPTIONAL]!r}\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        f"stray = sorted(m for m in sys.modules if m.split('.')[0] in {FOLDERS!r})\n"
        "assert not stray, stray\n"
        "import speclane.pipeline.framework.spec as spec\n"
        "assert (spec.SPEC_DIR / 'verify.toml').is_file(), spec.SPEC_DIR\n"
        "print(len(names))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "", "TRITON_INTERPRET": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 100
