/* y = x W^T (+ b) for bf16 activations with AVX-512 BF16 dot products (VDPBF16PS): the bf16 route's resident linears
 * on CPUs with AVX-512 BF16 and no AMX (AMD Zen 4 and later).
 *
 * The weight is the AMX kernel's tile layout (gh_amx_pack in amx_linear.c): within a tile of 32 K columns, pair p
 * of 16 output columns is 64 contiguous bytes, W[c][2p], W[c][2p + 1] for c = 0..15, which is one VDPBF16PS operand;
 * the row's pair is broadcast. So one packed weight serves either kernel, and a gated MLP's [gate | up] weight packed
 * gated gives silu(gate) * up here too (bf16_store.h, the AMX kernel's epilogue).
 *
 * Why a kernel of our own: as for AMX (amx_linear.c), a prompt position must compute the same bits however its
 * prompt was split, and oneDNN's GEMM sums a row differently by the row count of the call. Here every output
 * (row r, column c) is one float32 lane accumulating its K pairs in order, whatever the call's row count, tiling or
 * thread count, so a prompt step takes all its rows in one call. (Its bits are not the AMX kernel's: a CPU runs one
 * of the two for every call of a process.)
 *
 * Work: 32-column blocks (a gate and an up tile when gated) split over threads; each thread walks its columns in
 * chunks whose packed weights fit half of L2, and for each chunk all rows, ROWS at a time, against one 32-column
 * block: 2 x ROWS accumulators in registers, the block's two weight vectors loaded once per K pair for all ROWS rows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Not on Arm: BFDOT fits the packed layout but rounds a pair's sum otherwise than VDPBF16PS, and its bits are
 * unchecked on Neoverse V2 (docs/ARM_KERNELS.md); there the bf16 route keeps oneDNN's linears. */
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define HAVE_DOT 1
#include "bf16_store.h"
#else
#define HAVE_DOT 0
#endif
#include "gh_native.h"
#include "tiled_linear.h"

/* Rows sharing each loaded weight vector: 2 x 8 independent accumulators keep two VDPBF16PS a cycle in flight
 * against its latency (Zen 5, SmolLM2's prompt linears: 821 GFLOP/s on 2 cores, 4 rows 556, 12 rows 795) */
#define DOT_ROWS 8

/* 1 when this build runs the kernel (the CPU has AVX-512 BF16), else 0 */
int gh_bf16_dot_available(void) { return HAVE_DOT; }

#if HAVE_DOT
typedef struct {
    uint16_t *y;
    const float *bias;
    int64_t y_stride, n, inter;
    int mode;
} Output;

/* One call's arguments, for the columns each thread takes (split_columns). */
typedef struct {
    const uint16_t *x, *wp;
    int64_t rows, x_stride, k_tiles;
    Output out;
} DotCall;

/* rows [0, R) of x against the 32 columns from c: the sums of tiles t0 (columns c..c+15) and t1 (c+16..) */
static inline __attribute__((always_inline)) void dot_block(const uint16_t *x, int64_t x_stride, const uint16_t *t0,
                                                            const uint16_t *t1, int64_t k_tiles, __m512 acc[][2],
                                                            const int R) {
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t kt = 0; kt < k_tiles; kt++) {
        const uint16_t *b0 = t0 + kt * TILE_ELEMS, *b1 = t1 + kt * TILE_ELEMS;
        for (int p = 0; p < 16; p++) {
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0 + p * 32), w1 = (__m512bh)_mm512_loadu_si512(b1 + p * 32);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, x + r * x_stride + kt * 32 + p * 2, sizeof pair);
                __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
            }
        }
    }
}

