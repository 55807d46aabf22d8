/* Decode attention over the paged KV pool, one new token per sequence (gh_decode_attention), and a decode step's
 * RoPE, KV store and attention for one layer in one call (gh_decode_attention_block; gh_attention.h: what it
 * shares with multi-token attention). */
#include "gh_native.h"
#include "gh_attention.h"

/* Decode attention over the paged pool: one new query token per sequence, at position seq_len - 1,
 * sees keys 0 .. seq_len - 1. q [B, heads, head_dim] (strides q_seq_stride, q_head_stride), out
 * [B, heads, head_dim] contiguous; the heads of group g = h / (heads / kv_heads) share KV head g. Block
 * tables int32 [B, table_stride], seq_lens int64 [B]. Scores and the weighted sum in float32.
 *
 * A work item is the `rows` = span * group query heads of `span` KV heads of one sequence, its scores head-major
 * (scores[j * len + p]). Each score is score_dot's arithmetic, each head's probabilities are exp_f32's, summed in
 * key order, and its weighted V sum adds key after key: the multi-token kernel's operations in its order, so decode
 * keeps its bits (test_decode_attention_gives_the_extend_kernels_bits). */

/* the plane offset of key p's slot row (KV head 0), and the next key's by stepping through the blocks */
typedef struct {
    const int32_t *table;
    const PoolMap *map;
    int64_t block, slot, block_size, slot_stride;
} SlotWalk;

INLINE SlotWalk slot_walk(const int32_t *table, int64_t p, int64_t block_size, const PoolMap *map,
                          int64_t slot_stride) {
    SlotWalk w = {table, map, p / block_size, p % block_size, block_size, slot_stride};
    return w;
}

INLINE int64_t slot_next(SlotWalk *w) {
    int64_t at = block_at(w->map, w->table[w->block]) + w->slot * w->slot_stride;
    if (++w->slot == w->block_size) w->slot = 0, w->block++;
    return at;
}

/* One pass of the portable path over the item's keys in order, each slot row (its span KV heads) against every
 * head of the item: the scores (values 0: K rows) or the weighted V sums into acc (values 1: V rows) */
INLINE void keywise_pass(int values, const float *qf, float *acc, float *scores, float *kv, const void *cache,
                         const int32_t *table, int64_t len, int64_t block_size, const PoolMap *map,
                         int64_t slot_stride, int64_t head_stride, int64_t g0, int64_t span, int64_t group,
                         int64_t head_dim, float scale, int dtype, int kv_type, float kv_scale, int64_t elem) {
    SlotWalk walk = slot_walk(table, 0, block_size, map, slot_stride);
    for (int64_t p = 0; p < len; p++) {
        int64_t at = slot_next(&walk) + g0 * head_stride;
        if (p + KV_AHEAD < len)
            prefetch_row(cache, map, table, p + KV_AHEAD, block_size, slot_stride, g0 * head_stride,
                         span * head_dim, elem);
        for (int64_t g = 0; g < span; g++) {
            const float *row = kv_row(kv, cache, at + g * head_stride, head_dim, dtype, kv_type, kv_scale);
            for (int64_t j = g * group; j < (g + 1) * group; j++) {
                if (values) attn_axpy(acc + j * head_dim, scores[j * len + p], row, head_dim);
                else scores[j * len + p] = score_dot(qf + j * head_dim, row, head_dim) * scale;
            }
        }
    }
}

/* The portable path: one key at a time, every head of the item against it. */
INLINE void decode_item_keywise(const float *qf, float *acc, float *scores, float *sums, float *kv,
                                const void *k_cache, const void *v_cache, const int32_t *table, int64_t len,
                                int64_t block_size, const PoolMap *kmap, const PoolMap *vmap, int64_t slot_stride,
                                int64_t head_stride, int64_t g0, int64_t span, int64_t group, int64_t head_dim,
                                float scale, int dtype, int kv_type, float k_scale, float v_scale, int64_t elem) {
    int64_t rows = span * group;
    keywise_pass(0, qf, acc, scores, kv, k_cache, table, len, block_size, kmap, slot_stride, head_stride, g0,
                 span, group, head_dim, scale, dtype, kv_type, k_scale, elem);
    for (int64_t j = 0; j < rows; j++) {
        float *s = scores + j * len, top = -INFINITY, sum = 0.0f;
        for (int64_t p = 0; p < len; p++) top = s[p] > top ? s[p] : top;
        for (int64_t p = 0; p < len; p++) {   /* summed in key order, as ext_softmax sums a lane */
            s[p] = exp_f32(s[p] - top);
            sum += s[p];
        }
        sums[j] = sum;
    }
    memset(acc, 0, (size_t)(rows * head_dim) * sizeof(float));
    keywise_pass(1, qf, acc, scores, kv, v_cache, table, len, block_size, vmap, slot_stride, head_stride, g0,
                 span, group, head_dim, scale, dtype, kv_type, v_scale, elem);
}

