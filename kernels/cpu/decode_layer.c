/* One decoder layer of a decode step in one call: RMSNorm, the fused qkv projection, RoPE + KV store + decode
 * attention, the output projection and residual, RMSNorm, gate/up, SiLU-and-mul, down and residual.
 *
 * At one sequence a layer's arithmetic takes ~0.25 ms on 2 cores and the ~10 Python-level op calls around it
 * cost more than that; here the Python side (gh200rt/backends/cpu/decode_layer.py) resolves the four linears'
 * current weights to argument blocks and makes one call. Every step is the entry point the layer-by-layer
 * path calls, with the arguments that path passes (the per-linear thread counts among them), and the residual
 * adds are single float32 additions like torch's, so the result has the layer-by-layer path's bits: a fused
 * layer, an unfused one and any tier agree exactly (DESIGN invariant 4).
 *
 * bfloat16 activations (the bf16 route, dtype 1): hidden, out, the norms' weights, cos/sin, the KV pool and every
 * buffer between the ops are bf16, as the op-by-op path keeps them; a linear through a GGUF checkpoint's blocks (one
 * row) widens its input to float32 and rounds its output back, as OneRowBlocksWeight does; a bf16 weight in tiles
 * (AmxWeight, Bf16DotWeight: any row count) takes the bf16 rows as NativeOps._tiled_linear passes them, the gate/up
 * product with the SiLU fused where the MLP calls it so; a residual add rounds the float32 sum of two bf16 values,
 * as torch's bf16 add.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "gh_native.h"
#include "gh_decode_layer.h"

static int linear(const LinearArgs *l, const float *x, int64_t rows, float *out) {
    if (l->kind == LINEAR_F32) {
        gh_f32_linear(x, rows, l->k, (const float *)l->w, l->n, l->k, l->w_stride, l->bias, out, l->n, l->threads);
        return 0;
    }
    if (l->kind == LINEAR_F16) {
        gh_f16_linear(x, rows, l->k, (const uint16_t *)l->w, l->n, l->k, l->w_stride, l->bias, out, l->n, l->threads);
        return 0;
    }
    if (gh_quant_linear(x, rows, l->k, l->packed, out, l->n, l->threads)) return -1;
    if (l->bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < l->n; j++) out[r * l->n + j] += l->bias[j];
    return 0;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {   /* round to nearest even, as torch's .to(torch.bfloat16) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline int tiled(const LinearArgs *l) { return l->kind == LINEAR_AMX || l->kind == LINEAR_BF16_DOT; }

/* bf16 rows [rows, k] through a tiled bf16 weight, contiguous out (silu: [rows, gated_inter] of silu(gate) * up) */
static int tiled_linear(const LinearArgs *l, const void *x, int64_t rows, void *out, int silu) {
    int64_t width = silu ? l->gated_inter : l->n;
    if (l->kind == LINEAR_AMX)
        return gh_amx_linear(x, rows, l->k, l->w, l->n, l->k, l->bias, out, width, l->threads, l->gated_inter, silu);
    return gh_bf16_dot_linear(x, rows, l->k, l->w, l->n, l->k, l->bias, out, width, l->threads, l->gated_inter, silu);
}

/* out = x W^T (+ bias) in the activations' dtype; wide: float32 room for [rows, max(k, n)] twice (bf16 only) */
static int linear_in(const LinearArgs *l, const void *x, int64_t rows, void *out, int dtype, float *wide) {
    if (tiled(l)) return tiled_linear(l, x, rows, out, 0) ? -1 : 0;
    if (!dtype) return linear(l, (const float *)x, rows, (float *)out);
    float *xf = wide, *yf = wide + rows * (l->k > l->n ? l->k : l->n);
    for (int64_t i = 0; i < rows * l->k; i++) xf[i] = bf16_to_f32(((const uint16_t *)x)[i]);
    if (linear(l, xf, rows, yf)) return -1;
    for (int64_t i = 0; i < rows * l->n; i++) ((uint16_t *)out)[i] = f32_to_bf16(yf[i]);
    return 0;
}

static void add(const void *a, const void *b, void *out, int64_t count, int dtype) {
    if (!dtype) {
        for (int64_t i = 0; i < count; i++) ((float *)out)[i] = ((const float *)a)[i] + ((const float *)b)[i];
        return;
    }
    for (int64_t i = 0; i < count; i++)
        ((uint16_t *)out)[i] = f32_to_bf16(bf16_to_f32(((const uint16_t *)a)[i]) + bf16_to_f32(((const uint16_t *)b)[i]));
}

