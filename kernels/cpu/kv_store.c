/* New K and V rows into the paged KV pool, in the compute dtype (gh_write_kv) or fp8 (gh_write_kv_fp8), and the
 * fp8 value table through which the attention kernels read an fp8 pool (gh_ops.h: kv_row). */
#include "gh_native.h"
#include "gh_ops.h"

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

/* every fp8 byte's value, exact in float32: e4m3fn (bias 7, no infinities, S.1111.111 is NaN) and e5m2 (bias 15) */
float fp8_values[2][256];

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

/* the float32 values of n fp8 bytes (tests: the table against torch's conversion) */
void gh_fp8_values(const uint8_t *bytes, int64_t n, int kv_type, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = fp8_values[kv_type - 1][bytes[i]];
}
