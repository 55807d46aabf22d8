/* y = x W^T for a weight-only quantized W (gh200rt/formats/pack.py's PackedWeight int8 / int4: GGUF Q8_0 / Q4_0 /
 * Q4_1 without loss) and float32 activations, reading the packed bytes directly.
 *
 * Integer dot products, the way llama.cpp multiplies its blocks, but with 16-bit activations: each row of x
 * is rounded to int16 per block of 32 columns (scale = the block's largest |x| / 32767, so every element
 * keeps an absolute error below 1/65534 of that largest value: ~30x finer than rounding the weights to
 * fp16), codes times int16 sum exactly in int32 (vpmaddwd), and each block's sum enters a float32
 * accumulator scaled by weight scale x block scale. int4 codes are centred (q - 8); the group's minimum
 * plus 8 scales multiplies the float32 sum of x over the group. Per output: 8 float lanes along K, then one fixed horizontal sum, whatever the number
 * of rows or threads; a row's result depends on that row alone (rows never mix, each row is rounded on its
 * own), so batching and the split between threads change no bits.
 *
 * Work is split over blocks of NB output channels. One row: codes are widened in registers. More rows: a
 * block's codes are widened once into a per-thread int16 buffer that every row reads (the same operations
 * on the same values, so the same bits as one row alone).
 *
 * Threads: OpenMP, when built with it (gh200rt/backends/cpu/native.py links the libgomp torch already loaded, so
 * these regions run on torch's own thread pool instead of a second pool spinning against it).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "gh_native.h"
#ifdef __AVX2__
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif
#ifdef _OPENMP
#include <omp.h>
static inline int64_t thread_index(void) { return omp_get_thread_num(); }
#else
static inline int64_t thread_index(void) { return 0; }
#endif

#define NB 4      /* output channels per block */
#define CHUNK 32  /* columns per activation block */
#define INLINE static inline __attribute__((always_inline))

typedef struct {
    const uint8_t *q;        /* int8 [N, K] (fmt 0); uint8 [N, K/2], column k in byte k/2, low nibble even k (fmt 1);
                              * or fmt 1's codes widened (fmt 2): int8 [N, K] holding q - 8 in chunk order (below) */
    const float *scale;      /* [N, groups] */
    const float *minimum;    /* [N, groups] (int4) or NULL */
    int64_t k, group, groups, fmt;
} Weight;

typedef struct {             /* the rows of x as the kernel reads them */
    const int16_t *q;        /* [rows][k] int16, in chunk order (below) */
    const float *scale;      /* [rows][k / CHUNK] */
    const float *sum;        /* [rows][groups]: float32 sum of x over each weight group (int4), else NULL */
    int64_t k, groups;
} Rows;

/* Chunk order of the int16 activations: int8 weights keep column order; an int4 chunk is stored as its 16
 * even columns then its 16 odd ones, the order a byte's low and high nibbles come out in. Widened int4 codes
 * (fmt 2) are stored in that order too, so they load as int8 codes do and fill the same integer lanes as the
 * nibbles: the same bits, without unpacking nibbles on every call (faster where the vector units, not the
 * memory, bound a row: 128-bit units). */
static void quantize_rows(const float *x, int64_t rows, int64_t x_stride, int64_t k, int fmt, int64_t group,
                          int16_t *xq, float *xscale, float *xsum) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * x_stride;
        for (int64_t c = 0; c < k; c += CHUNK) {
            float amax = 0.0f;
            for (int i = 0; i < CHUNK; i++) amax = fmaxf(amax, fabsf(row[c + i]));
            float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
            xscale[r * (k / CHUNK) + c / CHUNK] = amax / 32767.0f;
            int16_t *dst = xq + r * k + c;
            for (int i = 0; i < CHUNK; i++) {
                float v = nearbyintf(row[c + i] * inv);
                v = v > 32767.0f ? 32767.0f : (v < -32767.0f ? -32767.0f : v);
                int pos = fmt ? (i & 1) * (CHUNK / 2) + i / 2 : i;
                dst[pos] = (int16_t)v;
            }
        }
        if (xsum)
            for (int64_t g = 0; g < k / group; g++) {
                float t = 0.0f;
                for (int64_t c = g * group; c < (g + 1) * group; c++) t += row[c];
                xsum[r * (k / group) + g] = t;
            }
    }
}

