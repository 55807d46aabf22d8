/* y = x W^T (+ b) for float32 x and an fp16 W [n, k] (the fp16 CPU route's resident weights), read in place, for
 * the few rows of a decode step.
 *
 * fbgemm's fp16 GEMM, which serves the route's batches, costs at two to eight rows about what it costs at
 * sixteen; here the weights are widened in registers (F16C, or NEON's FCVTL) and multiplied by float32 FMA chains.
 * Work is split over blocks of NB output channels (static, over OpenMP threads of torch's pool). One row runs
 * against all NB channels of its block (8 FMA chains, the NB weight rows streamed side by side: at one row the
 * weight is read once, so the kernel's job is to keep the loads flowing). More rows go in groups of up to RT rows
 * against CT channels at a time: each widened weight vector serves every row of the group, and the block's weights
 * come from memory for the first group and from cache for the next.
 *
 * Bits: every output (row r, channel c) is the same sequence of operations whichever tile computes it: 8 lanes
 * accumulated along K with one FMA per 8 columns over the widened (exact) weights, one fixed horizontal sum, the
 * K % 8 tail in order, then the bias — f32_linear.c's sequence over the float32 copy of the weight, so the two
 * agree bit for bit, and a row's result depends on that row and the weight alone (not on the batch or the
 * thread count).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "f32_acc.h"
#include "gh_native.h"

#define NB ACC_BLOCK /* output channels per block (a thread's unit of work) */
#define RT 4        /* rows per group above one row */
#define CT 3        /* channels per tile of a row group (RT x CT accumulators and CT widened weights in registers) */
#define F16_INLINE static inline __attribute__((always_inline))

/* fp16 -> float32, exact (the portable path, and the K % 8 tails) */
F16_INLINE float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);                  /* inf, nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);          /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;                                               /* zero */
    } else {                                                       /* subnormal: normalise */
        uint32_t e = 113u;
        while (!(man & 0x400u)) { man <<= 1; e--; }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* 8 fp16 weights widened into an accumulator operand (exact) */
#if ACC_VECTOR && defined(__F16C__)
F16_INLINE acc_t widen(const uint16_t *w) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)); }
#elif ACC_VECTOR && defined(__ARM_NEON)
F16_INLINE acc_t widen(const uint16_t *w) {
    acc_t a = {vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w))), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w + 4)))};
    return a;
}
#else
F16_INLINE acc_t widen(const uint16_t *w) {
    float f[8];
    for (int l = 0; l < 8; l++) f[l] = half_to_float(w[l]);
    return acc_load(f);
}
#endif

/* the end of one output: horizontal sum, the K % 8 tail in column order, the bias */
F16_INLINE float finish(acc_t acc, const float *x, const uint16_t *w, int64_t k8, int64_t k, const float *bias,
                        int64_t c) {
    float s = acc_sum(acc);
    for (int64_t i = k8; i < k; i++) s += half_to_float(w[i]) * x[i];
    return bias ? s + bias[c] : s;
}

/* one row against channels c0 .. c0 + 7 */
F16_INLINE void tile_1x8(const float *x, const uint16_t *w, int64_t w_stride, int64_t k, const float *bias,
                         int64_t c0, float *o) {
    int64_t k8 = k & ~(int64_t)7;
    acc_t a[NB];
    for (int c = 0; c < NB; c++) a[c] = acc_zero();
    for (int64_t i = 0; i < k8; i += 8) {
        acc_t u = acc_load(x + i);
#pragma GCC unroll 8
        for (int c = 0; c < NB; c++) a[c] = acc_fma(widen(w + c * w_stride + i), u, a[c]);
    }
    for (int c = 0; c < NB; c++) o[c0 + c] = finish(a[c], x, w + c * w_stride, k8, k, bias, c0 + c);
}

/* R rows (R <= RT) against C channels (C <= CT) from channel c: each widened weight vector serves the R rows */
F16_INLINE void tile_rc(const float *x, int64_t x_stride, const uint16_t *w, int64_t w_stride, int64_t k,
                        const float *bias, int64_t c, float *o, int64_t o_stride, const int R, const int C) {
    int64_t k8 = k & ~(int64_t)7;
    acc_t a[RT][CT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < C; j++) a[r][j] = acc_zero();
    for (int64_t i = 0; i < k8; i += 8) {
        acc_t v[CT];
#pragma GCC unroll 4
        for (int j = 0; j < C; j++) v[j] = widen(w + j * w_stride + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            acc_t u = acc_load(x + r * x_stride + i);
#pragma GCC unroll 4
            for (int j = 0; j < C; j++) a[r][j] = acc_fma(v[j], u, a[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < C; j++)
            o[r * o_stride + c + j] = finish(a[r][j], x + r * x_stride, w + j * w_stride, k8, k, bias, c + j);
}

/* a group of R rows against the nb channels of one block */
F16_INLINE void row_group(const float *x, int64_t x_stride, const uint16_t *wb, int64_t w_stride, int64_t k,
                          const float *bias, int64_t c0, int64_t nb, float *o, int64_t o_stride, const int R) {
    int64_t c = 0;
    for (; c + CT <= nb; c += CT)
        tile_rc(x, x_stride, wb + c * w_stride, w_stride, k, bias, c0 + c, o, o_stride, R, CT);
    for (; c < nb; c++) tile_rc(x, x_stride, wb + c * w_stride, w_stride, k, bias, c0 + c, o, o_stride, R, 1);
}

static void channel_block(const float *x, int64_t rows, int64_t x_stride, const void *w, int64_t w_stride,
                          int64_t k, const float *bias, int64_t c0, int64_t nb, float *out, int64_t out_stride) {
    const uint16_t *wb = (const uint16_t *)w + c0 * w_stride;
    if (rows == 1 && nb == NB) {
        tile_1x8(x, wb, w_stride, k, bias, c0, out);
        return;
    }
    int64_t r = 0;
    for (; r + RT <= rows; r += RT)
        row_group(x + r * x_stride, x_stride, wb, w_stride, k, bias, c0, nb, out + r * out_stride, out_stride, RT);
    const float *xr = x + r * x_stride;
    float *o = out + r * out_stride;
    switch (rows - r) {   /* constant row counts: the tiles' accumulators stay in registers */
    case 3: row_group(xr, x_stride, wb, w_stride, k, bias, c0, nb, o, out_stride, 3); break;
    case 2: row_group(xr, x_stride, wb, w_stride, k, bias, c0, nb, o, out_stride, 2); break;
    case 1: row_group(xr, x_stride, wb, w_stride, k, bias, c0, nb, o, out_stride, 1); break;
    default: break;
    }
}

/* out [rows, n] (row stride out_stride) = x [rows, k] (row stride x_stride) W^T (+ bias [n]), W fp16 [n, k] with
 * row stride w_stride, unit column stride. threads: the most to use (the caller passes 1 for small weights). */
void gh_f16_linear(const float *x, int64_t rows, int64_t x_stride, const uint16_t *w, int64_t n, int64_t k,
                   int64_t w_stride, const float *bias, float *out, int64_t out_stride, int64_t threads) {
    acc_over_blocks(channel_block, x, rows, x_stride, w, n, k, w_stride, bias, out, out_stride, threads);
}
