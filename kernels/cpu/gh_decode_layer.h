/* The argument blocks of the one-call decoder layer (decode_layer.c): the Python side fills them through ctypes
 * (gh200rt/backends/cpu/native_args.py mirrors them field for field) and the aarch64 test harness includes them, so
 * neither copy of the layout can drift from the kernel's. */
#ifndef GH_DECODE_LAYER_H
#define GH_DECODE_LAYER_H
#include <stdint.h>
#include "gh_native.h"

enum { LINEAR_F32 = 0, LINEAR_QUANT = 1, LINEAR_F16 = 2, LINEAR_AMX = 3, LINEAR_BF16_DOT = 4 };

typedef struct {
    int64_t kind;                /* LINEAR_F32: dense float32 w; LINEAR_QUANT: packed weight; LINEAR_F16: fp16 w;
                                  * LINEAR_AMX / LINEAR_BF16_DOT: bf16 w in amx_linear.c's tiles, bf16 rows */
    const void *w;               /* LINEAR_F32 / LINEAR_F16: [n, k], row stride w_stride, unit column stride */
    int64_t w_stride;
    const WeightArgs *packed;    /* LINEAR_QUANT */
    const float *bias;           /* [n] or NULL: inside the float32 kernel, added after a quantized product */
    int64_t n, k, threads;       /* threads: what the single-op wrapper passes for this weight */
    int64_t gated_inter;         /* LINEAR_AMX / LINEAR_BF16_DOT: the tiles' gated packing (0: plain) */
} LinearArgs;

typedef struct {
    LinearArgs qkv, o, gate_up, down;
    const void *norm1, *norm2;   /* input / post-attention RMSNorm weights [hidden], in the activations' dtype */
    float eps, scale;
    const void *cos, *sin;       /* [rows, head_dim / 2], in the activations' dtype */
    void *k_cache, *v_cache;     /* the activations' dtype, or fp8 (kv_type) */
    int64_t block_stride, slot_stride, head_stride, block_size;
    const int64_t *slots;
    const int32_t *block_tables;
    int64_t table_stride;
    const int64_t *seq_lens;
    int64_t heads, kv_heads, head_dim, hidden, inter, threads;
    int64_t kv_type;             /* the pool's element type (gh_ops.h: KV_SAME, or an fp8 format read with kv_scale) */
    const float *kv_scale;       /* the layer's [K scale, V scale] for an fp8 pool */
    int64_t dtype;               /* the activations': 0 float32, 1 bfloat16 */
    HostKV host;                 /* the layer's host KV blocks read in place; first 0: none */
    int64_t fused_silu;          /* 1: gate_up (gated tiles) returns silu(gate) * up itself, as the MLP calls it */
} DecodeLayerArgs;

/* What changes from step to step and is the same for every layer of it: gh_decode_layers sets these fields of each
 * layer's DecodeLayerArgs (a copy) from here. */
typedef struct {
    const void *cos, *sin;
    const int64_t *slots;
    const int32_t *block_tables;
    int64_t table_stride;
    const int64_t *seq_lens;
} DecodeStepArgs;

int gh_decode_layer(const void *hidden, int64_t rows, const DecodeLayerArgs *a, void *out);
int gh_decode_layers(const void *hidden, int64_t rows, const DecodeLayerArgs *const *layers, int64_t count,
                     const DecodeStepArgs *step, void *out);

#endif
