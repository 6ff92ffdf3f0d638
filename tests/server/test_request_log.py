"""`speclane serve` logs one line per finished request (logger `speclane.requests`), and `stats` counts the
client that asks as connected even before it has sent a request."""

from __future__ import annotations

import logging

import zmq

from tests.server.test_final_frames import finals, served, turns  # noqa: F401  (served: a fixture)


def test_one_log_line_per_finished_request(served, caplog):
    server, client = served
    c = client()
    with caplog.at_level(logging.INFO, logger="speclane.requests"):
        c.generate(id="a", prompt="hi", max_tokens=2)
        c.generate(id="b", prompt="hi", max_tokens=3)
        turns(server)
        finals(c, ["a", "b"], server)
    lines = [r.getMessage() for r in caplog.records if r.name == "speclane.requests"]
    assert lines == [
        "request 'a': length, prompt 0 + completion 2 tokens",
        "request 'b': length, prompt 0 + completion 3 tokens",
    ]


def test_stats_counts_the_asking_client_as_connected(served):
    server, client = served
    c = client()
    ident = c.sock.getsockopt(zmq.ROUTING_ID)
    assert server.stats(client=ident).clients == 1
    assert server.stats().clients == 0  # nobody asking, nothing in flight


def test_a_cancel_that_crosses_its_done_is_answered_but_not_logged(served, caplog):
    server, client = served
    c = client()
    with caplog.at_level(logging.INFO, logger="speclane.requests"):
        c.generate(id="a", prompt="hi", max_tokens=2)
        turns(server)
        assert finals(c, ["a"], server)["a"][-1].type == "done"
        c.cancel("a")  # the client's hang-up crossed the done: still one reply, no error line
        reply = finals(c, ["a"], server)["a"][-1]
        c.cancel("never")  # an id never in flight: an error, logged
        never = finals(c, ["never"], server)["never"][-1]
    assert reply.code == "unknown_id" and "has ended" in reply.message
    assert never.code == "unknown_id" and "has ended" not in never.message
    lines = [r.getMessage() for r in caplog.records if r.name == "speclane.requests"]
    assert len(lines) == 2 and lines[0].startswith("request 'a': length") and "'never'" in lines[1]
