/* y = x W^T (+ b) for bf16 activations on Intel AMX (Sapphire Rapids and later): the bf16 route's resident linears.
 *
 * Why a kernel of our own: a prompt position must compute the same bits however its prompt was split (prefix
 * caching, chunked prefill). oneDNN's AMX GEMM sums a row differently by the row count of the call, so the route
 * used to cut every step into blocks of probed sizes (row_blocks.py), at a cost of ~20% of prompt throughput.
 * Here every output (row r, column c) is the same sequence of operations whatever the call's row count, thread
 * count or tiling: 32-element K steps in K order, each one tile dot product (TDPBF16PS: bf16 pairs multiplied
 * exactly and summed into the float32 accumulator in the hardware's fixed order), then the float32 bias, then one
 * rounding to bf16 (nearest even, as torch rounds). Rows of the A tiles beyond the call's rows are zero padding
 * that no other row sees: AMX computes every row of a tile independently.
 *
 * Layout: gh_amx_pack writes W [n, k] as [n_pad / 16][k_pad / 32] tiles of 16 K-pairs x 16 columns x 2 (the VNNI
 * order TDPBF16PS reads: element (pair p, column c, e) is W[c][2p + e]), zeros beyond n and k. The activations are
 * read in place (k a multiple of 32). A gated MLP's fused [gate | up] weight (n = 2 * inter, inter a multiple of
 * 16) may be packed "gated": tile columns alternate 16 gate rows and the 16 up rows of the same outputs, so each
 * 32-column block holds both halves of 16 outputs. Its product is stored in the weight's own column order, or,
 * with `silu`, as silu(gate) * up: the two halves rounded to bf16 as the plain product stores them, then exactly
 * the native SiLU op's arithmetic (layer_ops.c's gh_silu_mul: exp_f32, silu rounded to bf16, the product
 * rounded), so the fused call has the bits of the product followed by the op, without writing and reading the
 * product.
 *
 * Work: columns are split over threads in 32-column blocks; each thread walks its columns in chunks whose packed
 * weights fit half of L2 (they are re-read for every 32 rows), and for each chunk all rows, 32 at a time, against
 * 2 x 2 tiles (4 accumulators, 2 A and 2 B tiles: the 8 tile registers). Measured on one Sapphire Rapids core at
 * SmolLM2-135M's shapes and ~1,800 rows: 1.2-1.4 TFLOP/s, oneDNN's brgemm 1.1-1.6 (docs/BENCHMARKS.md).
 */
#define _GNU_SOURCE  /* syscall() under -std=c11 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#include "bf16_store.h"
#else
#define HAVE_AMX 0
#endif
#include "gh_native.h"
#include "tiled_linear.h"

#define AMX_ROWS 16          /* rows of a tile */
#ifndef AMX_STREAM_ROWS
#define AMX_STREAM_ROWS 64   /* calls of up to this many rows take the weights block by block */
#endif

/* 1 when this CPU and kernel let the process use AMX tiles (asks the kernel once for the tile state), else 0 */
int gh_amx_available(void) {
#if HAVE_AMX
    static int state = -1;
    if (state < 0) {
        /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): without it the first tile instruction faults */
        state = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    return state;
#else
    return 0;
#endif
}

/* bf16 values gh_amx_pack writes for an [n, k] weight */
int64_t gh_amx_packed_elems(int64_t n, int64_t k) {
    int64_t n_pad = (n + 31) / 32 * 32, k_pad = (k + TILE_K - 1) / TILE_K * TILE_K;
    return n_pad * k_pad;
}

/* W [n, k] (row stride w_stride) -> out (gh_amx_packed_elems(n, k) values), the layout above; gated_inter > 0
 * packs a [gate | up] weight of n = 2 * gated_inter rows gated (gated_inter a multiple of 16) */
