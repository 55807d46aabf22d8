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
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define NB 8        /* output channels per block (a thread's unit of work) */
#define F32_INLINE static inline __attribute__((always_inline))

#if defined(__AVX2__) && defined(__FMA__)
typedef __m256 acc_t;
F32_INLINE acc_t acc_zero(void) { return _mm256_setzero_ps(); }
F32_INLINE acc_t acc_fma(const float *w, acc_t x, acc_t acc) { return _mm256_fmadd_ps(_mm256_loadu_ps(w), x, acc); }
F32_INLINE acc_t acc_load(const float *x) { return _mm256_loadu_ps(x); }
F32_INLINE float acc_sum(acc_t v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  /* lanes i + (i + 4) */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                         /* (0 + 2), (1 + 3) */
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
/* portable form: the same structure in plain C (its own bits, equally independent of rows and threads) */
typedef struct { float v[8]; } acc_t;
F32_INLINE acc_t acc_zero(void) { acc_t a = {{0, 0, 0, 0, 0, 0, 0, 0}}; return a; }
F32_INLINE acc_t acc_load(const float *x) { acc_t a; for (int l = 0; l < 8; l++) a.v[l] = x[l]; return a; }
F32_INLINE acc_t acc_fma(const float *w, acc_t x, acc_t acc) {
    for (int l = 0; l < 8; l++) acc.v[l] += w[l] * x.v[l];
    return acc;
}
F32_INLINE float acc_sum(acc_t a) {
    float s0 = a.v[0] + a.v[4], s1 = a.v[1] + a.v[5], s2 = a.v[2] + a.v[6], s3 = a.v[3] + a.v[7];
    return (s0 + s2) + (s1 + s3);
}
#endif

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
        for (int c = 0; c < 8; c++) a[c] = acc_fma(w + c * w_stride + i, u, a[c]);
    }
    for (int c = 0; c < 8; c++) o[c0 + c] = finish(a[c], x, w + c * w_stride, k8, k, bias, c0 + c);
}

/* one row against one channel (the ends of blocks narrower than their tiles) */
F32_INLINE void tile_1x1(const float *x, const float *w, int64_t k, const float *bias, int64_t c, float *o) {
    int64_t k8 = k & ~(int64_t)7;
    acc_t a = acc_zero();
    for (int64_t i = 0; i < k8; i += 8) a = acc_fma(w + i, acc_load(x + i), a);
    o[c] = finish(a, x, w, k8, k, bias, c);
}

static void channel_block(const float *x, int64_t rows, int64_t x_stride, const float *w, int64_t w_stride,
                          int64_t k, const float *bias, int64_t c0, int64_t nb, float *out, int64_t out_stride) {
    const float *wb = w + c0 * w_stride;
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
    int64_t blocks = (n + NB - 1) / NB;
    if (threads < 1) threads = 1;
    (void)threads;
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t c0 = b * NB;
        channel_block(x, rows, x_stride, w, w_stride, k, bias, c0, n - c0 < NB ? n - c0 : NB, out, out_stride);
    }
}
