"""Typed ports as a case table: the records that flow between stages (RowBatch, PassOutput, lanes, events) are
checked field by field, with the round's dims shared across ports and fields."""

import pytest
import torch

from speclane.stages.contract.errors import ContractError
from speclane.stages.contract.events import TokenEvent
from speclane.stages.contract.lanes import Lane
from speclane.stages.contract.ports import Port, check_value
from speclane.stages.models.state import PassOutput, RowBatch
from tests.stages.conftest import make_lane

BATCH = Port("batch", "record", record=RowBatch)
PASS = Port("pass_out", "record", record=PassOutput)
LANES = Port("lane_view", "record", ("lanes",), "host", record=Lane)
EVENTS = Port("events", "record", ("events",), "host", record=TokenEvent)


def batch(**change):
    b = RowBatch.build([(0, 5, [1, 2, 3]), (2, 0, [4])])
    fields = {f: getattr(b, f) for f in ("tokens", "positions", "cu_rows", "slots", "lane_rows", "lane_start")}
    return RowBatch(**{**fields, **change})


def pass_out(rows=4, logit_rows=4, hidden=6, dtype=torch.float32):
    return PassOutput(
        logits=torch.zeros(logit_rows, 10),
        hidden=torch.zeros(rows, hidden, dtype=dtype),
        taps=torch.zeros(rows, 0, hidden, dtype=dtype),
        records=(None,),
        record="rows",
    )


# (port, value, sizes bound before) -> the error's words (None: the value keeps the contract)
CASES = {
    "a batch": (BATCH, batch(), {}, None),
    "a batch, lanes bound by cu_rows [lanes+1]": (BATCH, batch(), {"lanes": 2, "rows": 4}, None),
    "positions of the wrong dtype": (
        BATCH,
        batch(positions=torch.zeros(4, dtype=torch.int32)),
        {},
        "'positions' has dtype torch.int32, the contract says int64",
    ),
    "cu_rows one short": (
        BATCH,
        batch(cu_rows=torch.tensor([0, 3])),
        {"lanes": 2},
        "('lanes+1') is 2, but 'lanes' is 2",
    ),
    "a lane_rows entry not an int": (BATCH, batch(lane_rows=(3, 1.0)), {}, "'lane_rows' holds a value that is not"),
    "a batch with more lanes than the round": (BATCH, batch(), {"lanes": 3}, "'lanes' is 3 elsewhere"),
    "not a RowBatch": (BATCH, object(), {}, "holds a object, the contract says RowBatch"),
    "a pass": (PASS, pass_out(), {"rows": 4}, None),
    "a prefill pass: logits of each lane's last row": (
        PASS,
        pass_out(rows=9, logit_rows=2),
        {"lanes": 2, "rows": 9},
        None,
    ),
    "hidden rows that are not the batch's": (PASS, pass_out(rows=5), {"rows": 4}, "('rows') is 5, but 'rows' is 4"),
    "hidden in an integer dtype": (PASS, pass_out(dtype=torch.int64), {}, "the contract says a float"),
    "lanes": (LANES, [make_lane(slot=0), make_lane(slot=1)], {"lanes": 2}, None),
    "one lane too many": (LANES, [make_lane(slot=0), make_lane(slot=1)], {"lanes": 1}, "length ('lanes') is 2"),
    "a lane that is not a Lane": (LANES, [make_lane(), "lane"], {}, "holds a str, the contract says Lane"),
    "events": (EVENTS, [TokenEvent(0, 0, 65, "A")], {}, None),
    "events as a tuple of tuples": (EVENTS, [(0, 0, 65, "A")], {}, "holds a tuple, the contract says TokenEvent"),
    "runs on the host": (
        Port("runs", "int64", ("lanes", "k1"), "host"),
        torch.zeros(2, 3, dtype=torch.int64),
        {},
        None,
    ),
    "runs not on the host": (
        Port("runs", "int64", ("lanes", "k1"), "host"),
        torch.zeros(2, 3, dtype=torch.int64, device="meta"),
        {},
        "the contract says the host",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_contract_case_table(name):
    port, value, bound, error = CASES[name]
    sizes = dict(bound)
    if error is None:
        check_value(port, value, sizes, "case")
    else:
        with pytest.raises(ContractError) as err:
            check_value(port, value, sizes, "case")
        assert error in str(err.value)


@pytest.mark.parametrize(
    "inp, out, why",
    [
        (BATCH, BATCH, None),
        (Port("batch", "object"), BATCH, None),  # an untyped reader takes the record
        (BATCH, Port("batch", "object"), "dtype object does not match RowBatch"),
        (BATCH, PASS, "dtype PassOutput does not match RowBatch"),
        (
            Port("logits", "float32", ("rows", "vocab")),
            Port("logits", "float32", ("logit_rows", "vocab")),
            "dims [logit_rows, vocab] do not match [rows, vocab]",
        ),
    ],
)
def test_record_ports_connect_to_their_own_class(inp, out, why):
    assert inp.compatible(out) == why
