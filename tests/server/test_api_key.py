"""One trust model for both doors: with an API key, the ZeroMQ door asks every message for it as the HTTP door does,
the key is read from a file or the environment (not only the command line), and `--http` works beside
`--curve-keys` (the gateway reaches the server in-process, where no CURVE handshake applies).

A real `speclane serve --curve-keys --http --api-key-file`: without the in-process endpoint every HTTP request
waited out its timeout, the gateway's TCP connection refused for want of a listed CURVE key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from speclane.pipeline.cli.serve import HTTP_READY
from speclane.pipeline.cli.serve import stop as stop_server
from speclane.pipeline.net.api_key import read_key
from speclane.pipeline.net.client import ServerError
from speclane.stages.contract.errors import ConfigError
from tests.server.conftest import MODEL, curve_client, post_json, start_server

KEY = "sk-file-key-\u00e9"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, curve_keys):
    """(HTTP URL, ZeroMQ endpoint) of a server with CURVE, an HTTP door and an API key read from a file."""
    folder = tmp_path_factory.mktemp("serve_keyed")
    key_file = folder / "api.key"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    lines: list[str] = []
    proc, endpoint = start_server(
        folder / "serve.log",
        "--max-lanes",
        "2",
        "--curve-keys",
        str(curve_keys / "server"),
        "--http",
        "127.0.0.1:0",
        "--api-key-file",
        str(key_file),
        lines=lines,
    )
    url = next(line[len(HTTP_READY) :].split()[0] for line in lines if line.startswith(HTTP_READY))
    yield url, endpoint
    stop_server(proc)


def test_http_is_served_beside_curve(keyed):
    status, answer = post_json(
        keyed[0], "/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 3}, key=KEY, timeout=60
    )
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1, answer
    status, answer = post_json(keyed[0], "/v1/completions", {"model": MODEL, "prompt": "Hello"}, key="sk-wrong")
    assert (status, answer["error"]["code"]) == (401, "invalid_api_key")


@pytest.mark.parametrize("key", [None, "sk-wrong", KEY[:-1], 12345])
def test_zmq_messages_without_the_key_are_refused(keyed, curve_keys, key):
    with curve_client(keyed[1], curve_keys, "alice", timeout=60) as alice:
        extra = {} if key is None else {"key": key}
        for message in (
            {"v": 1, "type": "generate", "id": 1, "prompt": "Hello", "max_tokens": 2},
            {"v": 1, "type": "stats", "id": 2},
            {"v": 1, "type": "cancel", "id": 3},
            {"v": 1, "type": "graph", "id": 4},
        ):
            alice.send({**message, **extra})
            reply = alice.recv()
            assert (reply.type, reply.code, reply.field, reply.id) == (
                "error",
                "invalid_api_key",
                "key",
                message["id"],
            ), reply
        alice.api_key = "sk-wrong"
        with pytest.raises(ServerError, match="invalid_api_key"):
            alice.stats()


def test_zmq_messages_with_the_key_are_served(keyed, curve_keys):
    with curve_client(keyed[1], curve_keys, "alice", timeout=60, api_key=KEY) as alice:
        assert alice.generate(prompt="Hello", max_tokens=2).wait().usage["completion_tokens"] >= 1
        assert alice.stats().lanes["max"] == 2


def test_speclane_client_takes_the_key_from_the_environment(keyed, curve_keys):
    cmd = [
        sys.executable,
        "-m",
        "speclane.pipeline.cli",
        "client",
        "--connect",
        keyed[1],
        "--prompt",
        "Hello",
        "--max-tokens",
        "2",
        "--server-key",
        str(curve_keys / "server" / "server.key"),
        "--client-key",
        str(curve_keys / "alice.key_secret"),
        "--timeout",
        "60",
    ]
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "SPECLANE_API_KEY": KEY},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    refused = subprocess.run(
        cmd,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "SPECLANE_API_KEY"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2 and "invalid_api_key" in refused.stderr, refused.stderr


def test_the_key_is_read_from_a_file_the_environment_or_the_flag(tmp_path):
    path = tmp_path / "key"
    path.write_text("  sk-1\n")
    assert read_key(None, path, environ={"SPECLANE_API_KEY": "sk-env"}) == "sk-1"
    assert read_key(None, None, environ={"SPECLANE_API_KEY": "sk-env"}) == "sk-env"
    assert read_key("sk-flag", None, environ={"SPECLANE_API_KEY": "sk-env"}) == "sk-flag"
    assert read_key(None, None, environ={}) is None and read_key(None, None, environ={"SPECLANE_API_KEY": ""}) is None
    with pytest.raises(ConfigError, match="give one"):
        read_key("sk-flag", path, environ={})
    path.write_text("\n")
    with pytest.raises(ConfigError, match="--api-key-file .*: the file is empty"):
        read_key(None, path, environ={})
    with pytest.raises(ConfigError, match="--api-key-file .*: cannot read it"):
        read_key(None, tmp_path / "missing", environ={})
    with pytest.raises(ConfigError, match=r"\$SPECLANE_API_KEY: the key is blank"):
        read_key(None, None, environ={"SPECLANE_API_KEY": " "})
