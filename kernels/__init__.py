"""Kernels, grouped by the backend they serve (installed as gh200rt.kernels):

triton/   the CUDA backend's Triton kernels, one op per file beside its torch reference (triton/__init__.py lists them)
cpu/      the CPU backend's native C (gh200rt/backends/cpu/native.py builds it once per machine and calls it through
          ctypes): the small ops (layer_ops.c: RMSNorm, RoPE, SiLU-and-mul; kv_store.c: KV store; decode_attention.c,
          extend_attention.c: attention), the linears (quant_linear.c, f32_linear.c, f16_linear.c, amx_linear.c,
          bf16_dot_linear.c) and a decode step's layer in one call (decode_layer.c)
"""