void gh_amx_pack(const uint16_t *w, int64_t n, int64_t k, int64_t w_stride, int64_t gated_inter, uint16_t *out) {
    int64_t n_tiles = (n + 31) / 32 * 2, k_tiles = (k + TILE_K - 1) / TILE_K;
    for (int64_t nt = 0; nt < n_tiles; nt++) {
        /* the weight row of this tile's first column: gated, tile 2j holds gate rows 16j.., tile 2j + 1 up rows */
        int64_t first = gated_inter ? (nt % 2) * gated_inter + (nt / 2) * 16 : nt * 16;
        for (int64_t kt = 0; kt < k_tiles; kt++) {
            uint16_t *tile = out + (nt * k_tiles + kt) * TILE_ELEMS;
            for (int p = 0; p < 16; p++)
                for (int c = 0; c < 16; c++)
                    for (int e = 0; e < 2; e++) {
                        int64_t row = first + c, col = kt * TILE_K + p * 2 + e;
                        tile[(p * 16 + c) * 2 + e] = row < n && col < k ? w[row * w_stride + col] : 0;
                    }
        }
    }
}

#if HAVE_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;


/* A finished 32 x 32 block waiting to be rounded and stored: its float32 tiles, where it goes, and the rows left */
typedef struct {
    float acc[4][256] __attribute__((aligned(64)));
    uint16_t *y;
    const float *bias;
    int64_t y_stride, c, n, inter, rows, done;
    int mode;
} Pending;

/* stores rows [p->done, until) of a pending block (each row: its 32 columns, two 16-column halves; gated, the
 * halves go to the gate and up columns of 16 outputs, or become their silu(gate) * up) */
static inline void drain(Pending *p, int64_t until) {
    if (until > p->rows) until = p->rows;
    int left = (int)(p->n - p->c), cols0 = left < 16 ? left : 16, cols1 = left - 16 < 16 ? left - 16 : 16;
    int64_t to0 = p->c, to1 = p->c + 16;
    if (p->mode != STORE_PLAIN) {   /* n = 2 * inter, inter a multiple of 16: every block is whole */
        to0 = p->c / 2, to1 = p->inter + p->c / 2;
        cols0 = cols1 = 16;
    }
    for (int64_t r = p->done; r < until; r++) {
        int half = r >= AMX_ROWS, tr = (int)(r - half * AMX_ROWS);
        uint16_t *row = p->y + r * p->y_stride;
        const float *acc0 = p->acc[2 * half] + tr * 16, *acc1 = p->acc[2 * half + 1] + tr * 16;
        if (p->mode == STORE_SILU) {
            store_silu16(row + to0, _mm512_loadu_ps(acc0), _mm512_loadu_ps(acc1));
            continue;
        }
        store_row16(row + to0, _mm512_loadu_ps(acc0), p->bias ? p->bias + to0 : NULL, cols0);
        if (cols1 > 0) store_row16(row + to1, _mm512_loadu_ps(acc1), p->bias ? p->bias + to1 : NULL, cols1);
    }
    if (until > p->done) p->done = until;
}

/* 32 rows from x (row stride x_stride; 16 when `two` is 0) against the 32 columns from c of packed W, k_tiles K
 * steps; the previous
 * block (`prev`) is rounded and stored a few rows per K step, so the vector units work while the tile unit
 * multiplies (stored after the loop, the rounding cost a fifth of the time); this block's tiles go to `next`. */
static inline void block_32x32(const uint16_t *x, int64_t x_stride, const uint16_t *wp, int64_t k_tiles, int64_t c,
                               int two, Pending *prev, Pending *next) {
    const uint16_t *b0 = wp + (c / 16) * k_tiles * TILE_ELEMS, *b1 = b0 + k_tiles * TILE_ELEMS;
    int64_t per_step = (prev->rows + k_tiles - 1) / k_tiles;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kt = 0; kt < k_tiles; kt++) {
        _tile_loadd(4, x + kt * TILE_K, x_stride * 2);
        _tile_loadd(6, b0 + kt * TILE_ELEMS, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + kt * TILE_ELEMS, 64);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
            _tile_loadd(5, x + AMX_ROWS * x_stride + kt * TILE_K, x_stride * 2);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        if (prev->done < prev->rows) drain(prev, prev->done + per_step);
    }
    drain(prev, prev->rows);
    _tile_stored(0, next->acc[0], 64);
    _tile_stored(1, next->acc[1], 64);
    if (two) {
        _tile_stored(2, next->acc[2], 64);
        _tile_stored(3, next->acc[3], 64);
    }
}

