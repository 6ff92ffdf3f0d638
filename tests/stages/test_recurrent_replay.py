"""recurrent_replay as a case table: which row's record each lane restores (its last committed one).

The target is a recorder: restoring the records is tested in tests/models; here the question is which lengths the
stage hands it (the same rule as kv_commit, so a lane's KV and recurrent state stay at one length).
"""

import pytest
import torch

from speclane.stages.recurrent_replay import RecurrentReplay
from tests.stages.conftest import Recorder, batch
from tests.stages.test_kv_commit import CASES


@pytest.mark.parametrize("advance, lane_rows, committed_len, expected", CASES)
def test_recurrent_replay_case_table(advance, lane_rows, committed_len, expected):
    target, state, pass_out = Recorder(), object(), object()
    cl = torch.tensor(committed_len, dtype=torch.int64)
    assert RecurrentReplay(advance=advance).run(target, state, batch(lane_rows), pass_out, cl) == {}
    assert target.calls == [("recurrent", state, expected, pass_out)]
