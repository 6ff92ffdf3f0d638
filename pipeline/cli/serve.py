"""`speclane serve`: load the model, build the engine and serve it over ZeroMQ (see docs/protocol.md).

Also `spawn`/`stop`: run `speclane serve` as a child process and wait for its ready line (tests, benchmarks).
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from speclane.pipeline.cli.common import add_model_flags, add_spec_flags, engine_from_args
from speclane.pipeline.cli.progress import Progress
from speclane.pipeline.cli.step_flags import add_step_flags, apply_step_flags, check_step_flags
from speclane.pipeline.net.api_key import read_key
from speclane.pipeline.net.replica_cluster import AUTOSCALING, TIMING_FLAGS, wants_replicas
from speclane.stages.contract.errors import ConfigError

if TYPE_CHECKING:  # imported by `run`: the parser (and --help) builds without torch, which this imports
    from speclane.pipeline.net.server import Server

READY = "speclane serve: ready on "
HTTP_READY = "speclane serve: OpenAI-compatible API on "
ROOT = Path(__file__).resolve().parents[2]


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the engine over ZeroMQ (a ROUTER socket; loopback by default)")
    p.add_argument(
        "--bind",
        default="tcp://127.0.0.1:5557",
        help="endpoint to bind (default tcp://127.0.0.1:5557; port * picks a free one)",
    )
    p.add_argument("--allow-remote", action="store_true", help="allow binding to a non-loopback address")
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests waiting beyond --max-lanes; past it a request gets a queue_full error",
    )
    p.add_argument(
        "--max-client-queue",
        type=int,
        default=None,
        help="requests one client may have waiting beyond the free lanes (by CURVE key where CURVE is on, "
        "else by connection); past it a client_queue_full error (default: a quarter of --max-queue)",
    )
    p.add_argument(
        "--snapshot-dir",
        default=None,
        metavar="DIR",
        help="write prompt checkpoints to DIR as they are taken and serve from the ones there after a "
        "restart (each file is verified first: a damaged or old one is moved aside as *.bad with a "
        "warning, one of another model or drafter left alone; docs/artifacts.md)",
    )
    add_step_flags(p)
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="on SIGTERM or SIGINT: seconds requests in flight get to finish before they end with a "
        "server_stopping error (default 10; a second signal ends them at once)",
    )
    p.add_argument(
        "--curve-keys",
        type=Path,
        default=None,
        help="folder with server.key_secret and clients/*.key: CURVE encryption, and only the listed "
        "client keys are served",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=1 << 20,
        help="largest message accepted; a peer sending more is disconnected (default 1 MiB)",
    )
    p.add_argument(
        "--http",
        default=None,
        metavar="HOST:PORT",
        help="also serve the OpenAI-compatible API there (/v1/chat/completions, /v1/completions, "
        "/v1/models; docs/http.md); loopback unless --allow-remote; needs `pip install speclane[http]`",
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="a file holding the API key both doors ask for: HTTP as 'Authorization: Bearer KEY', ZeroMQ "
        "as the `key` field of every message (preferred, as is $SPECLANE_API_KEY, the default; unset: "
        "no key asked)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="the API key itself; other users see it in `ps`: prefer --api-key-file or $SPECLANE_API_KEY",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="with --http: the model name /v1/models lists and "
        "requests must name (default: the --model file's name, or SmolLM2-135M-Instruct)",
    )
    add_replica_flags(p)
    add_model_flags(p)
    add_spec_flags(p)
    p.set_defaults(func=run)


def add_replica_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replicas (Ray Serve; `pip install 'speclane[ray]'`, docs/scaling.md)")
    g.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="run N engines, each in its own process (--threads CPU threads, or one GPU, each), behind the same "
        "doors; requests go to the replica holding their longest prompt prefix, else the less loaded of two",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="join a running Ray cluster (auto: the one `ray start --head` started here) instead of starting "
        "a local Ray on loopback",
    )
    g.add_argument("--min-replicas", type=int, default=None, help="autoscale by requests in flight, down to this")
    g.add_argument("--max-replicas", type=int, default=None, help="autoscale by requests in flight, up to this")
    for field, (_, flag, what) in TIMING_FLAGS.items():
        text = f"autoscaling: {what} (Ray Serve's {field}; default {AUTOSCALING[field]:g})"
        g.add_argument(flag, type=float, default=None, metavar="S", help=text)
    g.add_argument(
        "--replica-routing",
        choices=("prefix", "random"),
        default="prefix",
        help="prefix: to the replica holding the prompt's longest checkpointed prefix, unless it is much busier "
        "(default); random: the less loaded of two random replicas, always (for comparisons)",
    )
    g.add_argument(
        "--replica-stall",
        type=float,
        default=10.0,
        metavar="S",
        help="a replica that sends nothing for a request this many seconds (not even its heartbeat) is taken as "
        "hung: the request ends with a replica_unresponsive error (default 10)",
    )


def _http_socket(args: argparse.Namespace):
    if args.http is None:
        return None
    try:
        from speclane.pipeline.net.http_door import http_socket
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"--http needs FastAPI and uvicorn ({exc.name} is missing): pip install 'speclane[http]'"
        ) from exc
    return http_socket(args.http, args.allow_remote)


def _start_gateway(args: argparse.Namespace, sock, server: Server):
    from speclane.pipeline.net.http import create_app
    from speclane.pipeline.net.http_door import Gateway

    name = args.served_model_name or (Path(args.model).stem if args.model else "SmolLM2-135M-Instruct")
    logging.getLogger("speclane.http").setLevel(logging.INFO)
    # Over the server's inproc endpoint: under --curve-keys a TCP connection would need a listed key of its own.
    app = create_app(
        server.inproc, name, api_key=server.api_key, max_message_bytes=args.max_message_bytes, ctx=server.ctx
    )
    gateway = Gateway(sock, app)
    print(f"{HTTP_READY}{gateway.start()}/v1 (model {name})", flush=True)
    return gateway


def run(args: argparse.Namespace) -> int:
    from speclane.pipeline.net.server import Server, check_bind

    check_bind(args.bind, args.allow_remote)  # before the model loads: a refused bind should be quick
    if args.max_queue < 1 or args.max_message_bytes < 256:
        raise ConfigError("--max-queue must be >= 1 and --max-message-bytes >= 256")
    if args.max_client_queue is not None and args.max_client_queue < 1:
        raise ConfigError(f"--max-client-queue must be >= 1, got {args.max_client_queue}")
    check_step_flags(args)
    if args.grace < 0:
        raise ConfigError(f"--grace must be >= 0 seconds, got {args.grace:g}")
    api_key = read_key(args.api_key, args.api_key_file)
    http_sock = _http_socket(args)  # before the model loads, like the bind check
    if wants_replicas(args):
        from speclane.pipeline.net.replica_cluster import run_replicas

        return run_replicas(args, api_key, http_sock, READY)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("speclane.requests").setLevel(logging.INFO)  # one line per finished request
    engine = engine_from_args(args, progress=Progress())
    apply_step_flags(engine, args)
    # The server enforces --max-queue beyond the free lanes; the engine's own bound is only a backstop.
    engine.max_queue = args.max_queue + engine.lanes.max_lanes
    server = Server(
        engine,
        args.bind,
        allow_remote=args.allow_remote,
        curve_keys=args.curve_keys,
        api_key=api_key,
        inproc=f"inproc://speclane-gateway-{os.getpid()}" if http_sock is not None else None,
        max_message_bytes=args.max_message_bytes,
        max_queue=args.max_queue,
        max_client_queue=args.max_client_queue,
        grace_s=args.grace,
    )
    endpoint = server.start()
    gateway = _start_gateway(args, http_sock, server) if http_sock is not None else None
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop admitting, let in-flight requests finish, then end them
        signal.signal(sig, lambda *_: server.stop())
    # Tests and scripts wait for this line before connecting.
    print(f"{READY}{endpoint}", flush=True)
    try:
        server.serve_forever()
    finally:
        if gateway is not None:
            gateway.stop()
        server.close()
    print("speclane serve: stopped", file=sys.stderr)
    return 0


def spawn(
    log: Path, *flags: str, timeout: float = 180.0, lines: list[str] | None = None
) -> tuple[subprocess.Popen, str]:
    """Start `speclane serve FLAGS` on a free loopback port (one torch thread); return it and its endpoint.
    `lines` collects what it printed before its ready line (the HTTP address, with --http)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # `python -m` from the repo root, so a spec can name user stages by dotted path (tests.fixtures...).
    cmd = [
        sys.executable,
        "-m",
        "speclane.pipeline.cli",
        "serve",
        "--bind",
        "tcp://127.0.0.1:*",
        "--threads",
        "1",
        *flags,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    deadline = time.monotonic() + timeout
    line, pending = "", ""
    # Raw reads of the pipe, split here: a buffered readline can pull two lines (the HTTP address and the ready
    # line, printed back to back) into its buffer, where select() no longer sees the second one.
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1.0)[0]:
            pending += os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
            while "\n" in pending:
                line, pending = pending.split("\n", 1)
                if line.startswith(READY):
                    return proc, line[len(READY) :].strip()
                if lines is not None:
                    lines.append(line + "\n")
    stop(proc)
    raise RuntimeError(f"speclane serve did not start ({line!r}); its log:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
