/* y = x W^T (+ b) for float32 x and a dense float32 W [n, k], read in place (a resident tensor, a staging slot
 * or a view into a host slab alike), for the few rows of a decode step.
 *
 * At one or two rows a linear is a stream over the weight: each weight element is used once or twice, so the
 * kernel's job is to keep the loads flowing. Work is split over blocks of NB output channels (static, over
 * OpenMP threads of torch's pool); inside a block each row runs against all NB channels (8 float32 FMA
 * chains in registers, NB weight rows streamed side by side). The block's weights come from memory for the
 * first row and from cache for the next ones: on 2 AVX2 cores two rows cost what one does, and this beats a
 * tile of two rows x four channels sharing each weight load (docs/benchmarks/kernels.md).
 *
 * Bits: every output (row r, channel c) is the same sequence of operations whichever tile computes it: 8
 * lanes accumulated along K with one FMA per 8 columns, one fixed horizontal sum, the K % 8 tail in order,
 * then the bias. So a row's result depends on that row alone — not on the batch, the thread count or where
 * the weight lives (DESIGN invariant 4).
 */
#include <stdint.h>
#include <stdlib.h>
#include "f32_acc.h"

#define NB ACC_BLOCK /* output channels per block (a thread's unit of work) */
#define F32_INLINE static inline __attribute__((always_inline))

/* the end of one output: horizontal sum, the K % 8 tail in column order, the bias */
F32_INLINE float finish(acc_t acc, const float *x, const float *w, int64_t k8, int64_t k, const float *bias,
                        int64_t c) {
    float s = acc_sum(acc);
    for (int64_t i = k8; i < k; i++) s += w[i] * x[i];
    return bias ? s + bias[c] : s;
}

/* one row against channels c0 .. c0 + 7 */
F32_INLINE void tile_1x8(const float *x, const float *w, int64_t w_stride, int64_t k, const float *bias, int64_t c0,
                         float *o) {
    int64_t k8 = k & ~(int64_t)7;
    acc_t a[8];
    for (int c = 0; c < 8; c++) a[c] = acc_zero();
    for (int64_t i = 0; i < k8; i += 8) {
        acc_t u = acc_load(x + i);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) a[c] = acc_fma(acc_load(w + c * w_stride + i), u, a[c]);
    }
    for (int c = 0; c < 8; c++) o[c0 + c] = finish(a[c], x, w + c * w_stride, k8, k, bias, c0 + c);
}

/* one row against one channel (the ends of blocks narrower than their tiles) */
F32_INLINE void tile_1x1(const float *x, const float *w, int64_t k, const float *bias, int64_t c, float *o) {
    int64_t k8 = k & ~(int64_t)7;
    acc_t a = acc_zero();
    for (int64_t i = 0; i < k8; i += 8) a = acc_fma(acc_load(w + i), acc_load(x + i), a);
    o[c] = finish(a, x, w, k8, k, bias, c);
}

static void channel_block(const float *x, int64_t rows, int64_t x_stride, const void *w, int64_t w_stride,
                          int64_t k, const float *bias, int64_t c0, int64_t nb, float *out, int64_t out_stride) {
    const float *wb = (const float *)w + c0 * w_stride;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * out_stride;
        if (nb == NB) {
            tile_1x8(xr, wb, w_stride, k, bias, c0, o);
        } else {
            for (int64_t c = 0; c < nb; c++) tile_1x1(xr, wb + c * w_stride, k, bias, c0 + c, o);
        }
    }
}

/* out [rows, n] (row stride out_stride) = x [rows, k] (row stride x_stride) W^T (+ bias [n]), W [n, k] with row
 * stride w_stride, unit column stride. threads: the most to use (the caller passes 1 for small weights). */
void gh_f32_linear(const float *x, int64_t rows, int64_t x_stride, const float *w, int64_t n, int64_t k,
                   int64_t w_stride, const float *bias, float *out, int64_t out_stride, int64_t threads) {
    acc_over_blocks(channel_block, x, rows, x_stride, w, n, k, w_stride, bias, out, out_stride, threads);
}
