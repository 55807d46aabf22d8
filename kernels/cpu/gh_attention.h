/* What the two attention kernels share (extend_attention.c: multi-token, decode_attention.c: one new token per
 * sequence): the weighted-sum step, the vector-path switches, score_dot (the one score arithmetic both use, so a
 * query gets the same bits from either), the KV row prefetch, the 8-lane sum and the vector exps. */
#ifndef GH_ATTENTION_H
#define GH_ATTENTION_H
#include "gh_native.h"
#include "gh_ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
INLINE void attn_axpy(float *acc, float w, const float *v, int64_t n) {
    __m256 wv = _mm256_set1_ps(w);
    int64_t d = 0;
    for (; d + 8 <= n; d += 8) _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + d),
                                                                         _mm256_loadu_ps(acc + d)));
    for (; d < n; d++) acc[d] += w * v[d];
}
#elif defined(__ARM_NEON)
#include <arm_neon.h>
/* AVX2's split: fused over whole groups of 8, the n % 8 tail unfused, so the same bits */
INLINE void attn_axpy(float *acc, float w, const float *v, int64_t n) {
    float32x4_t wv = vdupq_n_f32(w);
    int64_t d = 0;
    for (; d + 8 <= n; d += 8) {
        vst1q_f32(acc + d, vfmaq_f32(vld1q_f32(acc + d), wv, vld1q_f32(v + d)));
        vst1q_f32(acc + d + 4, vfmaq_f32(vld1q_f32(acc + d + 4), wv, vld1q_f32(v + d + 4)));
    }
    for (; d < n; d++) acc[d] += w * v[d];
}
#else
INLINE void attn_axpy(float *acc, float w, const float *v, int64_t n) {
    for (int64_t d = 0; d < n; d++) acc[d] += w * v[d];
}
#endif

/* Multi-token attention's vector path (ext_scores) needs AVX2 or NEON and a head size that is a multiple of 16. NEON
 * runs the AVX2 path's 8-lane arithmetic in 4-lane halves, so an Arm host gets the AVX2 build's bits. */
#if (defined(__AVX2__) && defined(__FMA__)) || defined(__ARM_NEON)
#define EXT_VECTOR(head_dim) ((head_dim) % 16 == 0)
#else
#define EXT_VECTOR(head_dim) 0
#endif
/* With AVX-512 the vector paths put two 8-lane groups in one register: two keys' FMA chains side by side, or 16
 * dims of a weighted sum. Every lane does what the 8-lane code does, so the bits do not depend on the width
 * (test_cpu_native_widths.py holds the AVX-512 build to the AVX2 build's bits). */
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define WIDE 1
#include <immintrin.h>
#else
#define WIDE 0
#endif

/* One query's score q . key, as lane t of ext_scores computes it: with the vector path one 8-lane FMA chain along
 * the head and the sum ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), else dot(). Decode attention scores with it, so
 * a position attends with the same arithmetic whether it is decoded or is the last row of a prompt chunk: a
 * prompt whose last token is computed alone after a cached prefix gets a full prefill's bits. */
INLINE float score_dot(const float *q, const float *key, int64_t head_dim) {
#if defined(__AVX2__) && defined(__FMA__)
    if (EXT_VECTOR(head_dim)) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t c = 0; c < head_dim; c += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(key + c), a);
        __m256 h = _mm256_hadd_ps(a, a);            /* (0 + 1), (2 + 3) in lanes 0, 1; (4 + 5), (6 + 7) in 4, 5 */
        h = _mm256_hadd_ps(h, h);
        return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
#elif defined(__ARM_NEON)
    if (EXT_VECTOR(head_dim)) {
        float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;   /* lanes 0-3, 4-7 of the chain */
        for (int64_t c = 0; c < head_dim; c += 8) {
            lo = vfmaq_f32(lo, vld1q_f32(q + c), vld1q_f32(key + c));
            hi = vfmaq_f32(hi, vld1q_f32(q + c + 4), vld1q_f32(key + c + 4));
        }
        float32x4_t h = vpaddq_f32(lo, hi);   /* (0 + 1), (2 + 3), (4 + 5), (6 + 7) */
        h = vpaddq_f32(h, h);
        return vgetq_lane_f32(h, 0) + vgetq_lane_f32(h, 1);
    }
#endif
    return dot(q, key, head_dim);
}

/* K and V rows are scattered over the pool's blocks (and rows of one head sit kv_heads * head_dim apart), which
 * the hardware prefetcher does not follow: without asking for them a few keys ahead the kernel waits on
 * memory for most of its time (perf: ~70% of its samples on the two row loads). */
#ifndef KV_AHEAD
#define KV_AHEAD 4
#endif
/* Where a table entry's block starts, in elements from one plane's base (K's or V's): a pool block, or from
 * map.first on a host block (HostKV), which lies host_delta elements from that base (both allocations are aligned
 * to the element, so the distance is a whole number of them). */
typedef struct {
    int64_t block_stride, first, host_stride, host_delta;
} PoolMap;

INLINE PoolMap pool_map(const void *plane, int64_t block_stride, const HostKV *host, int values, int64_t elem) {
    PoolMap m = {block_stride, INT64_MAX, 0, 0};
    if (host) {
        m.first = host->first;
        m.host_stride = host->block_stride;
        m.host_delta = ((intptr_t)(values ? host->v : host->k) - (intptr_t)plane) / elem;
    }
    return m;
}

INLINE int64_t block_at(const PoolMap *m, int64_t entry) {
    return entry < m->first ? entry * m->block_stride : m->host_delta + (entry - m->first) * m->host_stride;
}

INLINE void prefetch_row(const void *cache, const PoolMap *map, const int32_t *table, int64_t p, int64_t block_size,
                         int64_t slot_stride, int64_t head_offset, int64_t head_dim, int64_t elem) {
    const char *row = (const char *)cache + (block_at(map, table[p / block_size]) + (p % block_size) * slot_stride
                                              + head_offset) * elem;
    for (int64_t b = 0; b < head_dim * elem; b += 64) __builtin_prefetch(row + b);
}

/* keys per pass of the weighted V sum: their V rows stay in L1 between lane tiles (multi-token) or heads (decode) */
#define EXT_CHUNK 64

#if defined(__AVX2__) && defined(__FMA__)
/* r[t] = sum of the 8 lanes of a[t] */
INLINE __m256 sum_lanes8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

EXP_LANES(256, exp8)
#elif defined(__ARM_NEON)
/* an 8-lane FMA chain (one query vector's score, as score_dot runs it) in two 4-lane halves */
typedef struct { float32x4_t lo, hi; } chain8;

/* dst[t] = sum of the 8 lanes of a[t], in sum_lanes8's order: ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) */
INLINE void sum_chains8(const chain8 *a, float *dst) {
    float32x4_t p[8];
    for (int t = 0; t < 8; t++) p[t] = vpaddq_f32(a[t].lo, a[t].hi);
    float32x4_t q0 = vpaddq_f32(p[0], p[1]), q1 = vpaddq_f32(p[2], p[3]);   /* per chain (0-3), (4-7) */
    float32x4_t q2 = vpaddq_f32(p[4], p[5]), q3 = vpaddq_f32(p[6], p[7]);
    vst1q_f32(dst, vpaddq_f32(q0, q1));
    vst1q_f32(dst + 4, vpaddq_f32(q2, q3));
}
#endif

#if WIDE
EXP_LANES(512, exp16)
#endif
#endif
