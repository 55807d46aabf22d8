/* The CPU model runner's small ops as native loops: one call per layer op instead of 5-20 torch ops.
 *
 * Built by kernels/cpu_native.py with -O3 -march=native -ffp-contract=off and called through ctypes with
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

/* A KV pool's element type: the compute dtype's (KV_SAME), or fp8 (--kv-cache-dtype fp8*, kv/fp8.py) read with the
 * layer's K and V scales. */
enum { KV_SAME = 0, KV_E4M3 = 1, KV_E5M2 = 2 };

/* every fp8 byte's value, exact in float32: e4m3fn (bias 7, no infinities, S.1111.111 is NaN) and e5m2 (bias 15) */
static float fp8_values[2][256];

static float fp8_value(unsigned byte, int exp_bits) {
    int man_bits = 7 - exp_bits, bias = (1 << (exp_bits - 1)) - 1;
    unsigned exp = (byte >> man_bits) & ((1u << exp_bits) - 1), man = byte & ((1u << man_bits) - 1);
    float sign = byte & 0x80u ? -1.0f : 1.0f;
    if (exp_bits == 4 && exp == 15 && man == 7) return NAN;
    if (exp_bits == 5 && exp == 31) return man ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexpf((float)man, 1 - bias - man_bits);
    return sign * ldexpf((float)((1u << man_bits) | man), (int)exp - bias - man_bits);
}

__attribute__((constructor)) static void fill_fp8_values(void) {
    for (unsigned b = 0; b < 256; b++) {
        fp8_values[0][b] = fp8_value(b, 4);
        fp8_values[1][b] = fp8_value(b, 5);
    }
}

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

/* float32 -> fp8, rounding to nearest even in the bits, as torch converts (c10's fp8e4m3fn_from_fp32_value and
 * fp8e5m2_from_fp32_value): NaN stays NaN, and for e5m2 what overflows becomes infinity (kv/fp8.py clamps first) */
static uint8_t fp8_from_float(float f, int kv_type) {
    int e4m3 = kv_type == KV_E4M3, drop = e4m3 ? 20 : 21;   /* float32 mantissa bits the format drops */
    uint32_t bits, denorm_bits = e4m3 ? 141u << 23 : 134u << 23;  /* 2^(drop + 1 - min normal exponent) */
    memcpy(&bits, &f, 4);
    uint32_t sign = bits & 0x80000000u;
    bits ^= sign;
    uint8_t code;
    if (e4m3 && bits >= 1087u << 20) {                      /* 480 and above, or NaN: e4m3fn's NaN */
        code = 0x7f;
    } else if (!e4m3 && bits >= 143u << 23) {               /* 65536 and above */
        code = bits > 0x7f800000u ? 0x7f : 0x7c;
    } else if (bits < (e4m3 ? 121u : 113u) << 23) {         /* below the smallest normal: denormals by addition */
        float a, denorm;
        memcpy(&a, &bits, 4);
        memcpy(&denorm, &denorm_bits, 4);
        a += denorm;
        uint32_t sum;
        memcpy(&sum, &a, 4);
        code = (uint8_t)(sum - denorm_bits);
    } else {
        uint32_t odd = (bits >> drop) & 1u;
        bits += ((uint32_t)((e4m3 ? 7 : 15) - 127) << 23) + ((1u << (drop - 1)) - 1u) + odd;
        code = (uint8_t)(bits >> drop);
    }
    return code | (uint8_t)(sign >> 24);
}

/* K and V rows into an fp8 pool (gh_write_kv's layout and arguments, k and v in the compute dtype): each element
 * divided by its scale, clamped to the format's largest finite value and converted — kv/fp8.py's quantize */
