/* The float32 accumulator of the dense linears (f32_linear.c, f16_linear.c, fp8_linear.c): 8 lanes along K, one
 * FMA per 8 columns, one fixed horizontal sum; and their split of the output channels over threads. Every kernel
 * runs this sequence per output, so an fp16 or fp8 weight gives the bits of its float32 copy on every host: the
 * files cannot pick different forms of it. */
#ifndef GH_F32_ACC_H
#define GH_F32_ACC_H
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#define ACC_INLINE static inline __attribute__((always_inline))

#if defined(__AVX2__) && defined(__FMA__)
#define ACC_VECTOR 1
typedef __m256 acc_t;
ACC_INLINE acc_t acc_zero(void) { return _mm256_setzero_ps(); }
ACC_INLINE acc_t acc_load(const float *x) { return _mm256_loadu_ps(x); }
/* acc + w * x, lane by lane */
ACC_INLINE acc_t acc_fma(acc_t w, acc_t x, acc_t acc) { return _mm256_fmadd_ps(w, x, acc); }
ACC_INLINE float acc_sum(acc_t v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  /* lanes i + (i + 4) */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                         /* (0 + 2), (1 + 3) */
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#elif defined(__ARM_NEON)
/* the AVX2 form in two 4-lane halves: the same fused multiply-adds per lane and the same horizontal sum, so the
 * AVX2 build's bits */
#define ACC_VECTOR 1
typedef struct { float32x4_t lo, hi; } acc_t;   /* lanes 0-3, 4-7 */
ACC_INLINE acc_t acc_zero(void) { acc_t a = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; return a; }
ACC_INLINE acc_t acc_load(const float *x) { acc_t a = {vld1q_f32(x), vld1q_f32(x + 4)}; return a; }
ACC_INLINE acc_t acc_fma(acc_t w, acc_t x, acc_t acc) {
    acc_t a = {vfmaq_f32(acc.lo, w.lo, x.lo), vfmaq_f32(acc.hi, w.hi, x.hi)};
    return a;
}
ACC_INLINE float acc_sum(acc_t v) {
    float32x4_t s = vaddq_f32(v.lo, v.hi);                          /* lanes i + (i + 4) */
    float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));   /* (0 + 2), (1 + 3) */
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}
#else
/* portable form: the same structure in plain C (its own bits, equally independent of rows and threads) */
#define ACC_VECTOR 0
typedef struct { float v[8]; } acc_t;
ACC_INLINE acc_t acc_zero(void) { acc_t a = {{0, 0, 0, 0, 0, 0, 0, 0}}; return a; }
ACC_INLINE acc_t acc_load(const float *x) { acc_t a; for (int l = 0; l < 8; l++) a.v[l] = x[l]; return a; }
ACC_INLINE acc_t acc_fma(acc_t w, acc_t x, acc_t acc) {
    for (int l = 0; l < 8; l++) acc.v[l] += w.v[l] * x.v[l];
    return acc;
}
ACC_INLINE float acc_sum(acc_t a) {
    float s0 = a.v[0] + a.v[4], s1 = a.v[1] + a.v[5], s2 = a.v[2] + a.v[6], s3 = a.v[3] + a.v[7];
    return (s0 + s2) + (s1 + s3);
}
#endif

#define ACC_BLOCK 8   /* output channels per block of the dense linears (a thread's unit of work) */

/* one block's outputs: channels c0 .. c0 + nb of every row, weights w (the kernel's own type) */
typedef void (*acc_block_fn)(const float *x, int64_t rows, int64_t x_stride, const void *w, int64_t w_stride,
                             int64_t k, const float *bias, int64_t c0, int64_t nb, float *out, int64_t out_stride);

/* out [rows, n] = x W^T (+ bias): blocks of ACC_BLOCK output channels split statically over up to `threads` OpenMP
 * threads of torch's pool (the callers pass 1 for small weights), each through `block` */
ACC_INLINE void acc_over_blocks(acc_block_fn block, const float *x, int64_t rows, int64_t x_stride, const void *w,
                                int64_t n, int64_t k, int64_t w_stride, const float *bias, float *out,
                                int64_t out_stride, int64_t threads) {
    int64_t blocks = (n + ACC_BLOCK - 1) / ACC_BLOCK;
    if (threads < 1) threads = 1;
    (void)threads;
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t c0 = b * ACC_BLOCK;
        block(x, rows, x_stride, w, w_stride, k, bias, c0, n - c0 < ACC_BLOCK ? n - c0 : ACC_BLOCK, out, out_stride);
    }
}
#endif