/* One call's arguments, for the columns each thread takes (split_columns). */
typedef struct {
    const uint16_t *x, *wp, *tail;
    const float *bias;
    uint16_t *y;
    int64_t rows, x_stride, n, k_tiles, y_stride, inter;
    int mode;
} AmxCall;

/* columns [c0, c1) (32-aligned starts) for every row: chunks of columns whose packed weights stay in L2 */
static void column_range(void *arg, int64_t c0, int64_t c1) {
    const AmxCall *a = arg;
    const uint16_t *x = a->x, *wp = a->wp, *tail = a->tail;
    const float *bias = a->bias;
    uint16_t *y = a->y;
    int64_t rows = a->rows, x_stride = a->x_stride, n = a->n, k_tiles = a->k_tiles, y_stride = a->y_stride;
    int64_t inter = a->inter;
    int mode = a->mode;
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = AMX_ROWS;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    Pending *slots = aligned_alloc(64, 2 * sizeof(Pending));
    if (!slots) return;
    Pending *prev = &slots[0], *next = &slots[1];
    prev->rows = prev->done = 0;
    /* a few row blocks: each 32-column block against all of them while it is in L1 (weights read from memory once,
     * the hardware's prefetch streaming on while the tiles multiply: 7-15% faster at 48-64 rows with cold caches);
     * more: chunks of columns kept in L2 while all rows pass (at 96+ rows the block order is slower) */
    int64_t chunk = rows <= AMX_STREAM_ROWS ? 32 : tile_chunk_columns(k_tiles);
    for (int64_t cc = c0; cc < c1; cc += chunk) {
        int64_t ce = cc + chunk < c1 ? cc + chunk : c1;
        for (int64_t r = 0; r < rows; r += 32) {
            int64_t count = rows - r < 32 ? rows - r : 32;
            const uint16_t *a = count == 32 ? x + r * x_stride : tail;
            int64_t a_stride = count == 32 ? x_stride : k_tiles * TILE_K;
            for (int64_t c = cc; c < ce; c += 32) {
                block_32x32(a, a_stride, wp, k_tiles, c, count > AMX_ROWS, prev, next);
                next->y = y + r * y_stride;
                next->bias = bias;
                next->y_stride = y_stride;
                next->c = c;
                next->n = n;
                next->inter = inter;
                next->mode = mode;
                next->rows = count;
                next->done = 0;
                Pending *swap = prev;
                prev = next;
                next = swap;
            }
        }
    }
    drain(prev, prev->rows);
    free(slots);
    _tile_release();
}
#endif

/* y [rows, n] bf16 (row stride y_stride) = x [rows, k] bf16 (row stride x_stride, k a multiple of 32) W^T (+ bias
 * float32 [n]) for W packed by gh_amx_pack with the same gated_inter; with `silu` (a gated weight, no bias) y is
 * [rows, gated_inter]: silu(gate) * up. Returns 0, or -1 where AMX is unavailable (gh_amx_available), the
 * arguments do not fit, or the row tail's buffer cannot be allocated. */
int gh_amx_linear(const uint16_t *x, int64_t rows, int64_t x_stride, const uint16_t *wp, int64_t n, int64_t k,
                  const float *bias, uint16_t *y, int64_t y_stride, int64_t threads, int64_t gated_inter, int silu) {
#if HAVE_AMX
    int mode = tiled_store_mode(n, k, bias, gated_inter, silu);
    if (!gh_amx_available() || mode < 0) return -1;
    if (rows <= 0 || n <= 0) return 0;
    int64_t full = rows / 32 * 32;
    uint16_t *tail = NULL;  /* the last rows (fewer than 32) zero-padded to 32 */
    if (full < rows) {
        tail = calloc((size_t)(32 * k), sizeof(uint16_t));
        if (!tail) return -1;
        for (int64_t r = full; r < rows; r++) memcpy(tail + (r - full) * k, x + r * x_stride, (size_t)k * 2);
    }
    AmxCall call = {x, wp, tail, bias, y, rows, x_stride, n, k / TILE_K, y_stride, gated_inter, mode};
    split_columns(n, threads, column_range, &call);
    free(tail);
    return 0;
#else
    (void)x; (void)rows; (void)x_stride; (void)wp; (void)n; (void)k; (void)bias; (void)y; (void)y_stride;
    (void)threads; (void)gated_inter; (void)silu;
    return -1;
#endif
}
