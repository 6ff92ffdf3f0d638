"""accept as a case table (greedy, a deterministic drafter): drafts and the target's choices in, the committed run out.

Logits are one-hot at the target's choice for each row, so the target "chooses" exactly the listed token.
"""

import pytest
import torch

from speclane.stages.accept import Accept
from tests.stages.conftest import make_lane

VOCAB = 16


def logits_for(choices):
    """[rows, vocab] float32 whose argmax at row i is choices[i]."""
    out = torch.zeros(len(choices), VOCAB)
    out[torch.arange(len(choices)), torch.tensor(choices)] = 5.0
    return out


# per lane: (drafts, the target's choice at the anchor and after each draft) -> (committed run, committed_len)
CASES = {
    "all accepted": ([([1, 2, 3], [1, 2, 3, 4])], [[1, 2, 3, 4]], [4]),
    "first rejected": ([([1, 2, 3], [5, 2, 3, 4])], [[5, -1, -1, -1]], [1]),
    "rejected in the middle": ([([1, 2, 3], [1, 7, 3, 4])], [[1, 7, -1, -1]], [2]),
    "no drafts": ([([], [4])], [[4]], [1]),
    "ragged lanes": ([([1, 2], [1, 2, 9]), ([3, 4, 5], [3, 6, 5, 1])], [[1, 2, 9, -1], [3, 6, -1, -1]], [3, 2]),
    "a lane without drafts beside one with": ([([], [8]), ([3, 4], [3, 4, 2])], [[8, -1, -1], [3, 4, 2]], [1, 3]),
}


@pytest.mark.parametrize("name", CASES)
def test_accept_case_table(name):
    lanes_in, committed, committed_len = CASES[name]
    k = max(len(d) for d, _ in lanes_in)
    drafts = torch.tensor([d + [-1] * (k - len(d)) for d, _ in lanes_in], dtype=torch.int64).reshape(len(lanes_in), k)
    rows = [c for _, choices in lanes_in for c in choices]
    cu = [0]
    for _, choices in lanes_in:
        cu.append(cu[-1] + len(choices))
    lanes = [make_lane(slot=i) for i in range(len(lanes_in))]
    out = Accept().run(logits_for(rows), torch.tensor(cu), drafts, tuple(len(d) for d, _ in lanes_in), lanes)
    assert out["committed"].tolist() == committed
    assert out["committed_len"].tolist() == committed_len


def test_prefill_commits_only_for_lanes_whose_prompt_is_done():
    lanes = [make_lane(slot=0), make_lane(slot=1)]
    drafts = torch.full((2, 0), -1, dtype=torch.int64)
    out = Accept().run(logits_for([3, 4]), torch.tensor([0, 1, 2]), drafts, (0, 0), lanes, final=(True, False))
    assert out["committed"].tolist() == [[3], [4]]
    assert out["committed_len"].tolist() == [1, 0]