#if defined(__AVX2__) && defined(__FMA__)
/* The vector path hides what bounds the key-at-a-time loop, the latency of each score's FMA chain and sum and
 * of each head's running sum, behind independent work. Keys come DECODE_TILE at a time. */
#define DECODE_TILE 8
#ifndef DECODE_AHEAD
#define DECODE_AHEAD 16   /* keys prefetched ahead of the tile being scored */
#endif

/* the 8 scores q . keys[t], each as score_dot computes it (one 8-lane FMA chain, sum_lanes8's order), times scale */
INLINE __m256 decode_scores8(const float *qv, const float *const *keys, int64_t head_dim, __m256 scale) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t c = 0; c < head_dim; c += 8) {
        __m256 x = _mm256_loadu_ps(qv + c);
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[0] + c), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[1] + c), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[2] + c), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[3] + c), a3);
        a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[4] + c), a4);
        a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[5] + c), a5);
        a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[6] + c), a6);
        a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys[7] + c), a7);
    }
    return _mm256_mul_ps(sum_lanes8(a0, a1, a2, a3, a4, a5, a6, a7), scale);
}

/* o[k][d0 .. d0 + 16) += sum over keys p of w[k][p] * rows[p][d0 ..] for 4 heads: 8 accumulators in registers,
 * each element's products added in key order */
INLINE void decode_pv_tile(float *const *o, const float *const *w, const float *const *rows, int64_t keys,
                           int64_t d0) {
    __m256 a00 = _mm256_loadu_ps(o[0] + d0), a01 = _mm256_loadu_ps(o[0] + d0 + 8), a10 = _mm256_loadu_ps(o[1] + d0),
           a11 = _mm256_loadu_ps(o[1] + d0 + 8), a20 = _mm256_loadu_ps(o[2] + d0),
           a21 = _mm256_loadu_ps(o[2] + d0 + 8), a30 = _mm256_loadu_ps(o[3] + d0), a31 = _mm256_loadu_ps(o[3] + d0 + 8);
    for (int64_t p = 0; p < keys; p++) {
        __m256 v0 = _mm256_loadu_ps(rows[p] + d0), v1 = _mm256_loadu_ps(rows[p] + d0 + 8), b;
        b = _mm256_broadcast_ss(w[0] + p);
        a00 = _mm256_fmadd_ps(b, v0, a00), a01 = _mm256_fmadd_ps(b, v1, a01);
        b = _mm256_broadcast_ss(w[1] + p);
        a10 = _mm256_fmadd_ps(b, v0, a10), a11 = _mm256_fmadd_ps(b, v1, a11);
        b = _mm256_broadcast_ss(w[2] + p);
        a20 = _mm256_fmadd_ps(b, v0, a20), a21 = _mm256_fmadd_ps(b, v1, a21);
        b = _mm256_broadcast_ss(w[3] + p);
        a30 = _mm256_fmadd_ps(b, v0, a30), a31 = _mm256_fmadd_ps(b, v1, a31);
    }
    _mm256_storeu_ps(o[0] + d0, a00), _mm256_storeu_ps(o[0] + d0 + 8, a01);
    _mm256_storeu_ps(o[1] + d0, a10), _mm256_storeu_ps(o[1] + d0 + 8, a11);
    _mm256_storeu_ps(o[2] + d0, a20), _mm256_storeu_ps(o[2] + d0 + 8, a21);
    _mm256_storeu_ps(o[3] + d0, a30), _mm256_storeu_ps(o[3] + d0 + 8, a31);
}

/* s[p] = exp(s[p] - max(s)) over one head's len scores: 8 keys at a time by exp8, the tail by exp_f32 (the same
 * bits) */
