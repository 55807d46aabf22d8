"""``python -m gh200rt.bench ab <experiment>``: one path of the engine switched off and on (or two forms of it side
by side) in alternating rounds of one process, so that load from other processes falls on both alike."""
from gh200rt.bench.commands import Command

COMMANDS = {
    "native-switch": Command("gh200rt.bench.ab.native_switch", "CPU prefill and decode step with a native path "
                                                               "(fp16 linear, fp8 KV, row blocks) off and on"),
    "fp32-reorder": Command("gh200rt.bench.ab.fp32_reorder", "the fp32 CPU route's linears: native rows and "
                                                             "reordered weights against dense and the one-row rule"),
}
