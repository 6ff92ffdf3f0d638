"""The server's ROUTER socket: where it may bind (loopback unless allowed), its options (ZMTP 3 peers only,
heartbeats, the largest message) and CURVE with a ZAP allow-list. The serve loop is `pipeline/net/server.py`'s; the
client's socket is `pipeline/net/client.py`'s."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from speclane.pipeline.net.liveness import heartbeat
from speclane.stages.contract.errors import ConfigError, RequestError

log = logging.getLogger("speclane.server")

ZAP_DOMAIN = "speclane"  # the ZAP handler's allow-list is configured for this domain


def check_bind(bind: str, allow_remote: bool) -> None:
    """Refuse an endpoint reachable from other machines unless `allow_remote`."""
    url = urlsplit(bind)
    if url.scheme in ("ipc", "inproc"):
        return
    if url.scheme != "tcp":
        raise ConfigError(f"--bind {bind}: use tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    host = bind[len("tcp://") :].rpartition(":")[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # '*', an interface name or a host name: possibly reachable from outside
    if not loopback and not allow_remote:
        raise ConfigError(
            f"--bind {bind}: '{host}' is not a loopback address; bind to tcp://127.0.0.1:PORT, "
            f"or pass --allow-remote (and consider --curve-keys)"
        )


def router(ctx: zmq.Context, max_message_bytes: int, curve_keys: Path | None) -> tuple[zmq.Socket, object]:
    """A ROUTER socket with the server's options, and its CURVE authenticator (None without --curve-keys)."""
    sock = ctx.socket(zmq.ROUTER)
    # EHOSTUNREACH on a send to a client that went away, instead of a silent drop: that frees its lanes.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # A client that reconnects under its routing id (speclane.pipeline.net.client sets one; after a disconnect for an
    # oversized message, say) takes its id over, and the streams of its requests in flight go on to it.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    # A ZAP domain makes libzmq refuse peers of the old framings (ZMTP 1.0 and 2.0) at the handshake: raw bytes on
    # the port would otherwise read as a stream of tiny messages, each answered with an error many times its size.
    # With no ZAP handler (no --curve-keys) every ZMTP 3 peer is let in as before.
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    # Transport heartbeats drop a peer that stops answering even when its TCP connection lingers, and tell
    # clients with no heartbeat of their own (HEARTBEAT_TTL) to drop a server that went silent.
    heartbeat(sock)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.LINGER, 0)
    auth = None
    if curve_keys is not None:
        auth = _curve(ctx, sock, Path(curve_keys))
    return sock, auth


def _curve(ctx: zmq.Context, sock: zmq.Socket, keys: Path) -> ThreadAuthenticator:
    secret, clients = keys / "server.key_secret", keys / "clients"
    if not secret.is_file() or not clients.is_dir():
        raise ConfigError(
            f"--curve-keys {keys}: expected server.key_secret and a clients/ folder of allowed "
            "client public keys (*.key); zmq.auth.create_certificates writes both kinds"
        )
    public, private = zmq.auth.load_certificate(secret)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain=ZAP_DOMAIN, location=str(clients))
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = private, public, True
    return auth


def user_id(frame: zmq.Frame) -> bytes | None:
    """The CURVE public key ZAP authenticated the sender with (zmq.auth sets it as the message's User-Id)."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return user.encode() if user else None


def receive(frames: list[zmq.Frame], door) -> None:
    """One message from a ROUTER socket for `door` (the server, or the replica door): split the envelope, parse,
    and pass it to `door._handle(envelope, msg, client)`; anything refused or failing answers with one error by
    `door._send` and never escapes (nothing a client sends may take the loop down). `door` has `_auth` (CURVE on
    or not) and `api_key`."""
    from speclane.pipeline.net import protocol as P  # the protocol imports nothing of the sockets

    user = user_id(frames[-1]) if door._auth is not None else None
    frames = [f.bytes for f in frames]
    # A DEALER sends [payload]; a REQ socket adds an empty delimiter, which its reply must carry too.
    envelope = frames[:2] if len(frames) == 3 and not frames[1] else frames[:1]
    msg = None
    try:
        if len(frames) != len(envelope) + 1:
            raise P.ProtocolError(
                "send one JSON frame a message (from a DEALER or REQ socket)", field="message", code="bad_frames"
            )
        msg = P.parse_client(frames[-1], door.api_key)
        door._handle(envelope, msg, user or envelope[0])
    except RequestError as exc:
        door._send(envelope, P.Error(id=getattr(exc, "rid", None), code=exc.code, field=exc.field, message=str(exc)))
    except Exception as exc:  # noqa: BLE001 - nothing a client sends may take the loop down
        log.exception("message from %r failed", envelope[:1])
        rid = getattr(getattr(msg, "request", msg), "id", None)
        door._send(envelope, P.Error(id=rid, code="internal", message=f"{type(exc).__name__}: {exc}"))
