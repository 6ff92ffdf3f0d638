"""Real `speclane serve` processes on loopback for the server tests, started once per session each.

`server`: the default verify spec (ngram), 4 lanes, a row budget of 8 so every round stays on the decode
route (tokens equal offline generation whatever lanes share a round), a small maximum message size.
`gateway`: `--http` with an API key, 2 lanes.
`guarded`: CURVE with one listed client key, 2 lanes, a queue of 1, and a verify spec with a stage that fails
lanes whose prompt carries a marker token (tests/fixtures/failing_stage.py).
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import tomlkit
import zmq.auth

from speclane.pipeline.cli.serve import HTTP_READY, spawn
from speclane.pipeline.cli.serve import stop as stop_server
from speclane.pipeline.net.client import Client

SPECS = Path(__file__).resolve().parents[2] / "specs"
MARKER = 4242
MAX_MESSAGE_BYTES = 65536
MODEL_FLAGS = ("--dtype", "float32", "--spec-draft-rows", "8")
KEY = "sk-test-key"
MODEL = "SmolLM2-135M-Instruct"


def start_server(log: Path, *flags: str, lines: list[str] | None = None):
    return spawn(log, *MODEL_FLAGS, *flags, lines=lines)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, endpoint = start_server(log, "--max-lanes", "4", "--max-message-bytes", str(MAX_MESSAGE_BYTES))
    yield endpoint
    stop_server(proc)


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    """(HTTP base URL, ZeroMQ endpoint, log path) of one `speclane serve --http --api-key` process."""
    log = tmp_path_factory.mktemp("serve_http") / "serve.log"
    lines: list[str] = []
    proc, endpoint = start_server(log, "--max-lanes", "2", "--http", "127.0.0.1:0", "--api-key", KEY, lines=lines)
    url = next(line[len(HTTP_READY) :].split()[0] for line in lines if line.startswith(HTTP_READY))
    yield url, endpoint, log
    stop_server(proc)


@pytest.fixture(scope="session")
def curve_keys(tmp_path_factory):
    """server.key_secret + clients/alice.key for the server; alice's and mallory's secret keys for clients."""
    root = tmp_path_factory.mktemp("curve")
    (root / "server" / "clients").mkdir(parents=True)
    zmq.auth.create_certificates(root / "server", "server")
    zmq.auth.create_certificates(root, "alice")
    zmq.auth.create_certificates(root, "mallory")
    (root / "server" / "clients" / "alice.key").write_bytes((root / "alice.key").read_bytes())
    return root


def fail_spec(folder: Path) -> Path:
    """specs/verify.toml with FailOnMarker right after anchor_gather: it raises before any stage touches state."""
    doc = tomlkit.parse((SPECS / "verify.toml").read_text())
    stage = tomlkit.table()
    stage.update(
        {"name": "fail_on_marker", "kind": "tests.fixtures.failing_stage:FailOnMarker", "params": {"marker": MARKER}}
    )
    names = [s["name"] for s in doc["stages"]]
    doc["stages"].insert(names.index("anchor_gather") + 1, stage)
    path = folder / "fail_verify.toml"
    path.write_text(tomlkit.dumps(doc))
    return path


@pytest.fixture(scope="session")
def guarded(tmp_path_factory, curve_keys):
    folder = tmp_path_factory.mktemp("serve_guarded")
    proc, endpoint = start_server(
        folder / "serve.log",
        "--max-lanes",
        "2",
        "--max-queue",
        "1",
        "--spec",
        str(fail_spec(folder)),
        "--curve-keys",
        str(curve_keys / "server"),
    )
    yield endpoint
    stop_server(proc)


def curve_client(endpoint: str, keys: Path, who: str, **kw) -> Client:
    server_public, _ = zmq.auth.load_certificate(keys / "server" / "server.key")
    return Client(
        endpoint, server_key=server_public, client_keys=zmq.auth.load_certificate(keys / f"{who}.key_secret"), **kw
    )


def wait_until(check, what: str, seconds: float = 60.0):
    """Poll `check()` until it returns a truthy value; fail naming `what` if it never does."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"{what}: not reached within {seconds:g} s")


def post_json(
    url: str,
    path: str,
    body: dict | bytes,
    key: str | None = None,
    timeout: float = 60.0,
    content_type: str = "application/json",
) -> tuple[int, dict]:
    """POST `body` (a dict sent as JSON, or bytes as they are) to `path` (e.g. /v1/completions) of the gateway at
    `url`: (status, the answer's JSON)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {key}"} if key else {})}
    data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    try:
        conn.request("POST", path, data, headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()
