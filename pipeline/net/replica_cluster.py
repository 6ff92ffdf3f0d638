"""`speclane serve --replicas N`: Ray started (or joined), the engine deployed as a Ray Serve deployment of N
replicas with the prefix router, the door in front, and all of it taken down again on exit.

Owns the deployment's options (`deployment_options`, plain data: replicas or autoscaling bounds, one replica's CPUs
or GPU, health checks, the router), starting a local Ray on loopback with its dashboard off, and the door's
tokenizer for routing. The door itself is replicas.py; the replica replica.py; routing replica_routing.py and
replica_router.py. Needs the `ray` extra.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
from typing import Any

from speclane.stages.contract.errors import ConfigError

log = logging.getLogger("speclane.replicas")

APP = "speclane"
ROUTING_STATS_S = 0.5  # how often each replica publishes its checkpoint prefixes and load to the router
HEALTH_PERIOD_S, HEALTH_TIMEOUT_S = 2.0, 10.0  # Ray Serve's health checks: a replica failing them is replaced
# Autoscaling's timing, as Ray Serve's `autoscaling_config` names it: how often the door reports requests in flight,
# the window they are averaged over, and how long a need must last before a replica is added or removed.
AUTOSCALING = {"metrics_interval_s": 1.0, "look_back_period_s": 5.0, "upscale_delay_s": 2.0, "downscale_delay_s": 30.0}
# The `serve` flag that sets each field: its argparse name, its spelling, what it sets (all seconds).
TIMING_FLAGS = {
    "upscale_delay_s": (
        "upscale_delay",
        "--upscale-delay",
        "how long a need for more replicas lasts before one is added",
    ),
    "downscale_delay_s": ("downscale_delay", "--downscale-delay", "how long a need for fewer lasts before one goes"),
    "metrics_interval_s": ("autoscale_interval", "--autoscale-interval", "how often the door reports its load"),
    "look_back_period_s": ("autoscale_window", "--autoscale-window", "the window its reports are averaged over"),
}
GONE_ENV = "SPECLANE_AUTOSCALING"  # what set the timing before the flags did: refused, naming them


def wants_replicas(args: argparse.Namespace) -> bool:
    """Whether the flags ask for replicas (more than one, a cluster to join, or autoscaling bounds)."""
    return args.replicas > 1 or bool(args.ray_address) or args.min_replicas is not None or args.max_replicas is not None


def check_flags(args: argparse.Namespace) -> None:
    """Refuse inconsistent replica flags, each problem named, before Ray or a model starts."""
    problems = []
    if args.replicas < 1:
        problems.append(f"--replicas must be >= 1, got {args.replicas}")
    lo, hi = args.min_replicas, args.max_replicas
    if (lo is None) != (hi is None):
        problems.append("--min-replicas and --max-replicas go together (autoscaling between them); give both")
    elif lo is not None and not 0 <= lo <= hi or hi is not None and hi < 1:
        problems.append(f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got {lo} and {hi}")
    if args.replica_stall <= 0:
        problems.append(f"--replica-stall must be > 0 seconds, got {args.replica_stall}")
    problems += timing_problems(args)
    if args.snapshot_dir is not None:
        problems.append("--snapshot-dir is not supported with replicas (each replica would need a folder of its own)")
    if problems:
        raise ConfigError("; ".join(problems))


def timing_problems(args: argparse.Namespace, env: dict[str, str] | None = None) -> list[str]:
    """What is wrong with the autoscaling timing flags, each naming its flag: a value that is not a finite number of
    seconds (>= 0 for the delays, > 0 for the interval and window), a window not longer than the interval, a timing
    flag without autoscaling, or the retired $SPECLANE_AUTOSCALING still set."""
    problems = []
    if (os.environ if env is None else env).get(GONE_ENV):
        flags = ", ".join(flag for _, flag, _ in TIMING_FLAGS.values())
        problems.append(f"${GONE_ENV} is no longer read; set autoscaling's timing with {flags} and unset it")
    given = {field: getattr(args, name, None) for field, (name, _, _) in TIMING_FLAGS.items()}
    if args.min_replicas is None and any(v is not None for v in given.values()):
        named = ", ".join(TIMING_FLAGS[f][1] for f, v in given.items() if v is not None)
        problems.append(f"{named}: autoscaling's timing needs autoscaling; add --min-replicas and --max-replicas")
    for field, value in given.items():
        delay = field.endswith("delay_s")
        if value is not None and (not math.isfinite(value) or value < 0 or (value == 0 and not delay)):
            problems.append(
                f"{TIMING_FLAGS[field][1]} must be a number of seconds {'>= 0' if delay else '> 0'}, got {value:g}"
            )
    if not problems:
        timing = autoscaling_timing(args)
        if timing["look_back_period_s"] <= timing["metrics_interval_s"]:
            problems.append(
                f"--autoscale-window ({timing['look_back_period_s']:g} s) must be longer than --autoscale-interval "
                f"({timing['metrics_interval_s']:g} s): the window averages several reports"
            )
    return problems


def autoscaling_timing(args: argparse.Namespace) -> dict[str, float]:
    """AUTOSCALING with the fields the timing flags set (checked by `timing_problems`)."""
    timing = dict(AUTOSCALING)
    for field, (name, _, _) in TIMING_FLAGS.items():
        if getattr(args, name, None) is not None:
            timing[field] = float(getattr(args, name))
    return timing


def deployment_options(args: argparse.Namespace, lanes: int) -> dict[str, Any]:
    """Ray Serve's options for the engine deployment: replicas (or autoscaling by requests in flight, a replica's
    lanes being its target, timed by `autoscaling_timing`), one replica's resources (--threads CPUs, or one GPU),
    health checks, the router."""
    from speclane.pipeline.net.replica_router import PrefixRouter

    options: dict[str, Any] = {
        # a replica takes every request the door sends: its own server queues and bounds them
        "max_ongoing_requests": lanes + args.max_queue + 64,
        "health_check_period_s": HEALTH_PERIOD_S,
        "health_check_timeout_s": max(HEALTH_TIMEOUT_S, args.replica_stall),
        "graceful_shutdown_timeout_s": args.grace + 5,
        "ray_actor_options": {"num_cpus": args.threads or 1, "runtime_env": {"env_vars": REPLICA_ENV}},
        "request_router_config": {
            "request_router_class": PrefixRouter,
            "request_router_kwargs": {"prefix": args.replica_routing == "prefix"},
            "request_routing_stats_period_s": ROUTING_STATS_S,
            "request_routing_stats_timeout_s": 5.0,
        },
    }
    if args.device.startswith("cuda"):
        options["ray_actor_options"]["num_gpus"] = 1
    if args.min_replicas is not None:
        options["autoscaling_config"] = {
            "min_replicas": args.min_replicas,
            "initial_replicas": min(max(args.replicas, args.min_replicas, 1), args.max_replicas),
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": lanes,
            **autoscaling_timing(args),
        }
    else:
        options["num_replicas"] = args.replicas
    return options


def replica_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags a replica builds its engine from: the serve flags, one device each (`cuda`: Ray picks which)."""
    flags = {k: v for k, v in vars(args).items() if k != "func"}
    if args.device.startswith("cuda"):
        flags["device"] = "cuda"  # Ray sets CUDA_VISIBLE_DEVICES to the replica's one GPU
    return flags