/* stores R rows of one 32-column block from c as the output mode says (the AMX kernel's drain, from registers) */
static inline void store_block(const Output *o, int64_t r0, int64_t c, __m512 acc[][2], int R) {
    int left = (int)(o->n - c), cols0 = left < 16 ? left : 16, cols1 = left - 16 < 16 ? left - 16 : 16;
    int64_t to0 = c, to1 = c + 16;
    if (o->mode != STORE_PLAIN) {   /* n = 2 * inter, inter a multiple of 16: every block is whole */
        to0 = c / 2, to1 = o->inter + c / 2;
        cols0 = cols1 = 16;
    }
    for (int r = 0; r < R; r++) {
        uint16_t *row = o->y + (r0 + r) * o->y_stride;
        if (o->mode == STORE_SILU) {
            store_silu16(row + to0, acc[r][0], acc[r][1]);
            continue;
        }
        store_row16(row + to0, acc[r][0], o->bias ? o->bias + to0 : NULL, cols0);
        if (cols1 > 0) store_row16(row + to1, acc[r][1], o->bias ? o->bias + to1 : NULL, cols1);
    }
}

static void dot_rows(const uint16_t *x, int64_t x_stride, const uint16_t *t0, const uint16_t *t1, int64_t k_tiles,
                     const Output *o, int64_t r0, int64_t c, int R) {
    __m512 acc[DOT_ROWS][2];
    switch (R) {   /* constant row counts: the accumulators stay in registers */
    case 8: dot_block(x, x_stride, t0, t1, k_tiles, acc, 8); break;
    case 7: dot_block(x, x_stride, t0, t1, k_tiles, acc, 7); break;
    case 6: dot_block(x, x_stride, t0, t1, k_tiles, acc, 6); break;
    case 5: dot_block(x, x_stride, t0, t1, k_tiles, acc, 5); break;
    case 4: dot_block(x, x_stride, t0, t1, k_tiles, acc, 4); break;
    case 3: dot_block(x, x_stride, t0, t1, k_tiles, acc, 3); break;
    case 2: dot_block(x, x_stride, t0, t1, k_tiles, acc, 2); break;
    default: dot_block(x, x_stride, t0, t1, k_tiles, acc, 1); break;
    }
    store_block(o, r0, c, acc, R);
}

/* columns [c0, c1) (32-aligned starts) for every row */
static void dot_columns(void *arg, int64_t c0, int64_t c1) {
    const DotCall *a = arg;
    const uint16_t *x = a->x, *wp = a->wp;
    const Output *o = &a->out;
    int64_t rows = a->rows, x_stride = a->x_stride, k_tiles = a->k_tiles, chunk = tile_chunk_columns(k_tiles);
    for (int64_t cc = c0; cc < c1; cc += chunk) {
        int64_t ce = cc + chunk < c1 ? cc + chunk : c1;
        for (int64_t r = 0; r < rows; r += DOT_ROWS) {
            int R = rows - r < DOT_ROWS ? (int)(rows - r) : DOT_ROWS;
            for (int64_t c = cc; c < ce; c += 32) {
                const uint16_t *t0 = wp + (c / 16) * k_tiles * TILE_ELEMS, *t1 = t0 + k_tiles * TILE_ELEMS;
                dot_rows(x + r * x_stride, x_stride, t0, t1, k_tiles, o, r, c, R);
            }
        }
    }
}
#endif

/* gh_amx_linear's contract (amx_linear.c) on AVX-512 BF16 dot products, over the same packed weight. Returns 0, or
 * -1 where the kernel is unavailable or the arguments do not fit. */
int gh_bf16_dot_linear(const uint16_t *x, int64_t rows, int64_t x_stride, const uint16_t *wp, int64_t n, int64_t k,
                       const float *bias, uint16_t *y, int64_t y_stride, int64_t threads, int64_t gated_inter,
                       int silu) {
#if HAVE_DOT
    int mode = tiled_store_mode(n, k, bias, gated_inter, silu);
    if (mode < 0) return -1;
    if (rows <= 0 || n <= 0) return 0;
    DotCall call = {x, wp, rows, x_stride, k / TILE_K, {y, bias, y_stride, n, gated_inter, mode}};
    split_columns(n, threads, dot_columns, &call);
    return 0;
#else
    (void)x; (void)rows; (void)x_stride; (void)wp; (void)n; (void)k; (void)bias; (void)y; (void)y_stride;
    (void)threads; (void)gated_inter; (void)silu;
    return -1;
#endif
}
