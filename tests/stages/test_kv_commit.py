"""kv_commit as a case table: how far each lane's KV length moves, handed to the target.

The target is a recorder: what the model does with the lengths is tested in tests/models; here the question is
which lengths each stage hands it.
"""
import pytest
import torch

from stages.kv_commit import KVCommit
from stages.recurrent_replay import RecurrentReplay
from tests.stages.conftest import Recorder, batch


# (advance, rows per lane in the pass, committed_len from accept) -> rows each lane commits
CASES = [
    ("committed", (4, 4), [4, 1], [4, 1]),     # verify: anchor + accepted drafts
    ("committed", (3, 1, 5), [2, 1, 5], [2, 1, 5]),
    ("rows", (512, 37), None, [512, 37]),      # prefill: every row of the chunk
    ("rows", (1,), None, [1]),
]


@pytest.mark.parametrize("advance, lane_rows, committed_len, expected", CASES)
def test_kv_commit_case_table(advance, lane_rows, committed_len, expected):
    target, state = Recorder(), object()
    cl = torch.tensor(committed_len, dtype=torch.int64) if committed_len is not None else None
    assert KVCommit(advance=advance).run(target, state, batch(lane_rows), cl) == {}
    assert target.calls == [("kv", state, expected)]


@pytest.mark.parametrize("cls", [KVCommit, RecurrentReplay])
def test_an_unknown_advance_is_refused(cls):
    with pytest.raises(ValueError, match="advance must be 'committed' or 'rows'"):
        cls(advance="all")
