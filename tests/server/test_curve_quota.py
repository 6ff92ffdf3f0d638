"""The per-client queue quota under CURVE counts by the client's key, not by its connection (issue 16).

A real `speclane serve` with two listed client keys, one lane and `--max-client-queue 1`: two sockets that
authenticate with the same key share one quota, two sockets with different keys each have their own, and
`stats` counts "yours" by key. Keyed by routing identity instead, the second socket of the same key would be
admitted and would see none of the first socket's requests as its own: both checks below would fail.
"""

from __future__ import annotations

import pytest
import zmq.auth

from speclane.pipeline.cli.serve import stop as stop_server
from speclane.pipeline.net.client import Client, ServerError
from tests.server.conftest import curve_client, start_server, wait_until

LONG = {"prompt": "Count from one to a thousand:", "max_tokens": 400, "ignore_eos": True}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """server.key_secret, and clients/ listing both alice's and bob's public keys."""
    root = tmp_path_factory.mktemp("curve_quota")
    (root / "server" / "clients").mkdir(parents=True)
    zmq.auth.create_certificates(root / "server", "server")
    for who in ("alice", "bob"):
        zmq.auth.create_certificates(root, who)
        (root / "server" / "clients" / f"{who}.key").write_bytes((root / f"{who}.key").read_bytes())
    return root


@pytest.fixture(scope="module")
def quota_server(tmp_path_factory, keys):
    folder = tmp_path_factory.mktemp("serve_quota")
    proc, endpoint = start_server(
        folder / "serve.log",
        "--max-lanes",
        "1",
        "--max-queue",
        "8",
        "--max-client-queue",
        "1",
        "--curve-keys",
        str(keys / "server"),
    )
    yield endpoint
    stop_server(proc)


def test_quota_is_shared_by_one_key_and_separate_across_keys(quota_server, keys):
    sockets = {
        name: curve_client(quota_server, keys, who, timeout=120)
        for name, who in (("alice1", "alice"), ("alice2", "alice"), ("bob", "bob"))
    }
    a1, a2, bob = sockets["alice1"], sockets["alice2"], sockets["bob"]
    streams: list[tuple[Client, object]] = []
    try:
        running = a1.generate(**LONG)
        streams.append((a1, running))
        next(iter(running))  # the one lane is taken: whatever comes next waits
        queued = a1.generate(**LONG)
        streams.append((a1, queued))
        # the stats query follows the generate on the same socket, so the server has counted it when this answers
        assert a1.stats().queue["yours"] == 1
        # alice's second socket: the same key, a different routing id
        over = a2.generate(**LONG)
        with pytest.raises(ServerError) as info:
            over.wait()
        assert (info.value.code, info.value.field, info.value.rid) == ("client_queue_full", "request", over.id)
        queue = a2.stats().queue
        assert (queue["waiting"], queue["yours"], queue["max_per_client"]) == (1, 1, 1)
        # bob's key has a quota of its own
        bobs = bob.generate(**LONG)
        streams.append((bob, bobs))
        queue = wait_until(lambda: (q := bob.stats().queue)["waiting"] == 2 and q, "bob's request queued")
        assert (queue["yours"], queue["clients_waiting"]) == (1, 2)
        assert a2.stats().queue["yours"] == 1  # alice's one queued request, seen from her other socket
    finally:
        # the queued ones first, so a lane freed by a cancel cannot admit one before its own cancel arrives
        for client, stream in reversed(streams):
            client.cancel(stream.id)
        for client, stream in streams:
            assert stream.wait().finish_reason == "cancelled"
        for client in sockets.values():
            client.close()
