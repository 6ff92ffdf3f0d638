"""`bench --plot DIR` where matplotlib does not import: refused before anything is measured, with the package and
the command that installs it, not a traceback at the end of a long run."""

from __future__ import annotations

import json
import sys

import pytest

from speclane.bench import cmd_bench
from speclane.bench.__main__ import main as bench_main
from speclane.pipeline.cli import main


@pytest.fixture
def no_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError

    def measure(*_a, **_k):
        raise AssertionError("measured before saying that --plot cannot plot")

    monkeypatch.setattr(cmd_bench, "measure", measure)


@pytest.mark.parametrize("door", [lambda argv: main(["bench", *argv]), bench_main])
def test_plot_without_matplotlib_is_refused_before_measuring(no_matplotlib, capsys, tmp_path, door):
    assert door(["--quick", "--plot", str(tmp_path / "plots")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("speclane bench: error: --plot needs the matplotlib package") and err.count("\n") == 1
    assert "pip install matplotlib" in err
    assert not (tmp_path / "plots").exists()


def test_plot_of_a_result_file_is_refused_before_its_tables(no_matplotlib, capsys, tmp_path):
    result = tmp_path / "result.json"
    result.write_text(json.dumps({}))
    assert main(["bench", "--from-json", str(result), "--plot", str(tmp_path / "plots")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "pip install matplotlib" in err


def test_without_plot_matplotlib_is_not_needed(no_matplotlib, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("speclane.bench.report.tables", lambda res: "the tables")
    result = tmp_path / "result.json"
    result.write_text(json.dumps({}))
    assert main(["bench", "--from-json", str(result)]) == 0
    assert capsys.readouterr().out == "the tables\n"
