"""Requests and knobs: bad input is refused naming the field; the row budget follows the seed's formula."""

import pytest

from speclane.pipeline.runtime.request import (
    MAX_STOP_BYTES,
    MAX_STOP_STRINGS,
    MIN_TEMPERATURE,
    SpecKnobs,
    parse_request,
)
from speclane.stages.anchor_gather import drafts_per_lane
from speclane.stages.contract.errors import ConfigError, RequestError


@pytest.mark.parametrize("lanes, expected", [(1, 3), (2, 3), (3, 1), (4, 1), (5, 0), (8, 0)])
def test_row_budget_8_rows_3_drafts(lanes, expected):
    # The seed: a budget of 8 with 3 draft tokens gives 3 drafts at one or two lanes, 1 at three or four,
    # none from five lanes on.
    assert drafts_per_lane(3, 8, lanes) == expected


def test_row_budget_zero_means_no_cap():
    assert drafts_per_lane(7, 0, 64) == 7
    assert drafts_per_lane(7, 3, 1) == 2


@pytest.mark.parametrize(
    "data, field, message",
    [
        (
            {"prompt": "x", "max_tokens": 0},
            "max_tokens",
            "field 'max_tokens': Input should be greater than or equal to 1",
        ),
        (
            {"prompt": "x", "spec": {"draft_tokens": 8}},
            "spec.draft_tokens",
            "field 'spec.draft_tokens': Input should be less than or equal to 7",
        ),
        ({"prompt": "x", "colour": "red"}, "colour", "unknown field 'colour'; remove it (see docs/protocol.md)"),
        (
            {"prompt": "x", "prompt_ids": [1]},
            "request",
            "field 'request': give exactly one of prompt, prompt_ids, messages (got ['prompt', 'prompt_ids'])",
        ),
        (
            {"prompt": "x", "temperature": -1},
            "temperature",
            "field 'temperature': Input should be greater than or equal to 0",
        ),
        (
            {"messages": [{"role": "robot", "content": "x"}]},
            "messages.0.role",
            "field 'messages.0.role': Input should be 'system', 'user', 'assistant' or 'tool'",
        ),
    ],
)
def test_bad_request_names_the_field(data, field, message):
    with pytest.raises(RequestError) as err:
        parse_request(data)
    assert err.value.field == field
    assert str(err.value) == message


def test_stop_accepts_a_string():
    assert parse_request({"prompt": "x", "stop": "END"}).stop == ["END"]


# A value of the wrong JSON type is refused, never converted; an empty list is blamed on itself; stop strings are
# bounded in count and size (they are matched on the serve loop for every token). One defect each.
@pytest.mark.parametrize(
    "data, field, message",
    [
        ({"prompt": "x", "max_tokens": "16"}, "max_tokens", "field 'max_tokens': Input should be a valid integer"),
        ({"prompt": "x", "max_tokens": 16.0}, "max_tokens", "field 'max_tokens': Input should be a valid integer"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens", "field 'max_tokens': Input should be a valid integer"),
        ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos", "field 'ignore_eos': Input should be a valid boolean"),
        ({"prompt": "x", "ignore_eos": 1}, "ignore_eos", "field 'ignore_eos': Input should be a valid boolean"),
        ({"prompt": "x", "temperature": "0.5"}, "temperature", "field 'temperature': Input should be a valid number"),
        ({"prompt": "x", "seed": "7"}, "seed", "field 'seed': Input should be a valid integer"),
        ({"prompt_ids": ["1"]}, "prompt_ids.0", "field 'prompt_ids.0': Input should be a valid integer"),
        (
            {"prompt": "x", "spec": {"enabled": "no"}},
            "spec.enabled",
            "field 'spec.enabled': Input should be a valid boolean",
        ),
        ({"prompt_ids": []}, "prompt_ids", "field 'prompt_ids': prompt_ids is empty; give at least one token id"),
        ({"messages": []}, "messages", "field 'messages': messages is empty; give at least one message"),
        ({"prompt": "x", "stop": 123}, "stop", "field 'stop': give a string or a list of strings, got int"),
        ({"prompt": "x", "stop": ["END", 5]}, "stop.1", "field 'stop.1': Input should be a valid string"),
        (
            {"prompt": "x", "stop": ["s"] * (MAX_STOP_STRINGS + 1)},
            "stop",
            f"field 'stop': at most {MAX_STOP_STRINGS} stop strings, got {MAX_STOP_STRINGS + 1}; "
            "keep the ones that matter",
        ),
        (
            {"prompt": "x", "stop": ["ok", "é" * (MAX_STOP_BYTES // 2 + 1)]},
            "stop.1",
            (
                f"field 'stop.1': a stop string may have at most {MAX_STOP_BYTES} bytes of UTF-8, this one has "
                f"{MAX_STOP_BYTES + 2}; shorten it"
            ),
        ),
        (
            {"prompt": "x", "stop": "x" * (MAX_STOP_BYTES + 1)},
            "stop.0",
            (
                f"field 'stop.0': a stop string may have at most {MAX_STOP_BYTES} bytes of UTF-8, this one has "
                f"{MAX_STOP_BYTES + 1}; shorten it"
            ),
        ),
    ],
)
def test_wrong_types_empty_lists_and_long_stop_lists_name_the_field(data, field, message):
    with pytest.raises(RequestError) as err:
        parse_request(data)
    assert (err.value.field, str(err.value)) == (field, message)


def test_the_bounds_and_the_json_number_kinds_that_are_one_type_still_pass():
    longest = ["s" * MAX_STOP_BYTES] * MAX_STOP_STRINGS
    req = parse_request({"prompt": "x", "temperature": 1, "top_p": 1, "stop": longest})
    assert (req.temperature, req.top_p, len(req.stop)) == (1.0, 1.0, MAX_STOP_STRINGS)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"draft_tokens": 0}, "--spec-draft-tokens: Input should be greater than or equal to 1 (1 to 7)"),
        ({"draft_tokens": 8}, "--spec-draft-tokens: Input should be less than or equal to 7 (1 to 7)"),
        (
            {"draft_rows": -1},
            "--spec-draft-rows: Input should be greater than or equal to 0 (0 means the backend's default)",
        ),
    ],
)
def test_bad_knobs_name_the_flag_and_range(flags, message):
    with pytest.raises(ConfigError) as err:
        SpecKnobs.from_flags(**flags)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "t, sampled", [(1e-39, 0.0), (MIN_TEMPERATURE / 2, 0.0), (MIN_TEMPERATURE, MIN_TEMPERATURE), (0.7, 0.7)]
)
def test_a_temperature_below_the_minimum_is_greedy(t, sampled):
    """1e-39 is below float32's smallest normal number: logits / t overflow, so it samples as temperature 0."""
    assert parse_request({"prompt": "x", "temperature": t}).temperature == sampled
