"""drafter_commit as a case table: which rows of each lane the drafter takes into its window.

The drafter is a recorder: what a backend does with the rows is tested in tests/drafters; here the question is
which lengths the stage hands it (kv_commit's rule, so a lane's drafter window and KV length move together).
"""

import pytest
import torch

from speclane.stages.drafter_commit import DrafterCommit
from tests.stages.conftest import batch, make_lane
from tests.stages.test_kv_commit import CASES


class Drafter:
    def __init__(self):
        self.seen = []

    def observe(self, state, lanes, batch, out, committed_len):
        self.seen.append((state, [l.slot for l in lanes], out, committed_len.tolist()))


@pytest.mark.parametrize("advance, lane_rows, committed_len, expected", CASES)
def test_drafter_commit_case_table(advance, lane_rows, committed_len, expected):
    drafter, lanes, pass_out = Drafter(), [make_lane(slot=s) for s in range(len(lane_rows))], object()
    out = DrafterCommit(advance=advance).run(
        lanes,
        batch(lane_rows),
        pass_out,
        drafter=drafter,
        drafter_state="state",
        committed_len=torch.tensor(committed_len),
    )
    assert out == {}
    assert drafter.seen == [("state", list(range(len(lane_rows))), pass_out, expected)]


def test_no_drafter_takes_nothing_in():
    assert DrafterCommit().run([make_lane()], batch((1,)), object(), committed_len=torch.tensor([1])) == {}


def test_an_unknown_advance_is_refused():
    with pytest.raises(ValueError, match="advance must be 'committed' or 'rows'"):
        DrafterCommit(advance="all")
