"""The door's calls into the Ray Serve deployment: one asyncio loop, on a thread of its own, that streams each
request from its replica and hands every frame to the door's serve loop over an inproc PUSH socket. Ray Serve's
router for the handle runs on this same loop (`_run_router_in_separate_loop=False`): by default Ray gives it a loop
of its own, and every item of every stream then crosses from that loop's thread to this one, two thread wake-ups a
token on cores the replicas compute on. Nothing here blocks the loop (a large prompt is tokenized in a worker
thread, the replicas' names are listed in one), so sharing it costs the router nothing.

Events, one multipart message each: [rid, b"o", replica id] when a replica takes a request; [rid, b"0" or b"1",
frame, ...] the frames to send its client (b"1": the last one ends it); [rid, b"q" or b"Q", number, frame, ...]
the same, numbered from the request's first frame, where the replica sends the frames between its first and last
items to the door's frame socket (`sink`; replica.py); [qid, b"s", reply] a stats answer. A
request whose replica dies mid-stream (its process killed, its node gone) ends with one error frame,
`replica_failed`, naming the cause; one whose replica sends nothing, not even a heartbeat, for `stall_s` ends with
`replica_unresponsive`, and its stream is cancelled. The prompt is tokenized here (off the serve loop; a large
one in a worker thread), for the router's prefix match only: the replica tokenizes it again. A replica names
itself with its first item, together with the first frames when they come soon (replica.py); a cancel that comes
before that waits for the owner's name, up to `UNOWNED_CANCEL_S`, then gives up on the stream, which cancels the
call on whichever replica has it. Per request this is one Ray call and one Ray item per batch of frames ready at
once, a short request's whole answer in one; on the door's machine, one Ray item at its start and one at its end
(and a heartbeat a second while it waits). Not here: the client-facing socket and its bookkeeping (replicas.py),
the routing rule (replica_routing.py), putting frames back in order (frame_order.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import zmq

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net import replica_routing
from speclane.pipeline.net.frame_order import number
from speclane.pipeline.net.replica import OWNER_WAIT_S, _ends

log = logging.getLogger("speclane.replicas")

STALL_S = 10.0  # no item of a stream, heartbeats included, this long: its replica is taken as hung
STATS_TIMEOUT_S = 3.0
REPLICA_PREFIX = "SERVE_REPLICA::"
INLINE_TOKENIZE_BYTES = 4096  # a request this small is tokenized on the loop: a worker thread's hop costs more
UNOWNED_CANCEL_S = OWNER_WAIT_S + 0.75  # a cancelled request whose replica has not named itself by then is let go


def _error(cid: Any, code: str, message: str) -> bytes:
    return P.encode(P.Error(id=cid, code=code, message=message))


class RayCalls:
    """`handle`: the deployment's handle; `prompt_ids(request) -> list[int] | None`: the prompt's tokens for
    routing; `events`: the inproc endpoint the door's PULL socket is bound to, in `ctx`; `sink`: the door's frame
    socket (endpoint, token), which replicas on this machine send their frames to (None: every frame through Ray)."""

    def __init__(self, handle, prompt_ids, ctx: zmq.Context, events: str, stall_s: float = STALL_S, sink=None):
        import ray
        import ray.util.client

        self.prompt_ids, self.stall_s = prompt_ids, stall_s
        # Through Ray Client (ray://) this process is not on the node it names: its loopback is no replica's
        local = sink is not None and not ray.util.client.ray.is_connected()
        self.sink = (*sink, ray.get_runtime_context().get_node_id()) if local else None
        self._push = ctx.socket(zmq.PUSH)
        self._push.connect(events)
        self.loop = asyncio.new_event_loop()
        self._tasks: dict[int, asyncio.Task] = {}
        self._owners: dict[int, str] = {}
        self._cancelled: set[int] = set()  # rids cancelled by their client before a replica took them
        self._unowned: set[int] = set()  # rids cancelled by their client before their replica named itself
        self._thread = threading.Thread(target=self.loop.run_forever, name="speclane-ray-calls", daemon=True)
        self._thread.start()
        self.handle = asyncio.run_coroutine_threadsafe(self._on_this_loop(handle), self.loop).result(60)
        # Built once (options() makes a handle a call); its items come over Ray Serve's gRPC channel to the
        # replica, not as Ray objects.
        self._generate = self.handle.options(stream=True, _by_reference=False).generate

    @staticmethod
    async def _on_this_loop(handle):
        """`handle`, its router made on the running loop (a handle makes its router once, at its first options()
        or call, on the loop that is running then)."""
        if not handle.is_initialized:
            handle._init(_run_router_in_separate_loop=False)
        return handle

    def close(self) -> None:
        async def _end():
            for task in list(self._tasks.values()):
                task.cancel()
            await asyncio.sleep(0)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(_end(), self.loop).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        self._push.close(0)

    # --- from the door's thread -----------------------------------------------------------------------------
    def generate(self, rid: int, cid: Any, request) -> None:
        self.loop.call_soon_threadsafe(self._start, rid, cid, request)

    def cancel(self, rid: int) -> None:
        self.loop.call_soon_threadsafe(self._cancel_soon, rid)

    def stats(self, qid: int) -> None:
        """Every replica's stats, as one event [qid, b"s", JSON list]."""
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._stats(qid)))

    def ask(self, qid: int, message: bytes) -> None:
        """Any one replica's reply to `message` (a graph query), as the event [qid, b"a", reply]."""
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._ask(qid, message)))

    # --- on the loop's thread -------------------------------------------------------------------------------
    def _emit(self, key: int, kind: bytes, *frames: bytes) -> None:
        self._push.send_multipart([number(key), kind, *frames])

    def _start(self, rid: int, cid: Any, request) -> None:
        self._tasks[rid] = self.loop.create_task(self._stream(rid, cid, request))

    async def _stream(self, rid: int, cid: Any, request) -> None:
        replica, gen, ended = None, None, False
        try:
            wire = json.dumps(P.generate_json(request)).encode()
            if len(wire) <= INLINE_TOKENIZE_BYTES:
                ids = self.prompt_ids(request)
            else:
                ids = await self.loop.run_in_executor(None, self.prompt_ids, request)
            gen = self._generate.remote(
                wire, rid=rid, cid=cid, prefix_ids=ids, max_tokens=request.max_tokens, sink=self.sink
            )
            while True:
                try:
                    item = await asyncio.wait_for(gen.__anext__(), self.stall_s)
                except StopAsyncIteration:
                    self._emit(rid, b"1", _error(cid, "replica_failed", f"replica {replica} ended the stream early"))
                    return
                if isinstance(item, dict) and "seq" in item:  # the last frames; those before came to the sink
                    ended = True
                    self._emit(rid, b"Q", number(item["seq"]), *item["frames"])
                    return
                if isinstance(item, dict):
                    replica = self._owners[rid] = item["replica"]
                    replica_routing.UNRESPONSIVE.clear(replica)  # it speaks: routed to again
                    self._emit(rid, b"o", replica.encode())
                    if rid in self._unowned:  # its client cancelled it while its replica was not yet named
                        self._unowned.discard(rid)
                        self.loop.create_task(self._cancel(rid))
                    if item.get("direct") and item["frames"]:
                        ended = _ends(item["frames"][-1])
                        self._emit(rid, b"Q" if ended else b"q", number(0), *item["frames"])
                        if ended:
                            return
                        continue
                    item = item["frames"]
                if item:
                    ended = _ends(item[-1])
                    self._emit(rid, b"1" if ended else b"0", *item)
                    if ended:
                        return
        except asyncio.CancelledError:
            if rid in self._cancelled:  # cancelled before a replica had it: it ends here, as the engine ends one
                usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
                self._emit(rid, b"1", P.encode(P.Done(id=cid, finish_reason="cancelled", usage=usage, spec={})))
            raise
        except TimeoutError:
            where = f"replica {replica}" if replica else "no replica"
            if replica:
                replica_routing.UNRESPONSIVE.mark(replica)  # new requests go to the others meanwhile
            log.warning("request %r: %s sent nothing in %g s; ending it", cid, where, self.stall_s)
            if not replica:  # never taken: what the routers did meanwhile
                log.warning(
                    "routing of the last requests (door's router, then Ray's):\n%s", replica_routing.TRAIL.dump()
                )
            self._emit(
                rid,
                b"1",
                _error(
                    cid,
                    "replica_unresponsive",
                    f"{where} sent nothing for this request in {self.stall_s:g} s (hung or overloaded); "
                    "the request was cancelled: send it again",
                ),
            )
        except Exception as exc:  # noqa: BLE001 - a replica's death (RayActorError ...) ends its requests alone
            cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("request %r: replica %s failed: %s", cid, replica, cause)
            self._emit(
                rid,
                b"1",
                _error(
                    cid,
                    "replica_failed",
                    f"the replica serving this request ({replica or 'not yet chosen'}) failed: {cause}; "
                    "send it again (another replica takes it)",
                ),
            )
        finally:
            replica_routing.LEDGER.ended(rid)  # before its client can send its next request: its lane is free
            self._tasks.pop(rid, None)
            self._owners.pop(rid, None)
            self._cancelled.discard(rid)
            self._unowned.discard(rid)
            if gen is not None and not ended:
                gen.cancel()  # the replica's stream ends too, and frees the lane

    def _cancel_soon(self, rid: int) -> None:
        if rid in self._owners:
            self.loop.create_task(self._cancel(rid))
        elif rid in self._tasks:  # its replica may have it without having named itself yet: wait for the name
            self._unowned.add(rid)
            self.loop.call_later(UNOWNED_CANCEL_S, self._let_go, rid)

    def _let_go(self, rid: int) -> None:
        """A cancelled request whose replica never named itself: end it here; giving up on its stream cancels the
        call on the replica that may have it, which frees the lane (replica.py)."""
        task = self._tasks.get(rid)
        if rid in self._unowned and task is not None:
            self._unowned.discard(rid)
            self._cancelled.add(rid)
            task.cancel()

    async def _cancel(self, rid: int) -> None:
        owner = self._owners.get(rid)
        if owner is None:  # its stream ended meanwhile
            return
        try:
            await asyncio.wait_for(self.handle.cancel.remote(rid, owner=owner), STATS_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the owner is gone: its stream ends with replica_failed
            log.info("cancel of %d on replica %s: %s", rid, owner, exc)

    async def _replica_ids(self) -> list[str]:
        import ray

        names = await self.loop.run_in_executor(None, lambda: ray.util.list_named_actors(all_namespaces=True))
        app, name = self.handle.deployment_id.app_name, self.handle.deployment_id.name
        prefix = f"{REPLICA_PREFIX}{app}#{name}#"
        return sorted(a["name"][len(prefix) :] for a in names if a["name"].startswith(prefix))

    async def _one_stats(self, replica: str) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(self.handle.stats.remote(owner=replica), STATS_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a replica starting or dying: listed, without figures
            return {"replica": replica, "error": f"{type(exc).__name__}: no stats ({str(exc)[:200]})"}

    async def _stats(self, qid: int) -> None:
        try:
            replies = await asyncio.gather(*(self._one_stats(r) for r in await self._replica_ids()))
        except Exception as exc:  # noqa: BLE001
            replies = [{"error": f"{type(exc).__name__}: {exc}"}]
        self._emit(qid, b"s", json.dumps(replies).encode())

    async def _ask(self, qid: int, message: bytes) -> None:
        try:
            reply = await asyncio.wait_for(self.handle.ask.remote(message), STATS_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            reply = _error(None, "replica_failed", f"no replica answered: {type(exc).__name__}: {str(exc)[:200]}")
        self._emit(qid, b"a", reply)
