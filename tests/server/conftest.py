"""Real `speclane serve` processes on loopback for the server tests, started once per session each.

`server`: the default verify spec (ngram), 4 lanes, a row budget of 8 so every round stays on the decode
route (tokens equal offline generation whatever lanes share a round), a small maximum message size.
`guarded`: CURVE with one listed client key, 2 lanes, a queue of 1, and a verify spec with a stage that fails
lanes whose prompt carries a marker token (tests/fixtures/failing_stage.py).
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq.auth

from pipeline.client import Client

ROOT = Path(__file__).resolve().parents[2]
FAIL_SPEC = Path(__file__).parent / "specs" / "fail_verify.toml"
MARKER = 4242
MAX_MESSAGE_BYTES = 65536
MODEL_FLAGS = ("--dtype", "float32", "--threads", "1", "--spec-draft-rows", "8")


def start_server(log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """Start `speclane serve` on a free loopback port; return the process and its endpoint once ready."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # `python -m` from the repo root, so the server can import the test fixture stage by its dotted path.
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--bind", "tcp://127.0.0.1:*", *MODEL_FLAGS, *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    deadline = time.monotonic() + 180
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if "ready on " in line:
                return proc, line.split("ready on ", 1)[1].strip()
    stop_server(proc)
    raise RuntimeError(f"speclane serve did not start ({line!r}); its log:\n{log.read_text()[-4000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, endpoint = start_server(log, "--max-lanes", "4", "--max-message-bytes", str(MAX_MESSAGE_BYTES))
    yield endpoint
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


@pytest.fixture(scope="session")
def guarded(tmp_path_factory, curve_keys):
    log = tmp_path_factory.mktemp("serve_guarded") / "serve.log"
    proc, endpoint = start_server(log, "--max-lanes", "2", "--max-queue", "1", "--spec", str(FAIL_SPEC),
                                  "--curve-keys", str(curve_keys / "server"))
    yield endpoint
    stop_server(proc)


def curve_client(endpoint: str, keys: Path, who: str, **kw) -> Client:
    server_public, _ = zmq.auth.load_certificate(keys / "server" / "server.key")
    return Client(endpoint, server_key=server_public, client_keys=zmq.auth.load_certificate(keys / f"{who}.key_secret"),
                  **kw)


def wait_until(check, what: str, seconds: float = 60.0):
    """Poll `check()` until it returns a truthy value; fail naming `what` if it never does."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"{what}: not reached within {seconds:g} s")
