"""Per-client outboxes of the server's ROUTER socket: sending never blocks a round, and a client that cannot be
reached is reported gone only after RECONNECT_S, so one that reconnects under its routing id gets the rest.

What to do with a gone client's requests is the server's (`pipeline/net/server.py`); this only keeps messages.
"""

from __future__ import annotations

import collections
import time

import attrs
import zmq

# A client whose unsent messages pile up past this is not reading: its requests are cancelled.
MAX_OUTBOX = 50_000
# A client unreachable this long is gone (its requests are cancelled); within it, a client that reconnects under
# its routing id (after a disconnect for an oversized message, say) gets the rest of its streams.
RECONNECT_S = 3.0


@attrs.define
class Outboxes:
    sock: zmq.Socket
    _boxes: dict[bytes, collections.deque] = attrs.field(factory=dict)
    _away: dict[bytes, float] = attrs.field(factory=dict)  # identity -> when a send to it first failed

    def __bool__(self) -> bool:
        return bool(self._boxes)

    def put(self, frames: list[bytes]) -> bool:
        """Queue one message (envelope + payload); False when its client's box is past MAX_OUTBOX."""
        box = self._boxes.setdefault(frames[0], collections.deque())
        box.append(frames)
        return len(box) <= MAX_OUTBOX

    def flush(self) -> list[bytes]:
        """Send what each client's pipe takes now; the identities unreachable for over RECONNECT_S."""
        now, gone = time.monotonic(), []
        for ident in list(self._boxes):
            box = self._boxes[ident]
            while box:
                try:
                    self.sock.send_multipart(box[0], zmq.NOBLOCK)
                except zmq.Again:
                    break  # its pipe is full: keep the rest for the next turn
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    if now - self._away.setdefault(ident, now) > RECONNECT_S:
                        gone.append(ident)
                    break
                self._away.pop(ident, None)
                box.popleft()
            if not box:
                self._boxes.pop(ident, None)
        return gone

    def forget(self, ident: bytes) -> None:
        self._boxes.pop(ident, None)
        self._away.pop(ident, None)
