"""Streaming a committed run token by token: stops cut the run where they fall, held text is flushed."""

import pytest

from speclane.pipeline.runtime.request import parse_request
from speclane.stages.contract.lanes import Lane, push_token


class CharDetok:
    """Token id n decodes to chr(n); ids >= 1000 are the halves of a two-token character."""

    def __init__(self):
        self.held = ""

    def push(self, t):
        if t >= 1000:
            if self.held:
                out, self.held = "é", ""
                return out
            self.held = "?"
            return ""
        return chr(t)

    def flush(self):
        out, self.held = ("\ufffd" if self.held else ""), ""
        return out


def lane(**req):
    return Lane(
        rid=1,
        order=0,
        slot=0,
        prompt_ids=[1],
        request=parse_request({"prompt_ids": [1], **req}),
        draft_tokens=0,
        eos_ids=frozenset({0}),
        detok=CharDetok(),
        seed=0,
    )


def run(l, tokens):
    out = []
    for t in tokens:
        text, done = push_token(l, t)
        out.append(text)
        if done:
            break
    return out


def test_stop_string_inside_a_run_cuts_it_and_holds_back_its_prefix():
    l = lane(stop=["XY"], max_tokens=50)
    pieces = run(l, [ord(c) for c in "abXcXYdef"])
    assert pieces == ["a", "b", "", "Xc", "", ""]
    assert l.text == "abXc" and l.finish_reason == "stop" and len(l.out_ids) == 6


def test_eos_ends_without_text_and_max_tokens_ends_with_length():
    l = lane(max_tokens=10)
    assert run(l, [ord("a"), 0, ord("b")]) == ["a", ""]
    assert l.finish_reason == "stop" and l.out_ids == [97, 0]
    l = lane(max_tokens=2)
    assert run(l, [ord("a"), ord("b"), ord("c")]) == ["a", "b"]
    assert l.finish_reason == "length"


def test_split_character_is_flushed_at_the_end():
    l = lane(max_tokens=2)
    assert run(l, [ord("a"), 1000]) == ["a", "\ufffd"]
    l = lane(max_tokens=3)
    assert run(l, [1000, 1001, ord("z")]) == ["", "é", "z"]


def test_ignore_eos_keeps_going():
    l = lane(max_tokens=3, ignore_eos=True)
    run(l, [0, 0, 0])
    assert l.finish_reason == "length" and l.out_ids == [0, 0, 0]


def test_acceptance_counting_per_position():
    l = lane()
    l.count_round(3, 1)
    l.count_round(3, 3)
    l.count_round(2, 0)
    assert l.offered_at == [3, 2, 1] and l.accepted_at == [2, 1, 1]
    assert l.drafted_at == [3, 3, 2]  # every position a round drafted, reached or not
