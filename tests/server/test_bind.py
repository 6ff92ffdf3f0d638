"""Loopback by default: a non-loopback bind is refused before the model loads, unless --allow-remote."""

from __future__ import annotations

import pytest

from speclane.pipeline.cli import main
from speclane.pipeline.net.server import check_bind
from speclane.stages.contract.errors import ConfigError


@pytest.mark.parametrize(
    "bind",
    [
        "tcp://127.0.0.1:5557",
        "tcp://localhost:1",
        "tcp://[::1]:5557",
        "tcp://127.0.0.1:*",
        "ipc:///tmp/speclane.sock",
        "inproc://x",
    ],
)
def test_loopback_and_local_transports_pass(bind):
    check_bind(bind, allow_remote=False)


@pytest.mark.parametrize(
    "bind", ["tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://192.168.1.4:5557", "tcp://eth0:5557", "tcp://example.com:80"]
)
def test_remote_binds_need_allow_remote(bind):
    with pytest.raises(ConfigError, match="--allow-remote"):
        check_bind(bind, allow_remote=False)
    check_bind(bind, allow_remote=True)


def test_serve_refuses_before_loading(capsys):
    assert main(["serve", "--bind", "tcp://*:5557"]) == 2
    assert "not a loopback address" in capsys.readouterr().err


def test_unknown_transport_is_refused():
    with pytest.raises(ConfigError, match="tcp://HOST:PORT"):
        check_bind("udp://127.0.0.1:1", allow_remote=True)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prefill-lanes", "0"], "--prefill-lanes must be >= 1, got 0"),
        (["--prefill-rows", "-3"], "--prefill-rows must be >= 1, got -3"),
        (["--grace", "-1"], "--grace must be >= 0 seconds, got -1"),
    ],
)
def test_serve_refuses_bad_step_flags_before_loading(capsys, flags, message):
    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err
