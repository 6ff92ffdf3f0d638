"""The reply encoder never fails on what a client sent: every server message, with generated ids and texts, is
written as one frame that parses back to the same message."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from speclane.pipeline.net import protocol as P

# Any code point, lone surrogates included (json's \\udXXX escapes let a client send them), plus ints of any size
# the id check takes.
TEXT = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
IDS = st.one_of(TEXT.filter(lambda s: 0 < len(s) <= 256), st.integers(-(2**63), 2**63 - 1))


def _messages(rid, text):
    return [
        P.Token(id=rid, index=3, token_id=7, text=text),
        P.Done(
            id=rid,
            finish_reason="stop",
            usage={"completion_tokens": 1},
            spec={"note": text},
            text=text,
            token_ids=[1, 2],
        ),
        P.Error(id=rid, code="invalid_request", field=text or None, message=text),
        P.StatsReply(id=rid, lanes={}, queue={}, finished={}, clients=1, spec={"x": text}),
        P.GraphReply(id=rid, graph={text: [text]}),
    ]


@settings(max_examples=300, deadline=None)
@given(rid=IDS, text=TEXT)
def test_every_reply_encodes_and_parses_back(rid, text):
    for msg in _messages(rid, text):
        frame = P.encode(msg)
        assert isinstance(frame, bytes)
        assert P.parse_server(frame) == msg
