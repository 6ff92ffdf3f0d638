"""The CLI's contracts: `plan` prints the row budget's outcome; `generate --json` prints one object a request,
in input order; bad flags and request files exit 2 naming the flag, file line or field."""

import json

import pytest
import torch

from speclane.pipeline.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("lanes, drafts, rows", [(1, 3, 4), (2, 3, 8), (3, 1, 6), (4, 1, 8), (5, 0, 5)])
def test_plan_follows_the_row_budget(capsys, lanes, drafts, rows):
    code, out, _ = run(
        capsys,
        "plan",
        "--spec-backend",
        "mtp",
        "--spec-draft-tokens",
        "3",
        "--spec-draft-rows",
        "8",
        "--lanes",
        str(lanes),
        "--json",
    )
    assert code == 0
    got = json.loads(out)
    assert (got["drafts_per_lane"], got["rows"], got["row_budget"]) == (drafts, rows, 8)


def test_plan_rows_zero_means_the_backends_default(capsys):
    # mtp's default budget is 8 rows; ngram has no cap
    _, out, _ = run(
        capsys,
        "plan",
        "--spec-backend",
        "ngram",
        "--spec-draft-tokens",
        "7",
        "--spec-draft-rows",
        "0",
        "--lanes",
        "8",
        "--json",
    )
    assert json.loads(out)["drafts_per_lane"] == 7


def test_generate_json_one_object_a_request_in_input_order(capsys, tmp_path):
    reqs = tmp_path / "r.jsonl"
    reqs.write_text(
        '{"id": "z", "prompt_ids": [1, 2, 3], "max_tokens": 3}\n'
        '{"id": "a", "prompt": "Hello", "max_tokens": 2, "spec": {"enabled": false}}\n'
    )
    code, out, err = run(
        capsys,
        "generate",
        "--requests",
        str(reqs),
        "--json",
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--spec-backend",
        "ngram",
    )
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in lines] == ["z", "a"]
    assert [len(r["tokens"]) for r in lines] == [3, 2]
    for r in lines:
        assert set(r) == {"id", "tokens", "text", "finish_reason", "usage", "spec"}
        assert r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == len(r["tokens"])
        assert set(r["spec"]) == {"rounds", "drafted", "accepted", "tokens_per_round", "accepted_per_position"}
    assert lines[1]["spec"]["accepted_per_position"] == []  # speculation off for that request
    compute = json.loads(err.strip().splitlines()[-1])["summary"]["compute"]  # what ran, said where it is read
    assert compute["dtype"] == "float32" and compute["quant"] == "none"
    assert compute["path"].startswith(f"CPU {torch.backends.cpu.get_cpu_capability()}")
    assert "decode route:" in compute["path"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["generate", "--prompt", "x", "--spec-draft-tokens", "0"],
            "--spec-draft-tokens: Input should be greater than",
        ),
        (["generate", "--prompt-ids", "1,x"], "--prompt-ids: '1,x' is not a comma-separated list of integers"),
        (["generate", "--prompt", "x", "--spec", "nope.toml"], "cannot read spec file nope.toml"),
        (["generate", "--prompt", "x", "--checkpoint-memory", "-1"], "--checkpoint-memory must be >= 0"),
        (["generate", "--prompt", "x", "--checkpoint-interval", "-5"], "--checkpoint-interval must be >= 0"),
        (["generate", "--prompt", "x", "--checkpoint-host-memory", "-1"], "--checkpoint-host-memory must be >= 0"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_version_and_a_closed_pipe(capsys, monkeypatch):
    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("speclane ")
    with pytest.raises(SystemExit) as exc:  # beside other arguments, argparse's own --version
        main(["--version", "generate"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("speclane ")

    class ClosedPipe:  # what stdout is once `| head` has read enough
        def write(self, _):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert main(["graph", "--format", "json"]) == 141  # quietly, no traceback


def test_version_imports_no_subcommand_and_no_torch():
    """`speclane --version` answers before torch loads (a second and more of start-up for one line)."""
    import subprocess
    import sys

    code = (
        "import sys; from speclane.pipeline.cli import main; main(['--version']); "
        "print('torch' in sys.modules, any(m.startswith('speclane.pipeline.cli.') for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "False False", done.stdout + done.stderr


def test_help_lists_every_subcommand_without_importing_torch():
    """`speclane --help` reads each subcommand's help line from its source: the same lines the full parser has,
    and neither a subcommand nor torch is imported."""
    import subprocess
    import sys

    from speclane.pipeline.cli import build_parser, overview_parser

    def lines(parser):
        return [a for a in parser._subparsers._group_actions[0]._choices_actions]

    full = {a.dest: a.help for a in lines(build_parser())}
    quick = {a.dest: a.help for a in lines(overview_parser())}
    assert quick == full and len(full) >= 9
    code = (
        "import sys, contextlib, io; from speclane.pipeline.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out: rc = main(['--help'])\n"
        "print(rc, 'torch' in sys.modules, any(m.startswith('speclane.pipeline.cli.') for m in sys.modules), "
        "'generate' in out.getvalue())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "0 False False True", done.stdout + done.stderr
