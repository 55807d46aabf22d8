/* gh_extend_attention: multi-token attention (prompt chunks) over the paged KV pool, its lane tiles, softmax and
 * weighted V sums. gh_attention.h holds what it shares with decode attention. */
#include "gh_native.h"
#include "gh_attention.h"

/* Multi-token attention over the paged pool (prompt chunks, with or without a cached prefix): sequence b's
 * query_lens[b] = query_starts[b + 1] - query_starts[b] new tokens are the last of its seq_lens[b], so its
 * query i sits at position seq_lens[b] - query_lens[b] + i and sees keys 0 .. that position. q [T, heads,
 * head_dim] (strides q_tok_stride, q_head_stride), out [T, heads, head_dim] contiguous.
 *
 * The work is cut into tiles of EXT_LANES query vectors of one (sequence, KV head): the heads sharing the KV
 * head, row after row, so every key row loaded serves all eight; a work item takes up to EXT_TILES
 * consecutive tiles, which share each K row and each chunk of V rows while they are in L1. A tile's scores
 * sit key-major, one lane per query vector ([keys][8]), which makes the causal mask, the softmax and the
 * weighted V sum per-lane vector arithmetic. Scores and sums in float32; results agree with torch's SDPA
 * to float32 rounding, and a query's bits depend only on its own row, its keys and its lane, not on the
 * thread, the work item or the tile's other lanes. */
#define EXT_LANES 8
#define EXT_TILES 4    /* tiles of one (sequence, KV head) per work item, sharing each K row and V chunk loaded */

/* One step c of the tile's 8 FMA chains a0 .. a7 (W-bit registers): lane group t adds query vector t's 8 elements
 * at c (read by qload from the rows of qb, head_dim apart) times the key's, the same operation at either width */
#define LANE_CHAINS(W, qload, key_expr)                                                                            \
    do {                                                                                                           \
        __m##W k = key_expr;                                                                                       \
        a0 = _mm##W##_fmadd_ps(qload(qb + c), k, a0);                                                              \
        a1 = _mm##W##_fmadd_ps(qload(qb + head_dim + c), k, a1);                                                   \
        a2 = _mm##W##_fmadd_ps(qload(qb + 2 * head_dim + c), k, a2);                                               \
        a3 = _mm##W##_fmadd_ps(qload(qb + 3 * head_dim + c), k, a3);                                               \
        a4 = _mm##W##_fmadd_ps(qload(qb + 4 * head_dim + c), k, a4);                                               \
        a5 = _mm##W##_fmadd_ps(qload(qb + 5 * head_dim + c), k, a5);                                               \
        a6 = _mm##W##_fmadd_ps(qload(qb + 6 * head_dim + c), k, a6);                                               \
        a7 = _mm##W##_fmadd_ps(qload(qb + 7 * head_dim + c), k, a7);                                               \
    } while (0)

/* dst[t] = q[t] . key for the tile's 8 query vectors (rows of qb, head_dim apart) */
INLINE void ext_scores(const float *qb, const float *key, int64_t head_dim, float *dst) {
#if defined(__AVX2__) && defined(__FMA__)
    if (EXT_VECTOR(head_dim)) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int64_t c = 0; c < head_dim; c += 8) LANE_CHAINS(256, _mm256_loadu_ps, _mm256_loadu_ps(key + c));
        _mm256_storeu_ps(dst, sum_lanes8(a0, a1, a2, a3, a4, a5, a6, a7));
        return;
    }
#elif defined(__ARM_NEON)
    if (EXT_VECTOR(head_dim)) {
        chain8 a[EXT_LANES];
        for (int t = 0; t < EXT_LANES; t++) a[t].lo = a[t].hi = vdupq_n_f32(0.0f);
        for (int64_t c = 0; c < head_dim; c += 8) {
            float32x4_t klo = vld1q_f32(key + c), khi = vld1q_f32(key + c + 4);
#pragma GCC unroll 8
            for (int t = 0; t < EXT_LANES; t++) {
                a[t].lo = vfmaq_f32(a[t].lo, vld1q_f32(qb + t * head_dim + c), klo);
                a[t].hi = vfmaq_f32(a[t].hi, vld1q_f32(qb + t * head_dim + c + 4), khi);
            }
        }
        sum_chains8(a, dst);
        return;
    }
#endif
    for (int t = 0; t < EXT_LANES; t++) dst[t] = dot(qb + t * head_dim, key, head_dim);
}