/* int4 codes enter the integer products centred (q - 8, so that their common offset does not ride on the
 * rounded x); the offset's share, (minimum + 8 scale) times the float32 sum of x, is added here */
INLINE float minimum_term(const Weight *w, int64_t n, const float *xsum) {
    float t = 0.0f;
    if (w->minimum)
        for (int64_t g = 0; g < w->groups; g++) {
            float offset = w->minimum[n * w->groups + g] + 8.0f * w->scale[n * w->groups + g];
            t += offset * xsum[g];
        }
    return t;
}

/* the code of column col of row n, centred (q - 8 for int4), in any format */
INLINE int code_at(const Weight *w, int64_t n, int64_t col) {
    if (w->fmt == 2) {
        int64_t i = col % CHUNK;
        return ((const int8_t *)w->q)[n * w->k + col - i + (i & 1) * (CHUNK / 2) + i / 2];
    }
    return w->fmt == 0 ? ((const int8_t *)w->q)[n * w->k + col]
                       : ((w->q[n * (w->k / 2) + col / 2] >> ((col & 1) * 4)) & 0x0f) - 8;
}

#ifdef __AVX2__
#define QUANT_VECTOR 1
typedef __m256 lanes8;                     /* 8 float32 lanes */
typedef struct { __m256i a, b; } codes32;  /* a chunk's 32 int16 values, in chunk order */
typedef __m256 scale8;                     /* a chunk's x scale in every lane */

INLINE lanes8 lanes_zero(void) { return _mm256_setzero_ps(); }

INLINE float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  /* lanes i + (i + 4) */
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));                                          /* + (i + 2) */
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

INLINE void prefetch_line(const char *p) { _mm_prefetch(p, _MM_HINT_T0); }

INLINE scale8 load_scale(const float *p) { return _mm256_broadcast_ss(p); }

INLINE codes32 load_codes(const int16_t *p) {
    codes32 v = {_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 16))};
    return v;
}

INLINE void store_codes(int16_t *p, codes32 v) {
    _mm256_storeu_si256((__m256i *)p, v.a);
    _mm256_storeu_si256((__m256i *)(p + 16), v.b);
}

/* the 32 codes of row n at chunk c as two vectors of 16 int16, in chunk order */
INLINE codes32 codes(const Weight *w, int fmt, int64_t n, int64_t c) {
    codes32 v;
    if (fmt) {
        __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w->q + n * (w->k >> 1) + (c >> 1))));
        v.a = _mm256_sub_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x0f)), _mm256_set1_epi16(8));
        v.b = _mm256_sub_epi16(_mm256_srli_epi16(u, 4), _mm256_set1_epi16(8));
    } else {
        const uint8_t *p = w->q + n * w->k + c;
        v.a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
        v.b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
    }
    return v;
}

/* acc += (codes . x over the chunk, in 8 int32 lanes) * (weight scale * x scale) */
INLINE __m256 chunk_dot(codes32 w, codes32 x, float wscale, __m256 xscale, __m256 acc) {
    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w.a, x.a), _mm256_madd_epi16(w.b, x.b));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(_mm256_set1_ps(wscale), xscale), acc);
}

/* minimum_term of the NB channels from n0 at once, one channel per lane: each lane runs minimum_term's operations
 * in its order (so its bits), and the NB dependent chains of adds overlap */
INLINE void minimum_terms(const Weight *w, int64_t n0, const float *xsum, float *term) {
    const float *mn = w->minimum + n0 * w->groups, *sc = w->scale + n0 * w->groups;
    int64_t gs = w->groups;
    __m128 t = _mm_setzero_ps(), eight = _mm_set1_ps(8.0f);
    for (int64_t g = 0; g < gs; g++) {
        __m128 m = _mm_set_ps(mn[3 * gs + g], mn[2 * gs + g], mn[gs + g], mn[g]);
        __m128 s = _mm_set_ps(sc[3 * gs + g], sc[2 * gs + g], sc[gs + g], sc[g]);
        t = _mm_add_ps(t, _mm_mul_ps(_mm_add_ps(m, _mm_mul_ps(eight, s)), _mm_set1_ps(xsum[g])));
    }
    _mm_storeu_ps(term, t);
}
#elif defined(__ARM_NEON)
/* The AVX2 path's arithmetic in NEON registers: the same int32 lanes (a lane sums codes 2i and 2i + 1 of each
 * half of the chunk, as vpmaddwd pairs them; integer sums are exact, so only which products share a lane matters),
 * the same fused multiply-add per lane and the same horizontal sum, so the AVX2 build's bits. */
