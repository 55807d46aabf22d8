/* y = x W^T (+ b) for float32 x and an fp8 (e4m3fn) W [n, k] with float32 scales per channel and group of columns
 * (an FP8 checkpoint's weights: DeepSeek's 128 x 128 blocks, or one scale per channel), read in place, for the few
 * rows of a decode step.
 *
 * Without it a CPU linear over fp8 bytes dequantizes the whole weight to float32 on every call (four bytes written
 * and read again per byte of weight) before multiplying; here 8 codes are widened in registers to the float32
 * value PackedWeight.dequantize gives them (the code's exact value times its scale, one rounding) and enter
 * f32_linear.c's accumulator: 8 lanes along K, one FMA per 8 columns, one fixed horizontal sum, the K % 8 tail in
 * order, then the bias. So a call gives, bit for bit, what f32_linear gives over the dequantized weight, and a
 * row's result depends on that row and the weight alone (not on the batch or the thread count).
 *
 * Scales change every `group` columns (a multiple of 8, or the whole row).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "f32_acc.h"
#include "gh_native.h"

#define NB ACC_BLOCK /* output channels per block (a thread's unit of work) */
#define RT 4        /* rows per group above one row */
#define CT 3        /* channels per tile of a row group above one row */
#define F8_INLINE static inline __attribute__((always_inline))

typedef struct {
    const uint8_t *q;        /* codes [n, k], row stride w_stride */
    const float *scale;      /* [n, scale_stride]: column i of channel c has scale[c * scale_stride + i / group] */
    int64_t scale_stride, group;
} Fp8Weight;

/* the float32 value of an e4m3fn code (exact) */
F8_INLINE float fp8_value(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80u) << 24, em = code & 0x7fu, bits;
    float f;
    if (em == 0x7fu) return NAN;
    if (em < 8u) {                                   /* subnormal: mantissa x 2^-9 */
        f = (float)em * 0x1p-9f;
        return sign ? -f : f;
    }
    bits = sign | ((em << 20) + (120u << 23));
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* 8 codes times their scale, as float32 (each product rounded once, as dequantize rounds it). The vector paths
 * move each code's bits into a binary16 (sign to bit 15, exponent and mantissa to bits 7-13: the code's value
 * times 2^-8, a subnormal code a subnormal half; 0x7f / 0xff get an all-ones exponent, NaN), widen it exactly
 * (F16C, NEON's FCVTL) and multiply by `scale256` = scale x 2^8: the same real product as value x scale, so the
 * same rounding (for any scale below 2^119). */
#if ACC_VECTOR && defined(__AVX2__) && defined(__F16C__)
F8_INLINE acc_t widen(const uint8_t *q, float scale256) {
    __m128i t = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)q));   /* code << 8 */
    __m128i bits = _mm_and_si128(_mm_srai_epi16(t, 1), _mm_set1_epi16((short)0xbfff));
    __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(bits, _mm_set1_epi16(0x7f80)), _mm_set1_epi16(0x3f80));
    bits = _mm_or_si128(bits, _mm_and_si128(nan, _mm_set1_epi16(0x7c00)));
    return _mm256_mul_ps(_mm256_cvtph_ps(bits), _mm256_set1_ps(scale256));
}
#elif ACC_VECTOR && defined(__ARM_NEON)
F8_INLINE acc_t widen(const uint8_t *q, float scale256) {
    int16x8_t t = vreinterpretq_s16_u16(vshll_n_u8(vld1_u8(q), 8));                            /* code << 8 */
    uint16x8_t bits = vandq_u16(vreinterpretq_u16_s16(vshrq_n_s16(t, 1)), vdupq_n_u16(0xbfff));
    uint16x8_t nan = vceqq_u16(vandq_u16(bits, vdupq_n_u16(0x7f80)), vdupq_n_u16(0x3f80));
    bits = vorrq_u16(bits, vandq_u16(nan, vdupq_n_u16(0x7c00)));
    float32x4_t s = vdupq_n_f32(scale256);
    acc_t a = {vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(bits))), s),
               vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(bits))), s)};
    return a;
}
#else
F8_INLINE acc_t widen(const uint8_t *q, float scale256) {
    float f[8];
    for (int l = 0; l < 8; l++) f[l] = fp8_value(q[l]) * 0x1p-8f * scale256;   /* x 2^-8 exact: value x scale */
    return acc_load(f);
}
#endif

