import pytest

from gh200rt.serve.errors import APIError
from gh200rt.serve.truncation import PromptTruncation, parse_truncation

IDS = list(range(10))


def test_left_keeps_the_last_tokens_right_the_first():
    assert PromptTruncation(3).apply(IDS, 100, 5) == [7, 8, 9]
    assert PromptTruncation(3, "right").apply(IDS, 100, 5) == [0, 1, 2]
    assert PromptTruncation(30).apply(IDS, 100, 5) == IDS


def test_minus_one_keeps_what_max_model_len_leaves_after_max_tokens():
    assert PromptTruncation(-1).apply(IDS, 8, 2) == list(range(4, 10))
    assert PromptTruncation(-1, "right").apply(IDS, 8, None) == list(range(8))
    assert PromptTruncation(-1).apply(IDS, 100, 5) == IDS


def test_more_than_fits_is_refused_naming_the_room_left():
    with pytest.raises(APIError, match="room for 6 prompt tokens") as e:
        PromptTruncation(7).apply(IDS, 8, 2)
    assert e.value.status == 400 and e.value.body()["error"]["param"] == "truncate_prompt_tokens"


@pytest.mark.parametrize("body, param", [
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"), ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": True}, "truncate_prompt_tokens"), ({"truncate_prompt_tokens": "4"}, "truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": 4, "truncation_side": "both"}, "truncation_side")])
def test_bad_values_are_a_400_naming_the_field(body, param):
    with pytest.raises(APIError) as e:
        parse_truncation(body)
    assert e.value.body()["error"]["param"] == param


def test_parse_defaults_to_the_left_side_and_nothing_without_a_count():
    assert parse_truncation({"truncate_prompt_tokens": 4}) == PromptTruncation(4, "left")
    assert parse_truncation({"truncation_side": "right"}) is None