#define QUANT_VECTOR 1
typedef struct { float32x4_t lo, hi; } lanes8;   /* lanes 0-3, 4-7 */
typedef struct { int16x8_t v[4]; } codes32;      /* a chunk's 32 int16 values, in chunk order */
typedef float32x4_t scale8;                      /* a chunk's x scale in every lane */

INLINE lanes8 lanes_zero(void) {
    lanes8 z = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    return z;
}

INLINE float hsum8(lanes8 v) {
    float32x4_t s = vaddq_f32(v.lo, v.hi);                          /* lanes i + (i + 4) */
    float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));   /* + (i + 2) */
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

INLINE void prefetch_line(const char *p) { __builtin_prefetch(p, 0, 3); }

INLINE scale8 load_scale(const float *p) { return vld1q_dup_f32(p); }

INLINE codes32 load_codes(const int16_t *p) {
    codes32 v = {{vld1q_s16(p), vld1q_s16(p + 8), vld1q_s16(p + 16), vld1q_s16(p + 24)}};
    return v;
}

INLINE void store_codes(int16_t *p, codes32 v) {
    for (int i = 0; i < 4; i++) vst1q_s16(p + 8 * i, v.v[i]);
}

INLINE codes32 codes(const Weight *w, int fmt, int64_t n, int64_t c) {
    codes32 v;
    if (fmt) {
        uint8x16_t u = vld1q_u8(w->q + n * (w->k >> 1) + (c >> 1));
        uint8x16_t low = vandq_u8(u, vdupq_n_u8(0x0f)), high = vshrq_n_u8(u, 4);
        int16x8_t eight = vdupq_n_s16(8);
        v.v[0] = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(low))), eight);
        v.v[1] = vsubq_s16(vreinterpretq_s16_u16(vmovl_high_u8(low)), eight);
        v.v[2] = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(high))), eight);
        v.v[3] = vsubq_s16(vreinterpretq_s16_u16(vmovl_high_u8(high)), eight);
    } else {
        const int8_t *p = (const int8_t *)w->q + n * w->k + c;
        int8x16_t a = vld1q_s8(p), b = vld1q_s8(p + 16);
        v.v[0] = vmovl_s8(vget_low_s8(a)), v.v[1] = vmovl_high_s8(a);
        v.v[2] = vmovl_s8(vget_low_s8(b)), v.v[3] = vmovl_high_s8(b);
    }
    return v;
}

/* vpmaddwd on 8 int16: lane i = a[2i] x[2i] + a[2i + 1] x[2i + 1] */
INLINE int32x4_t pair_products(int16x8_t a, int16x8_t x) {
    return vpaddq_s32(vmull_s16(vget_low_s16(a), vget_low_s16(x)), vmull_high_s16(a, x));
}

INLINE lanes8 chunk_dot(codes32 w, codes32 x, float wscale, scale8 xscale, lanes8 acc) {
    int32x4_t lo = vaddq_s32(pair_products(w.v[0], x.v[0]), pair_products(w.v[2], x.v[2]));
    int32x4_t hi = vaddq_s32(pair_products(w.v[1], x.v[1]), pair_products(w.v[3], x.v[3]));
    float32x4_t scale = vmulq_f32(vdupq_n_f32(wscale), xscale);
    lanes8 r = {vfmaq_f32(acc.lo, vcvtq_f32_s32(lo), scale), vfmaq_f32(acc.hi, vcvtq_f32_s32(hi), scale)};
    return r;
}

INLINE void minimum_terms(const Weight *w, int64_t n0, const float *xsum, float *term) {
    const float *mn = w->minimum + n0 * w->groups, *sc = w->scale + n0 * w->groups;
    int64_t gs = w->groups;
    float32x4_t t = vdupq_n_f32(0.0f), eight = vdupq_n_f32(8.0f);
    for (int64_t g = 0; g < gs; g++) {
        float m4[4] = {mn[g], mn[gs + g], mn[2 * gs + g], mn[3 * gs + g]};
        float s4[4] = {sc[g], sc[gs + g], sc[2 * gs + g], sc[3 * gs + g]};
        float32x4_t offset = vaddq_f32(vld1q_f32(m4), vmulq_f32(eight, vld1q_f32(s4)));
        t = vaddq_f32(t, vmulq_f32(offset, vdupq_n_f32(xsum[g])));
    }
    vst1q_f32(term, t);
}
#else
#define QUANT_VECTOR 0
#endif

