"""The verify round's graph: eight typed stages wired by port name, state ordered like data."""

import pytest
import torch

from speclane.pipeline.framework.executor import plan
from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.spec import load_spec, parse_spec
from speclane.stages.contract.errors import ContractError

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


def test_verify_round_is_the_eight_stages_in_order():
    graph = build_graph(load_spec("verify"))
    assert graph.order() == EIGHT
    assert [graph.graph.nodes[n]["kind"] for n in graph.order()] == EIGHT
    assert graph.round_inputs == ("drafter", "drafter_state", "lanes", "round_costs", "target", "target_state")
    assert "events" in graph.round_outputs


def test_edges_come_from_port_names_and_state_orders_mutators():
    edges = build_graph(load_spec("verify")).edges()
    assert {
        "from": "accept",
        "to": "kv_commit",
        "port": "committed_len",
        "from_port": "committed_len",
        "kind": "data",
    } in edges
    # a mutator runs after the readers listed before it, even when no data port joins them
    bump = [{"name": "bump", "kind": "tests.fixtures.user_stages:LaneBump"}]
    count = [{"name": "count", "kind": "tests.fixtures.user_stages:LaneCount"}]
    graph = build_graph(_spec(count + bump))
    assert graph.order() == ["count", "bump"]
    assert {"from": "count", "to": "bump", "port": "lanes", "from_port": "lanes", "kind": "state"} in graph.edges()
    assert build_graph(_spec(bump + count)).edges() == []  # a reader listed after the mutator sees it changed


def _spec(stages, wires=()):
    return parse_spec({"name": "t", "stages": stages, "wires": list(wires)}, "t.toml")


def test_wire_renames_an_edge_and_user_stage_runs_by_import_path():
    spec = _spec([{"name": "ping", "kind": "tests.fixtures.user_stages:Ping"}], [])
    # Ping needs 'pong', which only the engine could give: a missing input
    with pytest.raises(Exception, match="input 'pong': no stage produces it"):
        build_graph(spec)
    graph = build_graph(spec, provided=("pong",))
    out = plan(graph).run({"pong": torch.tensor([3, 4])})
    assert out["ping"].tolist() == [3, 4]


def test_contracts_checked_at_run_time():
    graph = build_graph(_spec([{"name": "ping", "kind": "tests.fixtures.user_stages:Ping"}]), provided=("pong",))
    with pytest.raises(
        ContractError,
        match=r"stage 'ping' input: port 'pong' has dtype torch.float32, the "
        r"contract says int64",
    ):
        plan(graph, check_contracts=True).run({"pong": torch.zeros(2)})
    with pytest.raises(ContractError, match=r"port 'pong' has shape \(2, 2\), the contract says \[lanes\]"):
        plan(graph, check_contracts=True).run({"pong": torch.zeros(2, 2, dtype=torch.int64)})


def test_missing_round_input_is_named():
    graph = build_graph(_spec([{"name": "ping", "kind": "tests.fixtures.user_stages:Ping"}]), provided=("pong",))
    with pytest.raises(ContractError, match=r"missing round inputs \['pong'\]"):
        plan(graph).run({})


def test_user_stage_between_accept_and_emit_is_ordered_there():
    base = load_spec("verify").model_dump(by_alias=True)
    base["stages"].insert(4, {"name": "log", "kind": "tests.fixtures.user_stages:CommittedLog", "params": {}})
    graph = build_graph(parse_spec(base, "x"))
    order = graph.order()
    assert order.index("accept") < order.index("log") < order.index("stream_emit")
