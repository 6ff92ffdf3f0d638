"""The code blocks of docs/*.md that are marked runnable run, so the docs cannot rot.

Markers (the first word after the fence stays the language, so the docs render as usual):
- ```<lang> test=NAME   the block is written to the file NAME in a scratch directory; a ```toml block must
                        be a valid spec (loaded and built), other blocks are files for later blocks to use.
- ```toml test=NAME invalid   a spec that must be refused (the page shows `spec validate` on it).
- ```console test       each `$ speclane ...` line is run in that directory; the lines after it, up to the
                        next `$`, are its stdout then stderr (`...` matches anything, as in doctest).
                        `# exit N` at the end of a command says the exit status it must have (default 0).
Blocks of one page run in order in one directory, which starts with a copy of specs/. Blocks without a
marker (commands that load a model) are not run here; the tests that cover them are named in the page.
"""

from __future__ import annotations

import doctest
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from speclane.pipeline.cli import main
from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.spec import SPEC_DIR, load_spec
from speclane.stages.contract.errors import SpecError

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(r"^```(\w+)[ \t]+test(?:=(\S+)(?:[ \t]+(invalid))?)?[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


def blocks(page: Path) -> list[tuple[str, str | None, bool, str, int]]:
    """(language, file name or None, must be invalid, body, line number) of every marked block of a page."""
    text = page.read_text()
    return [
        (m.group(1), m.group(2), bool(m.group(3)), m.group(4), text.count("\n", 0, m.start()) + 1)
        for m in FENCE.finditer(text)
    ]


def commands(body: str) -> list[tuple[str, int, str]]:
    """(command line, expected exit status, expected output) of a console block."""
    out: list[tuple[str, int, str]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            cmd = line[2:]
            m = EXIT.search(cmd)
            out.append((cmd[: m.start()] if m else cmd, int(m.group(1)) if m else 0, ""))
        elif out:
            cmd, status, want = out[-1]
            out[-1] = (cmd, status, want + line + "\n")
        elif line.strip():
            raise AssertionError(f"console block: output before any command: {line!r}")
    return out


PAGES = sorted(p for p in DOCS.glob("*.md") if blocks(p))


def test_the_spec_format_page_has_runnable_blocks():
    assert DOCS / "spec-format.md" in PAGES
    kinds = {lang for lang, *_ in blocks(DOCS / "spec-format.md")}
    assert {"toml", "console", "python"} <= kinds


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_marked_blocks_run(page, tmp_path, monkeypatch, capsys):
    for spec in SPEC_DIR.glob("*.toml"):
        shutil.copy(spec, tmp_path / spec.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the directory on the path for user stages
    modules = set(sys.modules)
    checker = doctest.OutputChecker()
    try:
        for lang, name, invalid, body, line in blocks(page):
            where = f"{page.name}:{line}"
            if name is not None:
                (tmp_path / name).write_text(body)
                if lang == "toml" and invalid:
                    with pytest.raises(SpecError):
                        build_graph(load_spec(tmp_path / name))
                elif lang == "toml":
                    build_graph(load_spec(tmp_path / name))  # raises SpecError naming every problem
                continue
            assert lang == "console", f"{where}: a `test` block without a file name must be console"
            for cmd, status, want in commands(body):
                argv = shlex.split(cmd)
                assert argv[0] == "speclane", f"{where}: only speclane commands run: {cmd}"
                capsys.readouterr()
                code = main(argv[1:])
                out = capsys.readouterr()
                got = out.out + out.err
                assert code == status, f"{where}: `{cmd}` exited {code}, the page says {status}\n{got}"
                assert checker.check_output(want, got, doctest.ELLIPSIS), (
                    f"{where}: `{cmd}` printed\n{got}\nthe page says\n{want}"
                )
    finally:
        for mod in set(sys.modules) - modules:  # user stage modules written by the page
            if getattr(sys.modules[mod], "__file__", "") and str(tmp_path) in sys.modules[mod].__file__:
                del sys.modules[mod]