#if WIDE
/* the 8-lane vectors at a and b in one register, a in the low half */
INLINE __m512 pair8(const float *a, const float *b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

/* the 8-lane vector at a in both halves */
INLINE __m512 twice8(const float *a) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(a))));
}

/* _mm256_hadd_ps in each half: (a0 + a1, a2 + a3, b0 + b1, b2 + b3) per 128-bit lane */
INLINE __m512 hadd8x2(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
}

/* sum_lanes8 of each half: lanes 0-7 the low halves' sums, lanes 8-15 the high halves', the same additions */
INLINE __m512 sum_lanes8x2(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5, __m512 a6,
                           __m512 a7) {
    __m512 u0 = hadd8x2(hadd8x2(a0, a1), hadd8x2(a2, a3)), u1 = hadd8x2(hadd8x2(a4, a5), hadd8x2(a6, a7));
    /* 128-bit lane i of u0 holds a0-a3's partial sums of their elements 4i .. 4i + 3, of u1 a4-a7's; s: the low
     * halves' sums of a0-a3, the high halves' of a0-a3, the low halves' of a4-a7, the high halves' of a4-a7 */
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xdd));
    return _mm512_shuffle_f32x4(s, s, 0xd8);
}

/* ext_scores of two keys at once: dst[0 .. 8) for key0, dst[8 .. 16) for key1, each lane's bits ext_scores' */
INLINE void ext_scores2(const float *qb, const float *key0, const float *key1, int64_t head_dim, float *dst) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t c = 0; c < head_dim; c += 8) LANE_CHAINS(512, twice8, pair8(key0 + c, key1 + c));
    _mm512_storeu_ps(dst, sum_lanes8x2(a0, a1, a2, a3, a4, a5, a6, a7));
}

/* obuf[t][d0 .. d0 + 16) += sum over keys p of probs[p][t] * value_p[d0 ..] for all 8 lanes, a register each */
INLINE void ext_pv_tile16(float *obuf, const float *probs, const float *const *rows, int64_t keys, int64_t d0,
                          int64_t head_dim) {
    float *o = obuf + d0;
    __m512 a0 = _mm512_loadu_ps(o), a1 = _mm512_loadu_ps(o + head_dim), a2 = _mm512_loadu_ps(o + 2 * head_dim),
           a3 = _mm512_loadu_ps(o + 3 * head_dim), a4 = _mm512_loadu_ps(o + 4 * head_dim),
           a5 = _mm512_loadu_ps(o + 5 * head_dim), a6 = _mm512_loadu_ps(o + 6 * head_dim),
           a7 = _mm512_loadu_ps(o + 7 * head_dim);
    for (int64_t p = 0; p < keys; p++) {
        __m512 v = _mm512_loadu_ps(rows[p] + d0);
        const float *w = probs + p * EXT_LANES;
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[0]), v, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(w[1]), v, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(w[2]), v, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(w[3]), v, a3);
        a4 = _mm512_fmadd_ps(_mm512_set1_ps(w[4]), v, a4);
        a5 = _mm512_fmadd_ps(_mm512_set1_ps(w[5]), v, a5);
        a6 = _mm512_fmadd_ps(_mm512_set1_ps(w[6]), v, a6);
        a7 = _mm512_fmadd_ps(_mm512_set1_ps(w[7]), v, a7);
    }
    _mm512_storeu_ps(o, a0), _mm512_storeu_ps(o + head_dim, a1), _mm512_storeu_ps(o + 2 * head_dim, a2);
    _mm512_storeu_ps(o + 3 * head_dim, a3), _mm512_storeu_ps(o + 4 * head_dim, a4);
    _mm512_storeu_ps(o + 5 * head_dim, a5), _mm512_storeu_ps(o + 6 * head_dim, a6);
    _mm512_storeu_ps(o + 7 * head_dim, a7);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* obuf[t0 .. t0 + 4)[d0 .. d0 + 16) += sum over keys p of probs[p][t] * value_p[d0 ..]: 8 accumulators, the two V
 * vectors and the broadcast weight stay in registers (3 lanes x 32 dims would spill one) */
