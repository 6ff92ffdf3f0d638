"""Every bad message gets an error naming the field, and the server keeps serving: offline against the parser,
then live against a real server, which must still answer a valid request after all of them."""

from __future__ import annotations

import json
import socket
import time

import pytest

from speclane.pipeline.net import protocol as P
from speclane.pipeline.net.client import Client, ServerError
from tests.server.conftest import MAX_MESSAGE_BYTES

GEN = {"v": 1, "type": "generate", "id": 1, "prompt": "Hello", "max_tokens": 2}


def without(key: str) -> dict:
    return {k: v for k, v in GEN.items() if k != key}


# (case, raw message, field the error must name, code). One defect each.
PARSE_CASES = [
    ("not json", b"{nope", "message", "bad_json"),
    ("not utf-8", b"\xff\xfe", "message", "bad_json"),
    ("not an object", b"[1, 2]", "message", "invalid_request"),
    ("missing v", without("v"), "v", "invalid_request"),
    ("wrong version", {**GEN, "v": 2}, "v", "bad_version"),
    ("missing type", without("type"), "type", "invalid_request"),
    ("unknown type", {**GEN, "type": "generat"}, "type", "invalid_request"),
    ("type a list", {**GEN, "type": ["generate"]}, "type", "invalid_request"),
    ("type an object", {**GEN, "type": {}}, "type", "invalid_request"),
    ("missing id", without("id"), "id", "invalid_request"),
    ("no prompt", without("prompt"), "request", "invalid_request"),
    ("two prompts", {**GEN, "prompt_ids": [1, 2]}, "request", "invalid_request"),
    ("unknown field", {**GEN, "temprature": 0.5}, "temprature", "invalid_request"),
    ("max_tokens 0", {**GEN, "max_tokens": 0}, "max_tokens", "invalid_request"),
    ("max_tokens text", {**GEN, "max_tokens": "many"}, "max_tokens", "invalid_request"),
    ("draft tokens 0", {**GEN, "spec": {"draft_tokens": 0}}, "spec.draft_tokens", "invalid_request"),
    ("draft tokens 8", {**GEN, "spec": {"draft_tokens": 8}}, "spec.draft_tokens", "invalid_request"),
    ("unknown spec key", {**GEN, "spec": {"backend": "ngram"}}, "spec.backend", "invalid_request"),
    ("top_p 0", {**GEN, "top_p": 0.0}, "top_p", "invalid_request"),
    ("negative temperature", {**GEN, "temperature": -1}, "temperature", "invalid_request"),
    (
        "bad role",
        {**without("prompt"), "messages": [{"role": "robot", "content": "hi"}]},
        "messages.0.role",
        "invalid_request",
    ),
    ("cancel without id", {"v": 1, "type": "cancel"}, "id", "invalid_request"),
    ("cancel extra key", {"v": 1, "type": "cancel", "id": 1, "now": True}, "now", "invalid_request"),
    ("stats extra key", {"v": 1, "type": "stats", "verbose": True}, "verbose", "invalid_request"),
    ("lone surrogate", {**GEN, "prompt": "\ud800"}, "prompt", "invalid_request"),
    (
        "lone surrogate in a message",
        {**without("prompt"), "messages": [{"role": "user", "content": "a\udfff"}]},
        "messages.0.content",
        "invalid_request",
    ),
    (
        "5,000-digit max_tokens",
        b'{"v": 1, "type": "generate", "id": 1, "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        "max_tokens",
        "invalid_request",
    ),
    (
        "5,000-digit id",
        b'{"v": 1, "type": "generate", "prompt": "x", "id": ' + b"9" * 5000 + b"}",
        "id",
        "invalid_request",
    ),
    (
        "nested too deep",
        b'{"v": 1, "type": "generate", "id": 1, "prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
        "message",
        "bad_json",
    ),
    ("id true", {**GEN, "id": True}, "id", "invalid_request"),
    ("id a float", {**GEN, "id": 1.5}, "id", "invalid_request"),
    ("cancel id true", {"v": 1, "type": "cancel", "id": True}, "id", "invalid_request"),
    ("top_k past any vocabulary", {**GEN, "top_k": 10**20}, "top_k", "invalid_request"),
    # A value of the wrong JSON type is refused, not converted.
    ("v true", {**GEN, "v": True}, "v", "bad_version"),
    ("max_tokens a string of digits", {**GEN, "max_tokens": "16"}, "max_tokens", "invalid_request"),
    ("max_tokens a float", {**GEN, "max_tokens": 16.0}, "max_tokens", "invalid_request"),
    ("ignore_eos a string", {**GEN, "ignore_eos": "yes"}, "ignore_eos", "invalid_request"),
    ("temperature a string", {**GEN, "temperature": "0.5"}, "temperature", "invalid_request"),
    ("spec.enabled a string", {**GEN, "spec": {"enabled": "no"}}, "spec.enabled", "invalid_request"),
    ("prompt id a string", {**without("prompt"), "prompt_ids": [1, "2"]}, "prompt_ids.1", "invalid_request"),
    # Errors name the field the user wrote.
    ("empty messages", {**without("prompt"), "messages": []}, "messages", "invalid_request"),
    ("empty prompt_ids", {**without("prompt"), "prompt_ids": []}, "prompt_ids", "invalid_request"),
    ("stop a number", {**GEN, "stop": 123}, "stop", "invalid_request"),
    # What one request may cost the others: stop strings are matched on the serve loop.
    ("17 stop strings", {**GEN, "stop": ["x"] * 17}, "stop", "invalid_request"),
    ("a 257-byte stop string", {**GEN, "stop": ["\n", "x" * 257]}, "stop.1", "invalid_request"),
]
# The id of the raw (bytes) cases' errors; a dict case's error carries its id where the id is a str or an int.
RAW_IDS = {"5,000-digit max_tokens": 1, "nested too deep": 1}


