import os

from tests import triton_mode  # pytest's pythonpath puts the repository root on sys.path first

# Before any @triton.jit function is defined: the interpreter only where no CUDA device exists, so
# `pytest -m gpu` on a GPU host runs the compiled kernels (an explicit TRITON_INTERPRET wins).
triton_mode.apply(os.environ)
if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    from tests.interpreter_launches import list_builtins_once
    list_builtins_once()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def _is_gh200() -> bool:
    if not _has_cuda():
        return False
    from gh200rt.platform.detect import detect
    return detect().kind == "gh200"


def pytest_collection_modifyitems(config, items):
    has_cuda = _has_cuda()
    is_gh200 = has_cuda and _is_gh200()
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    for item in items:
        if "interpreter" in item.keywords and not interpreting:
            item.add_marker(pytest.mark.skip(reason="launches Triton kernels on CPU tensors, which needs "
                                                    "TRITON_INTERPRET=1; on a CUDA host the gpu tests judge the "
                                                    "compiled kernels against the same references"))
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gh200" in item.keywords and not is_gh200:
            item.add_marker(pytest.mark.skip(reason="needs a GH200"))


# ---- CPU routes (tests/cpu_routes.py) ---------------------------------------------------------------------
from tests.cpu_routes import TEST_ROUTES, native_build  # noqa: E402

_route_outcomes: dict[str, dict[str, int]] = {name: {} for name in TEST_ROUTES}
_route_of_test: dict[str, str] = {}


def pytest_addoption(parser):
    parser.addoption("--cpu-routes", default=",".join(TEST_ROUTES),
                     help=f"CPU routes the route-dependent tests run on, of {', '.join(TEST_ROUTES)} (default: all; "
                          "those this machine cannot execute are skipped with the reason)")


def _selected_routes(config) -> list[str]:
    names = [name.strip() for name in config.getoption("--cpu-routes").split(",") if name.strip()]
    unknown = [name for name in names if name not in TEST_ROUTES]
    if unknown:
        raise pytest.UsageError(f"--cpu-routes: unknown {', '.join(unknown)}; choose from {', '.join(TEST_ROUTES)}")
    return names


def pytest_configure(config):
    _selected_routes(config)   # a misspelt --cpu-routes stops the run before any test


@pytest.fixture(params=list(TEST_ROUTES))
def cpu_route(request):
    """A route forced for the test (``TestRoute``): pass ``**cpu_route.options`` to the engine."""
    route = TEST_ROUTES[request.param]
    if route.name not in _selected_routes(request.config):
        pytest.skip(f"CPU route {route.name} is not in --cpu-routes")
    why_not = route.unavailable()
    if why_not is not None:
        pytest.skip(f"CPU route {route.name} cannot execute here: {why_not}")
    if route.portable:
        with native_build(route.native_flags):
            yield route
    else:
        yield route


@pytest.fixture(scope="session")
def short_smollm2(tmp_path_factory) -> str:
    """The shipped SmolLM2 GGUF cut to its first four blocks (tests/engine/short_gguf.py): every shape, weight type
    and kernel path of the whole model, for the tests that run it on every CPU route."""
    from tests.engine.real_models import smollm2_gguf
    from tests.engine.short_gguf import write_first_blocks
    return write_first_blocks(smollm2_gguf(), str(tmp_path_factory.mktemp("smollm2") / "smollm2-4-blocks.gguf"), 4)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test starts with the session's torch thread count: a test that changes it (a pool worker's
    ``set_num_threads``, a tensor-parallel launch) would otherwise change later tests' reduction orders, and with them
    the bits of any reference computed under the other count."""
    import torch
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_runtest_logreport(report):
    route_name = _route_of_test.get(report.nodeid)
    if route_name is None or (report.when != "call" and report.outcome == "passed"):
        return   # one count per test: its call, or the setup / teardown that skipped or failed it
    outcome = "skipped" if report.skipped else report.outcome
    counts = _route_outcomes[route_name]
    counts[outcome] = counts.get(outcome, 0) + 1


def pytest_itemcollected(item):
    global _aarch64_collected
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "cpu_route" in callspec.params:
        _route_of_test[item.nodeid] = callspec.params["cpu_route"]
    _aarch64_collected |= item.path.name == AARCH64_TESTS


# ---- the native ops' aarch64 builds under emulation (tests/kernels/test_cpu_native_aarch64.py) ------------
AARCH64_TESTS = "test_cpu_native_aarch64.py"
_aarch64_collected = False


def _aarch64_summary(terminalreporter):
    """Whether the Arm builds' checks could run: a machine without the cross tools says so, never silently."""
    from tests.kernels.aarch64.builds import INSTALL_HINT, missing_tools
    why_not = missing_tools()
    state = "run here under qemu" if why_not is None else f"skipped: {why_not}; {INSTALL_HINT}"
    terminalreporter.section("aarch64 native builds")
    terminalreporter.write_line(f"NEON and portable builds of kernels/cpu: {state}")


def pytest_terminal_summary(terminalreporter, config):
    if _aarch64_collected:
        _aarch64_summary(terminalreporter)
    if not any(_route_outcomes.values()):
        return
    terminalreporter.section("CPU routes")
    selected = _selected_routes(config)
    for name, route in TEST_ROUTES.items():
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(_route_outcomes[name].items()))
        why_not = route.unavailable() if name in selected else "not in --cpu-routes"
        state = "runs here" if why_not is None else f"skipped: {why_not}"
        terminalreporter.write_line(f"{name:>14}  {state}  ({counts or 'no tests selected'})")