void gh_write_kv_fp8(void *k_cache, void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                     int64_t block_size, const void *k, const void *v, int64_t k_tok_stride, int64_t k_head_stride,
                     int64_t v_tok_stride, int64_t v_head_stride, const int64_t *slots, int64_t tokens,
                     int64_t kv_heads, int64_t head_dim, int dtype, int kv_type, const float *kv_scale) {
    float limit = kv_type == KV_E4M3 ? 448.0f : 57344.0f;
    for (int64_t t = 0; t < tokens; t++) {
        int64_t slot = slots[t];
        if (slot < 0) continue;
        int64_t base = (slot / block_size) * block_stride + (slot % block_size) * slot_stride;
        for (int64_t h = 0; h < kv_heads; h++)
            for (int which = 0; which < 2; which++) {
                const void *src = which ? v : k;
                uint8_t *dst = (uint8_t *)(which ? v_cache : k_cache) + base + h * head_stride;
                int64_t from = which ? t * v_tok_stride + h * v_head_stride : t * k_tok_stride + h * k_head_stride;
                for (int64_t d = 0; d < head_dim; d++) {
                    float x = load(src, from + d, dtype) / kv_scale[which];
                    x = x < -limit ? -limit : x > limit ? limit : x;
                    dst[d] = fp8_from_float(x, kv_type);
                }
            }
    }
}

/* a K or V row's n values as float32: read in place from a float32 pool, else widened into buf (load_kv_row) */
INLINE const float *kv_row(float *buf, const void *cache, int64_t at, int64_t n, int dtype, int kv_type, float scale) {
    if (!dtype && kv_type == KV_SAME) return (const float *)cache + at;
    load_kv_row(buf, cache, at, n, dtype, kv_type, scale);
    return buf;
}

/* the float32 values of n fp8 bytes (tests: the table against torch's conversion) */
void gh_fp8_values(const uint8_t *bytes, int64_t n, int kv_type, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = fp8_values[kv_type - 1][bytes[i]];
}

static void silu_rounded(float *restrict g, const float *restrict u, int64_t n, int dtype) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + exp_f32(-g[i]));
    if (dtype)
        for (int64_t i = 0; i < n; i++) g[i] = R(g[i], 1);
    for (int64_t i = 0; i < n; i++) g[i] *= u[i];
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

INLINE float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

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

/* out[r] = w * rms_norm(x[r]) over `dim`, statistics in float32 (x rows `x_stride` elements apart). */
INLINE void gh_rms_norm_impl(const void *x, int64_t rows, int64_t dim, int64_t x_stride, const void *w, void *out,
                 float eps, int dtype, int64_t threads) {
    int64_t team = team_size(threads, rows, rows * dim);
    PARALLEL
    {
        float *row = malloc((size_t)dim * sizeof(float));
        FOR_ROWS
        for (int64_t r = 0; r < rows; r++) {
            load_row(row, x, r * x_stride, dim, dtype);
            float inv = 1.0f / sqrtf(dot(row, row, dim) / (float)dim + eps);
            for (int64_t i = 0; i < dim; i++)
                store(out, r * dim + i, load(w, i, dtype) * R(row[i] * inv, dtype), dtype);
        }
        free(row);
    }
}

/* out[r] = silu(gate) * up over a fused [gate | up] row of 2 * inter elements. */
INLINE void gh_silu_mul_impl(const void *gate_up, int64_t rows, int64_t inter, void *out, int dtype,
                              int64_t threads) {
    int64_t team = team_size(threads, rows, rows * inter);
    PARALLEL
    {
        float *g = malloc((size_t)inter * sizeof(float)), *u = malloc((size_t)inter * sizeof(float));
        FOR_ROWS
        for (int64_t r = 0; r < rows; r++) {
            load_row(g, gate_up, r * 2 * inter, inter, dtype);
            load_row(u, gate_up, r * 2 * inter + inter, inter, dtype);
            silu_rounded(g, u, inter, dtype);
            store_row(out, r * inter, g, inter, dtype);
        }
        free(g);
        free(u);
    }
}

/* One token of rotate-half RoPE (rotary_impl's rows). Always inlined with a literal dtype, so each dtype's loop
 * is its own vectorised code: an OpenMP region is outlined before constants propagate into it, so a dtype
 * branch left inside the region's loop keeps the element loop scalar (bf16 ran at a fifth of float32's rate). */
INLINE void rotary_token(const void *restrict x, int64_t t, int64_t heads, int64_t half, int64_t tok_stride,
                         int64_t head_stride, const void *restrict cos, const void *restrict sin, void *restrict out,
                         int dtype) {
    for (int64_t h = 0; h < heads; h++) {
        int64_t src = t * tok_stride + h * head_stride, dst = (t * heads + h) * 2 * half;
        for (int64_t i = 0; i < half; i++) {
            float c = load(cos, t * half + i, dtype), s = load(sin, t * half + i, dtype);
            float x1 = load(x, src + i, dtype), x2 = load(x, src + half + i, dtype);
            store(out, dst + i, R(x1 * c, dtype) - R(x2 * s, dtype), dtype);
            store(out, dst + half + i, R(x2 * c, dtype) + R(x1 * s, dtype), dtype);
        }
    }
}