INLINE void ext_pv_tile(float *obuf, const float *probs, const float *const *rows, int64_t keys, int t0, int64_t d0,
                        int64_t head_dim) {
    float *o0 = obuf + t0 * head_dim + d0, *o1 = o0 + head_dim, *o2 = o1 + head_dim, *o3 = o2 + head_dim;
    __m256 a00 = _mm256_loadu_ps(o0), a01 = _mm256_loadu_ps(o0 + 8), a10 = _mm256_loadu_ps(o1),
           a11 = _mm256_loadu_ps(o1 + 8), a20 = _mm256_loadu_ps(o2), a21 = _mm256_loadu_ps(o2 + 8),
           a30 = _mm256_loadu_ps(o3), a31 = _mm256_loadu_ps(o3 + 8);
    for (int64_t p = 0; p < keys; p++) {
        const float *v = rows[p] + d0, *w = probs + p * EXT_LANES + t0;
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), b;
        b = _mm256_broadcast_ss(w);
        a00 = _mm256_fmadd_ps(b, v0, a00), a01 = _mm256_fmadd_ps(b, v1, a01);
        b = _mm256_broadcast_ss(w + 1);
        a10 = _mm256_fmadd_ps(b, v0, a10), a11 = _mm256_fmadd_ps(b, v1, a11);
        b = _mm256_broadcast_ss(w + 2);
        a20 = _mm256_fmadd_ps(b, v0, a20), a21 = _mm256_fmadd_ps(b, v1, a21);
        b = _mm256_broadcast_ss(w + 3);
        a30 = _mm256_fmadd_ps(b, v0, a30), a31 = _mm256_fmadd_ps(b, v1, a31);
    }
    _mm256_storeu_ps(o0, a00), _mm256_storeu_ps(o0 + 8, a01), _mm256_storeu_ps(o1, a10), _mm256_storeu_ps(o1 + 8, a11);
    _mm256_storeu_ps(o2, a20), _mm256_storeu_ps(o2 + 8, a21), _mm256_storeu_ps(o3, a30), _mm256_storeu_ps(o3 + 8, a31);
}
#elif defined(__ARM_NEON)
/* the same: 16 accumulators, four V vectors and the tile's four weights of a key in registers, each weight used by
 * lane (a fused multiply-add like the AVX2 one) */
INLINE void ext_pv_tile(float *obuf, const float *probs, const float *const *rows, int64_t keys, int t0, int64_t d0,
                        int64_t head_dim) {
    float32x4_t a[4][4];
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) a[t][i] = vld1q_f32(obuf + (t0 + t) * head_dim + d0 + 4 * i);
    for (int64_t p = 0; p < keys; p++) {
        float32x4_t w = vld1q_f32(probs + p * EXT_LANES + t0);
        for (int i = 0; i < 4; i++) {
            float32x4_t v = vld1q_f32(rows[p] + d0 + 4 * i);
            a[0][i] = vfmaq_laneq_f32(a[0][i], v, w, 0);
            a[1][i] = vfmaq_laneq_f32(a[1][i], v, w, 1);
            a[2][i] = vfmaq_laneq_f32(a[2][i], v, w, 2);
            a[3][i] = vfmaq_laneq_f32(a[3][i], v, w, 3);
        }
    }
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) vst1q_f32(obuf + (t0 + t) * head_dim + d0 + 4 * i, a[t][i]);
}
#endif

/* probs[p][t] = exp(scale * scores[p][t] - max) for keys p <= limit[t], else 0; sum[t] their sum */
INLINE void ext_softmax(float *probs, int64_t keys, const int32_t *limit, float scale, float *sum) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256i lim = _mm256_loadu_si256((const __m256i *)limit);
    __m256 vscale = _mm256_set1_ps(scale), total = _mm256_setzero_ps();
    /* four running maxima over alternate keys, so no key waits on the one before (a max is exact in any order) */
    __m256 top4[4] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY),
                      _mm256_set1_ps(-INFINITY)};
    for (int64_t p = 0; p < keys; p++) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(probs + p * EXT_LANES), vscale);
        _mm256_storeu_ps(probs + p * EXT_LANES, s);
        __m256 past = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)p), lim));
        top4[p & 3] = _mm256_blendv_ps(_mm256_max_ps(top4[p & 3], s), top4[p & 3], past);
    }
    __m256 top = _mm256_max_ps(_mm256_max_ps(top4[0], top4[1]), _mm256_max_ps(top4[2], top4[3]));
    int64_t p = 0;