/* out [rows, hidden] = the layer applied to hidden [rows, hidden] (both contiguous, in the activations' dtype),
 * one token per sequence. Returns 0, or -1 when a buffer could not be allocated (out is then unspecified, the KV
 * pool may hold this step's K/V: the caller raises and the step is retried from its inputs). */
int gh_decode_layer(const void *hidden, int64_t rows, const DecodeLayerArgs *a, void *out) {
    int dtype = (int)a->dtype;
    size_t esz = dtype ? 2 : 4;
    int64_t h = a->hidden, width = a->qkv.n, q_size = a->heads * a->head_dim, inter = a->inter;
    size_t elems = (size_t)(rows * (2 * h + width + q_size + h + 2 * inter + inter));
    int64_t widest = width > 2 * inter ? width : 2 * inter;
    if (q_size > widest) widest = q_size;
    if (h > widest) widest = h;
    size_t wide_floats = dtype ? (size_t)(2 * rows * widest) : 0;
    char *buf = malloc(elems * esz + wide_floats * sizeof(float) + 64);
    if (!buf) return -1;
    char *normed = buf, *h1 = normed + rows * h * esz, *qkv = h1 + rows * h * esz, *attn = qkv + rows * width * esz,
         *tmp = attn + rows * q_size * esz, *gate_up = tmp + rows * h * esz, *act = gate_up + rows * 2 * inter * esz;
    float *wide = dtype ? (float *)(((uintptr_t)(act + rows * inter * esz) + 63) & ~(uintptr_t)63) : NULL;
    int rc = 0;
    gh_rms_norm(hidden, rows, h, h, a->norm1, normed, a->eps, dtype, a->threads);
    if ((rc = linear_in(&a->qkv, normed, rows, qkv, dtype, wide))) goto done;
    if ((rc = gh_decode_attention_block(qkv, width, a->cos, a->sin, a->k_cache, a->v_cache, a->block_stride,
                                        a->slot_stride, a->head_stride, a->block_size, a->slots, a->block_tables,
                                        a->table_stride, a->seq_lens, rows, a->heads, a->kv_heads, a->head_dim,
                                        a->scale, attn, dtype, (int)a->kv_type, a->kv_scale, a->threads,
                                        a->host.first ? &a->host : NULL)))
        goto done;
    if ((rc = linear_in(&a->o, attn, rows, tmp, dtype, wide))) goto done;
    add(hidden, tmp, h1, rows * h, dtype);
    gh_rms_norm(h1, rows, h, h, a->norm2, normed, a->eps, dtype, a->threads);
    if (a->fused_silu) {
        if ((rc = tiled_linear(&a->gate_up, normed, rows, act, 1) ? -1 : 0)) goto done;
    } else {
        if ((rc = linear_in(&a->gate_up, normed, rows, gate_up, dtype, wide))) goto done;
        gh_silu_mul(gate_up, rows, inter, act, dtype, a->threads);
    }
    if ((rc = linear_in(&a->down, act, rows, tmp, dtype, wide))) goto done;
    add(h1, tmp, out, rows * h, dtype);
done:
    free(buf);
    return rc;
}

/* out = layers[count - 1](... layers[0](hidden)): a decode step's decoder layers one after another, each exactly as
 * gh_decode_layer runs it alone with the step's fields of *step (so the stack has the layer-by-layer bits), the
 * hidden states between them in two buffers taken in turn. Returns 0, or -1 as gh_decode_layer does. */
int gh_decode_layers(const void *hidden, int64_t rows, const DecodeLayerArgs *const *layers, int64_t count,
                     const DecodeStepArgs *step, void *out) {
    if (count <= 0) return 0;
    size_t bytes = (size_t)(rows * layers[0]->hidden) * (layers[0]->dtype ? 2 : 4);
    char *between = count > 1 ? malloc(2 * bytes) : NULL;
    if (count > 1 && !between) return -1;
    const void *in = hidden;
    int rc = 0;
    for (int64_t i = 0; i < count && !rc; i++) {
        DecodeLayerArgs a = *layers[i];
        a.cos = step->cos;
        a.sin = step->sin;
        a.slots = step->slots;
        a.block_tables = step->block_tables;
        a.table_stride = step->table_stride;
        a.seq_lens = step->seq_lens;
        void *dst = i == count - 1 ? out : between + (size_t)(i % 2) * bytes;
        rc = gh_decode_layer(in, rows, &a, dst);
        in = dst;
    }
    free(between);
    return rc;
}
