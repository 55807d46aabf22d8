"""scripts/junit_failures.py: failing test ids and first error lines out of pytest's junit XML, checked on an
excerpt of the first H100 run's file (whose XML an unescaped `<checkout>` damaged) and on the same excerpt
repaired; the two readings must agree."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from junit_failures import failing_tests, first_line, case_id  # noqa: E402

EXCERPT = ROOT / "tests" / "fixtures" / "gpu_tests_h100_excerpt.xml"
EXPECTED = [
    ("tests/gpu/test_gpu_decode_graphs.py::test_replay_matches_eager_for_each_placement_with_poisoned_slots"
     "[direct + streamed-float32]",
     "gh200rt.engine.cuda_graphs.addresses.GraphAddressChanged: the decode graph of batch bucket 24 would replay"),
    ("tests/gpu/test_gpu_decode_graphs.py::test_a_tier_move_on_a_gpu_recaptures_and_keeps_addresses_checked",
     "AssertionError: after a tier move: prompt 21 differs at step 21 (54 vs 112) but the reference's top-2 gap "
     "there is 0.000124, not a near tie"),
    ("tests/gpu/test_gpu_fp8.py::test_compiled_paged_attention_reads_fp8[1-query_lens0-seq_lens0-torch.float8_e4m3fn]",
     "ValueError: Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)"),
    ("tests/gpu/test_gpu_model_kernels.py::test_triton_model_matches_torch_path[kernel-prefill-llama-bf16]",
     "assert 0.030456852167844772 < 0.03"),
]


def check(found):
    assert [f["id"] for f in found] == [e[0] for e in EXPECTED], "passed and skipped tests are not listed"
    for f, (_, line) in zip(found, EXPECTED):
        assert f["kind"] == "failure" and f["first_line"].startswith(line) and "\n" not in f["first_line"]
    assert len(found[0]["first_line"]) <= 300 and found[0]["first_line"].endswith("...")


def test_the_damaged_real_file_is_read_line_by_line():
    assert "<checkout>/tests" in EXCERPT.read_text()
    check(failing_tests(EXCERPT))


def test_a_well_formed_file_reads_the_same(tmp_path):
    repaired = tmp_path / "gpu_tests.xml"
    repaired.write_text(EXCERPT.read_text().replace("<checkout>", "&lt;checkout&gt;"))
    check(failing_tests(repaired))


def test_errors_classes_and_collection_errors(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_x.TestGraphs" name="test_y" time="0.1">'
        '<error message="failed on setup with &quot;RuntimeError: CUDA error: out of memory&quot;">trace</error>'
        '</testcase><testcase classname="" name="tests.gpu.test_broken" time="0">'
        '<error message="collection failure">E   ImportError: cannot import name \'x\'</error></testcase>'
        '<testcase classname="tests.unit.test_z" name="test_w"><failure>def test_w():\n&gt;  assert f()\n'
        'E   assert False\n</failure></testcase></testsuite></testsuites>')
    assert [(f["id"], f["kind"], f["first_line"]) for f in failing_tests(path)] == [
        ("tests/gpu/test_x.py::TestGraphs::test_y", "error",
         'failed on setup with "RuntimeError: CUDA error: out of memory"'),
        ("tests.gpu.test_broken", "error", "collection failure"),
        ("tests/unit/test_z.py::test_w", "failure", "assert False")]


def test_no_file_is_none_not_an_empty_list(tmp_path):
    assert failing_tests(tmp_path / "missing.xml") is None
    assert case_id("tests.a.test_b", "test_c[1-x]") == "tests/a/test_b.py::test_c[1-x]"
    assert first_line("\n\n  first\nsecond", None) == "first"
