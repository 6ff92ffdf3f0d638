"""kv_commit as a case table: the round's one copy to the host, how far each lane's KV length moves, and what is
counted.

A lane's KV length lives on the lane (host); kv_commit is the one stage that advances it, by the committed run
in a verify round and by every row of the chunk in prefill. Acceptance is counted where the round commits.
"""

import pytest
import torch

from speclane.stages.kv_commit import KVCommit
from speclane.stages.recurrent_replay import RecurrentReplay
from tests.stages.conftest import batch, make_lane

# (advance, rows per lane in the pass, committed_len from accept) -> rows each lane commits
CASES = [
    ("committed", (4, 4), [4, 1], [4, 1]),  # verify: anchor + accepted drafts
    ("committed", (3, 1, 5), [2, 1, 5], [2, 1, 5]),
    ("rows", (512, 37), [0, 1], [512, 37]),  # prefill: every row of the chunk, whether or not it samples
    ("rows", (1,), [1], [1]),
]


def grid(committed_len, k1=5):
    """Runs whose token j of lane l is 10 * l + j, -1 past each lane's length (as accept pads them)."""
    return torch.tensor([[10 * l + j if j < n else -1 for j in range(k1)] for l, n in enumerate(committed_len)])


@pytest.mark.parametrize("advance, lane_rows, committed_len, expected", CASES)
def test_kv_commit_case_table(advance, lane_rows, committed_len, expected):
    lanes = [make_lane(slot=i, kv_len=100 + i) for i in range(len(lane_rows))]
    committed = grid(committed_len)
    drafted = tuple(n - 1 for n in lane_rows)
    out = KVCommit(advance=advance).run(lanes, batch(lane_rows), committed, torch.tensor(committed_len), drafted)
    assert [l.kv_len - 100 - i for i, l in enumerate(lanes)] == expected
    assert out["run_len"] == tuple(committed_len) and all(type(n) is int for n in out["run_len"])
    assert out["runs"].device.type == "cpu" and torch.equal(out["runs"], committed)


def test_the_round_makes_one_copy_to_the_host():
    """Runs and lengths leave the device together: one `.cpu()` for the whole round."""
    copies = []

    class Watched(torch.Tensor):
        def cpu(self, *a, **kw):
            copies.append(tuple(self.shape))
            return super().cpu(*a, **kw)

    committed = grid([2, 3]).as_subclass(Watched)
    KVCommit().run(
        [make_lane(slot=0), make_lane(slot=1)],
        batch((3, 3)),
        committed,
        torch.tensor([2, 3]).as_subclass(Watched),
        (2, 2),
    )
    assert copies == [(2, 6)]


# (drafted, committed_len) per lane -> (accepted counted, offered_at, accepted_at) per lane
COUNTS = [
    ((3, 3), (4, 1), [3, 0], [[1, 1, 1], [1, 0, 0]], [[1, 1, 1], [0, 0, 0]]),  # all accepted; first rejected
    ((3,), (3,), [2], [[1, 1, 1]], [[1, 1, 0]]),  # rejected at the third draft
    ((0, 2), (1, 2), [0, 1], [[], [1, 1]], [[], [1, 0]]),  # a lane without drafts beside one with
]


@pytest.mark.parametrize("drafted, committed_len, accepted, offered_at, accepted_at", COUNTS)
def test_a_verify_round_counts_what_it_committed(drafted, committed_len, accepted, offered_at, accepted_at):
    lanes = [make_lane(slot=i) for i in range(len(drafted))]
    KVCommit().run(lanes, batch([d + 1 for d in drafted]), grid(committed_len), torch.tensor(committed_len), drafted)
    assert [l.rounds for l in lanes] == [1] * len(lanes)
    assert [l.drafted for l in lanes] == list(drafted) and [l.accepted for l in lanes] == accepted
    assert [l.offered_at for l in lanes] == offered_at and [l.accepted_at for l in lanes] == accepted_at


def test_prefill_counts_no_round():
    lanes = [make_lane(slot=0), make_lane(slot=1)]
    KVCommit(advance="rows").run(lanes, batch((5, 3)), grid([1, 0]), torch.tensor([1, 0]), (0, 0))
    assert [l.rounds for l in lanes] == [0, 0] and [l.kv_len for l in lanes] == [5, 3]


@pytest.mark.parametrize("cls", [KVCommit, RecurrentReplay])
def test_an_unknown_advance_is_refused(cls):
    with pytest.raises(ValueError, match="advance must be 'committed' or 'rows'"):
        cls(advance="all")