#if QUANT_VECTOR
/* row r of x against channels n0..n0+nb-1; codes from the packed weight (buf NULL) or widened in buf */
INLINE void row_block(const Weight *w, int fmt, const Rows *x, int64_t r, int64_t n0, int nb, int from_buf,
                      const int16_t *buf, float *out) {
    lanes8 acc[NB];
    for (int j = 0; j < NB; j++) acc[j] = lanes_zero();
    const int16_t *xq = x->q + r * x->k;
    const float *xs = x->scale + r * (x->k / CHUNK);
    /* the next block's codes, one or two cache lines per chunk (a block of int4 codes spans k / 32 lines,
     * one of int8 codes twice that): the hardware prefetcher does not follow NB rows at once */
    const char *ahead = (const char *)w->q + (n0 + NB) * (fmt ? w->k >> 1 : w->k);
    int64_t g = 0, group_end = w->group;
    for (int64_t c = 0, i = 0; c < w->k; c += CHUNK, i++) {
        if (c == group_end) {
            g++;
            group_end += w->group;
        }
        if (!from_buf) {
            prefetch_line(ahead + (fmt ? i : 2 * i) * 64);
            if (!fmt) prefetch_line(ahead + (2 * i + 1) * 64);
        }
        codes32 xv = load_codes(xq + c);
        scale8 xscale = load_scale(xs + i);
        for (int j = 0; j < nb; j++) {
            codes32 wv;
            if (from_buf) wv = load_codes(buf + j * w->k + c);
            else wv = codes(w, fmt, n0 + j, c);
            acc[j] = chunk_dot(wv, xv, w->scale[(n0 + j) * w->groups + g], xscale, acc[j]);
        }
    }
    if (x->sum && nb == NB) {
        float term[NB];
        minimum_terms(w, n0, x->sum + r * x->groups, term);
        for (int j = 0; j < NB; j++) out[n0 + j] = hsum8(acc[j]) + term[j];
        return;
    }
    for (int j = 0; j < nb; j++)
        out[n0 + j] = hsum8(acc[j]) + (x->sum ? minimum_term(w, n0 + j, x->sum + r * x->groups) : 0.0f);
}

/* fmt a compile-time constant in each instance: no format test inside the loops */
INLINE void block_of(const Weight *w, int fmt, const Rows *x, int64_t rows, int64_t n0, int nb, float *out,
                     int64_t out_stride, int16_t *buf) {
    if (rows == 1) {
        if (nb == NB) row_block(w, fmt, x, 0, n0, NB, 0, NULL, out);
        else for (int j = 0; j < nb; j++) row_block(w, fmt, x, 0, n0 + j, 1, 0, NULL, out);
        return;
    }
    for (int j = 0; j < nb; j++)
        for (int64_t c = 0; c < w->k; c += CHUNK) store_codes(buf + j * w->k + c, codes(w, fmt, n0 + j, c));
    for (int64_t r = 0; r < rows; r++) {
        if (nb == NB) row_block(w, fmt, x, r, n0, NB, 1, buf, out + r * out_stride);
        else for (int j = 0; j < nb; j++) row_block(w, fmt, x, r, n0 + j, 1, 1, buf + j * w->k, out + r * out_stride);
    }
}