/* the end of one output: horizontal sum, the K % 8 tail in column order, the bias */
F8_INLINE float finish(acc_t acc, const float *x, const uint8_t *q, const float *scale, int64_t group, int64_t k8,
                       int64_t k, const float *bias, int64_t c) {
    float s = acc_sum(acc);
    for (int64_t i = k8; i < k; i++) {
        float w = fp8_value(q[i]) * scale[i / group];
        s += w * x[i];
    }
    return bias ? s + bias[c] : s;
}

/* R rows (R <= RT) against C channels (C <= NB) from channel c: each widened weight vector serves the R rows */
F8_INLINE void tile(const float *x, int64_t x_stride, const Fp8Weight *w, int64_t w_stride, int64_t k,
                    const float *bias, int64_t c, float *o, int64_t o_stride, const int R, const int C) {
    int64_t k8 = k & ~(int64_t)7;
    const uint8_t *q = w->q + c * w_stride;
    const float *scale = w->scale + c * w->scale_stride;
    acc_t a[RT][NB];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < C; j++) a[r][j] = acc_zero();
    for (int64_t g0 = 0; g0 < k8; g0 += w->group) {
        int64_t end = g0 + w->group < k8 ? g0 + w->group : k8;
        float s[NB];
        for (int j = 0; j < C; j++) s[j] = scale[j * w->scale_stride + g0 / w->group] * 256.0f;
        for (int64_t i = g0; i < end; i += 8) {
            acc_t v[NB];
#pragma GCC unroll 8
            for (int j = 0; j < C; j++) v[j] = widen(q + j * w_stride + i, s[j]);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                acc_t u = acc_load(x + r * x_stride + i);
#pragma GCC unroll 8
                for (int j = 0; j < C; j++) a[r][j] = acc_fma(v[j], u, a[r][j]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < C; j++)
            o[r * o_stride + c + j] = finish(a[r][j], x + r * x_stride, q + j * w_stride,
                                             scale + j * w->scale_stride, w->group, k8, k, bias, c + j);
}

/* a group of R rows against the nb channels of one block: one row against a whole block at once; more rows CT
 * channels at a time (R x CT accumulators stay in registers) */
F8_INLINE void row_group(const float *x, int64_t x_stride, const Fp8Weight *w, int64_t w_stride, int64_t k,
                         const float *bias, int64_t c0, int64_t nb, float *o, int64_t o_stride, const int R) {
    int64_t c = 0;
    if (R == 1)
        for (; c + NB <= nb; c += NB) tile(x, x_stride, w, w_stride, k, bias, c0 + c, o, o_stride, 1, NB);
    for (; c + CT <= nb; c += CT) tile(x, x_stride, w, w_stride, k, bias, c0 + c, o, o_stride, R, CT);
    for (; c < nb; c++) tile(x, x_stride, w, w_stride, k, bias, c0 + c, o, o_stride, R, 1);
}

static void channel_block(const float *x, int64_t rows, int64_t x_stride, const void *weight, int64_t w_stride,
                          int64_t k, const float *bias, int64_t c0, int64_t nb, float *out, int64_t out_stride) {
    const Fp8Weight *w = (const Fp8Weight *)weight;
    int64_t r = 0;
    for (; r + RT <= rows; r += RT)
        row_group(x + r * x_stride, x_stride, w, w_stride, k, bias, c0, nb, out + r * out_stride, out_stride, RT);
    const float *xr = x + r * x_stride;
    float *o = out + r * out_stride;
    switch (rows - r) {   /* constant row counts: the tiles' accumulators stay in registers */
    case 3: row_group(xr, x_stride, w, w_stride, k, bias, c0, nb, o, out_stride, 3); break;
    case 2: row_group(xr, x_stride, w, w_stride, k, bias, c0, nb, o, out_stride, 2); break;
    case 1: row_group(xr, x_stride, w, w_stride, k, bias, c0, nb, o, out_stride, 1); break;
    default: break;
    }
}

/* out [rows, n] (row stride out_stride) = x [rows, k] (row stride x_stride) W^T (+ bias [n]); W: e4m3fn codes
 * q [n, k] (row stride w_stride, unit column stride) times scale [n, scale_stride] per `group` columns (group a
 * multiple of 8, or >= k: one scale per channel). threads: the most to use (1 for small weights). */
void gh_fp8_linear(const float *x, int64_t rows, int64_t x_stride, const uint8_t *q, int64_t n, int64_t k,
                   int64_t w_stride, const float *scale, int64_t scale_stride, int64_t group, const float *bias,
                   float *out, int64_t out_stride, int64_t threads) {
    Fp8Weight w = {q, scale, scale_stride, group < k ? group : k};
    acc_over_blocks(channel_block, x, rows, x_stride, &w, n, k, w_stride, bias, out, out_stride, threads);
}
