"""mtp's observed rows: a round in which every lane has one row (nobody drafted) takes a shorter route; it must
give the pairs and the carried state the general route gives."""

import pytest
import torch

from speclane.stages.models.state import PassOutput, RowBatch
from tests.round.conftest import engine


@pytest.mark.parametrize("keep", [(1, 1, 1), (1, 0, 1)])
def test_one_row_lanes_pair_and_carry_as_the_general_route(tiny, tiny_fitted, keep):
    eng = engine(tiny, "mtp", k=4, max_lanes=4, options={"path": str(tiny_fitted[0])})
    drafter = eng.drafter
    hidden = tiny.cfg.hidden_size
    batch = RowBatch.build([(2, 5, [7]), (0, 9, [11]), (3, 4, [13])])
    g = torch.Generator().manual_seed(0)
    out = PassOutput(
        logits=torch.zeros(0, tiny.cfg.vocab_size),
        hidden=torch.randn(3, hidden, generator=g).to(tiny.dtype),
        taps=torch.zeros(3, 0, hidden),
        records=(),
        record="rows",
    )
    keep = torch.tensor(keep)
    states = [drafter.new_state(4, 64) for _ in range(2)]
    for s in states:
        s.carry.copy_(torch.randn(s.carry.shape, generator=torch.Generator().manual_seed(1)))
    fast = drafter.raw_rows(states[0], batch, out, keep)
    general = drafter.raw_rows_drafted(states[1], batch, out, keep)
    assert torch.equal(fast, general)
    assert torch.equal(states[0].carry, states[1].carry)
