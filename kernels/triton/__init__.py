"""The CUDA backend's Triton kernels, one op per file, each beside its torch reference (installed as
gh200rt.kernels.triton; under ``TRITON_INTERPRET=1`` they run on CPU tensors, which is how CI tests them).

host_gemm.py        y = x @ W.T for decode-sized M, W dense (bf16/fp16/fp32) or packed, read in place
gemv.py             its one-row route (decode at batch 1), streaming W once
fused_rows.py       a decode layer's products at 2-64 rows with their norms, SiLU-and-mul and residual adds fused
weight_operands.py  what the weight-reading kernels read of a weight, and their torch reference
fused_moe.py        an MoE layer's routed experts: gate_up + SiLU-and-mul, down + routing weights
fused_moe_operands.py  what those kernels read: pairs sorted and aligned by expert, the experts' address table
paged_attention.py  causal attention over the paged KV pool (decode and prefix-cached prefill)
paged_attention_split.py  its split-K (flash-decoding) route: per-split partials and their combine
paged_attention_walk.py   the online-softmax walk over a token's blocks that both attention kernels share
store_kv.py         write new K/V into the pool at their slots; rope_store_kv.py: RoPE and the store in one launch
rmsnorm.py, rope.py, silu_mul.py   the model runner's small fused ops
lora_sgmv.py        LoRA adapters' deltas for a batch of rows with different adapters
host_read.py        a kernel that reads host memory in place (the registration check, NUMA placement)
pdl.py              programmatic dependent launch (sm_90+) for the decode chain
compile_specs.py    representative Hopper compile configurations (scripts/check_kernels.py)

Importing a kernel module needs triton; the weight formats they read are in gh200rt/formats/.
"""
