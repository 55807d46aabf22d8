/* exp(x) in float32 as the native CPU ops compute it: one scalar function and its vector forms, the same operations
 * in the same order (no FMA: the library is built with -ffp-contract=off), so every lane has the scalar bits.
 * Shared by layer_ops.c (SiLU), the attention kernels (softmax; exp8 and exp16 in gh_attention.h, NEON's exp4
 * here) and amx_linear.c (the SiLU fused into the gate/up product). */
#ifndef GH_EXP_F32_H
#define GH_EXP_F32_H
#include <stdint.h>
#include <string.h>

#define EXP_INLINE static inline __attribute__((always_inline))

/* exp(x) for float32 in branch-free arithmetic the compiler vectorises (glibc's expf is a call per element):
 * x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (error below 2 ulp), times 2^n
 * built in the exponent bits. Inputs are clamped to [-87, 88]: e^-87 stands in for an underflow to zero
 * and stays a normal float. */
EXP_INLINE float exp_f32(float x) {
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest: 1.5 * 2^23 */
    float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f
              + r * 1.3888889e-3f)))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
/* exp_f32 on a register of W / 32 lanes (W = 256 or 512 bits): the same operations in the same order, so the same
 * bits; exp8 and exp16 */
#define EXP_LANES(W, name)                                                                                          \
    EXP_INLINE __m##W name(__m##W x) {                                                                                  \
        x = _mm##W##_max_ps(_mm##W##_min_ps(x, _mm##W##_set1_ps(88.0f)), _mm##W##_set1_ps(-87.0f));               \
        __m##W big = _mm##W##_set1_ps(12582912.0f);                                                                 \
        __m##W n = _mm##W##_sub_ps(_mm##W##_add_ps(_mm##W##_mul_ps(x, _mm##W##_set1_ps(1.44269504088896341f)), big), \
                                   big);                                                                            \
        __m##W r = _mm##W##_sub_ps(_mm##W##_sub_ps(x, _mm##W##_mul_ps(n, _mm##W##_set1_ps(0.693145751953125f))),   \
                                   _mm##W##_mul_ps(n, _mm##W##_set1_ps(1.428606765330187e-06f)));                   \
        __m##W p = _mm##W##_set1_ps(1.3888889e-3f);                                                                 \
        p = _mm##W##_add_ps(_mm##W##_set1_ps(8.3333338e-3f), _mm##W##_mul_ps(r, p));                               \
        p = _mm##W##_add_ps(_mm##W##_set1_ps(4.1666668e-2f), _mm##W##_mul_ps(r, p));                               \
        p = _mm##W##_add_ps(_mm##W##_set1_ps(1.6666667e-1f), _mm##W##_mul_ps(r, p));                               \
        p = _mm##W##_add_ps(_mm##W##_set1_ps(0.5f), _mm##W##_mul_ps(r, p));                                        \
        p = _mm##W##_add_ps(_mm##W##_set1_ps(1.0f), _mm##W##_mul_ps(r, p));                                        \
        p = _mm##W##_add_ps(_mm##W##_set1_ps(1.0f), _mm##W##_mul_ps(r, p));                                        \
        __m##W##i bits = _mm##W##_slli_epi32(_mm##W##_add_epi32(_mm##W##_cvttps_epi32(n), _mm##W##_set1_epi32(127)), \
                                             23);                                                                   \
        return _mm##W##_mul_ps(p, _mm##W##_castsi##W##_ps(bits));                                                  \
    }
#endif

#ifdef __ARM_NEON
#include <arm_neon.h>
/* exp_f32 on 4 NEON lanes: the same operations in the same order (separate multiplies and adds), so the same bits */
EXP_INLINE float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(-87.0f));
    float32x4_t big = vdupq_n_f32(12582912.0f);
    float32x4_t n = vsubq_f32(vaddq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)), big), big);
    float32x4_t r = vsubq_f32(vsubq_f32(x, vmulq_f32(n, vdupq_n_f32(0.693145751953125f))),
                              vmulq_f32(n, vdupq_n_f32(1.428606765330187e-06f)));
    float32x4_t p = vdupq_n_f32(1.3888889e-3f);
    p = vaddq_f32(vdupq_n_f32(8.3333338e-3f), vmulq_f32(r, p));
    p = vaddq_f32(vdupq_n_f32(4.1666668e-2f), vmulq_f32(r, p));
    p = vaddq_f32(vdupq_n_f32(1.6666667e-1f), vmulq_f32(r, p));
    p = vaddq_f32(vdupq_n_f32(0.5f), vmulq_f32(r, p));
    p = vaddq_f32(vdupq_n_f32(1.0f), vmulq_f32(r, p));
    p = vaddq_f32(vdupq_n_f32(1.0f), vmulq_f32(r, p));
    int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(bits));
}
#endif
#endif