INLINE void decode_exp_row(float *s, int64_t len) {
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    int64_t p = 0;
    for (; p + 8 <= len; p += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + p));
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, top8);
    for (int t = 0; t < 8; t++) top = lanes[t] > top ? lanes[t] : top;
    for (; p < len; p++) top = s[p] > top ? s[p] : top;
    __m256 vtop = _mm256_set1_ps(top);
    for (p = 0; p + 8 <= len; p += 8) _mm256_storeu_ps(s + p, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + p), vtop)));
    for (; p < len; p++) s[p] = exp_f32(s[p] - top);
}

INLINE void decode_item_tiled(const float *qf, float *acc, float *scores, float *sums, float *rows_f, float *spare,
                              const void *k_cache, const void *v_cache, const int32_t *table, int64_t len,
                              int64_t block_size, const PoolMap *kmap, const PoolMap *vmap, int64_t slot_stride,
                              int64_t head_stride, int64_t g0, int64_t span, int64_t group, int64_t head_dim,
                              float scale, int dtype, int kv_type, float k_scale, float v_scale, int64_t elem) {
    int64_t rows = span * group;
    __m256 vscale = _mm256_set1_ps(scale);
    const float *keys[EXT_CHUNK];
    SlotWalk walk = slot_walk(table, 0, block_size, kmap, slot_stride);
    SlotWalk ahead = slot_walk(table, DECODE_AHEAD < len ? DECODE_AHEAD : 0, block_size, kmap, slot_stride);
    for (int64_t p0 = 0; p0 < len; p0 += DECODE_TILE) {
        int64_t n = len - p0 < DECODE_TILE ? len - p0 : DECODE_TILE, at[DECODE_TILE];
        for (int64_t t = 0; t < n; t++) at[t] = slot_next(&walk) + g0 * head_stride;
        for (int64_t p = p0 + DECODE_AHEAD; DECODE_AHEAD && p < p0 + DECODE_AHEAD + n && p < len; p++) {
            const char *row = (const char *)k_cache + (slot_next(&ahead) + g0 * head_stride) * elem;
            for (int64_t b = 0; b < span * head_dim * elem; b += 64) __builtin_prefetch(row + b);
        }
        for (int64_t g = 0; g < span; g++) {
            for (int64_t t = 0; t < DECODE_TILE; t++)   /* a short tile repeats its last key (scores not kept) */
                keys[t] = t < n ? kv_row(rows_f + t * head_dim, k_cache, at[t] + g * head_stride, head_dim, dtype,
                                         kv_type, k_scale)
                                : keys[n - 1];
            for (int64_t j = g * group; j < (g + 1) * group; j++) {
                __m256 s = decode_scores8(qf + j * head_dim, keys, head_dim, vscale);
                if (n == DECODE_TILE) {
                    _mm256_storeu_ps(scores + j * len + p0, s);
                } else {
                    float part[DECODE_TILE];
                    _mm256_storeu_ps(part, s);
                    memcpy(scores + j * len + p0, part, (size_t)n * sizeof(float));
                }
            }
        }
    }
    for (int64_t j = 0; j < rows; j++) decode_exp_row(scores + j * len, len);
    /* each head's sum in key order, four heads' independent chains side by side */
    for (int64_t j0 = 0; j0 < rows; j0 += 4) {
        const float *r0 = scores + j0 * len, *r1 = j0 + 1 < rows ? r0 + len : r0;
        const float *r2 = j0 + 2 < rows ? r0 + 2 * len : r0, *r3 = j0 + 3 < rows ? r0 + 3 * len : r0;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int64_t p = 0; p < len; p++) s0 += r0[p], s1 += r1[p], s2 += r2[p], s3 += r3[p];
        float four[4] = {s0, s1, s2, s3};
        for (int64_t k = 0; k < 4 && j0 + k < rows; k++) sums[j0 + k] = four[k];
    }
    memset(acc, 0, (size_t)(rows * head_dim) * sizeof(float));
    walk = slot_walk(table, 0, block_size, vmap, slot_stride);
    ahead = slot_walk(table, DECODE_AHEAD < len ? DECODE_AHEAD : 0, block_size, vmap, slot_stride);
    for (int64_t p0 = 0; p0 < len; p0 += EXT_CHUNK) {
        int64_t chunk = len - p0 < EXT_CHUNK ? len - p0 : EXT_CHUNK;
        int64_t at[EXT_CHUNK];
        for (int64_t p = 0; p < chunk; p++) at[p] = slot_next(&walk) + g0 * head_stride;
        for (int64_t g = 0; g < span; g++) {
            for (int64_t p = 0; p < chunk; p++) {
                if (DECODE_AHEAD && g == 0 && p0 + p + DECODE_AHEAD < len) {
                    const char *row = (const char *)v_cache + (slot_next(&ahead) + g0 * head_stride) * elem;
                    for (int64_t b = 0; b < span * head_dim * elem; b += 64) __builtin_prefetch(row + b);
                }
                keys[p] = kv_row(rows_f + p * head_dim, v_cache, at[p] + g * head_stride, head_dim, dtype, kv_type,
                                 v_scale);
            }
            /* four heads at a time; a group's missing fourth accumulates into spare, never read */
            for (int64_t j0 = g * group; j0 < (g + 1) * group; j0 += 4) {
                float *o[4];
                const float *w[4];
                for (int64_t k = 0; k < 4; k++) {
                    int here = j0 + k < (g + 1) * group;
                    o[k] = here ? acc + (j0 + k) * head_dim : spare;
                    w[k] = scores + (here ? j0 + k : j0) * len + p0;
                }
                for (int64_t d0 = 0; d0 < head_dim; d0 += 16) decode_pv_tile(o, w, keys, chunk, d0);
            }
        }
    }
}
#endif