#if WIDE
    /* two keys' exps per register; the sum still adds key after key */
    __m512 top2 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(top)));
    __m512i lim2 = _mm512_broadcast_i64x4(lim);
    for (; p + 1 < keys; p += 2) {
        __m512i at = _mm512_inserti64x4(_mm512_set1_epi32((int32_t)p), _mm256_set1_epi32((int32_t)(p + 1)), 1);
        __mmask16 seen = _mm512_cmple_epi32_mask(at, lim2);
        __m512 e = _mm512_maskz_mov_ps(seen, exp16(_mm512_sub_ps(_mm512_loadu_ps(probs + p * EXT_LANES), top2)));
        _mm512_storeu_ps(probs + p * EXT_LANES, e);
        total = _mm256_add_ps(total, _mm512_castps512_ps256(e));
        total = _mm256_add_ps(total, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
#endif
    for (; p < keys; p++) {
        __m256 past = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)p), lim));
        __m256 e = _mm256_andnot_ps(past, exp8(_mm256_sub_ps(_mm256_loadu_ps(probs + p * EXT_LANES), top)));
        _mm256_storeu_ps(probs + p * EXT_LANES, e);
        total = _mm256_add_ps(total, e);
    }
    _mm256_storeu_ps(sum, total);
#elif defined(__ARM_NEON)
    /* the AVX2 path in 4-lane halves: lanes 0-3, then 4-7 */
    for (int h = 0; h < 2; h++) {
        int32x4_t lim = vld1q_s32(limit + 4 * h);
        float32x4_t vscale = vdupq_n_f32(scale), top = vdupq_n_f32(-INFINITY), total = vdupq_n_f32(0.0f);
        for (int64_t p = 0; p < keys; p++) {
            float *at = probs + p * EXT_LANES + 4 * h;
            float32x4_t s = vmulq_f32(vld1q_f32(at), vscale);
            vst1q_f32(at, s);
            top = vbslq_f32(vcleq_s32(vdupq_n_s32((int32_t)p), lim), vmaxq_f32(top, s), top);
        }
        for (int64_t p = 0; p < keys; p++) {
            float *at = probs + p * EXT_LANES + 4 * h;
            uint32x4_t seen = vcleq_s32(vdupq_n_s32((int32_t)p), lim);
            float32x4_t e = vbslq_f32(seen, exp4(vsubq_f32(vld1q_f32(at), top)), vdupq_n_f32(0.0f));
            vst1q_f32(at, e);
            total = vaddq_f32(total, e);
        }
        vst1q_f32(sum + 4 * h, total);
    }
#else
    float top[EXT_LANES];
    for (int t = 0; t < EXT_LANES; t++) top[t] = -INFINITY, sum[t] = 0.0f;
    for (int64_t p = 0; p < keys; p++)
        for (int t = 0; t < EXT_LANES; t++) {
            float s = probs[p * EXT_LANES + t] * scale;
            probs[p * EXT_LANES + t] = s;
            top[t] = p <= limit[t] && s > top[t] ? s : top[t];
        }
    for (int64_t p = 0; p < keys; p++)
        for (int t = 0; t < EXT_LANES; t++) {
            float e = p <= limit[t] ? exp_f32(probs[p * EXT_LANES + t] - top[t]) : 0.0f;
            probs[p * EXT_LANES + t] = e;
            sum[t] += e;
        }
#endif
}

/* obuf[t] += sum over the chunk's keys of probs[p][t] * value_p, for all 8 lanes */
INLINE void ext_weighted_sum(float *obuf, const float *probs, const float *const *rows, int64_t keys,
                             int64_t head_dim) {
#if WIDE
    if (EXT_VECTOR(head_dim)) {
        for (int64_t d0 = 0; d0 < head_dim; d0 += 16) ext_pv_tile16(obuf, probs, rows, keys, d0, head_dim);
        return;
    }
#elif (defined(__AVX2__) && defined(__FMA__)) || defined(__ARM_NEON)
    if (EXT_VECTOR(head_dim)) {
        for (int64_t d0 = 0; d0 < head_dim; d0 += 16) {
            ext_pv_tile(obuf, probs, rows, keys, 0, d0, head_dim);
            ext_pv_tile(obuf, probs, rows, keys, 4, d0, head_dim);
        }
        return;
    }
#endif
    for (int64_t p = 0; p < keys; p++)
        for (int t = 0; t < EXT_LANES; t++) attn_axpy(obuf + t * head_dim, probs[p * EXT_LANES + t], rows[p], head_dim);
}

