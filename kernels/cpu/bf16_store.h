/* Rounding a tile-packed bf16 product's float32 sums and storing them (AVX-512 BF16), shared by the AMX kernel
 * (amx_linear.c) and the AVX-512 BF16 dot-product kernel (bf16_dot_linear.c), so the two store alike: plain (each
 * sum plus its bias rounded to bf16 by VCVTNEPS2BF16: nearest even), or, for a gated MLP's product, silu(gate) * up
 * with the native SiLU op's arithmetic (layer_ops.c's gh_silu_mul) on the rounded halves. */
#ifndef GH_BF16_STORE_H
#define GH_BF16_STORE_H
#include <immintrin.h>
#include <stdint.h>
#include "exp_f32.h"
#include "tiled_linear.h"

/* 16 float32 sums (+ bias) rounded to bf16 and stored, the first `cols` of them */
static inline void store_row16(uint16_t *dst, __m512 v, const float *bias, int cols) {
    __mmask16 mask = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias));
    _mm256_mask_storeu_epi16(dst, mask, (__m256i)_mm512_cvtneps_pbh(v));
}

/* float32 -> bf16 bits as gh_ops.h's bf16_store rounds (nearest even in the bits, NaN kept quiet), 16 lanes */
static inline __m256i bf16_bits(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, quiet));
}

/* bf16 bits widened back to float32 (exact) */
static inline __m512 bf16_widen(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

EXP_LANES(512, exp16)

/* 16 outputs of silu(gate) * up from the float32 gate and up sums: each rounded to bf16 as store_row16 stores it,
 * then gh_silu_mul's arithmetic on the bf16 values */
static inline void store_silu16(uint16_t *dst, __m512 gate, __m512 up) {
    __m512 g = bf16_widen((__m256i)_mm512_cvtneps_pbh(gate));
    __m512 u = bf16_widen((__m256i)_mm512_cvtneps_pbh(up));
    __m512 negated = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN)));
    __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(negated)));
    _mm256_storeu_si256((__m256i *)dst, bf16_bits(_mm512_mul_ps(bf16_widen(bf16_bits(silu)), u)));
}
#endif
