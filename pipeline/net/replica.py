"""One engine replica of `speclane serve --replicas`: the body of the Ray Serve deployment, one engine a process.

It runs the same `Server` a single `speclane serve` runs (pipeline/net/server.py), bound only to an inproc endpoint, so
lanes, the queue, validation, stop strings and every error are the single server's. Each call from the door becomes
a DEALER connection to that server: `generate` streams the server's frames as they are, in lists of what was ready
at once (one Ray item each; an empty list is a heartbeat: the serve loop turned within `stall_s`), the first item a
dict naming the replica. On the door's own machine (`sink`: its frame socket, on loopback) only the first and the
last item travel through Ray: the frames between go to the door's socket, numbered from the request's first frame
(two channels keep no order between them: the door puts them back in it), every request's frames ready at once in
one message (`_direct`) rather than a Ray item each. `cancel` sends a cancel on the request's own connection, so
it reaches the lanes that run it; `stats` asks the server. `record_routing_stats` is what the router reads: the
checkpoint prefixes held and the load (pipeline/net/replica_routing.py). `check_health` fails while the serve loop
is stuck, so Ray Serve replaces the replica. Not here: Ray's deployment options and the cluster
(replica_cluster.py), the client-facing door (replicas.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
from typing import Any

import zmq
import zmq.asyncio

from speclane.pipeline.net.frame_order import number
from speclane.pipeline.net.replica_routing import publication
from speclane.pipeline.net.server import Server

log = logging.getLogger("speclane.replica")

INPROC = "inproc://speclane-replica"
HEARTBEAT_S = 1.0  # a stream with nothing to send says it is alive this often
# The first item names the replica. It waits this long for the first frames to travel with it (a short request's
# whole answer then costs one Ray item); past it, the name goes alone, so a cancel finds the owner early.
OWNER_WAIT_S = 0.25
STALL_S = 30.0  # a serve loop that has not turned this long, with work in it, is stuck
TOKEN_HEAD = b'{"v":1,"type":"token"'  # how the server encodes a token frame (protocol.encode)


def _ends(frame: bytes) -> bool:
    """Whether `frame` ends its request (a done or an error message)."""
    if frame.startswith(TOKEN_HEAD):
        return False
    try:
        return json.loads(frame).get("type") in ("done", "error")
    except (ValueError, AttributeError):
        return True


class EngineReplica:
    """`flags`: the `speclane serve` flags as a dict (argparse's namespace), for `engine_from_args`."""

    def __init__(self, flags: dict[str, Any], stall_s: float = STALL_S):
        import ray
        from ray import serve

        from speclane.pipeline.cli.common import engine_from_args
        from speclane.pipeline.cli.step_flags import apply_step_flags

        self.id = serve.get_replica_context().replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()
        self.stall_s = stall_s
        args = argparse.Namespace(**flags)
        engine = engine_from_args(args)
        apply_step_flags(engine, args)
        engine.max_queue = args.max_queue + engine.lanes.max_lanes
        self._warm_up(engine)
        # The door bounds each client's requests; here every request has a connection of its own.
        self.server = Server(
            engine,
            INPROC,
            max_queue=args.max_queue,
            max_client_queue=args.max_queue,
            max_message_bytes=args.max_message_bytes,
            grace_s=args.grace,
        )
        self.server.start()
        self._actx = zmq.asyncio.Context.shadow(self.server.ctx.underlying)
        self._calls: dict[int, tuple[zmq.asyncio.Socket, Any]] = {}  # door rid -> (its connection, client's id)
        self._sinks: dict[str, zmq.Socket] = {}  # the doors' frame sockets, by endpoint
        self._outgoing: dict[tuple[str, bytes], list[bytes]] = {}  # frames for each sink, sent at the loop's turn
        self.frames = {"ray": 0, "sink": 0}  # frames sent to the door by each channel (stats)
        self._hashes: dict[tuple[int, ...], str] = {}
        self._seen: tuple = ()
        self._published: dict[str, Any] = publication((), 0, lanes=engine.lanes.max_lanes)
        self.turned = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="speclane-replica", daemon=True)
        self._thread.start()
        log.info("replica %s serving (pid %d)", self.id, os.getpid())

    @staticmethod
    def _warm_up(engine) -> None:
        """One short request before Ray Serve counts the replica ready: what a process pays on its first round
        (kernels built or loaded, buffers planned) is not paid by a client, nor taken for a hung serve loop."""
        from speclane.pipeline.runtime.request import parse_request

        engine.generate([parse_request({"id": "warm-up", "prompt_ids": [1, 2, 3, 4], "max_tokens": 2})])
        engine.retired.clear()  # the stats count clients' requests only

    # --- the serve loop, on its own thread ------------------------------------------------------------------
    def _loop(self) -> None:
        server = self.server
        try:
            while not server.stopping:
                server.turn()
                self.turned = time.monotonic()
                self._publish()
            server.serve_forever()  # stopping: what is in flight ends within the grace period
        finally:
            server.close()

    def _publish(self) -> None:
        eng = self.server.engine
        load = len(eng.lanes.active) + len(eng.queue)
        store = eng.checkpoints
        seen = (store.added, store.evictions) if store is not None else ()
        if seen != self._seen:
            self._seen = seen
            # the store's keys are the token tuples of its checkpoints, least recently used first
            self._published = publication(tuple(store._entries), load, self._hashes, eng.lanes.max_lanes)
        else:
            self._published = {**self._published, "load": load}

    def _stalled(self) -> bool:
        return not self._thread.is_alive() or (
            self.server.engine.busy() and time.monotonic() - self.turned > self.stall_s
        )

    # --- calls from the door --------------------------------------------------------------------------------
    async def generate(
        self, request: bytes, rid: int, cid: Any, prefix_ids: Any = None, max_tokens: Any = None, sink: Any = None
    ):
        """The server's frames for `request` (a generate message), in lists of what was ready at once. The first
        item is {"replica": id, "pid": pid, "frames": [...], "direct": bool}: with the first frames when they come
        within OWNER_WAIT_S, else without any. `direct`: `sink` (the door's frame socket: endpoint, token, node) is
        on this machine, so the frames after the first item go there (`_direct`) and the last ones come as
        {"seq": their number, "frames": [...]}. `prefix_ids` (the prompt's tokens) and `max_tokens` are the
        router's, unused here."""
        sock = self._actx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(INPROC)
        self._calls[rid] = (sock, cid)
        ended, seq, said = False, 0, time.monotonic()
        direct = sink is not None and sink[2] == self.node
        first: dict[str, Any] | None = {"replica": self.id, "pid": os.getpid(), "frames": [], "direct": direct}
        try:
            await sock.send(request)
            while not ended:
                if not await sock.poll((HEARTBEAT_S if first is None else OWNER_WAIT_S) * 1000, zmq.POLLIN):
                    if first is not None:
                        yield first
                        first = None
                    elif not self._stalled():
                        yield []
                    said = time.monotonic()
                    continue
                frames = []
                while await sock.poll(0, zmq.POLLIN):
                    frames.append(await sock.recv())
                    ended = _ends(frames[-1])
                    if ended:
                        break
                channel = "sink" if direct and first is None and not ended else "ray"
                self.frames[channel] += len(frames)
                if first is not None:
                    first["frames"], seq = frames, len(frames)
                    frames, first = first, None
                elif direct and ended:
                    frames = {"seq": seq, "frames": frames}
                elif direct:
                    self._direct(sink, rid, seq, frames)
                    seq += len(frames)
                    if time.monotonic() - said < HEARTBEAT_S:
                        continue
                    frames = []  # a heartbeat through Ray, which hears nothing else of the stream meanwhile
                yield frames
                said = time.monotonic()
        finally:
            self._calls.pop(rid, None)
            if not ended:  # the door gave up on the stream (its client left, or a fault): free the lane
                sock.send(json.dumps({"v": 1, "type": "cancel", "id": cid}).encode(), zmq.NOBLOCK)
            sock.close()

    def _direct(self, sink: Any, rid: int, seq: int, frames: list[bytes]) -> None:
        """Queue `frames` (request `rid`'s, numbered from `seq`) for the door's frame socket; what every request
        queues before the loop turns goes in one message: [token, then per group rid, seq, count, frames...]."""
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        out = self._outgoing.setdefault((sink[0], sink[1]), [])
        out += [number(rid), number(seq), number(len(frames)), *frames]

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, {}
        for (endpoint, token), parts in outgoing.items():
            sock = self._sinks.get(endpoint)
            if sock is None:
                sock = self._sinks[endpoint] = self.server.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.SNDHWM, 0)  # queued, never dropped nor blocking: the door reads as they come
                sock.setsockopt(zmq.LINGER, 1000)
                sock.connect(endpoint)
            sock.send_multipart([token, *parts], zmq.NOBLOCK)

    async def cancel(self, rid: int, owner: str | None = None) -> bool:
        """Cancel the door's request `rid` on its own connection; False when it is not here (already ended)."""
        call = self._calls.get(rid)
        if call is None:
            return False
        await call[0].send(json.dumps({"v": 1, "type": "cancel", "id": call[1]}).encode())
        return True

    async def ask(self, message: bytes, owner: str | None = None) -> bytes:
        """The server's one reply to `message` (a stats or graph query)."""
        sock = self._actx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(INPROC)
        try:
            await sock.send(message)
            if not await sock.poll(5000, zmq.POLLIN):
                raise TimeoutError(f"replica {self.id}: its serve loop did not answer in 5 s")
            return await sock.recv()
        finally:
            sock.close()

    async def stats(self, owner: str | None = None) -> dict[str, Any]:
        """The server's stats reply, with this replica's id, process, requests served and frames sent by each
        channel (through Ray, to the door's frame socket)."""
        reply = json.loads(await self.ask(b'{"v":1,"type":"stats"}'))
        reply.update(replica=self.id, pid=os.getpid(), served=sum(reply.get("finished", {}).values()))
        reply["frames"] = dict(self.frames)
        return reply

    # Both are async, though they only read: Ray runs a plain method in a worker thread (a hop each call, several a
    # second); these run on the replica's loop and never block it.
    async def record_routing_stats(self) -> dict[str, Any]:
        return self._published

    async def check_health(self) -> None:
        if self._stalled():
            raise RuntimeError(f"replica {self.id}: its serve loop has not turned in {self.stall_s:g} s")

    def __del__(self) -> None:
        for sock in getattr(self, "_sinks", {}).values():
            sock.close(0)
        server = getattr(self, "server", None)
        if server is not None:
            server.stop(0)
            self._thread.join(5)