INLINE int gh_extend_attention_impl(const void *q, int64_t q_tok_stride, int64_t q_head_stride, const void *k_cache,
                         const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                         int64_t block_size, const int32_t *block_tables, int64_t table_stride,
                         const int64_t *seq_lens, const int64_t *query_starts, int64_t num_seqs, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, float scale, void *out, int dtype, int kv_type,
                         const float *kv_scale, int64_t threads, const HostKV *host) {
    int64_t group = heads / kv_heads, longest = 0, units = 0, work = 0, elem = kv_elem(kv_type, dtype);
    PoolMap kmap = pool_map(k_cache, block_stride, host, 0, elem);
    PoolMap vmap = pool_map(v_cache, block_stride, host, 1, elem);
    float k_scale = kv_type != KV_SAME ? kv_scale[0] : 1.0f, v_scale = kv_type != KV_SAME ? kv_scale[1] : 1.0f;
    int widen = dtype || kv_type;   /* K and V rows go through a float32 row, else they are read in place */
    int64_t key_step = WIDE && EXT_VECTOR(head_dim) ? 2 : 1;
    for (int64_t b = 0; b < num_seqs; b++) {
        int64_t vectors = (query_starts[b + 1] - query_starts[b]) * group;
        int64_t tiles = (vectors + EXT_LANES - 1) / EXT_LANES;
        if (seq_lens[b] > longest) longest = seq_lens[b];
        units += kv_heads * ((tiles + EXT_TILES - 1) / EXT_TILES);
        work += vectors * kv_heads * seq_lens[b] * head_dim;
    }
    /* unit -> its sequence, and each sequence's first unit: a sequence's units are consecutive, KV head-major */
    int64_t *unit_seq = malloc((size_t)(units + 1) * sizeof(int64_t)), *seq_unit = malloc((size_t)(num_seqs + 1)
                                                                                          * sizeof(int64_t));
    if (!unit_seq || !seq_unit) {
        free(unit_seq);
        free(seq_unit);
        return -1;
    }
    for (int64_t b = 0, n = 0; b < num_seqs; b++) {
        int64_t tiles = ((query_starts[b + 1] - query_starts[b]) * group + EXT_LANES - 1) / EXT_LANES;
        seq_unit[b] = n;
        for (int64_t i = 0; i < kv_heads * ((tiles + EXT_TILES - 1) / EXT_TILES); i++) unit_seq[n++] = b;
    }
    int64_t team = team_size(threads, units, work);
    PARALLEL
    {
        float *qb = malloc((size_t)(EXT_TILES * EXT_LANES * head_dim) * sizeof(float));
        float *obuf = malloc((size_t)(EXT_TILES * EXT_LANES * head_dim) * sizeof(float));
        float *probs = malloc((size_t)(EXT_TILES * (longest > 0 ? longest : 1) * EXT_LANES) * sizeof(float));
        float *rows_f = widen ? malloc((size_t)(EXT_CHUNK * head_dim) * sizeof(float)) : NULL;
        float *key_f = widen ? malloc((size_t)(2 * head_dim) * sizeof(float)) : NULL;
        const float *rows[EXT_CHUNK];
        FOR_PAIRS
        for (int64_t unit = 0; unit < units; unit++) {
            int64_t b = unit_seq[unit], qlen = query_starts[b + 1] - query_starts[b], len = seq_lens[b];
            int64_t tiles = (qlen * group + EXT_LANES - 1) / EXT_LANES, per_head = (tiles + EXT_TILES - 1) / EXT_TILES;
            int64_t g = (unit - seq_unit[b]) / per_head, tile0 = (unit - seq_unit[b]) % per_head * EXT_TILES;
            int64_t count = tiles - tile0 < EXT_TILES ? tiles - tile0 : EXT_TILES, most = 0;
            const int32_t *table = block_tables + b * table_stride;
            int32_t limit[EXT_TILES][EXT_LANES];
            int64_t vectors[EXT_TILES], keys[EXT_TILES];
            for (int64_t u = 0; u < count; u++) {
                int64_t first = (tile0 + u) * EXT_LANES;
                vectors[u] = qlen * group - first < EXT_LANES ? qlen * group - first : EXT_LANES;
                keys[u] = 0;
                for (int t = 0; t < EXT_LANES; t++) {
                    /* unused lanes repeat the last query vector (their results are not stored) */
                    int64_t v = first + (t < vectors[u] ? t : vectors[u] - 1), row = v / group;
                    load_row(qb + (u * EXT_LANES + t) * head_dim, q,
                             (query_starts[b] + row) * q_tok_stride + (g * group + v % group) * q_head_stride,
                             head_dim, dtype);
                    limit[u][t] = (int32_t)(len - qlen + row);
                    if (limit[u][t] + 1 > keys[u]) keys[u] = limit[u][t] + 1;
                }
                if (keys[u] > most) most = keys[u];
            }
            /* each key row, once loaded, serves every tile of the unit that sees it; WIDE scores two keys at once */
            for (int64_t p = 0; p < most; p += key_step) {
                const float *key[2];
                for (int64_t i = 0; i < key_step; i++) {
                    int64_t k = p + i < most ? p + i : p;
                    int64_t at = block_at(&kmap, table[k / block_size]) + (k % block_size) * slot_stride
                                 + g * head_stride;
                    if (k + KV_AHEAD < most)
                        prefetch_row(k_cache, &kmap, table, k + KV_AHEAD, block_size, slot_stride,
                                     g * head_stride, head_dim, elem);
                    key[i] = kv_row(key_f + i * head_dim, k_cache, at, head_dim, dtype, kv_type, k_scale);
                }
                for (int64_t u = 0; u < count; u++) {
                    float *dst = probs + (u * longest + p) * EXT_LANES;
                    if (p >= keys[u]) continue;
#if WIDE
                    if (key_step == 2 && p + 1 < keys[u]) {
                        ext_scores2(qb + u * EXT_LANES * head_dim, key[0], key[1], head_dim, dst);
                        continue;
                    }
#endif
                    ext_scores(qb + u * EXT_LANES * head_dim, key[0], head_dim, dst);
                }
            }
            float sum[EXT_TILES][EXT_LANES];
            for (int64_t u = 0; u < count; u++)
                ext_softmax(probs + u * longest * EXT_LANES, keys[u], limit[u], scale, sum[u]);
            memset(obuf, 0, (size_t)(count * EXT_LANES * head_dim) * sizeof(float));
            /* and each chunk of V rows, while in L1, every tile that sees it */
            for (int64_t p0 = 0; p0 < most; p0 += EXT_CHUNK) {
                int64_t chunk = most - p0 < EXT_CHUNK ? most - p0 : EXT_CHUNK;
                for (int64_t p = 0; p < chunk; p++) {
                    int64_t at = block_at(&vmap, table[(p0 + p) / block_size])
                                 + ((p0 + p) % block_size) * slot_stride + g * head_stride;
                    rows[p] = kv_row(rows_f + p * head_dim, v_cache, at, head_dim, dtype, kv_type, v_scale);
                }
                for (int64_t u = 0; u < count; u++)
                    if (keys[u] > p0)
                        ext_weighted_sum(obuf + u * EXT_LANES * head_dim, probs + (u * longest + p0) * EXT_LANES, rows,
                                         keys[u] - p0 < chunk ? keys[u] - p0 : chunk, head_dim);
            }
            for (int64_t u = 0; u < count; u++)
                for (int64_t t = 0; t < vectors[u]; t++) {
                    int64_t v = (tile0 + u) * EXT_LANES + t, row = v / group, head = g * group + v % group;
                    int64_t dst = ((query_starts[b] + row) * heads + head) * head_dim;
                    const float *o = obuf + (u * EXT_LANES + t) * head_dim;
                    for (int64_t d = 0; d < head_dim; d++) store(out, dst + d, o[d] / sum[u][t], dtype);
                }
        }
        free(qb);
        free(obuf);
        free(probs);
        free(rows_f);
        free(key_f);
    }
    free(unit_seq);
    free(seq_unit);
    return 0;
}

int gh_extend_attention(const void *q, int64_t q_tok_stride, int64_t q_head_stride, const void *k_cache,
                         const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                         int64_t block_size, const int32_t *block_tables, int64_t table_stride,
                         const int64_t *seq_lens, const int64_t *query_starts, int64_t num_seqs, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, float scale, void *out, int dtype, int kv_type,
                         const float *kv_scale, int64_t threads, const HostKV *host) {
    /* the common head sizes as constants: the per-key dot products and updates unroll completely */
#define CALL_DIM(dim, d) return gh_extend_attention_impl(q, q_tok_stride, q_head_stride, k_cache, v_cache, \
                                                         block_stride, slot_stride, head_stride, block_size, \
                                                         block_tables, table_stride, seq_lens, query_starts, \
                                                         num_seqs, heads, kv_heads, dim, scale, out, d, kv_type, \
                                                         kv_scale, threads, host)
#define CALL_64(d) CALL_DIM(64, d)
#define CALL_128(d) CALL_DIM(128, d)
#define CALL_ANY(d) CALL_DIM(head_dim, d)
    if (head_dim == 64) BY_DTYPE(CALL_64);
    if (head_dim == 128) BY_DTYPE(CALL_128);
    BY_DTYPE(CALL_ANY);
}
