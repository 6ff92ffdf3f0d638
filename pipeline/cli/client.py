"""`speclane client`: send one request to `speclane serve` and print its text as it streams."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import zmq.auth

from speclane.pipeline.cli.generate import prompt_fields
from speclane.pipeline.net.api_key import read_key
from speclane.pipeline.runtime.request import SamplingParams, parse_request
from speclane.stages.contract.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("client", help="send a request to `speclane serve` and stream the reply")
    p.add_argument("--connect", default="tcp://127.0.0.1:5557", help="server endpoint")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument(
        "--chat",
        action="store_true",
        help="send --prompt as a user message through the model's chat "
        "template (as `speclane generate --chat`; `speclane chat` holds a whole conversation)",
    )
    p.add_argument("--system", default=None, help="system message for --chat")
    # One flag per sampling field of the request model, so ranges and defaults stay written once.
    for name, field in SamplingParams.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if name == "stop":
            p.add_argument(flag, action="append", default=None, help="stop string (repeatable)")
        elif field.annotation is bool:
            p.add_argument(flag, action="store_true", default=None)
        else:
            p.add_argument(
                flag,
                type=float if name in ("temperature", "top_p") else int,
                default=None,
                help=f"default {field.default}",
            )
    p.add_argument("--draft-tokens", type=int, default=None, help="this request's draft tokens (1 to 7)")
    p.add_argument("--no-spec", action="store_true", help="turn speculation off for this request")
    p.add_argument("--json", action="store_true", help="print the final done message as JSON on stderr")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each message")
    p.add_argument("--server-key", type=Path, default=None, help="the server's CURVE public key file (.key)")
    p.add_argument("--client-key", type=Path, default=None, help="this client's CURVE secret key file")
    p.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="a file holding the server's API key (preferred, as is $SPECLANE_API_KEY, the default)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="the server's API key itself; other users see it in `ps`: prefer --api-key-file",
    )
    p.set_defaults(func=run)


def request_fields(args: argparse.Namespace) -> dict:
    fields = {k: getattr(args, k) for k in SamplingParams.model_fields if getattr(args, k) is not None}
    fields.update(prompt_fields(args.prompt, args.chat, args.system))
    spec = {}
    if args.no_spec:
        spec["enabled"] = False
    if args.draft_tokens is not None:
        spec["draft_tokens"] = args.draft_tokens
    if spec:
        fields["spec"] = spec
    return fields


def _curve(args) -> dict:
    if args.server_key is None:
        return {}
    try:
        server_public, _ = zmq.auth.load_certificate(args.server_key)
        keys = zmq.auth.load_certificate(args.client_key) if args.client_key else None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--server-key/--client-key: {exc}") from exc
    if keys is not None and keys[1] is None:
        raise ConfigError(f"--client-key {args.client_key}: not a secret key file (*.key_secret)")
    return {"server_key": server_public, "client_keys": keys}


def run(args: argparse.Namespace) -> int:
    from speclane.pipeline.net.client import Client

    request = parse_request({"id": 0, **request_fields(args)})
    # check: a refused connection is said within 2 s, not after --timeout (the probe is a plain TCP connect)
    api_key = read_key(args.api_key, args.api_key_file)
    with Client(args.connect, timeout=args.timeout, check=True, api_key=api_key, **_curve(args)) as client:
        stream = client.generate(request)
        try:
            for token in stream:
                sys.stdout.write(token.text)
                sys.stdout.flush()
        except TimeoutError as exc:
            print(f"\nspeclane client: {exc} (is `speclane serve` running at {args.connect}?)", file=sys.stderr)
            return 1
        except ConnectionError as exc:  # the server went away mid-stream: the message names it
            print(f"\nspeclane client: {exc}", file=sys.stderr)
            return 1
        print()
        if args.json:
            print(stream.done.model_dump_json(), file=sys.stderr)
    return 0
