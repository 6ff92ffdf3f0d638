"""Where a request goes among engine replicas: the routing rule of `speclane serve --replicas`, in plain Python.

Each replica publishes what it holds (`publication`): the hashes of the token prefixes it keeps prompt checkpoints
of, grouped by length, and its load (requests in lanes plus waiting). A checkpoint is kept only where a prefill or
a commit ended, with the whole slot state at that position (KV and, for a hybrid target, the recurrent state), so a
published prefix is a position a replica can resume from: a prompt that shares only part of a checkpoint's tokens
(a KV-only match) is never a hit. `rank` sends a request to the replica holding its longest published prefix,
unless that replica's load exceeds the least loaded one's by more than `imbalance` requests; otherwise to whichever
of two random choices has a lane free, then less work left (prompt tokens to prefill and tokens to generate, as the
router counts what it sent: `Ledger`). A replica the door saw leave a stream silent past its stall is passed over
for a while (`UNRESPONSIVE`), while Ray's health checks decide whether to replace it. Not here: Ray
(pipeline/net/replica_router.py calls `rank`), the replica itself (pipeline/net/replica.py), the store of
checkpoints (pipeline/runtime/checkpoints.py).
"""

from __future__ import annotations

import hashlib
import random
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

IMBALANCE = 4  # a holder busier than the least loaded replica by more than this many requests is passed over
MAX_PUBLISHED = 4096  # checkpoint prefixes a replica publishes, the most recently used first
UNRESPONSIVE_S = 30.0  # a replica that left a stream silent past the stall is passed over this long, or until it speaks


class Unresponsive:
    """Replicas that left a stream silent past the door's stall (replica_calls.py), by id, until when. The door's
    router passes them over while another replica runs: until Ray's health checks replace a hung replica, Ray's own
    router may still take it as free (its cached queue length, the request the door gave up on counted as ended).
    One per door process: the door's calls mark, its router reads."""

    def __init__(self):
        self._until: dict[str, float] = {}

    def mark(self, replica: str, seconds: float = UNRESPONSIVE_S) -> None:
        self._until[replica] = time.monotonic() + seconds

    def clear(self, replica: str) -> None:
        self._until.pop(replica, None)

    def __contains__(self, replica: str) -> bool:
        until = self._until.get(replica)
        return until is not None and until > time.monotonic()

    def marked(self) -> list[str]:
        return sorted(r for r in self._until if r in self)

    def least_recent(self, replicas: Sequence[str]) -> list[str]:
        """Of `replicas`, all marked, the ones marked longest ago: a replica that recovered speaks again only once a
        request reaches it, so when every replica is marked, the one silent most recently is the likeliest still
        hung."""
        first = min(self._until.get(r, 0.0) for r in replicas)
        return [r for r in replicas if self._until.get(r, 0.0) == first]


UNRESPONSIVE = Unresponsive()


class Trail:
    """The door's router's last choices, and a view of Ray's own router state (`state`, set by the router), for the
    log when a request waits past the stall with no replica named: what was chosen, among which, and whether Ray
    held the request back (queue lengths, routing tasks in backoff). One per door process, as `UNRESPONSIVE`."""

    def __init__(self, keep: int = 32):
        self._notes: deque[str] = deque(maxlen=keep)
        self.state: Callable[[], str] | None = None

    def note(self, text: str) -> None:
        self._notes.append(f"{time.monotonic():.3f} {text}")

    def dump(self) -> str:
        try:
            state = self.state() if self.state is not None else "no router in this process"
        except Exception as exc:  # noqa: BLE001 - Ray's internals moved: the notes are still worth the log
            state = f"Ray's router state unreadable: {type(exc).__name__}: {exc}"
        return "\n".join([f"now {time.monotonic():.3f}; {state}", *self._notes])


TRAIL = Trail()


