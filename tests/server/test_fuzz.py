"""Generated frames thrown at a real server: random bytes, random JSON values, valid messages with a field given a
value of another type (huge integers, deep nesting, lone surrogates, long keys), random request ids, from sockets
with random routing ids. Every message the server reads gets exactly one reply of at most MAX_REPLY bytes, never an
`internal` error (a generate it accepts: its tokens, then one final message), and after all of them a valid request
still completes.

Each example sends its frame and then a `stats` query; the server answers a client's messages in order, so what
came before that answer is the frame's reply. Bounded: 200 examples, each under a deadline.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import zmq
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client
from tests.server.conftest import MAX_MESSAGE_BYTES

MAX_REPLY = 16 * 1024  # an error reply's bound, whatever its message echoes
SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc80b", "\ud83d"])
TEXT = st.one_of(st.text(max_size=40), SURROGATES)
HUGE = st.one_of(st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1), st.integers())
SCALARS = st.one_of(st.none(), st.booleans(), HUGE, st.floats(allow_nan=False), TEXT)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12
)
IDS = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.text(max_size=300),
    SURROGATES,
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
)
VALID = [
    {"v": 1, "type": "generate", "id": 1, "prompt": "Hello", "max_tokens": 2},
    {
        "v": 1,
        "type": "generate",
        "id": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
        "stop": ["\n"],
        "spec": {"draft_tokens": 2},
    },
    {"v": 1, "type": "generate", "id": 2, "prompt_ids": [1, 2, 3], "max_tokens": 2, "temperature": 0.5, "seed": 3},
    {"v": 1, "type": "cancel", "id": 5},
    {"v": 1, "type": "stats", "id": "q"},
    {"v": 1, "type": "graph"},
]
FIELDS = sorted({k for m in VALID for k in m} | {"top_p", "top_k", "ignore_eos", "stop", "spec", "key"})


@st.composite
def mutated(draw) -> bytes:
    """A valid message with one field set to another value (or removed, or an unknown key added)."""
    msg = dict(draw(st.sampled_from(VALID)))
    how = draw(st.sampled_from(["set", "set", "drop", "id", "unknown", "long key"]))
    if how == "set":
        msg[draw(st.sampled_from(FIELDS))] = draw(VALUES)
    elif how == "drop":
        msg.pop(draw(st.sampled_from(sorted(msg))))
    elif how == "id":
        msg["id"] = draw(IDS)
    elif how == "unknown":
        msg[draw(TEXT)] = draw(VALUES)
    else:
        msg[draw(st.sampled_from(["\x01", "\u00e9", "k"])) * draw(st.integers(2000, 9000))] = 1
    return json.dumps(msg).encode()


def _nested(depth: int, opener: bytes) -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    inner = opener * depth + closer * depth if opener == b"[" else b'{"a":' * depth + b"1" + closer * depth
    return b'{"v": 1, "type": "generate", "id": 9, "prompt": ' + inner + b"}"


FRAMES = st.one_of(
    st.binary(max_size=3000),
    VALUES.map(lambda v: json.dumps(v).encode()),
    mutated(),
    mutated(),
    st.builds(_nested, st.integers(1, 30_000), st.sampled_from([b"[", b"{"])),
    st.builds(
        lambda n, at: json.dumps({**VALID[0], at: 0}).replace(f'"{at}": 0', f'"{at}": {"9" * n}').encode(),
        st.integers(18, 6000),
        st.sampled_from(["max_tokens", "id", "top_k", "seed", "v"]),
    ),
)
ROUTING_IDS = st.binary(min_size=1, max_size=255).filter(lambda b: b[0] != 0)


def _replies(sock: zmq.Socket, until: str) -> list[tuple[int, P._Msg]]:
    """(size, message) of every reply up to the `stats` reply with id `until` (left out)."""
    got = []
    while True:
        assert sock.poll(30_000), f"no reply within 30 s; so far {got}"
        raw = sock.recv()
        msg = P.parse_server(raw)
        if msg.type == "stats" and msg.id == until:
            return got
        got.append((len(raw), msg))


def _sentinel(sock: zmq.Socket) -> list[tuple[int, P._Msg]]:
    tag = f"sentinel-{uuid.uuid4().hex}"
    sock.send(json.dumps({"v": 1, "type": "stats", "id": tag}).encode())
    return _replies(sock, tag)


def _check(endpoint: str, ctx: zmq.Context, frame: bytes, routing_id: bytes) -> None:
    assume(len(frame) < MAX_MESSAGE_BYTES)  # past it ZeroMQ drops the connection: no reply, by design
    try:
        local = P.parse_client(frame)
    except P.ProtocolError:
        local = None
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(frame)
        replies = _sentinel(sock)
        assert all(size <= MAX_REPLY for size, _ in replies), [size for size, _ in replies]
        assert not any(getattr(m, "code", None) == "internal" for _, m in replies), replies  # never a server fault
        if not isinstance(local, P.Generate):
            assert len(replies) == 1, replies
            kind = replies[0][1].type
            assert kind == (local.type if isinstance(local, (P.StatsQuery, P.GraphQuery)) else "error"), replies
            return
        # Accepted (or refused once tokenized): its tokens, then exactly one final message, also when cancelled.
        rid = local.request.id
        sock.send(json.dumps({"v": 1, "type": "cancel", "id": rid}).encode())
        while not any(m.type in ("done", "error") and m.id == rid for _, m in replies):
            replies += _sentinel(sock)
        replies += _sentinel(sock)  # whatever else would come for it has come: the server answers in order
        finals = [
            m
            for _, m in replies
            if m.type in ("done", "error") and m.id == rid and getattr(m, "code", None) != "unknown_id"
        ]  # a cancel that came after the end: its own reply
        assert len(finals) == 1, replies
        assert all(m.id == rid for _, m in replies), replies
        assert all(size <= MAX_REPLY for size, m in replies if m.type == "error"), replies
    finally:
        sock.close(0)


def test_generated_frames_get_one_bounded_reply_each_and_the_server_stays_up(server):
    ctx = zmq.Context()

    @settings(
        max_examples=200,
        deadline=timedelta(seconds=15),
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(frame=FRAMES, routing_id=ROUTING_IDS)
    def one(frame: bytes, routing_id: bytes) -> None:
        _check(server, ctx, frame, routing_id)

    try:
        one()
    finally:
        ctx.destroy(0)
    with Client(server, timeout=60) as client:
        assert client.generate(prompt="Hello", max_tokens=3).wait().usage["completion_tokens"] >= 1