static void block(const Weight *w, const Rows *x, int64_t rows, int64_t n0, int nb, float *out, int64_t out_stride,
                  int16_t *buf) {
    /* widened codes (fmt 2) load as int8 codes (fmt 0) do; their minimum terms come with x->sum */
    if (w->fmt == 1) block_of(w, 1, x, rows, n0, nb, out, out_stride, buf);
    else block_of(w, 0, x, rows, n0, nb, out, out_stride, buf);
}
#else
/* Portable form: the same rounding of x and the same integer products, one float32 chain per output. */
static void block(const Weight *w, const Rows *x, int64_t rows, int64_t n0, int nb, float *out, int64_t out_stride,
                  int16_t *buf) {
    (void)buf;
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < nb; j++) {
            int64_t n = n0 + j;
            float acc = 0.0f;
            for (int64_t c = 0; c < w->k; c += CHUNK) {
                int32_t dot = 0;
                for (int i = 0; i < CHUNK; i++) {
                    int pos = w->fmt ? (i & 1) * (CHUNK / 2) + i / 2 : i;
                    dot += code_at(w, n, c + i) * x->q[r * x->k + c + pos];
                }
                acc = fmaf((float)dot, w->scale[n * w->groups + c / w->group] * x->scale[r * (x->k / CHUNK) + c / CHUNK],
                           acc);
            }
            out[r * out_stride + n] = acc + (x->sum ? minimum_term(w, n, x->sum + r * x->groups) : 0.0f);
        }
}
#endif

/* out[rows, n] = x[rows, k] W^T (+ the int4 minimum terms). fmt 0: int8 q [n, k]; fmt 1: int4 q [n, k/2] with
 * minimum; fmt 2: fmt 1's codes widened to int8 [n, k] (Weight.q), with minimum, fmt 1's bits. group is a
 * multiple of 32, k a multiple of group. Returns 0, or -1 when the buffers could not be
 * allocated. */
int gh_quant_linear(const float *x, int64_t rows, int64_t x_stride, const WeightArgs *args, float *out,
                    int64_t out_stride, int64_t threads) {
    int64_t fmt = args->fmt, n = args->n, k = args->k, group = args->group;
    Weight w = {args->q, args->scale, fmt == 0 ? NULL : args->minimum, k, group, k / group, fmt};
    int64_t blocks = (n + NB - 1) / NB;
    if (threads < 1) threads = 1;
    int64_t groups = k / group, with_sum = w.minimum != NULL;
    size_t floats = (size_t)(rows * (k / CHUNK) + (with_sum ? rows * groups : 0));
    size_t shorts = (size_t)(rows * k + (rows > 1 ? threads * NB * k : 0));
    float *fbuf = malloc(floats * sizeof(float) + 32);
    int16_t *sbuf = malloc(shorts * sizeof(int16_t) + 32);
    if (!fbuf || !sbuf) {
        free(fbuf);
        free(sbuf);
        return -1;
    }
    quantize_rows(x, rows, x_stride, k, (int)fmt, group, sbuf, fbuf, with_sum ? fbuf + rows * (k / CHUNK) : NULL);
    Rows xr = {sbuf, fbuf, with_sum ? fbuf + rows * (k / CHUNK) : NULL, k, groups};
    int16_t *widened = sbuf + rows * k;
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * NB;
        int nb = (int)(n - n0 < NB ? n - n0 : NB);
        block(&w, &xr, rows, n0, nb, out, out_stride, rows > 1 ? widened + thread_index() * NB * k : NULL);
    }
    free(fbuf);
    free(sbuf);
    return 0;
}

/* The dense float32 [n, k] weight with PackedWeight.dequantize()'s bits (q * scale, then + minimum), for row
 * counts a GEMM serves better. */
void gh_dequantize(const WeightArgs *args, float *out, int64_t threads) {
    int64_t fmt = args->fmt, n = args->n, k = args->k, group = args->group;
    const uint8_t *q = args->q;
    const float *scale = args->scale;
    Weight w = {q, scale, fmt == 0 ? NULL : args->minimum, k, group, k / group, fmt};
    (void)threads;
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
    for (int64_t row = 0; row < n; row++)
        for (int64_t g = 0; g < w.groups; g++) {
            float s = scale[row * w.groups + g], m = w.minimum ? w.minimum[row * w.groups + g] : 0.0f;
            float *o = out + row * k + g * group;
            if (fmt == 0) {
                const int8_t *p = (const int8_t *)q + row * k + g * group;
                for (int64_t c = 0; c < group; c++) o[c] = (float)p[c] * s;
            } else if (fmt == 1) {
                const uint8_t *p = q + row * (k / 2) + g * group / 2;
                for (int64_t c = 0; c < group; c += 2) {
                    o[c] = (float)(p[c / 2] & 0x0f) * s + m;
                    o[c + 1] = (float)(p[c / 2] >> 4) * s + m;
                }
            } else {
                for (int64_t c = 0; c < group; c++) o[c] = (float)(code_at(&w, row, g * group + c) + 8) * s + m;
            }
        }
}