INLINE void gh_decode_attention_impl(const void *q, int64_t q_seq_stride, int64_t q_head_stride, const void *k_cache,
                         const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                         int64_t block_size, const int32_t *block_tables, int64_t table_stride,
                         const int64_t *seq_lens, int64_t num_seqs, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, float scale, void *out, int dtype, int kv_type, const float *kv_scale,
                         int64_t threads, const HostKV *host) {
    int64_t group = heads / kv_heads, longest = 0, keys = 0, elem = kv_elem(kv_type, dtype);
    PoolMap kmap = pool_map(k_cache, block_stride, host, 0, elem);
    PoolMap vmap = pool_map(v_cache, block_stride, host, 1, elem);
    float k_scale = kv_type != KV_SAME ? kv_scale[0] : 1.0f, v_scale = kv_type != KV_SAME ? kv_scale[1] : 1.0f;
    for (int64_t b = 0; b < num_seqs; b++) {
        if (seq_lens[b] > longest) longest = seq_lens[b];
        keys += seq_lens[b];
    }
    /* With a few sequences per thread, an item is a whole sequence: its KV heads slot by slot, the pool's
     * contiguous slot rows streamed in order. With fewer, a (sequence, KV head) pair, so that one sequence
     * still spreads over the threads. Each head's arithmetic is the same in both. */
    int64_t span = num_seqs >= 4 * threads ? kv_heads : 1, items = num_seqs * (kv_heads / span);
    int64_t team = team_size(threads, items, keys * heads * head_dim), rows = span * group;
    PARALLEL
    {
        float *qf = malloc((size_t)(rows * head_dim) * sizeof(float));
        float *acc = malloc((size_t)(rows * head_dim) * sizeof(float));
        float *scores = malloc((size_t)(rows * (longest > 0 ? longest : 1)) * sizeof(float));
        float *sums = malloc((size_t)rows * sizeof(float));
        float *rows_f = malloc((size_t)(EXT_CHUNK * head_dim) * sizeof(float));
        float *spare = malloc((size_t)head_dim * sizeof(float));
        FOR_PAIRS
        for (int64_t item = 0; item < items; item++) {
            int64_t b = item / (kv_heads / span), g0 = item % (kv_heads / span) * span, len = seq_lens[b];
            const int32_t *table = block_tables + b * table_stride;
            for (int64_t j = 0; j < rows; j++)
                load_row(qf + j * head_dim, q, b * q_seq_stride + (g0 * group + j) * q_head_stride, head_dim, dtype);
#if defined(__AVX2__) && defined(__FMA__)
            if (EXT_VECTOR(head_dim))
                decode_item_tiled(qf, acc, scores, sums, rows_f, spare, k_cache, v_cache, table, len, block_size,
                                  &kmap, &vmap, slot_stride, head_stride, g0, span, group, head_dim, scale, dtype,
                                  kv_type, k_scale, v_scale, elem);
            else
#endif
                decode_item_keywise(qf, acc, scores, sums, rows_f, k_cache, v_cache, table, len, block_size,
                                    &kmap, &vmap, slot_stride, head_stride, g0, span, group, head_dim, scale, dtype,
                                    kv_type, k_scale, v_scale, elem);
            for (int64_t j = 0; j < rows; j++) {
                int64_t dst = (b * heads + g0 * group + j) * head_dim;
                for (int64_t d = 0; d < head_dim; d++) store(out, dst + d, acc[j * head_dim + d] / sums[j], dtype);
            }
        }
        free(qf);
        free(acc);
        free(scores);
        free(sums);
        free(rows_f);
        free(spare);
    }
}