def prefix_hash(ids: Sequence[int]) -> str:
    """A 64-bit hash of a token prefix, the same in every process (Python's own `hash` is salted per process)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()


def publication(
    held: Iterable[tuple[int, ...]], load: int, cache: dict | None = None, lanes: int | None = None
) -> dict[str, Any]:
    """What a replica publishes: {"prefixes": {length: [hash, ...]}, "load": load, "lanes": lanes}. `held`: the
    token tuples of its checkpoints, most recently used last; `cache` (tokens -> hash) saves rehashing the ones seen
    before; `lanes`: how many requests it runs at once (None: not said)."""
    cache = {} if cache is None else cache
    held = list(held)[-MAX_PUBLISHED:]
    prefixes: dict[int, list[str]] = {}
    for tokens in held:
        digest = cache.get(tokens)
        if digest is None:
            digest = cache[tokens] = prefix_hash(tokens)
        prefixes.setdefault(len(tokens), []).append(digest)
    for gone in set(cache) - set(held):
        del cache[gone]
    return {"prefixes": prefixes, "load": load, "lanes": lanes}


def prefix_hashes(ids: Sequence[int], lengths: Iterable[int]) -> dict[int, str]:
    """{n: prefix_hash(ids[:n])} for each of `lengths` shorter than `ids`, in one pass over `ids` (the hash runs on,
    copied at each length), however many lengths there are."""
    raw = array("q", ids).tobytes()
    run, done, out = hashlib.blake2b(digest_size=8), 0, {}
    for n in sorted({n for n in lengths if 0 < n < len(ids)}):
        run.update(raw[done * 8 : n * 8])
        done, out[n] = n, run.copy().hexdigest()
    return out


def longest_held(prefixes: dict[int, Any], ids: Sequence[int], hashes: dict[int, str] | None = None) -> int:
    """The length of the longest published prefix of `ids` shorter than `ids` (0: none). A checkpoint serves only a
    strictly longer prompt: the prompt's last token must still go through the target to yield the first token.
    `hashes`: prefix_hashes(ids, ...) over at least these lengths, when the caller has them."""
    hashes = prefix_hashes(ids, prefixes) if hashes is None else hashes
    for length in sorted(prefixes, reverse=True):
        if length < len(ids) and hashes[length] in prefixes[length]:
            return length
    return 0


class Ledger:
    """The work a router has sent each replica and not yet seen end: per request, the tokens it asks of its
    replica (prompt tokens past the replica's checkpoint, plus its max_tokens), counted until the request ends,
    in full (what a replica has done of it is not seen here), and the requests themselves. A request routed again
    (a retry) moves. A request ends when the door sees its last frame or Ray says its call ended, whichever comes
    first: a client that sends its next request at once is routed knowing the lane it left is free."""

    def __init__(self):
        self.work: dict[Any, int] = {}  # replica -> tokens
        self.requests: dict[Any, int] = {}  # replica -> requests
        self._sent: dict[Any, tuple[Any, int]] = {}  # request -> (replica, tokens)

    def sent(self, request: Any, replica: Any, tokens: int) -> None:
        self.ended(request)
        self._sent[request] = (replica, tokens)
        self.work[replica] = self.work.get(replica, 0) + tokens
        self.requests[replica] = self.requests.get(replica, 0) + 1

    def ended(self, request: Any) -> None:
        replica, tokens = self._sent.pop(request, (None, 0))
        if replica is not None:
            for kept, less in ((self.work, tokens), (self.requests, 1)):
                left = kept.get(replica, 0) - less
                if left > 0:
                    kept[replica] = left
                else:
                    kept.pop(replica, None)

    def keep(self, live: set) -> None:
        """Forget replicas not in `live` (gone: their requests ended with them)."""
        for request, (replica, _) in list(self._sent.items()):
            if replica not in live:
                self.ended(request)


LEDGER = Ledger()  # the door's router's (it sets its own here); the door's calls end a request in it at its last frame


def held_lengths(published: Sequence[dict[str, Any] | None], ids: Sequence[int]) -> list[int]:
    """For each publication (None: none yet), the longest published prefix of `ids` it holds; each prefix of `ids`
    hashed once, whatever the number of replicas."""
    hashes = prefix_hashes(ids, {n for pub in published if pub for n in pub.get("prefixes", {})})
    return [longest_held(pub.get("prefixes", {}), ids, hashes) if pub else 0 for pub in published]


def rank(
    replicas: Sequence[Any],
    published: Sequence[dict[str, Any] | None],
    loads: Sequence[int],
    ids: Sequence[int] | None,
    imbalance: int = IMBALANCE,
    rng: random.Random | None = None,
    work: Sequence[float] | None = None,
    held: Sequence[int] | None = None,
    busy: Sequence[int] | None = None,
) -> list[list[Any]]:
    """Ranked choices for one request, best first, as Ray Serve's request router takes them: the replica holding the
    longest published prefix of `ids` (when not past `imbalance`), then two random replicas. `published[i]` is
    replica i's publication (None: none yet), `loads[i]` its requests in flight, `work[i]` the tokens of work they
    still hold (prompt tokens to prefill and tokens to generate), `held`: held_lengths(published, ids) when the
    caller has it, `busy[i]` the requests it runs as the caller counts them (default: `loads`). Without `work`, the
    pair is one rank, of which Ray takes the replica with fewer requests; with it, the pair is two ranks, the one
    with less work first: requests differ in size, and a replica given the longer prompts finishes last while the
    other idles, however evenly the requests were counted out. Before work, a free lane: a replica whose requests
    fill the lanes it publishes ranks after one with a lane free, which takes the request now where the other would
    queue it, whatever their work."""
    rng = rng or random
    if not replicas:
        return []
    ranks: list[list[Any]] = []
    if ids:
        held = held_lengths(published, ids) if held is None else held
        order = loads if work is None else work
        best, best_len = None, 0
        for i, n in enumerate(held):
            if n > best_len or (n == best_len and n and order[i] < order[best]):
                best, best_len = i, n
        if best is not None and loads[best] - min(loads) <= imbalance:
            ranks.append([replicas[best]])
    pair = rng.sample(range(len(replicas)), min(2, len(replicas)))
    if work is None:
        ranks.append([replicas[i] for i in sorted(pair, key=lambda i: loads[i])])
    else:
        lanes = [(pub or {}).get("lanes") for pub in published]
        full = [n is not None and b >= n for n, b in zip(lanes, loads if busy is None else busy)]
        ranks += [[replicas[i]] for i in sorted(pair, key=lambda i: (full[i], work[i], loads[i]))]
    return ranks
