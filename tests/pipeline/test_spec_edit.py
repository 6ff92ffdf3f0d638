"""Spec editing: get/set/diff by dotted key, comments and layout kept, invalid edits refused untouched."""

import difflib
import shutil
from pathlib import Path

import pytest

from speclane.pipeline.cli import main
from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.spec import SPEC_DIR, load_spec
from speclane.pipeline.framework.spec_edit import diff_lines, edit, get_lines
from speclane.stages.contract.errors import SpecError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "specs"
LOG = '"tests.fixtures.user_stages:CommittedLog"'


@pytest.fixture
def verify(tmp_path):
    path = tmp_path / "verify.toml"
    shutil.copy(SPEC_DIR / "verify.toml", path)
    return path


def changed_lines(before: str, after: str) -> list[str]:
    return [ln for ln in difflib.ndiff(before.splitlines(), after.splitlines()) if ln[:1] in "+-"]


def test_set_changes_one_value_and_keeps_comments_and_layout(verify):
    before = verify.read_text()
    edit(verify, [("stages.anchor_gather.params.draft_tokens", "3")])
    assert changed_lines(before, verify.read_text()) == [
        '- params = { draft_tokens = 7, row_budget = 0, plan = "measured" }',
        '+ params = { draft_tokens = 3, row_budget = 0, plan = "measured" }',
    ]
    assert load_spec(verify).stage("anchor_gather").params["draft_tokens"] == 3


def test_set_reaches_into_a_table_parameter_and_creates_params(tmp_path):
    decode = tmp_path / "decode.toml"
    shutil.copy(SPEC_DIR / "decode.toml", decode)
    edit(decode, [("stages.draft.params.options.ngram.max_n", "6"), ("stages.stream_emit.params.prefill", "false")])
    spec = load_spec(decode)
    assert spec.stage("draft").params["options"] == {"ngram": {"max_n": 6}}
    assert spec.stage("stream_emit").params == {"prefill": False}
    assert "# row_budget 0: no cap" in decode.read_text()


def test_invalid_edit_is_refused_with_every_problem_and_the_file_untouched(verify):
    before = verify.read_bytes()
    with pytest.raises(SpecError) as err:
        edit(
            verify,
            [
                ("stages.anchor_gather.params.draft_tokens", "9"),
                ("stages.draft.params.backend", '"ngrm"'),
                ("stages.target_pass.params.recrd", '"rows"'),
            ],
        )
    assert verify.read_bytes() == before
    problems = err.value.problems
    assert len(problems) == 3
    assert problems[0] == f"{verify}: stage 'anchor_gather': bad parameter value: draft_tokens must be 0 to 7, got 9"
    assert problems[1].startswith(
        f"{verify}: stage 'draft': bad parameter value: unknown draft backend 'ngrm' "
        '(did you mean "ngram"?); known: none, ngram, dflash2, mtp'
    )
    assert "oracle" not in problems[1]  # a control the CLI refuses is not offered to users
    assert problems[2] == (
        f"{verify}: stage 'target_pass': unknown parameter 'recrd' (did you mean \"record\"?); "
        "parameters of kind 'target_pass': record, logits"
    )
    assert "the file is unchanged" in str(err.value)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("stages.dratf.params.backend", '"none"', "the spec has no stage 'dratf' (did you mean \"draft\"?)"),
        ("stages.draft.params.backend", "none", "'none' is not one TOML value; a string needs quotes"),
        ("stages.draft.params.backend", '"a"\nname = "x"', "is not one TOML value"),
        ("stagez", "1", "unknown key 'stagez' (remove it; see docs/spec-format.md)"),  # refused by validation
        ("stages", "1", "'stages' is not a key of a spec"),
        ("wires.0.from", '"a.b"', "the spec has 0 wire(s)"),
        ("stages.draft.kind.x", "1", "'kind' holds a value, not a table"),
    ],
)
def test_bad_keys_and_values_are_named(verify, key, value, message):
    before = verify.read_bytes()
    with pytest.raises(SpecError) as err:
        edit(verify, [(key, value)])
    assert message in str(err.value)
    assert verify.read_bytes() == before


def test_out_leaves_the_source_as_it_was(verify, tmp_path):
    before = verify.read_bytes()
    out = tmp_path / "decode-like.toml"
    edit(verify, [("stages.draft.params.backend", '"none"')], out=out)
    assert verify.read_bytes() == before
    assert load_spec(out).stage("draft").params["backend"] == "none"


def test_setting_a_new_stage_kind_adds_it_where_asked(verify):
    before = verify.read_text()
    graph = edit(verify, [("stages.log.kind", LOG), ("stages.log.params.prefix", '"r"')], after="accept")
    order = graph.order()
    assert order.index("accept") < order.index("log") < order.index("kv_commit")
    assert changed_lines(before, verify.read_text()) == [
        '+ name = "log"',
        f"+ kind = {LOG}",
        '+ params = {prefix = "r"}',
        "+ ",
        "+ [[stages]]",
    ]
    assert [s.name for s in load_spec(verify).stages][4] == "log"