/* Rotate-half RoPE: x [T, heads, 2 * half] (strides tok_stride, head_stride; last dim contiguous),
 * cos/sin [T, half] contiguous in x's dtype, out [T, heads, 2 * half] contiguous. */
INLINE void gh_rotary_impl(const void *x, int64_t tokens, int64_t heads, int64_t half, int64_t tok_stride,
               int64_t head_stride, const void *cos, const void *sin, void *out, int dtype, int64_t threads) {
    int64_t team = team_size(threads, tokens, tokens * heads * half);
    PARALLEL
    FOR_ROWS
    for (int64_t t = 0; t < tokens; t++) {
        if (dtype) rotary_token(x, t, heads, half, tok_stride, head_stride, cos, sin, out, 1);
        else rotary_token(x, t, heads, half, tok_stride, head_stride, cos, sin, out, 0);
    }
}

/* Copy new K and V [T, kv_heads, head_dim] (token and head strides in elements; last dim contiguous) to
 * their pool slots. The pool's K and V planes share strides (block, slot within block, head; elements).
 * A negative slot is a padding row: it writes nothing. */
void gh_write_kv(void *k_cache, void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                 int64_t block_size, const void *k, const void *v, int64_t k_tok_stride, int64_t k_head_stride,
                 int64_t v_tok_stride, int64_t v_head_stride, const int64_t *slots, int64_t tokens,
                 int64_t kv_heads, int64_t head_dim, int64_t elem_size) {
    size_t row = (size_t)(head_dim * elem_size);
    for (int64_t t = 0; t < tokens; t++) {
        int64_t slot = slots[t];
        if (slot < 0) continue;
        int64_t base = (slot / block_size) * block_stride + (slot % block_size) * slot_stride;
        for (int64_t h = 0; h < kv_heads; h++) {
            memcpy((char *)k_cache + (base + h * head_stride) * elem_size,
                   (const char *)k + (t * k_tok_stride + h * k_head_stride) * elem_size, row);
            memcpy((char *)v_cache + (base + h * head_stride) * elem_size,
                   (const char *)v + (t * v_tok_stride + h * v_head_stride) * elem_size, row);
        }
    }
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
#define EXT_CHUNK 64   /* keys per pass of the weighted V sum: their V rows stay in L1 between lane tiles */
#define EXT_TILES 4    /* tiles of one (sequence, KV head) per work item, sharing each K row and V chunk loaded */

#if defined(__AVX2__) && defined(__FMA__)
/* r[t] = sum of the 8 lanes of a[t] */
INLINE __m256 sum_lanes8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

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

EXP_LANES(256, exp8)
#endif

#if WIDE
EXP_LANES(512, exp16)
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
#elif defined(__AVX2__) && defined(__FMA__)
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
                         const float *kv_scale, int64_t threads) {
    int64_t group = heads / kv_heads, longest = 0, units = 0, work = 0, elem = kv_elem(kv_type, dtype);
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
                    int64_t at = table[k / block_size] * block_stride + (k % block_size) * slot_stride
                                 + g * head_stride;
                    if (k + KV_AHEAD < most)
                        prefetch_row(k_cache, table, k + KV_AHEAD, block_size, block_stride, slot_stride,
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
                    int64_t at = table[(p0 + p) / block_size] * block_stride + ((p0 + p) % block_size) * slot_stride
                                 + g * head_stride;
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

/* Decode attention over the paged pool: one new query token per sequence, at position seq_len - 1,
 * sees keys 0 .. seq_len - 1. q [B, heads, head_dim] (strides q_seq_stride, q_head_stride), out
 * [B, heads, head_dim] contiguous; the heads of group g = h / (heads / kv_heads) share KV head g. Block
 * tables int32 [B, table_stride], seq_lens int64 [B]. Scores and the weighted sum in float32.
 *
 * A work item is the `rows` = span * group query heads of `span` KV heads of one sequence, its scores head-major
 * (scores[j * len + p]). Each score is score_dot's arithmetic, each head's probabilities are exp_f32's, summed in
 * key order, and its weighted V sum adds key after key: the multi-token kernel's operations in its order, so decode
 * keeps its bits (test_decode_attention_gives_the_extend_kernels_bits). */

/* the pool offset of key p's slot row (KV head 0), and the next key's by stepping through the blocks */
typedef struct {
    const int32_t *table;
    int64_t block, slot, block_size, block_stride, slot_stride;
} SlotWalk;

INLINE SlotWalk slot_walk(const int32_t *table, int64_t p, int64_t block_size, int64_t block_stride,
                          int64_t slot_stride) {
    SlotWalk w = {table, p / block_size, p % block_size, block_size, block_stride, slot_stride};
    return w;
}

INLINE int64_t slot_next(SlotWalk *w) {
    int64_t at = w->table[w->block] * w->block_stride + w->slot * w->slot_stride;
    if (++w->slot == w->block_size) w->slot = 0, w->block++;
    return at;
}

/* One pass of the portable path over the item's keys in order, each slot row (its span KV heads) against every
 * head of the item: the scores (values 0: K rows) or the weighted V sums into acc (values 1: V rows) */
INLINE void keywise_pass(int values, const float *qf, float *acc, float *scores, float *kv, const void *cache,
                         const int32_t *table, int64_t len, int64_t block_size, int64_t block_stride,
                         int64_t slot_stride, int64_t head_stride, int64_t g0, int64_t span, int64_t group,
                         int64_t head_dim, float scale, int dtype, int kv_type, float kv_scale, int64_t elem) {
    SlotWalk walk = slot_walk(table, 0, block_size, block_stride, slot_stride);
    for (int64_t p = 0; p < len; p++) {
        int64_t at = slot_next(&walk) + g0 * head_stride;
        if (p + KV_AHEAD < len)
            prefetch_row(cache, table, p + KV_AHEAD, block_size, block_stride, slot_stride, g0 * head_stride,
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
                                int64_t block_size, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                                int64_t g0, int64_t span, int64_t group, int64_t head_dim, float scale, int dtype,
                                int kv_type, float k_scale, float v_scale, int64_t elem) {
    int64_t rows = span * group;
    keywise_pass(0, qf, acc, scores, kv, k_cache, table, len, block_size, block_stride, slot_stride, head_stride, g0,
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
    keywise_pass(1, qf, acc, scores, kv, v_cache, table, len, block_size, block_stride, slot_stride, head_stride, g0,
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
                              int64_t block_size, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                              int64_t g0, int64_t span, int64_t group, int64_t head_dim, float scale, int dtype,
                              int kv_type, float k_scale, float v_scale, int64_t elem) {
    int64_t rows = span * group;
    __m256 vscale = _mm256_set1_ps(scale);
    const float *keys[EXT_CHUNK];
    SlotWalk walk = slot_walk(table, 0, block_size, block_stride, slot_stride);
    SlotWalk ahead = slot_walk(table, DECODE_AHEAD < len ? DECODE_AHEAD : 0, block_size, block_stride, slot_stride);
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
    walk = slot_walk(table, 0, block_size, block_stride, slot_stride);
    ahead = slot_walk(table, DECODE_AHEAD < len ? DECODE_AHEAD : 0, block_size, block_stride, slot_stride);
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
                         int64_t threads) {
    int64_t group = heads / kv_heads, longest = 0, keys = 0, elem = kv_elem(kv_type, dtype);
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
                                  block_stride, slot_stride, head_stride, g0, span, group, head_dim, scale, dtype,
                                  kv_type, k_scale, v_scale, elem);
            else
#endif
                decode_item_keywise(qf, acc, scores, sums, rows_f, k_cache, v_cache, table, len, block_size,
                                    block_stride, slot_stride, head_stride, g0, span, group, head_dim, scale, dtype,
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

/* Public entry points: each calls its always-inline body with a constant dtype, so the compiler builds
 * (and vectorises) a float32 and a bfloat16 version instead of branching per element. */
#define BY_DTYPE(call) do { if (dtype) call(1); else call(0); } while (0)

void gh_rms_norm(const void *x, int64_t rows, int64_t dim, int64_t x_stride, const void *w, void *out, float eps,
                 int dtype, int64_t threads) {
#define CALL(d) gh_rms_norm_impl(x, rows, dim, x_stride, w, out, eps, d, threads)
    BY_DTYPE(CALL);
#undef CALL
}

void gh_silu_mul(const void *gate_up, int64_t rows, int64_t inter, void *out, int dtype, int64_t threads) {
#define CALL(d) gh_silu_mul_impl(gate_up, rows, inter, out, d, threads)
    BY_DTYPE(CALL);
#undef CALL
}

void gh_rotary(const void *x, int64_t tokens, int64_t heads, int64_t half, int64_t tok_stride, int64_t head_stride,
               const void *cos, const void *sin, void *out, int dtype, int64_t threads) {
#define CALL(d) gh_rotary_impl(x, tokens, heads, half, tok_stride, head_stride, cos, sin, out, d, threads)
    BY_DTYPE(CALL);
#undef CALL
}

void gh_decode_attention(const void *q, int64_t q_seq_stride, int64_t q_head_stride, const void *k_cache,
                         const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                         int64_t block_size, const int32_t *block_tables, int64_t table_stride,
                         const int64_t *seq_lens, int64_t num_seqs, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, float scale, void *out, int dtype, int kv_type, const float *kv_scale,
                         int64_t threads) {
    /* the common head sizes as constants: the per-key dot products and updates unroll completely */
#define CALL_DIM(dim, d) gh_decode_attention_impl(q, q_seq_stride, q_head_stride, k_cache, v_cache, block_stride, \
                                                  slot_stride, head_stride, block_size, block_tables, table_stride, \
                                                  seq_lens, num_seqs, heads, kv_heads, dim, scale, out, d, kv_type, \
                                                  kv_scale, threads)
#define CALL_64(d) CALL_DIM(64, d)
#define CALL_128(d) CALL_DIM(128, d)
#define CALL_ANY(d) CALL_DIM(head_dim, d)
    if (head_dim == 64) BY_DTYPE(CALL_64);
    else if (head_dim == 128) BY_DTYPE(CALL_128);
    else BY_DTYPE(CALL_ANY);
}

int gh_extend_attention(const void *q, int64_t q_tok_stride, int64_t q_head_stride, const void *k_cache,
                         const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                         int64_t block_size, const int32_t *block_tables, int64_t table_stride,
                         const int64_t *seq_lens, const int64_t *query_starts, int64_t num_seqs, int64_t heads,
                         int64_t kv_heads, int64_t head_dim, float scale, void *out, int dtype, int kv_type,
                         const float *kv_scale, int64_t threads) {
#undef CALL_DIM
#define CALL_DIM(dim, d) return gh_extend_attention_impl(q, q_tok_stride, q_head_stride, k_cache, v_cache, \
                                                         block_stride, slot_stride, head_stride, block_size, \
                                                         block_tables, table_stride, seq_lens, query_starts, \
                                                         num_seqs, heads, kv_heads, dim, scale, out, d, kv_type, \
                                                         kv_scale, threads)
    if (head_dim == 64) BY_DTYPE(CALL_64);
    if (head_dim == 128) BY_DTYPE(CALL_128);
    BY_DTYPE(CALL_ANY);
#undef CALL_DIM
}

/* A decode step's attention for one layer in one call, from the fused qkv projection: RoPE on the query and
 * key heads, the new K and V into their pool slots, then decode attention. The same bodies as gh_rotary,
 * gh_write_kv and gh_decode_attention on the same values, so the same bits as the three calls; one call
 * saves the two round trips through Python per layer. qkv [T, (heads + 2 kv_heads) * head_dim] (row stride
 * qkv_stride), one token per sequence in sequence order; out [T, heads, head_dim]. Returns -1 when the
 * scratch row could not be allocated. */
int gh_decode_attention_block(const void *qkv, int64_t qkv_stride, const void *cos, const void *sin, void *k_cache,
                              void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                              int64_t block_size, const int64_t *slots, const int32_t *block_tables,
                              int64_t table_stride, const int64_t *seq_lens, int64_t num_seqs, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, float scale, void *out, int dtype, int kv_type,
                              const float *kv_scale, int64_t threads) {
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
                        head_dim, scale, out, dtype, kv_type, kv_scale, threads);
    free(rotated);
    return 0;
}
