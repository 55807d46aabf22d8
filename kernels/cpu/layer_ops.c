/* The decoder layer's row ops: RMSNorm, SiLU-and-mul and rotate-half RoPE (gh_rms_norm, gh_silu_mul, gh_rotary).
 * gh_ops.h holds the contract (dtypes, rounding, threads) and the helpers. */
#include "gh_native.h"
#include "gh_ops.h"

static void silu_rounded(float *restrict g, const float *restrict u, int64_t n, int dtype) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + exp_f32(-g[i]));
    if (dtype)
        for (int64_t i = 0; i < n; i++) g[i] = R(g[i], 1);
    for (int64_t i = 0; i < n; i++) g[i] *= u[i];
}

/* out[r] = w * rms_norm(x[r]) over `dim`, statistics in float32 (x rows `x_stride` elements apart). */
INLINE void gh_rms_norm_impl(const void *x, int64_t rows, int64_t dim, int64_t x_stride, const void *w, void *out,
                 float eps, int dtype, int64_t threads) {
    int64_t team = team_size(threads, rows, rows * dim);
    PARALLEL
    {
        float *row = malloc((size_t)dim * sizeof(float));
        FOR_ROWS
        for (int64_t r = 0; r < rows; r++) {
            load_row(row, x, r * x_stride, dim, dtype);
            float inv = 1.0f / sqrtf(dot(row, row, dim) / (float)dim + eps);
            for (int64_t i = 0; i < dim; i++)
                store(out, r * dim + i, load(w, i, dtype) * R(row[i] * inv, dtype), dtype);
        }
        free(row);
    }
}

/* out[r] = silu(gate) * up over a fused [gate | up] row of 2 * inter elements. */
INLINE void gh_silu_mul_impl(const void *gate_up, int64_t rows, int64_t inter, void *out, int dtype,
                              int64_t threads) {
    int64_t team = team_size(threads, rows, rows * inter);
    PARALLEL
    {
        float *g = malloc((size_t)inter * sizeof(float)), *u = malloc((size_t)inter * sizeof(float));
        FOR_ROWS
        for (int64_t r = 0; r < rows; r++) {
            load_row(g, gate_up, r * 2 * inter, inter, dtype);
            load_row(u, gate_up, r * 2 * inter + inter, inter, dtype);
            silu_rounded(g, u, inter, dtype);
            store_row(out, r * inter, g, inter, dtype);
        }
        free(g);
        free(u);
    }
}

/* One token of rotate-half RoPE (rotary_impl's rows). Always inlined with a literal dtype, so each dtype's loop
 * is its own vectorised code: an OpenMP region is outlined before constants propagate into it, so a dtype
 * branch left inside the region's loop keeps the element loop scalar (bf16 ran at a fifth of float32's rate). */
INLINE void rotary_token(const void *restrict x, int64_t t, int64_t heads, int64_t half, int64_t tok_stride,
                         int64_t head_stride, const void *restrict cos, const void *restrict sin, void *restrict out,
                         int dtype) {
    for (int64_t h = 0; h < heads; h++) {
        int64_t src = t * tok_stride + h * head_stride, dst = (t * heads + h) * 2 * half;
        for (int64_t i = 0; i < half; i++) {
            float c = load(cos, t * half + i, dtype), s = load(sin, t * half + i, dtype);
            float x1 = load(x, src + i, dtype), x2 = load(x, src + half + i, dtype);
            store(out, dst + i, R(x1 * c, dtype) - R(x2 * s, dtype), dtype);
            store(out, dst + half + i, R(x2 * c, dtype) + R(x1 * s, dtype), dtype);
        }
    }
}

/* Rotate-half RoPE: x [T, heads, 2 * half] (strides tok_stride, head_stride; last dim contiguous),
 * cos/sin [T, half] contiguous in x's dtype, out [T, heads, 2 * half] contiguous. */
INLINE void gh_rotary_impl(const void *x, int64_t tokens, int64_t heads, int64_t half, int64_t tok_stride,
               int64_t head_stride, const void *cos, const void *sin, void *out, int dtype, int64_t threads) {
    int64_t team = team_size(threads, tokens, tokens * heads * half);
    PARALLEL
    FOR_ROWS
    for (int64_t t = 0; t < tokens; t++) {
        if (dtype) rotary_token(x, t, heads, half, tok_stride, head_stride, cos, sin, out, 1);
        else rotary_token(x, t, heads, half, tok_stride, head_stride, cos, sin, out, 0);
    }
}

/* the entry points: each body with a constant dtype (gh_ops.h: BY_DTYPE) */
void gh_rms_norm(const void *x, int64_t rows, int64_t dim, int64_t x_stride, const void *w, void *out, float eps,
                 int dtype, int64_t threads) {
#define CALL(d) gh_rms_norm_impl(x, rows, dim, x_stride, w, out, eps, d, threads)
    BY_DTYPE(CALL);
#undef CALL
}

void gh_silu_mul(const void *gate_up, int64_t rows, int64_t inter, void *out, int dtype, int64_t threads) {
#define CALL(d) gh_silu_mul_impl(gate_up, rows, inter, out, d, threads)
    BY_DTYPE(CALL);
#undef CALL
}

void gh_rotary(const void *x, int64_t tokens, int64_t heads, int64_t half, int64_t tok_stride, int64_t head_stride,
               const void *cos, const void *sin, void *out, int dtype, int64_t threads) {
#define CALL(d) gh_rotary_impl(x, tokens, heads, half, tok_stride, head_stride, cos, sin, out, d, threads)
    BY_DTYPE(CALL);
#undef CALL
}