class DoorPrompts:
    """The door's tokenizer: a request's prompt as token ids, for the router's prefix match, as the engine reads it
    (intake.prompt_ids: the chat template for messages, given ids as they are, else the prompt text)."""

    def __init__(self, model: str | None):
        from speclane.stages.models.artifact import resolve
        from speclane.stages.models.tokenizer import Tokenizer

        self.tokenizer = Tokenizer.load(resolve(model))
        self._chat = None

    def __call__(self, request) -> list[int] | None:
        try:
            messages = request.conversation(False)
            if messages is not None:
                if self._chat is None:
                    from speclane.stages.models.chat import ChatTemplate

                    self._chat = ChatTemplate.from_tokenizer(self.tokenizer)
                return self.tokenizer.encode(self._chat.render(messages))
            if request.prompt_ids is not None:
                return list(request.prompt_ids)
            return self.tokenizer.encode(request.prompt, add_special=True)
        except Exception:  # noqa: BLE001 - the replica refuses a bad prompt with its own error; routing only guesses
            return None


# A replica's own Ray Serve settings, wherever it runs (a joined cluster too). Its methods run on the replica's main
# loop, which sends the stream's items, not on a loop of their own: by default each item of a stream crosses between
# the two loops' threads, a thread wake-up a token on a core the engine computes on. Nothing a replica's methods do
# blocks (the engine runs on threads of its own, replica.py).
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}

