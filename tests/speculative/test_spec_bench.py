"""``python -m gh200rt.bench speculative`` runs both engines on the same tasks and reports the speed-up, the
acceptance and whether greedy outputs agree (a tiny random model with a chat template stands in for SmolLM2)."""
import json
import re
import sys
from pathlib import Path

from gh200rt.bench.__main__ import main
from tests.model.tiny_checkpoints import save_tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from validate_report import speculative_figures  # noqa: E402


def test_the_benchmark_reports_both_engines_and_their_agreement(tmp_path, capsys):
    save_tiny("llama3-gqa-untied", str(tmp_path / "model"))
    figures = tmp_path / "speculative.json"
    assert main(["speculative", "--model", str(tmp_path / "model"), "--dtype", "float32", "--prompts", "2",
                 "--output-tokens", "16", "--batch", "2", "--max-chars", "100", "--max-model-len", "256",
                 "--json", str(figures), "--order", "off,on,on-sync,on-async"]) == 0
    text = capsys.readouterr().out
    # with and without async scheduling a speculating engine takes the same steps: the same outputs
    assert re.search(r"^spec sync +[0-9.]+ +[0-9.]+ +[0-9.]+ +[01]\.[0-9]{2} +[1-5]\.[0-9]{2}$", text, re.M), text
    assert re.search(r"^async scheduling with speculation: single stream [0-9.]+x, batch 2 [0-9.]+x of spec sync; "
                     r"outputs identical$", text, re.M), text
    assert re.search(r"^spec off +[0-9.]+ +[0-9.]+ +[0-9.]+ +- +-$", text, re.M), text
    assert re.search(r"^spec on +[0-9.]+ +[0-9.]+ +[0-9.]+ +[01]\.[0-9]{2} +[1-5]\.[0-9]{2}$", text, re.M), text
    assert re.search(r"^speed-up: single stream [0-9.]+x \(decode [0-9.]+x\), batch 2 [0-9.]+x; greedy outputs "
                     r"(identical|DIFFER \([0-9]+ of 4 equal; the others first differ at token [0-9, ]+: .*\))$", text,
                     re.M), text
    from gh200rt.bench.speculative import first_difference
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1 and first_difference([1, 2], [1, 2, 3]) == 2
    # the GPU validation kit's report reads the same figures: with speculation, next to the run without
    rows = speculative_figures(json.loads(figures.read_text()))
    assert [r["unit"] for r in rows] == ["tok/s"] * 4 and all(r["roofline"] > 0 for r in rows)
    assert "single stream" in rows[0]["what"] and "batch 2" in rows[1]["what"]
    assert "async scheduling" in rows[2]["what"] and "synchronous" in rows[2]["roofline_source"]


def test_a_random_eagle3_head_is_written_for_the_model_and_drafts(tmp_path, capsys):
    save_tiny("llama3-gqa-untied", str(tmp_path / "model"))
    head = tmp_path / "head"
    config = json.dumps({"method": "eagle3", "model": str(head), "num_speculative_tokens": 2})
    assert main(["speculative", "--model", str(tmp_path / "model"), "--dtype", "float32", "--prompts", "1",
                 "--output-tokens", "8", "--batch", "1", "--max-chars", "60", "--max-model-len", "256",
                 "--speculative-config", config, "--random-eagle3-head"]) == 0
    text = capsys.readouterr().out
    assert (head / "config.json").exists() and "wrote a random EAGLE-3 head" in text
    assert re.search(r"^spec on +[0-9.]+ +[0-9.]+ +[0-9.]+ +[01]\.[0-9]{2} +[1-3]\.[0-9]{2}$", text, re.M), text
    assert "greedy outputs identical" in text
