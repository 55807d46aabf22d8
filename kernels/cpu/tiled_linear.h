/* What the two tiled bf16 linears (amx_linear.c, bf16_dot_linear.c) share besides their epilogue (bf16_store.h):
 * the packed layout's sizes, the arguments both take, the L2-sized column chunks and the split of a call's columns
 * over threads. Every output is computed by one thread alone, whichever, so the split never changes bits. */
#ifndef GH_TILED_LINEAR_H
#define GH_TILED_LINEAR_H
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define TILE_K 32             /* bf16 K columns per packed tile (one 64-byte row of pairs) */
#define TILE_ELEMS 512        /* bf16 values in one packed tile: 16 pairs x 16 columns x 2 */
#define TILE_L2_CHUNK_BYTES (1 << 20)

enum { STORE_PLAIN = 0, STORE_GATED = 1, STORE_SILU = 2 };

/* How a call with these arguments stores its sums (STORE_*), or -1 where they do not fit: k a multiple of 32, a
 * gated weight 2 x gated_inter rows of multiples of 16, silu only over a gated weight and without a bias. */
static inline int tiled_store_mode(int64_t n, int64_t k, const float *bias, int64_t gated_inter, int silu) {
    if (k % TILE_K) return -1;
    if (gated_inter && (gated_inter % 16 || n != 2 * gated_inter)) return -1;
    if (silu && (!gated_inter || bias)) return -1;
    return silu ? STORE_SILU : gated_inter ? STORE_GATED : STORE_PLAIN;
}

/* Columns per chunk whose packed weights fit half of L2 (they are read again for every group of rows). */
static inline int64_t tile_chunk_columns(int64_t k_tiles) {
    int64_t chunk = TILE_L2_CHUNK_BYTES / (k_tiles * TILE_K * 2) / 32 * 32;
    return chunk < 32 ? 32 : chunk;
}

/* The n columns in 32-column blocks, split over up to `threads` OpenMP threads: each gives its contiguous share,
 * columns [c0, c1) with c0 32-aligned, to run(ctx, c0, c1). */
static inline void split_columns(int64_t n, int64_t threads, void (*run)(void *ctx, int64_t c0, int64_t c1),
                                 void *ctx) {
    int64_t blocks = (n + 31) / 32, team = threads < blocks ? threads : blocks;
    if (team < 1) team = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads((int)team) if (team > 1)
#endif
    {
#ifdef _OPENMP
        int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
#else
        int64_t t = 0, count = 1;
#endif
        int64_t b0 = blocks * t / count, b1 = blocks * (t + 1) / count;
        if (b0 < b1) run(ctx, b0 * 32, b1 * 32 < n ? b1 * 32 : n);
    }
}
#endif
