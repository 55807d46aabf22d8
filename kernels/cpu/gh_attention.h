/* What the two attention kernels share (extend_attention.c: multi-token, decode_attention.c: one new token per
 * sequence): the weighted-sum step, the vector-path switches, score_dot (the one score arithmetic both use, so a
 * query gets the same bits from either), the KV row prefetch, the 8-lane sum and the vector exps. */
#ifndef GH_ATTENTION_H
#define GH_ATTENTION_H
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
#else
INLINE void attn_axpy(float *acc, float w, const float *v, int64_t n) {
    for (int64_t d = 0; d < n; d++) acc[d] += w * v[d];
}
#endif

/* Multi-token attention's vector path (ext_scores) needs AVX2 and a head size that is a multiple of 16. */
#if defined(__AVX2__) && defined(__FMA__)
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
#endif
    return dot(q, key, head_dim);
}

/* K and V rows are scattered over the pool's blocks (and rows of one head sit kv_heads * head_dim apart), which
 * the hardware prefetcher does not follow: without asking for them a few keys ahead the kernel waits on
 * memory for most of its time (perf: ~70% of its samples on the two row loads). */
#ifndef KV_AHEAD
#define KV_AHEAD 4
#endif
INLINE void prefetch_row(const void *cache, const int32_t *table, int64_t p, int64_t block_size, int64_t block_stride,
                         int64_t slot_stride, int64_t head_offset, int64_t head_dim, int64_t elem) {
    const char *row = (const char *)cache + (table[p / block_size] * block_stride + (p % block_size) * slot_stride
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
#endif

#if WIDE
EXP_LANES(512, exp16)
#endif
#endif
