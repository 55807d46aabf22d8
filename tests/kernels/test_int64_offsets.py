"""Per-row kernels index with int64 row offsets: T * row stride passes 2^31 elements in one launch
(a 70B model's gate_up output past ~37k tokens), where an int32 offset would wrap and read or write
out of bounds. Checked on the Hopper TTIR, in a subprocess because the tests interpret Triton."""
import subprocess
import sys
import textwrap

KERNELS = ("silu_mul", "rmsnorm", "rope", "store_kv")

SCRIPT = textwrap.dedent("""
    import os, re, sys
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gh200rt.kernels.triton.compile_specs import all_specs
    wanted = set(sys.argv[1:])
    done = set()
    for spec in all_specs():
        if spec.name not in wanted or spec.name in done:
            continue
        done.add(spec.name)
        src = ASTSource(spec.fn, spec.signature, spec.constexprs)
        ttir = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=spec.num_warps)).asm["ttir"]
        row = re.search(r"(%\\S+) = tt.get_program_id x : i32", ttir).group(1)
        widened = re.search(rf"arith.extsi {re.escape(row)} : i32 to i64", ttir) is not None
        print(spec.name, "int64" if widened else "int32")
""")


def test_row_offsets_are_int64():
    out = subprocess.run([sys.executable, "-c", SCRIPT, *KERNELS], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = dict(line.split() for line in out.stdout.split("\n") if line.strip())
    assert found == {name: "int64" for name in KERNELS}, found
