"""--suffix-cache-tokens: written into the draft stage's `options.suffix.cache_tokens`, other options kept; a bad
value exits 2 naming the flag before the model loads; `generate` runs with the suffix backend."""

import argparse
import json

from speclane.pipeline.cli import main
from speclane.pipeline.cli.common import add_spec_flags, spec_from_args
from speclane.pipeline.framework.spec import load_spec


def parse(*argv):
    p = argparse.ArgumentParser()
    add_spec_flags(p)
    return p.parse_args(list(argv))


def test_the_flag_sets_the_suffix_option_and_keeps_the_others():
    assert spec_from_args(parse()) == "verify"  # unset: the spec as it is
    spec = spec_from_args(parse("--suffix-cache-tokens", "640"))
    options = spec.stage("draft").params["options"]
    assert options["suffix"] == {"cache_tokens": 640}
    assert options["ngram"] == load_spec("verify").stage("draft").params["options"]["ngram"]


def test_a_negative_budget_exits_2_naming_the_flag(capsys):
    code = main(["generate", "--prompt", "x", "--suffix-cache-tokens", "-1"])
    assert code == 2 and "--suffix-cache-tokens must be >= 0" in capsys.readouterr().err


def test_generate_with_the_suffix_backend(capsys, tmp_path):
    reqs = tmp_path / "r.jsonl"
    line = '{"id": "%s", "prompt_ids": [1, 2, 3, 4], "max_tokens": 6}\n'
    reqs.write_text(line % "a" + line % "b")
    code = main(
        [
            "generate",
            "--requests",
            str(reqs),
            "--json",
            "--dtype",
            "float32",
            "--threads",
            "1",
            "--max-lanes",
            "1",
            "--spec-backend",
            "suffix",
            "--spec-draft-plan",
            "fixed",
            "--suffix-cache-tokens",
            "64",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    first, second = (json.loads(x) for x in out.splitlines())
    assert first["tokens"] == second["tokens"]
    assert second["spec"]["accepted"] >= 3  # the second drafts the first's answer from the cache
