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
    const uint8_t *q;        /* int8 [N, K] (fmt 0) or uint8 [N, K/2], column k in byte k/2, low nibble even k */
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
 * even columns then its 16 odd ones, the order a byte's low and high nibbles come out in. */
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

#ifdef __AVX2__
INLINE float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  /* lanes i + (i + 4) */
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));                                          /* + (i + 2) */
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* the 32 codes of row n at chunk c as two vectors of 16 int16, in chunk order */
INLINE void codes(const Weight *w, int fmt, int64_t n, int64_t c, __m256i *a, __m256i *b) {
    if (fmt) {
        __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w->q + n * (w->k >> 1) + (c >> 1))));
        *a = _mm256_sub_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x0f)), _mm256_set1_epi16(8));
        *b = _mm256_sub_epi16(_mm256_srli_epi16(v, 4), _mm256_set1_epi16(8));
    } else {
        const uint8_t *p = w->q + n * w->k + c;
        *a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
        *b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
    }
}

/* acc += (codes . x over the chunk, in 8 int32 lanes) * (weight scale * x scale) */
INLINE __m256 chunk_dot(__m256i a, __m256i b, __m256i xa, __m256i xb, float wscale, __m256 xscale, __m256 acc) {
    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(a, xa), _mm256_madd_epi16(b, xb));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(_mm256_set1_ps(wscale), xscale), acc);
}

/* row r of x against channels n0..n0+nb-1; codes from the packed weight (buf NULL) or widened in buf */
INLINE void row_block(const Weight *w, int fmt, const Rows *x, int64_t r, int64_t n0, int nb, int from_buf,
                      const int16_t *buf, float *out) {
    __m256 acc[NB];
    for (int j = 0; j < NB; j++) acc[j] = _mm256_setzero_ps();
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
            _mm_prefetch(ahead + (fmt ? i : 2 * i) * 64, _MM_HINT_T0);
            if (!fmt) _mm_prefetch(ahead + (2 * i + 1) * 64, _MM_HINT_T0);
        }
        __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + c));
        __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + c + 16));
        __m256 xscale = _mm256_broadcast_ss(xs + i);
        for (int j = 0; j < nb; j++) {
            __m256i a, b;
            if (from_buf) {
                a = _mm256_loadu_si256((const __m256i *)(buf + j * w->k + c));
                b = _mm256_loadu_si256((const __m256i *)(buf + j * w->k + c + 16));
            } else {
                codes(w, fmt, n0 + j, c, &a, &b);
            }
            acc[j] = chunk_dot(a, b, xa, xb, w->scale[(n0 + j) * w->groups + g], xscale, acc[j]);
        }
    }
    if (x->sum && nb == NB) {
        /* minimum_term of the NB channels at once, one channel per lane: each lane runs minimum_term's
         * operations in its order (so its bits), and the NB dependent chains of adds overlap */
        const float *xsum = x->sum + r * x->groups;
        const float *mn = w->minimum + n0 * w->groups, *sc = w->scale + n0 * w->groups;
        int64_t gs = w->groups;
        __m128 t = _mm_setzero_ps(), eight = _mm_set1_ps(8.0f);
        for (int64_t g = 0; g < gs; g++) {
            __m128 m = _mm_set_ps(mn[3 * gs + g], mn[2 * gs + g], mn[gs + g], mn[g]);
            __m128 s = _mm_set_ps(sc[3 * gs + g], sc[2 * gs + g], sc[gs + g], sc[g]);
            t = _mm_add_ps(t, _mm_mul_ps(_mm_add_ps(m, _mm_mul_ps(eight, s)), _mm_set1_ps(xsum[g])));
        }
        float term[NB];
        _mm_storeu_ps(term, t);
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
        for (int64_t c = 0; c < w->k; c += CHUNK) {
            __m256i a, b;
            codes(w, fmt, n0 + j, c, &a, &b);
            _mm256_storeu_si256((__m256i *)(buf + j * w->k + c), a);
            _mm256_storeu_si256((__m256i *)(buf + j * w->k + c + 16), b);
        }
    for (int64_t r = 0; r < rows; r++) {
        if (nb == NB) row_block(w, fmt, x, r, n0, NB, 1, buf, out + r * out_stride);
        else for (int j = 0; j < nb; j++) row_block(w, fmt, x, r, n0 + j, 1, 1, buf + j * w->k, out + r * out_stride);
    }
}

static void block(const Weight *w, const Rows *x, int64_t rows, int64_t n0, int nb, float *out, int64_t out_stride,
                  int16_t *buf) {
    if (w->fmt) block_of(w, 1, x, rows, n0, nb, out, out_stride, buf);
    else block_of(w, 0, x, rows, n0, nb, out, out_stride, buf);
}
#else
/* Portable form: the same rounding of x and the same integer products, one float32 chain per output. */
INLINE int code_at(const Weight *w, int64_t n, int64_t col) {
    return w->fmt == 0 ? ((const int8_t *)w->q)[n * w->k + col]
                       : ((w->q[n * (w->k / 2) + col / 2] >> ((col & 1) * 4)) & 0x0f) - 8;
}

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
 * minimum. group is a multiple of 32, k a multiple of group. Returns 0, or -1 when the buffers could not be
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
            } else {
                const uint8_t *p = q + row * (k / 2) + g * group / 2;
                for (int64_t c = 0; c < group; c += 2) {
                    o[c] = (float)(p[c / 2] & 0x0f) * s + m;
                    o[c + 1] = (float)(p[c / 2] >> 4) * s + m;
                }
            }
        }
}
