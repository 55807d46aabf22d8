"""The PTX load-width parser of scripts/check_kernels.py (the script itself runs in CI after the tests)."""
import importlib.util
import os


def load_script():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "check_kernels.py")
    spec = importlib.util.spec_from_file_location("check_kernels", path)
    module = importlib.util.module_from_spec(spec)
    interpret = os.environ.get("TRITON_INTERPRET")
    try:
        spec.loader.exec_module(module)
    finally:  # the script drops TRITON_INTERPRET for its own process; keep ours
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret
    return module


def test_widest_global_load():
    widest = load_script().widest_global_load
    assert widest("ld.global.b16 {%rs1}, [%rd1];") == 16
    assert widest("ld.global.v2.b32 {%r1, %r2}, [%rd1];\n ld.global.b8 {%rs1}, [%rd2];") == 64
    assert widest("@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];") == 128
    assert widest("ld.global.nc.v2.b64 {%rd3, %rd4}, [%rd1];") == 128
    assert widest("cp.async.cg.shared.global [ %r28 + 0 ], [ %rd8 + 0 ], 0x10, %r29;") == 128
    assert widest("cp.async.ca.shared.global [ %r1 + 0 ], [ %rd2 + 0 ], 0x4, %r3;") == 32
    assert widest("st.global.v4.b32 [%rd1], {%r1, %r2, %r3, %r4};") == 0
