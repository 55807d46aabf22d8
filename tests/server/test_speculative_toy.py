"""``--speculative-config`` on the server: requests are served with drafts verified and vLLM's ``spec_decode``
counters on /metrics; a method gh200rt does not have stops the start with what to use."""
import json
import re
import time

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2})


def test_the_server_drafts_and_counts_as_vllm_does(start_toy_server):
    server = start_toy_server("--speculative-config", NGRAM)
    body = {"model": "toy", "prompt": "a b c a b c a b c a b", "max_tokens": 12, "temperature": 0}
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200

    def value(text, name, labels=""):
        found = re.search(rf'^vllm:{name}{{model_name="toy"{labels}}} (\S+)$', text, re.M)
        return float(found.group(1)) if found else None
    deadline = time.monotonic() + 10
    while True:      # the engine thread publishes its stats a moment after the response
        text = httpx.get(server.url + "/metrics", timeout=10).text
        drafts = value(text, "spec_decode_num_drafts_total")
        if drafts or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert drafts and drafts > 0, text[-2000:]
    assert value(text, "spec_decode_num_draft_tokens_total") >= drafts
    accepted = value(text, "spec_decode_num_accepted_tokens_total")
    per_position = [value(text, "spec_decode_num_accepted_tokens_per_pos", f',position="{j}"') for j in range(3)]
    assert None not in per_position and sum(per_position) == accepted


def test_a_method_the_model_cannot_serve_stops_the_start_with_what_to_use(start_toy_server):
    with pytest.raises(RuntimeError) as e:
        start_toy_server("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}')
    assert "this model has none; use ngram, suffix, draft_model or eagle3" in str(e.value)
    with pytest.raises(RuntimeError) as e:
        start_toy_server("--speculative-config", '{"method": "eagle3", "model": "x", "num_speculative_tokens": 2}')
    assert "eagle3 head 'x' is not a directory" in str(e.value)


def test_async_scheduling_with_drafts_serves_the_synchronous_completions(start_toy_server):
    """--async-scheduling beside --speculative-config: each step's report overlaps the next verifying step; the
    server streams what the synchronous one serves (text, logprobs, a stop string's cut), streams cut in flight leave
    nothing held, and steps were launched before the previous step was reported."""
    from tests.server.helpers import check_streams_with_disconnects, metric
    servers = [start_toy_server("--speculative-config", NGRAM, *flags) for flags in ((), ("--async-scheduling",))]
    for prompt, stop in (("a b c a b c a b c a b", None), ("abcabcabc", None), ("hello world hello", "o")):
        body = {"model": "toy", "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 2, "stop": stop}
        sync, late = (httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
                      for s in servers)
        assert (late["text"], late["finish_reason"], late["logprobs"]) == \
            (sync["text"], sync["finish_reason"], sync["logprobs"])
    check_streams_with_disconnects(servers[1], timeout=60, count=12)
    assert metric(servers[1], "steps_launched_ahead_total") > 0
