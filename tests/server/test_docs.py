"""docs/protocol.md cannot rot: every JSON block on it is a valid message of the protocol it documents."""

from __future__ import annotations

import re
from pathlib import Path

from speclane.pipeline.net import protocol as P

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
CLIENT_TYPES = set(P.CLIENT_TYPES)


def _blocks() -> list[str]:
    return re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)


def test_every_json_block_is_a_valid_message():
    blocks = _blocks()
    assert len(blocks) >= 10
    kinds = set()
    for block in blocks:
        raw = block.encode()
        # A block that carries a server-only field (index, finish_reason, lanes, graph, code, metrics text) is a reply.
        is_reply = (
            any(f'"{k}"' in block for k in ("index", "finish_reason", "lanes", 'graph": {', "code"))
            or '"text": "#' in block
        )
        msg = P.parse_server(raw) if is_reply else P.parse_client(raw)
        kinds.add(("reply" if is_reply else "request", msg.type))
    assert kinds >= {("request", t) for t in CLIENT_TYPES} | {("reply", t) for t in P.SERVER_TYPES}
