"""An edited spec changes what runs: the embedded model in float32, driven through `spec set` and `generate`.

(a) backend "none" drafts nothing where "ngram" drafts, with the same greedy tokens; (b) a user stage placed
between accept and stream_emit sees exactly the committed runs that are streamed; (c) `--stage-times` prints
a share for every stage of the round.
"""

import json
import re
import shutil

import pytest
import torch

import speclane.stages.models.loading as loading
from speclane.pipeline.cli import main
from speclane.pipeline.framework.spec import SPEC_DIR, load_spec
from speclane.pipeline.framework.spec_edit import edit
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.contract.events import TokenEvent

EIGHT = [
    "anchor_gather",
    "draft",
    "target_pass",
    "accept",
    "kv_commit",
    "drafter_commit",
    "recurrent_replay",
    "stream_emit",
]
# A prompt the n-gram drafter can continue from the lane's own text.
REPEAT = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)  # beside other processes (the OpenMP oversubscription trap)
    return loading.load_model(None, "float32")


@pytest.fixture
def cli(model, monkeypatch, capsys):
    """Run `speclane ...` in-process on the cached model; returns (exit status, stdout, stderr)."""
    monkeypatch.setattr(
        loading,
        "load_model",
        lambda path, dtype, device="cpu", quant="none", progress=None, expert_cache_bytes=None: model,
    )

    def run(*argv):
        capsys.readouterr()
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def ngram(tmp_path):
    """specs/decode.toml (backend none) edited to draft with the n-gram backend: one line of the spec."""
    plain, path = tmp_path / "plain.toml", tmp_path / "ngram.toml"
    shutil.copy(SPEC_DIR / "decode.toml", plain)
    edit(plain, [("stages.draft.params.backend", '"ngram"')], out=path)
    return path


def generate_json(cli, spec, *extra):
    code, out, err = cli(
        "generate",
        "--spec",
        str(spec),
        "--prompt",
        REPEAT,
        "--max-tokens",
        "16",
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--json",
        *extra,
    )
    assert code == 0, err
    return json.loads(out.splitlines()[0])


def test_edited_backend_and_parameters_change_drafting_not_tokens(cli, ngram, tmp_path):
    plain, short = tmp_path / "none.toml", tmp_path / "short.toml"
    assert cli("spec", "set", str(ngram), 'stages.draft.params.backend="none"', "--out", str(plain))[0] == 0
    edit(ngram, [("stages.anchor_gather.params.draft_tokens", "2")], out=short)
    seven, none, two = (generate_json(cli, s) for s in (ngram, plain, short))
    assert none["spec"]["drafted"] == 0 and none["spec"]["rounds"] == 15  # one token a round after prefill's
    assert seven["spec"]["drafted"] > 0 and seven["spec"]["rounds"] < 15
    assert two["spec"]["drafted"] > 0 and len(two["spec"]["accepted_per_position"]) == 2
    assert two["spec"]["tokens_per_round"] <= 3  # at most two drafts plus the bonus a round
    assert seven["tokens"] == none["tokens"] == two["tokens"]  # greedy: the target decides every token
    assert len(none["tokens"]) == 16


def test_user_stage_between_accept_and_emit_sees_exactly_the_streamed_runs(model, ngram):
    edit(ngram, [("stages.log.kind", '"tests.fixtures.user_stages:CommittedLog"')], after="accept")
    spec = load_spec(ngram)
    assert [s.name for s in spec.stages][3:6] == ["accept", "log", "kv_commit"]
    engine = Engine(*model, spec=spec, max_lanes=2, max_len=256)
    order = engine.verify.graph.order()
    assert order.index("accept") < order.index("log") < order.index("stream_emit")
    log = engine.verify.graph.stage("log")
    streamed = []
    done = engine.generate(
        [parse_request({"id": 0, "prompt": REPEAT, "max_tokens": 19})],
        on_event=lambda ev: streamed.append(ev.token_id) if isinstance(ev, TokenEvent) else None,
    )[0]
    assert streamed == list(done.tokens) and len(streamed) == 19
    runs = log.seen
    assert len(runs) == done.spec["rounds"] and all(1 <= len(r) <= 8 for r in runs)
    assert any(len(r) > 1 for r in runs)  # the drafter's tokens were accepted: runs, not single tokens
    # The first token comes from prefill; every verify round's run is streamed as it was committed, except
    # that the max-token limit may cut the last one.
    flat = [t for r in runs for t in r]
    assert flat[: len(streamed) - 1] == streamed[1:]
    assert 0 <= len(flat) - (len(streamed) - 1) < len(runs[-1])


def test_stage_times_prints_a_share_for_every_stage(cli, ngram):
    edit(ngram, [("stages.log.kind", '"tests.fixtures.user_stages:CommittedLog"')], before="stream_emit")
    code, out, err = cli(
        "generate",
        "--spec",
        str(ngram),
        "--prompt",
        REPEAT,
        "--max-tokens",
        "8",
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--stage-times",
    )
    assert code == 0, err
    lines = err.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("verify round stage"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("prefill pass stage"))
    table = [ln.strip() for ln in lines[start + 1 : end]]
    shares = {m.group(1): float(m.group(2)) for m in (re.fullmatch(r"(\w+)\s+(\d+\.\d) %", ln) for ln in table) if m}
    assert len(shares) == len(table)  # every line of the table is `stage  share %`
    assert set(EIGHT) | {"log"} == set(shares)  # the verify round's stages; prefill has its own table
    prefill = [ln.split()[0] for ln in lines[end + 1 :] if ln.startswith("  ")]
    assert "prefill_gather" in prefill and "draft" not in prefill
    assert all(0.0 <= s <= 100.0 for s in shares.values())
    assert abs(sum(shares.values()) - 100.0) <= 0.05 * len(shares) + 1e-9  # each printed to 0.1 %