void gh_decode_attention(const void *q, int64_t q_seq_stride, int64_t q_head_stride, const void *k_cache,
                         const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                         int64_t block_size, const int32_t *block_tables, int64_t table_stride,
                         const int64_t *seq_lens, int64_t num_seqs, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, float scale, void *out, int dtype, int kv_type, const float *kv_scale,
                         int64_t threads, const HostKV *host) {
    /* the common head sizes as constants: the per-key dot products and updates unroll completely */
#define CALL_DIM(dim, d) gh_decode_attention_impl(q, q_seq_stride, q_head_stride, k_cache, v_cache, block_stride, \
                                                  slot_stride, head_stride, block_size, block_tables, table_stride, \
                                                  seq_lens, num_seqs, heads, kv_heads, dim, scale, out, d, kv_type, \
                                                  kv_scale, threads, host)
#define CALL_64(d) CALL_DIM(64, d)
#define CALL_128(d) CALL_DIM(128, d)
#define CALL_ANY(d) CALL_DIM(head_dim, d)
    if (head_dim == 64) BY_DTYPE(CALL_64);
    else if (head_dim == 128) BY_DTYPE(CALL_128);
    else BY_DTYPE(CALL_ANY);
}

/* A decode step's attention for one layer in one call, from the fused qkv projection: RoPE on the query and
 * key heads, the new K and V into their pool slots, then decode attention. The same bodies as gh_rotary,
 * gh_write_kv and gh_decode_attention on the same values, so the same bits as the three calls; one call
 * saves the two round trips through Python per layer. qkv [T, (heads + 2 kv_heads) * head_dim] (row stride
 * qkv_stride), one token per sequence in sequence order; out [T, heads, head_dim]. Returns -1 when the
 * scratch row could not be allocated. The new K and V go to pool blocks: the host blocks tables may name (HostKV)
 * hold full, published prompt blocks, which no step writes. */
int gh_decode_attention_block(const void *qkv, int64_t qkv_stride, const void *cos, const void *sin, void *k_cache,
                              void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                              int64_t block_size, const int64_t *slots, const int32_t *block_tables,
                              int64_t table_stride, const int64_t *seq_lens, int64_t num_seqs, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, float scale, void *out, int dtype, int kv_type,
                              const float *kv_scale, int64_t threads, const HostKV *host) {
    int64_t rotated_heads = heads + kv_heads, elem = dtype ? 2 : 4;
    char *rotated = malloc((size_t)(num_seqs * rotated_heads * head_dim * elem) + 1);
    if (!rotated) return -1;
    gh_rotary(qkv, num_seqs, rotated_heads, head_dim / 2, qkv_stride, head_dim, cos, sin, rotated, dtype, threads);
    if (kv_type != KV_SAME)
        gh_write_kv_fp8(k_cache, v_cache, block_stride, slot_stride, head_stride, block_size,
                        rotated + heads * head_dim * elem, (const char *)qkv + rotated_heads * head_dim * elem,
                        rotated_heads * head_dim, head_dim, qkv_stride, head_dim, slots, num_seqs, kv_heads, head_dim,
                        dtype, kv_type, kv_scale);
    else
        gh_write_kv(k_cache, v_cache, block_stride, slot_stride, head_stride, block_size,
                    rotated + heads * head_dim * elem, (const char *)qkv + rotated_heads * head_dim * elem,
                    rotated_heads * head_dim, head_dim, qkv_stride, head_dim, slots, num_seqs, kv_heads, head_dim,
                    elem);
    gh_decode_attention(rotated, rotated_heads * head_dim, head_dim, k_cache, v_cache, block_stride, slot_stride,
                        head_stride, block_size, block_tables, table_stride, seq_lens, num_seqs, heads, kv_heads,
                        head_dim, scale, out, dtype, kv_type, kv_scale, threads, host);
    free(rotated);
    return 0;
}
