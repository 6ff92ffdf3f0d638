"""The client sorts a server's replies into the stream of the request the server accepted under each id: a second
`generate` under an id still in flight gets the `duplicate_id` refusal and never a token of the first, in whatever
order the replies come. Against a scripted ROUTER in this process, so every order is the one written here."""

from __future__ import annotations

import json

import pytest
import zmq

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client, ServerError


def token(rid, index: int, token_id: int) -> P.Token:
    return P.Token(id=rid, index=index, token_id=token_id, text=f"<{token_id}>")


def done(rid, ids: list[int]) -> P.Done:
    return P.Done(
        id=rid,
        finish_reason="length",
        usage={"completion_tokens": len(ids)},
        spec={},
        text="".join(f"<{t}>" for t in ids),
        token_ids=ids,
    )


def refused(rid) -> P.Error:
    return P.Error(id=rid, code="duplicate_id", field="id", message=f"field 'id': request {rid!r} is already in flight")


@pytest.fixture
def router():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    yield sock
    sock.close(0)
    ctx.term()


def serve(router, requests: int, replies: list) -> list[dict]:
    """Read `requests` generate messages, then send `replies` in order; the requests as sent."""
    sent, who = [], None
    for _ in range(requests):
        who, raw = router.recv_multipart()
        sent.append(json.loads(raw))
    for msg in replies:
        router.send_multipart([who, P.encode(msg)])
    return sent


# (case, streams generated under id "job", the server's replies in order, each stream's token ids or its refusal)
ORDERS = [
    (
        "refused before any token",
        2,
        [refused("job"), token("job", 0, 11), token("job", 1, 12), done("job", [11, 12])],
        [[11, 12], "duplicate_id"],
    ),
    (
        "refused between tokens",
        2,
        [token("job", 0, 11), refused("job"), token("job", 1, 12), done("job", [11, 12])],
        [[11, 12], "duplicate_id"],
    ),
    (
        "two refused",
        3,
        [token("job", 0, 11), refused("job"), refused("job"), done("job", [11])],
        [[11], "duplicate_id", "duplicate_id"],
    ),
    # The first had ended in the server when the second came: it was accepted, and its tokens are its own.
    (
        "accepted after the first ended",
        2,
        [token("job", 0, 11), done("job", [11]), token("job", 0, 21), done("job", [21])],
        [[11], [21]],
    ),
]


@pytest.mark.parametrize("case, count, replies, want", ORDERS, ids=[o[0] for o in ORDERS])
@pytest.mark.parametrize("read", ["in order", "last first"])
def test_each_stream_gets_only_its_own_request_messages(router, case, count, replies, want, read):
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    with Client(endpoint, timeout=10) as client:
        streams = [client.generate(id="job", prompt=f"p{i}", max_tokens=2) for i in range(count)]
        sent = serve(router, count, replies)
        assert [m["prompt"] for m in sent] == [f"p{i}" for i in range(count)]
        got = {}
        for i in range(count) if read == "in order" else reversed(range(count)):
            try:
                got[i] = streams[i].wait().token_ids
                assert [t.token_id for t in streams[i].tokens] == got[i]
            except ServerError as exc:
                got[i] = exc.code
                assert streams[i].tokens == [] and exc.rid == "job"
        assert [got[i] for i in range(count)] == want, case
        with pytest.raises(TimeoutError):
            client.recv(timeout=0.2)  # every reply went to a stream: none is left over


def test_messages_of_ids_no_stream_was_generated_under_stay_for_next_for(router):
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    with Client(endpoint, timeout=10) as client:
        client.send({"v": 1, "type": "generate", "id": "raw", "prompt": "x"})  # raw: no stream
        stream = client.generate(id="job", prompt="y", max_tokens=1)
        serve(router, 2, [token("raw", 0, 5), token("job", 0, 6), done("job", [6]), done("raw", [5])])
        assert stream.wait().token_ids == [6]
        assert [client.next_for("raw").type for _ in range(2)] == ["token", "done"]
