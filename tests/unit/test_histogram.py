"""The Prometheus histogram (cumulative buckets) and vLLM's 1-2-5 token buckets."""
from gh200rt.histogram import Histogram, one_two_five


def test_one_two_five():
    assert one_two_five(10) == (1, 2, 5, 10)
    assert one_two_five(4999) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def test_buckets_are_cumulative_and_inclusive():
    h = Histogram("x", "help", (1, 5))
    for v in (1, 2, 5, 6):
        h.observe(v)
    lines = h.render("vllm:x", 'model_name="m"')
    assert 'vllm:x_bucket{model_name="m",le="1"} 1' in lines       # le is inclusive: 1 <= 1
    assert 'vllm:x_bucket{model_name="m",le="5"} 3' in lines
    assert 'vllm:x_bucket{model_name="m",le="+Inf"} 4' in lines
    assert 'vllm:x_sum{model_name="m"} 14.0' in lines and 'vllm:x_count{model_name="m"} 4' in lines
