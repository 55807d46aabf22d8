import pytest

from gh200rt.sampling_params import SamplingParams


@pytest.mark.parametrize("kwargs, name", [
    ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"), ({"seed": 2**64}, "seed"), ({"seed": 2**63}, "seed"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"), ({"logprobs": -2}, "logprobs"),
    ({"prompt_logprobs": -2}, "prompt_logprobs"), ({"stop": [""]}, "stop"),
    ({"logprob_token_ids": [3]}, "logprob_token_ids"), ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
])
def test_bad_values_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        SamplingParams(**kwargs)


def test_normalisation():
    p = SamplingParams(stop="x", top_k=-1, temperature=0)
    assert p.stop == ["x"] and p.top_k == 0 and p.greedy


def test_tiny_temperatures_sample_greedily():
    assert SamplingParams(temperature=1e-300).greedy and SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=1e-4).greedy
