"""``bench peers``'s table: an engine named more than once (runs alternated with another's) keeps every run's
figure in its own column, and its median is printed."""
from gh200rt.bench.peers import print_medians, print_table


def test_repeated_engines_keep_each_runs_figures(capsys):
    engines = ["llamacpp", "gh200rt:auto", "llamacpp", "gh200rt:auto", "llamacpp", "gh200rt:auto"]
    runs = [{"single": s} for s in (72.3, 64.9, 68.9, 64.1, 71.2, 69.3)]
    print_table(engines, runs, ["single"])
    print_medians(engines, runs)
    out = capsys.readouterr().out
    assert "| single-stream decode, tok/s | 72.3 | 64.9 | 68.9 | 64.1 | 71.2 | 69.3 |" in out
    assert "llamacpp: median of 3 runs: single 71.2" in out
    assert "gh200rt:auto: median of 3 runs: single 64.9" in out


def test_a_skipped_engine_says_why(capsys):
    print_table(["vllm:bfloat16", "llamacpp"], [{"skipped": "vllm is not installed"}, {"single": 70.0}], ["single"])
    out = capsys.readouterr().out
    assert "| single-stream decode, tok/s | — | 70.0 |" in out
    assert "vllm:bfloat16: skipped: vllm is not installed" in out
