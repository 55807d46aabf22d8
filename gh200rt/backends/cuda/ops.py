"""The CUDA backend's ops: Triton kernels inside the model, through the layers' swap hooks (backends/interface.py).

``use_triton_kernels(model) -> bool``: when the model's weights are on a CUDA device and triton
imports, points every layer's hook at the Triton kernel adapter below and returns True; otherwise
leaves the model on its torch ops and returns False. ``install_triton_kernels(model)`` switches without looking
at the device: under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors, which is how the adapters are tested
here.

Hooks: ``SelfAttention.rotary_fn`` / ``write_kv_fn`` / ``attention_fn`` and ``decode_block_fn`` (q/k norms, RoPE
and the KV store in one launch, then the attention; the three before are what a long prefill takes), ``RMSNorm.norm_fn`` /
``add_norm_fn`` (the residual add fused into the norm) and
``SiluAndMul.act_fn`` (an MLP that calls ``silu_and_mul`` directly keeps the torch activation), and
``SparseMoeBlock.fused_experts_fn`` (one ``FusedExperts`` per block: it keeps the block's address tables),
``LatentAttention.attention_fn`` (the latent-pool kernel, kernels/triton/mla_attention.py), and
``DecoderLayer.decode_layer_fn``: a decode layer of one row (or up to ``fused_decode_rows``) on CUDA in six launches
(backends/cuda/decode_layer.py).
``ops["rotary"]`` and ``ops["moe"]`` are factories: a model's layers share one rotary adapter (the step's table,
built once).
"""
from __future__ import annotations

import functools
import warnings

import torch

from gh200rt.backends.cuda.decode_layer import GpuDecodeLayer, gpu_decode_layer
from gh200rt.backends.cuda.fused_moe import FusedExperts
from gh200rt.backends.interface import switch_hooks
from gh200rt.kv import attention as torch_attention
from gh200rt.kv import fp8
from gh200rt.kv.host_blocks import host_view
from gh200rt.models.layers.dense import dense_linear
from gh200rt.models.layers.mla_prefill import expanded_prefill
from gh200rt.models.layers.rotary import apply_rotary

# The Triton paged attention runs one program per (query token, KV head) over the token's whole
# context, so a long uncached prompt re-reads its K/V once per token: a step in which any sequence
# has more new tokens than this (a prefill) keeps the torch attention (SDPA, flash on the GPU)
# until a tiled prefill kernel exists. Decode, short chunks and speculative steps take the kernel.
TRITON_ATTENTION_MAX_QUERY = 16


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from gh200rt.kernels.triton.rmsnorm import fused_add_rmsnorm
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    normed, _ = fused_add_rmsnorm(rows, None, weight, eps)
    return normed.reshape(x.shape)


class TritonRotary:
    """``x[T, heads, D]`` with this step's ``cos``/``sin`` rows ``[T, 1, D/2]`` (already indexed by position).

    The kernel indexes a ``[positions, D]`` cos|sin table; this step's rows are that table for rows 0..T-1. Every
    layer of a step gets the same ``cos`` object (``model.embed``), so the table and the row indices are built
    once per step, by the first layer, not once per layer; one instance serves one model's layers."""

    def __init__(self):
        self._cos: torch.Tensor | None = None     # the step's cos the table was built from (held: compared by identity)
        self._table = self._rows = None
        self.tables_built = 0

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        from gh200rt.kernels.triton.rope import rotate
        if cos is not self._cos:
            tokens = x.shape[0]
            self._table = torch.cat((cos, sin), dim=-1).reshape(tokens, -1)
            self._rows = torch.arange(tokens, device=x.device)
            self._cos = cos
            self.tables_built += 1
        return rotate(x, self._rows, self._table)


def triton_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One call of ``TritonRotary`` (builds its table every time)."""
    return TritonRotary()(x, cos, sin)


def triton_write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                    kv_scale: torch.Tensor | None = None) -> None:
    from gh200rt.kernels.triton.store_kv import write_kv
    if not fp8.is_fp8(kv_cache.dtype):  # an fp8 pool quantizes from the activations' dtype in the kernel
        k, v = k.to(kv_cache.dtype), v.to(kv_cache.dtype)
    write_kv(kv_cache, k, v, slot_mapping, kv_scale)


def triton_paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta, scale: float,
                           num_kv_heads: int, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    block_size = kv_cache.shape[2]
    # the kernel walks a block per step with tl.arange(block_size): powers of two only
    if max(meta.query_lens_list) > TRITON_ATTENTION_MAX_QUERY or block_size & (block_size - 1):
        return torch_attention.paged_attention(q, kv_cache, meta, scale, num_kv_heads, kv_scale)
    from gh200rt.kernels.triton.paged_attention import paged_attention
    return paged_attention(q, kv_cache, meta, scale, num_kv_heads, kv_scale, host=host_view(meta, kv_cache))


def triton_latent_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta, scale: float, num_kv_heads: int,
                            kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Latent attention's multi-query step (``LatentAttention.attention_fn``): ``kv_cache`` is its one-plane pool
    seen as K and V (stride 0), which the latent kernel reads once; long prefills keep the torch attention, as
    ``triton_paged_attention`` does."""
    block_size = kv_cache.shape[2]
    if max(meta.query_lens_list) > TRITON_ATTENTION_MAX_QUERY or block_size & (block_size - 1):
        return torch_attention.paged_attention(q, kv_cache, meta, scale, num_kv_heads, kv_scale)
    from gh200rt.kernels.triton.mla_attention import mla_attention
    assert num_kv_heads == 1 and kv_cache.stride(0) == 0, "a latent pool: one plane read as K and V"
    return mla_attention(q, kv_cache[0], meta, scale, kv_scale, host=host_view(meta, kv_cache))


