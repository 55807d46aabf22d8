"""``python -m gh200rt.plan`` for Llama-3.1-70B-Instruct-FP8 (config.json only): fp8 KV halves the bytes
per token and doubles the tokens a fixed placement leaves room for; fp8 host weights halve what each
streamed layer copies, and so the predicted step of an all-streamed plan."""
import re

import pytest

from gh200rt.plan import main

FP8_70B = "tests/fixtures/llama31_70b_fp8"


def plan(capsys, *flags) -> dict:
    assert main(["--model", FP8_70B, *flags]) == 0
    out = capsys.readouterr().out
    return dict(text=out, tokens=int(re.search(r"= (\d+) tokens", out).group(1)),
                per_token=int(re.search(r"at (\d+) bytes per token", out).group(1)),
                step=float(re.search(r"predicted decode step \(batch 1\): ([\d.]+) ms", out).group(1)))


@pytest.mark.parametrize("platform", ["gh200-96g", "h100-sxm"])
def test_fp8_kv_and_fp8_host_weights_in_the_plan(capsys, platform):
    stream = ("--platform", platform, "--offload", "stream")
    base = plan(capsys, *stream, "--host-weight-dtype", "bf16")
    assert "resident layers fp8, offloaded layers bf16" in base["text"] and "KV cache bf16" in base["text"]
    kv8 = plan(capsys, *stream, "--host-weight-dtype", "bf16", "--kv-cache-dtype", "fp8")
    assert kv8["per_token"] * 2 == base["per_token"] == 2 * 8 * 128 * 2 * 80  # K+V, 8 KV heads x 128, 80 layers
    assert 1.99 * base["tokens"] <= kv8["tokens"] <= 2.01 * base["tokens"]
    host8 = plan(capsys, *stream)  # auto keeps the checkpoint's fp8 in host memory
    assert "offloaded layers fp8" in host8["text"]
    assert 0.49 < host8["step"] / base["step"] < 0.52  # the copies dominate; fp8 moves half the bytes
    # a KV target: fp8 KV leaves room for more resident layers, so the step gets faster
    target = ("--platform", platform, "--kv-cache-min-tokens", "100000")
    assert plan(capsys, *target, "--kv-cache-dtype", "fp8")["step"] < plan(capsys, *target)["step"]


def test_unsupported_quantization_in_config_is_an_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text(open(f"{FP8_70B}/config.json").read().replace('"channel"', '"block"'))
    assert main(["--model", str(tmp_path), "--platform", "gh200-96g"]) == 2
    assert "strategy 'block'" in capsys.readouterr().err