def expected_id(case: str, message):
    if isinstance(message, bytes):
        return RAW_IDS.get(case)
    rid = message.get("id")
    return rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None


# Only the engine or the server's bookkeeping can tell these apart from valid messages.
LIVE_CASES = [
    (
        "prompt id past the vocabulary",
        {**without("prompt"), "prompt_ids": [1, 10**9]},
        "prompt_ids.1",
        "invalid_request",
    ),
    ("negative prompt id", {**without("prompt"), "prompt_ids": [-1]}, "prompt_ids.0", "invalid_request"),
    ("prompt longer than max_len", {**GEN, "max_tokens": 10**6}, "max_tokens", "invalid_request"),
    ("cancel of an unknown id", {"v": 1, "type": "cancel", "id": "nobody"}, "id", "unknown_id"),
    ("top_k past the vocabulary", {**GEN, "top_k": 10**6}, "top_k", "invalid_request"),
    # 60,000 characters (under the test server's 64 KiB messages) are far more tokens than max_len
    ("prompt longer than max_len, small max_tokens", {**GEN, "prompt": "word " * 12_000}, "prompt", "invalid_request"),
]


def _raw(message) -> bytes:
    return message if isinstance(message, bytes) else json.dumps(message).encode()


@pytest.mark.parametrize("case,message,field,code", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parser_names_the_field(case, message, field, code):
    with pytest.raises(P.ProtocolError) as info:
        P.parse_client(_raw(message))
    assert (info.value.field, info.value.code) == (field, code), str(info.value)
    assert info.value.rid == expected_id(case, message), case
    assert field.split(".")[0] in str(info.value) or field in ("message", "request")


def test_parser_accepts_each_message_type():
    assert P.parse_client(_raw(GEN)).request.max_tokens == 2
    assert isinstance(P.parse_client(b'{"v": 1, "type": "cancel", "id": "a"}'), P.Cancel)
    assert isinstance(P.parse_client(b'{"v": 1, "type": "stats"}'), P.StatsQuery)
    assert isinstance(P.parse_client(b'{"v": 1, "type": "graph", "id": 3}'), P.GraphQuery)


def test_server_answers_every_bad_message_then_serves(server):
    with Client(server, timeout=30) as client:
        for case, message, field, code in PARSE_CASES + LIVE_CASES:
            client.send(_raw(message))
            reply = client.recv()
            assert isinstance(reply, P.Error), (case, reply)
            assert (reply.field, reply.code) == (field, code), (case, reply)
            assert reply.id == expected_id(case, message), (case, reply)
        # Two frames in one message, from a DEALER: refused as a whole.
        client.sock.send_multipart([b"x", _raw(GEN)])
        reply = client.recv()
        assert (reply.type, reply.code, reply.field) == ("error", "bad_frames", "message")
        done = client.generate(prompt="Hello", max_tokens=3).wait()
        assert done.usage["completion_tokens"] >= 1


@pytest.mark.parametrize("read_first", ["duplicate", "first"])
def test_a_refused_duplicate_id_gets_its_error_and_none_of_the_first_requests_tokens(server, read_first):
    with Client(server, timeout=60) as a, Client(server, timeout=60) as b:
        first = a.generate(id="job", prompt="Count to ten:", max_tokens=6, ignore_eos=True)
        duplicate = a.generate(id="job", prompt="Hello", max_tokens=6, ignore_eos=True)
        other = b.generate(id="job", prompt="Count to ten:", max_tokens=6, ignore_eos=True)  # ids are per client
        if read_first == "first":
            assert first.wait().finish_reason == "length"
        with pytest.raises(ServerError) as err:
            duplicate.wait()
        assert (err.value.code, err.value.field, err.value.rid) == ("duplicate_id", "id", "job")
        assert duplicate.tokens == [] and duplicate.done is None
        assert first.wait().finish_reason == "length" and other.wait().finish_reason == "length"
        assert [t.index for t in first.tokens] == list(range(6)) and first.missed == 0
        assert first.token_ids == other.token_ids
        # Once its stream ended, the id is free again.
        assert a.generate(id="job", prompt="Hi", max_tokens=2).wait().usage["completion_tokens"] >= 1


def test_oversized_message_disconnects_only_its_sender_and_its_streams_still_end(server):
    with Client(server, timeout=60) as big, Client(server, timeout=60) as other:
        running = big.generate(prompt="Count from one to a thousand:", max_tokens=30, ignore_eos=True)
        assert big.next_for(running.id).type == "token"
        big.send({**GEN, "prompt": "x" * (2 * MAX_MESSAGE_BYTES)})  # never answered: the server drops the link
        assert other.generate(prompt="Hello", max_tokens=2).wait().usage["completion_tokens"] >= 1
        # The client reconnects under its routing id, and its request in flight ends with its one `done`.
        msgs = [big.next_for(running.id)]
        while msgs[-1].type == "token":
            msgs.append(big.next_for(running.id))
        assert msgs[-1].type == "done" and msgs[-1].finish_reason == "length"
        indexes = [m.index for m in msgs[:-1]]
        assert indexes == sorted(set(indexes)) and all(i < 30 for i in indexes)
        # Tokens lost with the dropped connection are not lost to the client: `done` holds the whole answer.
        done = msgs[-1]
        assert len(done.token_ids) == 30 and all(done.token_ids[m.index] == m.token_id for m in msgs[:-1])
        with pytest.raises(TimeoutError):
            big.recv(timeout=1)  # nothing for the oversized message itself: it never arrived


SURROGATE = "\ud800"
# Every message type, its id a lone surrogate: JSON's escape lets a client send a string UTF-8 cannot hold.
SURROGATE_IDS = [
    ("stats", {"v": 1, "type": "stats", "id": SURROGATE}, "stats"),
    ("graph", {"v": 1, "type": "graph", "id": SURROGATE}, "graph"),
    ("cancel", {"v": 1, "type": "cancel", "id": SURROGATE + "x"}, "error"),
    ("generate", {**GEN, "id": SURROGATE}, "error"),  # refused by field: a request id must be valid text
]


def test_replies_to_ids_utf8_cannot_hold_and_stays_up(server):
    with Client(server, timeout=60) as client:
        for case, message, kind in SURROGATE_IDS:
            client.send(_raw(message))
            reply = client.recv()
            assert (reply.type, reply.id) == (kind, message["id"]), (case, reply)
        assert client.generate(prompt="Hello", max_tokens=2).wait().usage["completion_tokens"] >= 1


def test_raw_bytes_of_an_old_framing_are_not_answered_many_times_over(server):
    """Bytes on the port that are not ZMTP 3 (an old ZeroMQ's framing, or anything else) would read as ZMTP 1.0: 4 KB
    of them as 2,000 two-byte messages, each answered with an error of 150 bytes. They are refused at the handshake.
    A ZMTP 3 message of many frames gets one reply."""
    host, port = server[len("tcp://") :].rsplit(":", 1)
    got = b""
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"\x01\x00" + b"\x01\x00" * 2000)
        deadline = time.monotonic() + 3
        try:
            while time.monotonic() < deadline and (chunk := raw.recv(65536)):
                got += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert len(got) <= 64, f"{len(got)} bytes back for 4,002 sent"  # libzmq's own greeting at most
    with Client(server, timeout=30) as client:
        client.sock.send_multipart([b"x"] * 1000)
        assert (client.recv().code, client.stats().type) == ("bad_frames", "stats")  # one reply, then the next
        assert client.generate(prompt="Hello", max_tokens=2).wait().usage["completion_tokens"] >= 1


def test_an_error_reply_is_bounded_whatever_the_message_echoes():
    long_key = "\x01" * 9000  # an unknown field the error names, 6 bytes a character once escaped as JSON
    with pytest.raises(P.ProtocolError) as info:
        P.parse_client(json.dumps({"v": 1, "type": "stats", "id": "\ud800" * 256, long_key: 1}).encode())
    exc = info.value
    reply = P.encode(P.Error(id=exc.rid, code=exc.code, field=exc.field, message=str(exc)))
    assert (exc.field, exc.rid) == (long_key, "\ud800" * 256) and len(reply) < 16 * 1024, len(reply)
