"""Requests and knobs: bad input is refused naming the field; the row budget follows the seed's formula."""
import pytest

from speclane.pipeline.runtime.request import MIN_TEMPERATURE, SpecKnobs, parse_request
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


@pytest.mark.parametrize("data, field, message", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "field 'max_tokens': Input should be greater than or equal to 1"),
    ({"prompt": "x", "spec": {"draft_tokens": 8}}, "spec.draft_tokens",
     "field 'spec.draft_tokens': Input should be less than or equal to 7"),
    ({"prompt": "x", "colour": "red"}, "colour", "unknown field 'colour'; remove it (see docs/protocol.md)"),
    ({"prompt": "x", "prompt_ids": [1]}, "request",
     "field 'request': Value error, give exactly one of prompt, prompt_ids, messages (got ['prompt', 'prompt_ids'])"),
    ({"prompt": "x", "temperature": -1}, "temperature",
     "field 'temperature': Input should be greater than or equal to 0"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role",
     "field 'messages.0.role': Input should be 'system', 'user', 'assistant' or 'tool'"),
])
def test_bad_request_names_the_field(data, field, message):
    with pytest.raises(RequestError) as err:
        parse_request(data)
    assert err.value.field == field
    assert str(err.value) == message


def test_stop_accepts_a_string():
    assert parse_request({"prompt": "x", "stop": "END"}).stop == ["END"]


@pytest.mark.parametrize("flags, message", [
    ({"draft_tokens": 0}, "--spec-draft-tokens: Input should be greater than or equal to 1 (1 to 7)"),
    ({"draft_tokens": 8}, "--spec-draft-tokens: Input should be less than or equal to 7 (1 to 7)"),
    ({"draft_rows": -1}, "--spec-draft-rows: Input should be greater than or equal to 0 (0 means the backend's default)"),
])
def test_bad_knobs_name_the_flag_and_range(flags, message):
    with pytest.raises(ConfigError) as err:
        SpecKnobs.from_flags(**flags)
    assert str(err.value) == message


@pytest.mark.parametrize("t, sampled", [(1e-39, 0.0), (MIN_TEMPERATURE / 2, 0.0), (MIN_TEMPERATURE, MIN_TEMPERATURE),
                                        (0.7, 0.7)])
def test_a_temperature_below_the_minimum_is_greedy(t, sampled):
    """1e-39 is below float32's smallest normal number: logits / t overflow, so it samples as temperature 0."""
    assert parse_request({"prompt": "x", "temperature": t}).temperature == sampled
