"""Real `speclane serve --replicas` processes for the replica tests: start one door (with a Ray of its own), talk to
it as any client does, and on exit stop it and check that nothing of its Ray is left running.

Start-up is Ray's and the replicas' (a model load each), tens of seconds on a busy machine: the timeouts here are
generous, yet each one still ends a test that hangs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from speclane.pipeline.cli.serve import HTTP_READY, spawn
from speclane.pipeline.cli.serve import stop as stop_server
from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client
from tests.server.conftest import KEY, MODEL_FLAGS

START_S = 600  # Ray and the replicas' model loads, on a loaded machine
LONG = {"max_tokens": 400, "ignore_eos": True}  # a request that runs until it is cancelled
# A fixed prompt-row budget: a replica then starts without the pass-cost probe, which a cold cache would run in
# every replica at once.
PREFILL = ("--prefill-rows", "8")


def ray_pids() -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    names = ("raylet", "gcs_server", "ray::", "ray/_private", "ray/dashboard")
    return {int(line.split(None, 1)[0]) for line in out if any(n in line for n in names)}


@contextlib.contextmanager
def replica_door(folder: Path, *flags: str, env: dict[str, str] | None = None):
    """(ZeroMQ endpoint, HTTP URL or None) of `speclane serve FLAGS` with the API key; `env`: added to its
    environment. On exit it is stopped with SIGTERM, must exit 0, and every Ray process it started must be gone."""
    before = ray_pids()
    lines: list[str] = []
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})  # spawn passes this process's environment on
    try:
        proc, endpoint = spawn(
            folder / "serve.log", *MODEL_FLAGS, *flags, "--api-key", KEY, lines=lines, timeout=START_S
        )
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    url = next((line[len(HTTP_READY) :].split()[0] for line in lines if line.startswith(HTTP_READY)), None)
    try:
        yield endpoint, url
    finally:
        proc.terminate()  # the door shuts its Ray down, replicas with it: more than stop_server's few seconds
        try:
            proc.wait(180)
        except subprocess.TimeoutExpired:
            stop_server(proc)
        assert proc.returncode == 0, f"the door did not stop on SIGTERM; its log: {folder / 'serve.log'}"
        wait_for(lambda: not (ray_pids() - before), "every Ray process of the door gone", seconds=120)


def wait_for(check, what: str, seconds: float, every: float = 0.25):
    """Poll `check()` until it returns a truthy value; fail naming `what` and the last value seen if it never does
    (`check` may return (False, value) to report a value while not yet done)."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        value = check()
        if isinstance(value, tuple) and value and value[0] is False:
            last = value[1]
        elif value:
            return value
        time.sleep(every)
    pytest.fail(f"{what}: not reached within {seconds:g} s; last seen: {last!r}")


def client(endpoint: str, **kw) -> Client:
    return Client(endpoint, api_key=KEY, timeout=120, **kw)


def stats(endpoint: str) -> P.StatsReply:
    with client(endpoint) as c:
        return c.stats()


def live(endpoint: str) -> list[dict]:
    """The replicas `stats` lists with figures (those that answered), by id."""
    return sorted((r for r in stats(endpoint).replicas if "served" in r), key=lambda r: r["id"])


def served(endpoint: str) -> dict[str, int]:
    return {r["id"]: r["served"] for r in live(endpoint)}


def ends_of(c: Client, stream, seconds: float = 120) -> P._Msg | None:
    """Read `stream` for up to `seconds`: its final message (its done or error), or None if that did not come."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = c.next_of(stream, timeout=left)
        except TimeoutError:
            return None
        if isinstance(msg, (P.Done, P.Error)):
            return msg
    return None


def assert_silent(clients: list[Client], seconds: float = 1.5, cancelled: bool = False) -> None:
    """Nothing more arrives on any of `clients` (each had one stream, now ended) within `seconds`. `cancelled`: a
    cancel was sent, which the door refuses (unknown_id) when its request had ended before the cancel arrived."""
    time.sleep(seconds)
    for c in clients:
        try:
            late = c.recv(timeout=0.05)
        except TimeoutError:
            continue
        assert cancelled and isinstance(late, P.Error) and late.code == "unknown_id", late
        with pytest.raises(TimeoutError):
            c.recv(timeout=0.05)


def spread(endpoint: str, prompts: list[str]) -> None:
    """Send `prompts` at once, one client each, and wait for all: the router spreads them by load."""
    clients = [client(endpoint) for _ in prompts]
    try:
        streams = [c.generate(prompt=p, max_tokens=2) for c, p in zip(clients, prompts)]
        for s in streams:
            s.wait()
    finally:
        for c in clients:
            c.close()
