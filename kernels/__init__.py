"""Triton kernels, one op per file, each beside its torch reference (installed as gh200rt.kernels).

host_gemm.py        y = x @ W.T for decode-sized M, W dense (bf16/fp16/fp32) or packed, read in place
fused_moe.py        an MoE layer's routed experts: gate_up + SiLU-and-mul, down + routing weights
fused_moe_operands.py  what those kernels read: pairs sorted and aligned by expert, the experts' address table
paged_attention.py  causal attention over the paged KV pool (decode and prefix-cached prefill)
paged_attention_split.py  its split-K (flash-decoding) route: per-split partials and their combine
paged_attention_walk.py   the online-softmax walk over a token's blocks that both attention kernels share
store_kv.py         write new K/V into the pool at their slots
rmsnorm.py, rope.py, silu_mul.py   the model runner's small fused ops
compile_specs.py    representative Hopper compile configurations (scripts/check_kernels.py)
cpu/*.c             the CPU backend's native C (gh200rt/backends/cpu/native.py builds it once per machine and
                    calls it through ctypes): the small ops (cpu/layer_ops.c: RMSNorm, RoPE, SiLU-and-mul;
                    kv_store.c: KV store; decode_attention.c, extend_attention.c: attention) and the linears

Importing a kernel module needs triton; the weight formats they read are in gh200rt/formats/.
"""
