"""The guarded server: CURVE with an allow-list, a stage failure that ends only its own request, a full queue."""

from __future__ import annotations

import pytest

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client, ServerError, Unreachable
from tests.server.conftest import MARKER, curve_client


def test_listed_key_is_served_unlisted_and_plain_are_not(guarded, curve_keys):
    with curve_client(guarded, curve_keys, "alice", timeout=60) as alice:
        assert alice.generate(prompt="Hello", max_tokens=3).wait().usage["completion_tokens"] >= 1
    # Refused at the handshake: said as such within seconds, not a wait for the whole timeout.
    with curve_client(guarded, curve_keys, "mallory", timeout=60) as mallory:
        with pytest.raises(Unreachable, match="the server refused this client"):
            mallory.send({"v": 1, "type": "stats"})
            mallory.recv()
    with Client(guarded, timeout=60) as plain:
        with pytest.raises(Unreachable, match="the handshake failed"):
            plain.send({"v": 1, "type": "stats"})
            plain.recv()


def test_stage_failure_ends_only_its_request(guarded, curve_keys):
    with curve_client(guarded, curve_keys, "alice", timeout=120) as client:
        fine = client.generate(prompt="Once upon a time", max_tokens=12, ignore_eos=True)
        first = next(iter(fine))  # streaming before the failing request arrives
        bad = client.generate(prompt_ids=[1, MARKER, 2], max_tokens=12)
        with pytest.raises(ServerError) as info:
            bad.wait()
        assert info.value.code == "stage_error" and f"marker token {MARKER}" in str(info.value)
        assert info.value.rid == bad.id
        done = fine.wait()
        assert first.index == 0 and done.finish_reason == "length"
        assert [t.index for t in fine.tokens] == list(range(12))
        stats = client.stats()
        assert stats.finished.get("error", 0) >= 1 and stats.lanes["active"] == 0


def test_full_queue_answers_with_an_error(guarded, curve_keys):
    long = {"prompt": "Count from one to a thousand:", "max_tokens": 400, "ignore_eos": True}
    with curve_client(guarded, curve_keys, "alice", timeout=120) as client:
        running = [client.generate(**long) for _ in range(2)]
        for stream in running:
            next(iter(stream))  # both lanes taken
        queued = client.generate(**long)
        refused = client.generate(**long)
        with pytest.raises(ServerError) as info:
            refused.wait()
        assert (info.value.code, info.value.field, info.value.rid) == ("queue_full", "request", refused.id)
        queue = client.stats().queue
        assert (queue["waiting"], queue["max"], queue["yours"]) == (1, 1, 1)
        # The queued one first, so a lane freed by a cancel cannot admit it before its own cancel arrives.
        for stream in [queued] + running:
            client.cancel(stream.id)
        for stream in running + [queued]:
            assert stream.wait().finish_reason == "cancelled"
        assert queued.tokens == []