def triton_decode_block(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor, meta,
                        scale: float, heads: int, kv_heads: int, kv_scale: torch.Tensor | None = None,
                        qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> torch.Tensor | None:
    """RoPE and the KV store in one launch (Qwen3's q/k norms in it too), then the paged attention
    (``SelfAttention.decode_block_fn``); None where the Triton attention does not take the step (a long prefill,
    a block size that is not a power of two)."""
    block_size = kv_cache.shape[2]
    if max(meta.query_lens_list) > TRITON_ATTENTION_MAX_QUERY or block_size & (block_size - 1) \
            or qkv.stride(1) != 1:
        return None
    from gh200rt.kernels.triton.paged_attention import paged_attention
    from gh200rt.kernels.triton.rope_store_kv import rope_and_store_kv
    q = rope_and_store_kv(qkv, cos, sin, kv_cache, meta.slot_mapping, heads, kv_heads, kv_scale, qk_norm)
    return paged_attention(q, kv_cache, meta, scale, kv_heads, kv_scale, host=host_view(meta, kv_cache))


def triton_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(residual + x), residual + x)`` in one launch (``RMSNorm.add_norm_fn``)."""
    from gh200rt.kernels.triton.rmsnorm import fused_add_rmsnorm
    shape = x.shape
    rows, res = x.reshape(-1, shape[-1]), residual.reshape(-1, shape[-1])
    normed, summed = fused_add_rmsnorm(rows if rows.stride(-1) == 1 else rows.contiguous(),
                                       res if res.stride(-1) == 1 else res.contiguous(), weight, eps)
    return normed.reshape(shape), summed.reshape(shape)


def triton_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    from gh200rt.kernels.triton.silu_mul import silu_mul
    out = silu_mul(gate_up.reshape(-1, gate_up.shape[-1]))
    return out.reshape(*gate_up.shape[:-1], out.shape[-1])


def triton_dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """One row against a CUDA weight: the GEMV (one launch, measured faster than cuBLAS at M = 1 on an H100:
    docs/BENCHMARKS.md); anything else: ``dense_linear`` (cuBLAS)."""
    if x.is_cuda and x.numel() == x.shape[-1] and x.dtype == weight.dtype and weight.stride(-1) == 1:
        from gh200rt.kernels.triton.gemv import gemv
        return gemv(x, weight, bias)
    return dense_linear(x, weight, bias)


TRITON_OPS = dict(rotary=TritonRotary, write_kv=triton_write_kv, attention=triton_paged_attention,
                  decode_block=triton_decode_block, norm=triton_rms_norm, add_norm=triton_add_rms_norm,
                  act=triton_silu_and_mul, moe=FusedExperts, dense_linear=triton_dense_linear,
                  decode_layer=gpu_decode_layer,
                  # latent attention: the torch RoPE and store (one 576-wide row a token), the latent kernel, and
                  # chunks longer than it takes in the expanded form
                  latent_attention=(apply_rotary, torch_attention.write_kv, triton_latent_attention),
                  latent_prefill=functools.partial(expanded_prefill, min_query=TRITON_ATTENTION_MAX_QUERY))


def install_triton_kernels(model: torch.nn.Module) -> int:
    return switch_hooks(model, TRITON_OPS)


def use_triton_kernels(model: torch.nn.Module, fused_decode_rows: int = 1, pdl: bool = False) -> bool:
    """``fused_decode_rows``: decode steps of up to this many rows run a layer in one fused call
    (``GpuDecodeLayer``); ``pdl``: its launches use programmatic dependent launch (sm_90+)."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        warnings.warn("the model is on CUDA but triton is not installed, so it keeps its torch ops; "
                      "install gh200rt with the triton extra (pip install 'gh200rt[triton]')", stacklevel=2)
        return False
    hook = GpuDecodeLayer(fused_decode_rows, pdl)
    ops = TRITON_OPS if hook == gpu_decode_layer else dict(TRITON_OPS, decode_layer=hook)
    switch_hooks(model, ops)
    return True
