/* The CPU model runner's small ops as native loops: one call per layer op instead of 5-20 torch ops. This header
 * is what their sources (layer_ops.c, kv_store.c, extend_attention.c, decode_attention.c) share: the contract
 * below and the static inline helpers (the OpenMP team, bf16 loads and stores, rows in either dtype, the dot
 * product, the KV pool's rows). gh_native.h declares the entry points one source calls in another.
 *
 * Built by gh200rt/backends/cpu/native.py with -O3 -march=native -ffp-contract=off and called through ctypes with
 * data pointers and element strides; the Python side checks shapes, dtypes and devices. dtype: 0 float32,
 * 1 bfloat16 (bits in uint16). Every op rounds where its torch reference rounds: in bf16 each
 * elementwise op's result is rounded to bf16 (R below), and no multiply-add is fused into an FMA
 * (-ffp-contract=off), so rotary and the KV store give the torch ops' bits, RMSNorm and SiLU agree to
 * the last bits of their reductions and exp, and attention (decode and multi-token) to float32 rounding;
 * decode and multi-token attention give one query the same bits (score_dot, sums in key order).
 * Threads: each op takes a thread count and splits independent rows (RMSNorm, SiLU, RoPE tokens),
 * sequences or (sequence, KV head) pairs (decode attention) or tiles of query vectors (multi-token
 * attention) over OpenMP threads (torch's libgomp pool, as in quant_linear.c); every row is computed by
 * the same code whichever thread runs it, so the bits do not depend on the count. The Python side passes
 * 1 below a size where waking threads costs more than it saves.
 */
#ifndef GH_OPS_H
#define GH_OPS_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
/* a team of `team` threads (a local of the function, from team_size), none when it is 1 */
#define PARALLEL _Pragma("omp parallel num_threads((int)team) if (team > 1)")
#define FOR_ROWS _Pragma("omp for schedule(static)")
#define FOR_PAIRS _Pragma("omp for schedule(dynamic, 1)")
#else
#define PARALLEL (void)team;
#define FOR_ROWS
#define FOR_PAIRS
#endif

/* below this many elements of work an op keeps one thread: waking a second costs more than it saves */
#define SHARE_MIN_WORK 32768
static inline int64_t team_size(int64_t threads, int64_t items, int64_t work) {
    if (work < SHARE_MIN_WORK || threads < 2) return 1;
    return threads < items ? threads : items;
}

static inline float bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                         /* round to nearest even */
    return (uint16_t)(u >> 16);
}

#define INLINE static inline __attribute__((always_inline))
#include "exp_f32.h"

INLINE float load(const void *p, int64_t i, int dtype) {
    return dtype ? bf16_load(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

INLINE void store(void *p, int64_t i, float x, int dtype) {
    if (dtype) ((uint16_t *)p)[i] = bf16_store(x);
    else ((float *)p)[i] = x;
}

/* the value an op whose result is stored in `dtype` hands to the next op */
INLINE float R(float x, int dtype) { return dtype ? bf16_load(bf16_store(x)) : x; }

INLINE void load_row(float *dst, const void *src, int64_t offset, int64_t n, int dtype) {
    if (dtype) {
        const uint16_t *s = (const uint16_t *)src + offset;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_load(s[i]);
    } else {
        memcpy(dst, (const float *)src + offset, (size_t)n * sizeof(float));
    }
}

INLINE void store_row(void *dst, int64_t offset, const float *src, int64_t n, int dtype) {
    if (dtype) {
        uint16_t *d = (uint16_t *)dst + offset;
        for (int64_t i = 0; i < n; i++) d[i] = bf16_store(src[i]);
    } else {
        memcpy((float *)dst + offset, src, (size_t)n * sizeof(float));
    }
}

/* eight independent partial sums: vectorised without reassociating the float adds */
INLINE float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Public entry points: each calls its always-inline body with a constant dtype, so the compiler builds
 * (and vectorises) a float32 and a bfloat16 version instead of branching per element. */
#define BY_DTYPE(call) do { if (dtype) call(1); else call(0); } while (0)

/* A KV pool's element type: the compute dtype's (KV_SAME), or fp8 (--kv-cache-dtype fp8*, kv/fp8.py) read with the
 * layer's K and V scales. */
enum { KV_SAME = 0, KV_E4M3 = 1, KV_E5M2 = 2 };

/* every fp8 byte's value, exact in float32 (kv_store.c fills it when the library loads) */
extern float fp8_values[2][256] __attribute__((visibility("hidden")));

/* bytes per element of a pool */
INLINE int64_t kv_elem(int kv_type, int dtype) { return kv_type != KV_SAME ? 1 : dtype ? 2 : 4; }

/* one K or V row as float32: an fp8 row widened and multiplied by its scale, rounded to the compute dtype (the
 * bits of kv/fp8.py's dequantize), else load_row */
INLINE void load_kv_row(float *dst, const void *src, int64_t offset, int64_t n, int dtype, int kv_type, float scale) {
    if (kv_type == KV_SAME) {
        load_row(dst, src, offset, n, dtype);
        return;
    }
    const uint8_t *s = (const uint8_t *)src + offset;
    const float *values = fp8_values[kv_type - 1];
    for (int64_t i = 0; i < n; i++) dst[i] = R(values[s[i]] * scale, dtype);
}

/* a K or V row's n values as float32: read in place from a float32 pool, else widened into buf (load_kv_row) */
INLINE const float *kv_row(float *buf, const void *cache, int64_t at, int64_t n, int dtype, int kv_type, float scale) {
    if (!dtype && kv_type == KV_SAME) return (const float *)cache + at;
    load_kv_row(buf, cache, at, n, dtype, kv_type, scale);
    return buf;
}
#endif