# Settings of the Ray this command starts (a user's own environment wins; a joined cluster keeps its own): what Ray
# and Ray Serve do in the background, idle or not, which on a machine whose cores serve the replicas takes from them.
QUIET_RAY = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage report sent out
    # the Serve controller's loop: 10 a second by default; replacing a dead replica or acting on autoscaling's
    # decision waits at most this long more, beside health checks every HEALTH_PERIOD_S
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",  # Serve's cached Ray metrics: nothing here reads them
    "RAY_enable_metrics_collection": "0",  # Ray's own metrics: speclane's metrics are its own (pipeline/net/metrics.py)
    "RAY_task_events_report_interval_ms": "0",  # task events feed Ray's state API and dashboard, both unused here
}


def quiet_ray_env(args: argparse.Namespace) -> dict[str, str]:
    """Set QUIET_RAY's settings in this process's environment where it will start its own Ray (no --ray-address)
    and the user has not set them, before Ray or Ray Serve is imported (both read them at import, and the processes
    Ray starts inherit them). Returns what was set."""
    if args.ray_address:
        return {}
    out = {k: v for k, v in QUIET_RAY.items() if k not in os.environ}
    os.environ.update(out)
    return out


def start_ray(args: argparse.Namespace, cpus: int) -> bool:
    """Join `--ray-address`, or start a Ray of `cpus` CPUs on loopback with no dashboard; True when started here."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # joining too: this process sends no usage report
    if args.ray_address:
        ray.init(address=args.ray_address, log_to_driver=False, namespace=APP)
        return False
    for attempt in (1, 2, 3):  # Ray gives its node a fixed deadline to start, which a busy machine can miss
        try:
            ray.init(
                num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, namespace=APP
            )
            break
        except Exception as exc:
            ray.shutdown()  # the processes it did start go too
            if attempt == 3:
                raise ConfigError(f"a local Ray did not start ({exc}); is the machine short of CPU or memory?") from exc
            log.warning("a local Ray did not start (%s); trying again", exc)
    return True


def run_replicas(args: argparse.Namespace, api_key: str | None, http_sock, ready: str) -> int:
    """Serve through replicas until SIGTERM or SIGINT; `ready`: the line printed once clients may connect."""
    check_flags(args)
    quiet_ray_env(args)
    try:
        import ray  # noqa: F401
        from ray import serve
    except ModuleNotFoundError as exc:
        raise ConfigError(f"--replicas needs Ray Serve ({exc.name} is missing): pip install 'speclane[ray]'") from exc
    from speclane.pipeline.cli.common import max_lanes_from_args
    from speclane.pipeline.cli.serve import _start_gateway
    from speclane.pipeline.net.replica import EngineReplica
    from speclane.pipeline.net.replica_calls import RayCalls
    from speclane.pipeline.net.replicas import ReplicaDoor

    lanes = max_lanes_from_args(args)
    count = args.max_replicas if args.max_replicas is not None else args.replicas
    prompts = DoorPrompts(args.model)

    def interrupted(*_):
        raise KeyboardInterrupt  # while starting: unwind, so what Ray started here is shut down

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupted)
    started = start_ray(args, cpus=max(2, count * (args.threads or 1)))
    try:
        serve.start(proxy_location="Disabled")
        deployment = serve.deployment(EngineReplica, name="engine", **deployment_options(args, lanes))
        app = deployment.bind(replica_flags(args), args.replica_stall)
        handle = serve.run(app, name=APP, route_prefix=None)
        door = ReplicaDoor(
            lambda ctx, events, sink: RayCalls(handle, prompts, ctx, events, stall_s=args.replica_stall, sink=sink),
            args.bind,
            allow_remote=args.allow_remote,
            curve_keys=args.curve_keys,
            api_key=api_key,
            inproc=f"inproc://speclane-gateway-{os.getpid()}" if http_sock is not None else None,
            max_message_bytes=args.max_message_bytes,
            max_queue=args.max_queue,
            max_client_queue=args.max_client_queue,
            room=lanes * count,
            grace_s=args.grace,
            direct=True,
        )
        endpoint = door.start()
        gateway = _start_gateway(args, http_sock, door) if http_sock is not None else None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: door.stop())
        print(f"{ready}{endpoint}", flush=True)
        try:
            door.serve_forever()
        finally:
            if gateway is not None:
                gateway.stop()
            door.close()
    finally:
        # Every request has ended by now. A Ray started here goes whole, replicas with it; on a joined cluster
        # only this application is deleted.
        if started:
            ray.shutdown()
        else:
            serve.delete(APP)
    print("speclane serve: stopped", file=sys.stderr)
    return 0