def test_a_user_stage_with_a_broken_contract_is_refused(verify):
    with pytest.raises(SpecError) as err:
        edit(verify, [("stages.wrong.kind", '"tests.fixtures.user_stages:WrongDims"')])
    assert err.value.problems == [
        f"{verify}: stage 'wrong' input 'committed': contract mismatch with "
        "'accept.committed': dims [lanes, k1] do not match [lanes]"
    ]


def test_get_prints_resolved_values_with_defaults_marked():
    lines = get_lines(SPEC_DIR / "verify.toml")
    assert lines[:5] == [
        'name = "verify"',
        "version = 1",
        'description = "One verify round: anchors, drafts, one batched target pass, accept, commit, replay, emit."',
        'stages.anchor_gather.kind = "anchor_gather"',
        'stages.anchor_gather.params.device = "cpu"  # default',
    ]
    assert 'stages.draft.params.backend = "ngram"' in lines
    assert "stages.stream_emit.params.prefill = false  # default" in lines
    assert get_lines("verify", "stages.target_pass") == [
        'stages.target_pass.kind = "target_pass"',
        'stages.target_pass.params.logits = "tokens"',
        'stages.target_pass.params.record = "rows"',
    ]
    with pytest.raises(SpecError, match=r"no key 'stages.target_pas' \(did you mean \"stages.target_pass.kind\"\?\)"):
        get_lines("verify", "stages.target_pas")


def test_get_of_a_spec_with_an_unknown_kind_still_prints_its_values():
    lines = get_lines(FIXTURES / "unknown_kind.toml", "stages.accept")
    assert lines == ['stages.accept.kind = "acept"']


@pytest.mark.parametrize("name", ["verify", "decode", "prefill"])
def test_every_value_get_prints_sets_back_to_the_same_spec(name, tmp_path):
    """`get` prints what `set` takes: setting each printed value again changes nothing resolved."""
    for line in get_lines(name):
        if line.endswith("  # default"):
            line = line[: -len("  # default")]
        key, _, value = line.partition(" = ")
        out = tmp_path / "out.toml"
        edit(SPEC_DIR / f"{name}.toml", [(key, value)], out=out)
        assert diff_lines(SPEC_DIR / f"{name}.toml", out) == [], line


def test_diff_shows_changes_order_and_ignores_spelled_out_defaults(verify, tmp_path):
    assert diff_lines("verify", verify) == []
    explicit = tmp_path / "explicit.toml"
    edit(verify, [("stages.stream_emit.params.prefill", "false")], out=explicit)
    assert diff_lines(verify, explicit) == []
    edit(verify, [("stages.log.kind", LOG), ("stages.anchor_gather.params.draft_tokens", "3")], before="stream_emit")
    assert diff_lines("verify", verify) == [
        "- stages = anchor_gather, draft, target_pass, accept, kv_commit, drafter_commit, recurrent_replay, "
        "stream_emit",
        "+ stages = anchor_gather, draft, target_pass, accept, kv_commit, drafter_commit, recurrent_replay, log, "
        "stream_emit",
        "- stages.anchor_gather.params.draft_tokens = 7",
        "+ stages.anchor_gather.params.draft_tokens = 3",
        f"+ stages.log.kind = {LOG}",
        '+ stages.log.params.prefix = "run"',
    ]


def test_spec_commands_exit_codes_and_output(verify, tmp_path, capsys):
    assert (
        main(["spec", "set", str(verify), 'stages.draft.params.backend="none"', "--out", str(tmp_path / "o.toml")]) == 0
    )
    assert capsys.readouterr().out.startswith(f'{tmp_path / "o.toml"}: stages.draft.params.backend = "none"\n')
    assert main(["spec", "diff", str(verify), str(tmp_path / "o.toml")]) == 1
    assert main(["spec", "diff", str(verify), str(verify)]) == 0
    capsys.readouterr()
    assert main(["spec", "set", str(verify), "no-equals-sign"]) == 2
    assert "'no-equals-sign' is not KEY=VALUE" in capsys.readouterr().err
    assert main(["spec", "get", str(verify), "stages.accept.kind"]) == 0
    assert capsys.readouterr().out == 'stages.accept.kind = "accept"\n'


def test_validate_passes_the_shipped_specs(capsys):
    assert main(["spec", "validate", *map(str, sorted(SPEC_DIR.glob("*.toml")))]) == 0
    assert capsys.readouterr().out.count(": ok (") == len(list(SPEC_DIR.glob("*.toml")))


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.toml")), ids=lambda p: p.name)
def test_validate_prints_every_problem_of_a_bad_spec(path, capsys):
    with pytest.raises(SpecError) as err:
        build_graph(load_spec(path))
    assert main(["spec", "validate", str(path), str(SPEC_DIR / "verify.toml")]) == 2
    out = capsys.readouterr()
    for problem in err.value.problems:
        assert f"\n  - {problem}\n" in out.err + "\n"
    assert f"{len(err.value.problems)} problem(s)" in out.err
    assert "verify.toml: ok (" in out.out  # a bad file does not stop the others being checked
