/* One decoder layer of a decode step in one call: RMSNorm, the fused qkv projection, RoPE + KV store + decode
 * attention, the output projection and residual, RMSNorm, gate/up, SiLU-and-mul, down and residual.
 *
 * At one sequence a layer's arithmetic takes ~0.25 ms on 2 cores and the ~10 Python-level op calls around it
 * cost more than that; here the Python side (gh200rt/models/cpu_decode_layer.py) resolves the four linears'
 * current weights to argument blocks and makes one call. Every step is the entry point the layer-by-layer
 * path calls, with the arguments that path passes (the per-linear thread counts among them), and the residual
 * adds are single float32 additions like torch's, so the result has the layer-by-layer path's bits: a fused
 * layer, an unfused one and any tier agree exactly (DESIGN invariant 4).
 */
#include <stdint.h>
#include <stdlib.h>
#include "gh_native.h"

enum { LINEAR_F32 = 0, LINEAR_QUANT = 1, LINEAR_F16 = 2 };

typedef struct {
    int64_t kind;                /* LINEAR_F32: dense float32 w; LINEAR_QUANT: packed weight; LINEAR_F16: fp16 w */
    const void *w;               /* LINEAR_F32 / LINEAR_F16: [n, k], row stride w_stride, unit column stride */
    int64_t w_stride;
    const WeightArgs *packed;    /* LINEAR_QUANT */
    const float *bias;           /* [n] or NULL: inside the float32 kernel, added after a quantized product */
    int64_t n, k, threads;       /* threads: what the single-op wrapper passes for this weight */
} LinearArgs;

typedef struct {
    LinearArgs qkv, o, gate_up, down;
    const float *norm1, *norm2;  /* input / post-attention RMSNorm weights [hidden] */
    float eps, scale;
    const float *cos, *sin;      /* [rows, head_dim / 2] */
    void *k_cache, *v_cache;     /* float32, or fp8 (kv_type) */
    int64_t block_stride, slot_stride, head_stride, block_size;
    const int64_t *slots;
    const int32_t *block_tables;
    int64_t table_stride;
    const int64_t *seq_lens;
    int64_t heads, kv_heads, head_dim, hidden, inter, threads;
    int64_t kv_type;             /* the pool's element type (ops.c: KV_SAME, or an fp8 format read with kv_scale) */
    const float *kv_scale;       /* the layer's [K scale, V scale] for an fp8 pool */
} DecodeLayerArgs;

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

static void add(const float *a, const float *b, float *out, int64_t count) {
    for (int64_t i = 0; i < count; i++) out[i] = a[i] + b[i];
}

/* out [rows, hidden] = the layer applied to hidden [rows, hidden] (both contiguous), one token per sequence.
 * Returns 0, or -1 when a buffer could not be allocated (out is then unspecified, the KV pool may hold this
 * step's K/V: the caller raises and the step is retried from its inputs). */
int gh_decode_layer(const float *hidden, int64_t rows, const DecodeLayerArgs *a, float *out) {
    int64_t h = a->hidden, width = a->qkv.n, q_size = a->heads * a->head_dim, inter = a->inter;
    size_t floats = (size_t)(rows * (2 * h + width + q_size + h + 2 * inter + inter));
    float *buf = malloc(floats * sizeof(float) + 64);
    if (!buf) return -1;
    float *normed = buf, *h1 = normed + rows * h, *qkv = h1 + rows * h, *attn = qkv + rows * width,
          *tmp = attn + rows * q_size, *gate_up = tmp + rows * h, *act = gate_up + rows * 2 * inter;
    int rc = 0;
    gh_rms_norm(hidden, rows, h, h, a->norm1, normed, a->eps, 0, a->threads);
    if ((rc = linear(&a->qkv, normed, rows, qkv))) goto done;
    if ((rc = gh_decode_attention_block(qkv, width, a->cos, a->sin, a->k_cache, a->v_cache, a->block_stride,
                                        a->slot_stride, a->head_stride, a->block_size, a->slots, a->block_tables,
                                        a->table_stride, a->seq_lens, rows, a->heads, a->kv_heads, a->head_dim,
                                        a->scale, attn, 0, (int)a->kv_type, a->kv_scale, a->threads)))
        goto done;
    if ((rc = linear(&a->o, attn, rows, tmp))) goto done;
    add(hidden, tmp, h1, rows * h);
    gh_rms_norm(h1, rows, h, h, a->norm2, normed, a->eps, 0, a->threads);
    if ((rc = linear(&a->gate_up, normed, rows, gate_up))) goto done;
    gh_silu_mul(gate_up, rows, inter, act, 0, a->threads);
    if ((rc = linear(&a->down, act, rows, tmp))) goto done;
    add(h1, tmp, out, rows * h);
done:
    free(buf);
    return rc;
}
