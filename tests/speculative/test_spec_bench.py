"""``python -m gh200rt.bench speculative`` runs both engines on the same tasks and reports the speed-up, the
acceptance and whether greedy outputs agree (a tiny random model with a chat template stands in for SmolLM2)."""
import re

from gh200rt.bench.__main__ import main
from tests.model.tiny_checkpoints import save_tiny


def test_the_benchmark_reports_both_engines_and_their_agreement(tmp_path, capsys):
    save_tiny("llama3-gqa-untied", str(tmp_path))
    assert main(["speculative", "--model", str(tmp_path), "--dtype", "float32", "--prompts", "2", "--output-tokens",
                 "16", "--batch", "2", "--max-chars", "100", "--max-model-len", "256"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^spec off +[0-9.]+ +[0-9.]+ +- +-$", text, re.M), text
    assert re.search(r"^spec on +[0-9.]+ +[0-9.]+ +[01]\.[0-9]{2} +[1-5]\.[0-9]{2}$", text, re.M), text
    assert re.search(r"^speed-up: single stream [0-9.]+x, batch 2 [0-9.]+x; greedy outputs (identical|DIFFER)$",
                     text, re.M), text
