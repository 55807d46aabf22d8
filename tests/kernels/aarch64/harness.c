/* Every exported gh_* kernel of kernels/cpu on fixed inputs, each output written to stdout as one line
 * "<name> <kind> <count> <hex bytes>" (kind: f32, u16, u8, i32): built for aarch64 (the Grace build and the
 * portable one, run under qemu) and for x86, test_cpu_native_aarch64.py holds the builds' outputs to each other.
 * The inputs come from an integer generator, so every build sees the same bits. Shapes: the classes the x86
 * portable and width tests cover (K tails, row groups, head sizes on and off the vector paths, GQA, bf16, fp8
 * pools), kept small enough for emulation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gh_native.h"
#include "gh_decode_layer.h"   /* the one-call layer's argument blocks, as the kernel reads them */

int gh_extend_attention(const void *q, int64_t q_tok_stride, int64_t q_head_stride, const void *k_cache,
                        const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                        int64_t block_size, const int32_t *block_tables, int64_t table_stride, const int64_t *seq_lens,
                        const int64_t *query_starts, int64_t num_seqs, int64_t heads, int64_t kv_heads,
                        int64_t head_dim, float scale, void *out, int dtype, int kv_type, const float *kv_scale,
                        int64_t threads, const HostKV *host);
void gh_fp8_values(const uint8_t *bytes, int64_t n, int kv_type, float *out);
void gh_dequantize(const WeightArgs *args, float *out, int64_t threads);
int gh_amx_available(void);
int64_t gh_amx_packed_elems(int64_t n, int64_t k);
void gh_amx_pack(const uint16_t *w, int64_t n, int64_t k, int64_t w_stride, int64_t gated_inter, uint16_t *out);
int gh_amx_linear(const uint16_t *x, int64_t rows, int64_t x_stride, const uint16_t *wp, int64_t n, int64_t k,
                  const float *bias, uint16_t *y, int64_t y_stride, int64_t threads, int64_t gated_inter, int silu);
int gh_bf16_dot_available(void);
int gh_bf16_dot_linear(const uint16_t *x, int64_t rows, int64_t x_stride, const uint16_t *wp, int64_t n, int64_t k,
                       const float *bias, uint16_t *y, int64_t y_stride, int64_t threads, int64_t gated_inter,
                       int silu);

enum { KV_SAME = 0, KV_E4M3 = 1, KV_E5M2 = 2 };

/* ---- inputs ---- */

static uint64_t state = 0x9e3779b97f4a7c15ull;

static uint32_t next24(void) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(state >> 40);
}

/* uniform in [-1, 1): an integer times 2^-23, exact in float32 */
static float uniform(void) { return (float)((int32_t)next24() - (1 << 23)) * (1.0f / (1 << 23)); }

static void *alloc(size_t bytes) {
    void *p = calloc(1, bytes + 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static float *randoms(int64_t n, float scale) {
    float *p = alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = uniform() * scale;
    return p;
}

static uint16_t to_bf16(float f) {   /* nearest even, as gh_ops.h's bf16_store (no NaNs here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* n values in the dtype (0 float32, 1 bf16 bits) */
static void *values(int64_t n, float scale, int dtype) {
    float *f = randoms(n, scale);
    if (!dtype) return f;
    uint16_t *h = alloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = to_bf16(f[i]);
    free(f);
    return h;
}

/* finite fp16 bits of magnitude 2^-6 .. 2^2, and their float32 values (exact) */
static uint16_t *halves(int64_t n, float *widened) {
    uint16_t *h = alloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        uint32_t r = next24(), sign = r & 1u, exp = 9u + (r >> 1) % 8u, man = (r >> 4) & 0x3ffu;
        h[i] = (uint16_t)(sign << 15 | exp << 10 | man);
        uint32_t bits = sign << 31 | (exp + 112u) << 23 | man << 13;
        memcpy(widened + i, &bits, 4);
    }
    return h;
}

/* the value of an e4m3fn code, computed another way than fp8_linear.c does */
static float fp8_reference(uint8_t code) {
    int e = (code >> 3) & 15, m = code & 7;
    float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return code & 0x80 ? -v : v;
}

/* e4m3fn codes [n, k] (no NaN), positive scales [n, groups] per `group` columns, and the weight dequantized as
 * PackedWeight.dequantize gives it (each code's value times its scale) */
static uint8_t *fp8_weight(int64_t n, int64_t k, int64_t group, float **scale, float *dequantized) {
    int64_t groups = (k + group - 1) / group;
    uint8_t *q = alloc((size_t)(n * k));
    *scale = randoms(n * groups, 0.01f);
    for (int64_t i = 0; i < n * groups; i++) (*scale)[i] = fabsf((*scale)[i]) + 1e-4f;
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < k; i++) {
            uint8_t code = (uint8_t)next24();
            if ((code & 0x7f) == 0x7f) code ^= 1;
            q[c * k + i] = code;
            dequantized[c * k + i] = fp8_reference(code) * (*scale)[c * groups + i / group];
        }
    return q;
}

/* ---- output ---- */

static void emit(const char *name, const char *kind, const void *data, int64_t count) {
    int64_t size = strcmp(kind, "f32") == 0 || strcmp(kind, "i32") == 0 ? 4 : strcmp(kind, "u16") == 0 ? 2 : 1;
    const uint8_t *bytes = data;
    printf("%s %s %lld ", name, kind, (long long)count);
    for (int64_t i = 0; i < count * size; i++) printf("%02x", bytes[i]);
    putchar('\n');
}

static void emit_int(const char *name, int64_t value) {
    int32_t v = (int32_t)value;
    emit(name, "i32", &v, 1);
}

#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)

/* ---- linears ---- */

static void dense_linears(void) {
    static const int64_t shapes[][2] = {{203, 580}, {7, 13}, {33, 64}};
    char name[128];
    for (int s = 0; s < 3; s++) {
        int64_t n = shapes[s][0], k = shapes[s][1];
        float *w = randoms(n * k, 1.0f), *bias = randoms(n, 1.0f), *widened = alloc((size_t)(n * k) * 4);
        uint16_t *h = halves(n * k, widened);
        int64_t group = k == 13 ? 13 : k == 64 ? 32 : 16;    /* one scale per channel; blocks; a partial last block */
        float *scale, *dequantized = alloc((size_t)(n * k) * 4);
        uint8_t *codes = fp8_weight(n, k, group, &scale, dequantized);
        for (int64_t rows = 1; rows <= 8; rows += rows < 3 ? 2 : 5) {   /* 1, 3, 8 */
            float *x = randoms(rows * k, 1.0f), *out = alloc((size_t)(rows * n) * 4);
            gh_f32_linear(x, rows, k, w, n, k, k, bias, out, n, 2);
            emit(NAME("linear/f32/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32", out,
                 rows * n);
            gh_f32_linear(x, rows, k, w, n, k, k, NULL, out, n, 2);
            emit(NAME("linear/f32-nobias/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32",
                 out, rows * n);
            gh_f16_linear(x, rows, k, h, n, k, k, bias, out, n, 2);
            emit(NAME("linear/f16/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32", out,
                 rows * n);
            gh_f16_linear(x, rows, k, h, n, k, k, bias, out, n, 1);
            emit(NAME("linear/f16-1thread/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32",
                 out, rows * n);
            gh_f32_linear(x, rows, k, widened, n, k, k, bias, out, n, 2);
            emit(NAME("linear/f32-of-f16/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32",
                 out, rows * n);
            gh_fp8_linear(x, rows, k, codes, n, k, k, scale, (k + group - 1) / group, group, bias, out, n, 2);
            emit(NAME("linear/fp8/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32", out,
                 rows * n);
            gh_fp8_linear(x, rows, k, codes, n, k, k, scale, (k + group - 1) / group, group, bias, out, n, 1);
            emit(NAME("linear/fp8-1thread/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32",
                 out, rows * n);
            gh_f32_linear(x, rows, k, dequantized, n, k, k, bias, out, n, 2);
            emit(NAME("linear/f32-of-fp8/%lldx%lld/rows%lld", (long long)n, (long long)k, (long long)rows), "f32",
                 out, rows * n);
            free(x);
            free(out);
        }
        free(w);
        free(bias);
        free(widened);
        free(h);
        free(codes);
        free(scale);
        free(dequantized);
    }
}

/* a packed int8 (fmt 0) or int4 (fmt 1) weight with random codes, scales and (int4) minimums */
static WeightArgs packed_weight(int64_t fmt, int64_t n, int64_t k, int64_t group) {
    int64_t bytes = fmt ? n * k / 2 : n * k;
    uint8_t *q = alloc((size_t)bytes);
    for (int64_t i = 0; i < bytes; i++) q[i] = (uint8_t)next24();
    float *scale = randoms(n * (k / group), 0.01f);
    for (int64_t i = 0; i < n * (k / group); i++) scale[i] = scale[i] < 0 ? -scale[i] + 1e-4f : scale[i] + 1e-4f;
    WeightArgs args = {q, scale, fmt ? randoms(n * (k / group), 0.1f) : NULL, fmt, n, k, group};
    return args;
}

/* an int4 weight's codes widened to int8 q - 8 in the kernel's chunk order (fmt 2: the 16 even columns of each 32,
 * then the 16 odd ones), over the same scales and minimums */
static WeightArgs widened_weight(const WeightArgs *int4) {
    int64_t n = int4->n, k = int4->k;
    int8_t *q = alloc((size_t)(n * k));
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c += 32)
            for (int64_t i = 0; i < 16; i++) {
                uint8_t byte = ((const uint8_t *)int4->q)[r * (k / 2) + c / 2 + i];
                q[r * k + c + i] = (int8_t)((byte & 0x0f) - 8);
                q[r * k + c + 16 + i] = (int8_t)((byte >> 4) - 8);
            }
    WeightArgs args = {q, int4->scale, int4->minimum, 2, n, k, int4->group};
    return args;
}

static void free_weight(WeightArgs *args) {
    free((void *)args->q);
    free((void *)args->scale);
    free((void *)args->minimum);
}

static void quant_linears(void) {
    static const int64_t shapes[][3] = {{203, 576, 32}, {8, 64, 64}, {5, 96, 32}};
    char name[128];
    for (int s = 0; s < 3; s++)
        for (int64_t fmt = 0; fmt < 2; fmt++) {
            int64_t n = shapes[s][0], k = shapes[s][1], group = shapes[s][2];
            WeightArgs args = packed_weight(fmt, n, k, group);
            /* an int4 weight runs again with its codes widened (fmt 2) on the same rows */
            WeightArgs widened = fmt ? widened_weight(&args) : args;
            const WeightArgs *forms[] = {&args, &widened};
            int64_t form_fmts[] = {fmt, 2};
            float *dense = alloc((size_t)(n * k) * 4);
            for (int f = 0; f < 1 + (int)fmt; f++) {
                gh_dequantize(forms[f], dense, 2);
                emit(NAME("dequantize/fmt%lld/%lldx%lld", (long long)form_fmts[f], (long long)n, (long long)k),
                     "f32", dense, n * k);
            }
            for (int64_t rows = 1; rows <= 8; rows += rows < 3 ? 2 : 5) {
                float *x = randoms(rows * k, 2.0f), *out = alloc((size_t)(rows * n) * 4);
                for (int64_t threads = 1; threads <= 3; threads += 2)
                    for (int f = 0; f < 1 + (int)fmt; f++) {
                        long long ff = (long long)form_fmts[f];
                        emit_int(NAME("rc/quant/fmt%lld/%lldx%lld/rows%lld/threads%lld", ff, (long long)n,
                                      (long long)k, (long long)rows, (long long)threads),
                                 gh_quant_linear(x, rows, k, forms[f], out, n, threads));
                        emit(NAME("quant/fmt%lld/%lldx%lld/rows%lld/threads%lld", ff, (long long)n,
                                  (long long)k, (long long)rows, (long long)threads), "f32", out, rows * n);
                    }
                free(x);
                free(out);
            }
            free(dense);
            if (fmt) free((void *)widened.q);
            free_weight(&args);
        }
}

/* ---- row ops, KV store, fp8 ---- */

static void row_ops(void) {
    char name[128];
    static const int64_t dims[] = {96, 13};
    for (int dtype = 0; dtype < 2; dtype++) {
        int64_t esz = dtype ? 2 : 4;
        for (int i = 0; i < 2; i++) {
            int64_t dim = dims[i], rows = 6, stride = dim + 3;
            void *x = values(rows * stride, 3.0f, dtype), *w = values(dim, 1.0f, dtype);
            void *out = alloc((size_t)(rows * 2 * dim * esz));
            gh_rms_norm(x, rows, dim, stride, w, out, 1e-6f, dtype, 2);
            emit(NAME("rows/rms_norm/dtype%d/dim%lld", dtype, (long long)dim), dtype ? "u16" : "f32", out, rows * dim);
            gh_silu_mul(x, 3, dim, out, dtype, 2);   /* 3 rows of 2 * dim */
            emit(NAME("rows/silu_mul/dtype%d/dim%lld", dtype, (long long)dim), dtype ? "u16" : "f32", out, 3 * dim);
            free(x);
            free(w);
            free(out);
        }
        int64_t tokens = 6, heads = 3, half = 16, tok_stride = heads * 2 * half + 8;
        void *x = values(tokens * tok_stride, 2.0f, dtype), *cos = values(tokens * half, 1.0f, dtype);
        void *sin = values(tokens * half, 1.0f, dtype), *out = alloc((size_t)(tokens * heads * 2 * half * esz));
        gh_rotary(x, tokens, heads, half, tok_stride, 2 * half, cos, sin, out, dtype, 2);
        emit(NAME("rows/rotary/dtype%d", dtype), dtype ? "u16" : "f32", out, tokens * heads * 2 * half);
        free(x);
        free(cos);
        free(sin);
        free(out);
    }
}

static void kv_ops(void) {
    char name[128];
    uint8_t bytes[256];
    float table[256];
    for (int b = 0; b < 256; b++) bytes[b] = (uint8_t)b;
    for (int kv_type = KV_E4M3; kv_type <= KV_E5M2; kv_type++) {
        gh_fp8_values(bytes, 256, kv_type, table);
        emit(NAME("kv/fp8_values/%d", kv_type), "f32", table, 256);
    }
    int64_t block_size = 4, kv_heads = 2, d = 24, blocks = 5, tokens = 7;
    int64_t slot_stride = kv_heads * d, block_stride = block_size * slot_stride, pool = blocks * block_stride;
    int64_t slots[] = {3, 17, -1, 0, 9, 12, 19};
    for (int dtype = 0; dtype < 2; dtype++) {
        int64_t esz = dtype ? 2 : 4;
        void *k = values(tokens * kv_heads * d, 4.0f, dtype), *v = values(tokens * kv_heads * d, 4.0f, dtype);
        void *kc = alloc((size_t)(pool * esz)), *vc = alloc((size_t)(pool * esz));
        gh_write_kv(kc, vc, block_stride, slot_stride, d, block_size, k, v, kv_heads * d, d, kv_heads * d, d, slots,
                    tokens, kv_heads, d, esz);
        emit(NAME("kv/write/dtype%d/k", dtype), "u8", kc, pool * esz);
        emit(NAME("kv/write/dtype%d/v", dtype), "u8", vc, pool * esz);
        float kv_scale[2] = {0.02f, 0.03f};
        for (int kv_type = KV_E4M3; kv_type <= KV_E5M2; kv_type++) {
            uint8_t *k8 = alloc((size_t)pool), *v8 = alloc((size_t)pool);
            gh_write_kv_fp8(k8, v8, block_stride, slot_stride, d, block_size, k, v, kv_heads * d, d, kv_heads * d, d,
                            slots, tokens, kv_heads, d, dtype, kv_type, kv_scale);
            emit(NAME("kv/write_fp8/dtype%d/type%d/k", dtype, kv_type), "u8", k8, pool);
            emit(NAME("kv/write_fp8/dtype%d/type%d/v", dtype, kv_type), "u8", v8, pool);
            free(k8);
            free(v8);
        }
        free(k);
        free(v);
        free(kc);
        free(vc);
    }
}

/* ---- attention ---- */

/* A paged pool (K and V planes of [blocks][block_size][kv_heads][d]) whose sequences' blocks are scattered. */
typedef struct {
    int64_t num_seqs, kv_heads, d, block_size, blocks, table_stride, elem;
    int64_t seq_lens[16];
    int32_t *tables;
    void *k, *v;
} Pool;

static Pool make_pool(const int64_t *seq_lens, int64_t num_seqs, int64_t kv_heads, int64_t d, int dtype,
                      int kv_type) {
    Pool p = {num_seqs, kv_heads, d, 16, 1, 1, kv_type ? 1 : dtype ? 2 : 4, {0}, NULL, NULL, NULL};
    for (int64_t b = 0; b < num_seqs; b++) {
        int64_t needed = (seq_lens[b] + p.block_size - 1) / p.block_size;
        p.seq_lens[b] = seq_lens[b];
        p.blocks += needed;
        if (needed > p.table_stride) p.table_stride = needed;
    }
    p.blocks += 2;
    int32_t *ids = alloc((size_t)p.blocks * 4);
    for (int64_t i = 0; i < p.blocks - 1; i++) ids[i] = (int32_t)(i + 1);   /* block 0: the tables' padding */
    for (int64_t i = p.blocks - 2; i > 0; i--) {
        int64_t j = next24() % (uint32_t)(i + 1);
        int32_t t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    p.tables = alloc((size_t)(num_seqs * p.table_stride) * 4);
    for (int64_t b = 0, at = 0; b < num_seqs; b++)
        for (int64_t i = 0; i < (seq_lens[b] + p.block_size - 1) / p.block_size; i++)
            p.tables[b * p.table_stride + i] = ids[at++];
    free(ids);
    int64_t elems = p.blocks * p.block_size * kv_heads * d;
    if (kv_type) {
        uint8_t *k = alloc((size_t)elems), *v = alloc((size_t)elems);
        /* bit 6 clear: no NaN or infinity in either fp8 format, magnitudes below 2 */
        for (int64_t i = 0; i < elems; i++) k[i] = (uint8_t)(next24() & 0xb7), v[i] = (uint8_t)(next24() & 0xb7);
        p.k = k, p.v = v;
    } else {
        p.k = values(elems, 1.0f, dtype), p.v = values(elems, 1.0f, dtype);
    }
    return p;
}

static void free_pool(Pool *p) {
    free(p->tables);
    free(p->k);
    free(p->v);
}

/* The pool's blocks of even table columns moved to a host tier read in place (HostKV): copied into shuffled slots of
 * a separate allocation, K and V of a slot side by side (so the host block stride is twice the pool's), the table
 * entries pointed at them from `first` on, and the pool's copies poisoned (0x7f bytes: huge or NaN), so a read of
 * the wrong block shows. Returns the tables the host case reads; *host and *memory are set. */
static int32_t *move_to_host(const Pool *p, HostKV *host, void **memory) {
    int64_t block = p->block_size * p->kv_heads * p->d * p->elem, slots = 0;   /* bytes */
    int32_t *tables = alloc((size_t)(p->num_seqs * p->table_stride) * 4);
    memcpy(tables, p->tables, (size_t)(p->num_seqs * p->table_stride) * 4);
    for (int64_t b = 0; b < p->num_seqs; b++) slots += (p->seq_lens[b] + 2 * p->block_size - 1) / (2 * p->block_size);
    char *tier = alloc((size_t)(slots * 2 * block));
    host->first = p->blocks + 3;
    host->k = tier, host->v = tier + block, host->block_stride = 2 * block / p->elem;
    for (int64_t b = 0, slot = 0; b < p->num_seqs; b++)
        for (int64_t i = 0; i * p->block_size < p->seq_lens[b]; i += 2, slot++) {
            int64_t at = slots - 1 - slot;                   /* the slots not in table order */
            int32_t *entry = tables + b * p->table_stride + i;
            memcpy(tier + at * 2 * block, (char *)p->k + *entry * block, (size_t)block);
            memcpy(tier + at * 2 * block + block, (char *)p->v + *entry * block, (size_t)block);
            memset((char *)p->k + *entry * block, 0x7f, (size_t)block);
            memset((char *)p->v + *entry * block, 0x7f, (size_t)block);
            *entry = (int32_t)(host->first + at);
        }
    *memory = tier;
    return tables;
}

static int64_t pool_bytes(const Pool *p) { return p->blocks * p->block_size * p->kv_heads * p->d * p->elem; }

static float kv_scales[2] = {0.5f, 0.75f};

/* host: NULL, or the host blocks the pool's tables name (move_to_host), which the outputs' names say */
static void decode(const char *tag, const Pool *p, const void *q, int64_t heads, int dtype, int kv_type,
                   int64_t threads, const HostKV *host) {
    char name[160];
    int64_t d = p->d, esz = dtype ? 2 : 4;
    void *out = alloc((size_t)(p->num_seqs * heads * d * esz));
    gh_decode_attention(q, heads * d, d, p->k, p->v, p->block_size * p->kv_heads * d, p->kv_heads * d, d,
                        p->block_size, p->tables, p->table_stride, p->seq_lens, p->num_seqs, heads, p->kv_heads, d,
                        1.0f / 8.0f, out, dtype, kv_type, kv_scales, threads, host);
    emit(NAME("attn/decode%s/%s/threads%lld", host ? "-host" : "", tag, (long long)threads), dtype ? "u16" : "f32",
         out, p->num_seqs * heads * d);
    free(out);
}

static void extend(const char *tag, const Pool *p, const void *q, const int64_t *query_lens, int64_t heads,
                   int dtype, int kv_type, int64_t threads, const HostKV *host) {
    char name[160];
    int64_t d = p->d, esz = dtype ? 2 : 4, starts[17] = {0};
    for (int64_t b = 0; b < p->num_seqs; b++) starts[b + 1] = starts[b] + query_lens[b];
    int64_t tokens = starts[p->num_seqs];
    void *out = alloc((size_t)(tokens * heads * d * esz));
    int rc = gh_extend_attention(q, heads * d, d, p->k, p->v, p->block_size * p->kv_heads * d, p->kv_heads * d, d,
                                 p->block_size, p->tables, p->table_stride, p->seq_lens, starts, p->num_seqs, heads,
                                 p->kv_heads, d, 1.0f / 8.0f, out, dtype, kv_type, kv_scales, threads, host);
    emit_int(NAME("rc/extend%s/%s/threads%lld", host ? "-host" : "", tag, (long long)threads), rc);
    emit(NAME("attn/extend%s/%s/threads%lld", host ? "-host" : "", tag, (long long)threads), dtype ? "u16" : "f32",
         out, tokens * heads * d);
    free(out);
}

typedef struct {
    int64_t heads, kv_heads, d, num_seqs;
    int64_t query_lens[9], seq_lens[9];
} AttnCase;

static void attention(void) {
    static const AttnCase cases[] = {
        {6, 2, 64, 3, {1, 1, 1}, {1, 130, 77}},       /* decode: vector path, GQA */
        {4, 4, 128, 1, {1}, {300}},
        {6, 2, 24, 3, {1, 1, 1}, {5, 40, 130}},       /* head sizes off the vector path: 24, 20 (an 8-lane tail) */
        {4, 2, 20, 2, {1, 1}, {33, 17}},
        {8, 2, 80, 9, {1, 1, 1, 1, 1, 1, 1, 1, 1}, {200, 1, 8, 71, 129, 5, 64, 33, 16}},
        {6, 2, 64, 3, {9, 130, 4}, {9, 130, 40}},     /* prompt chunks: whole prompts and chunks after a prefix */
        {6, 2, 24, 3, {9, 70, 4}, {9, 70, 40}},
        {9, 3, 64, 4, {40, 3, 50, 1}, {40, 3, 90, 9}},
        {4, 4, 128, 2, {7, 64}, {71, 100}},
    };
    char tag[96];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const AttnCase *a = &cases[c];
        int single = 1;
        int64_t tokens = 0;
        for (int64_t b = 0; b < a->num_seqs; b++) single &= a->query_lens[b] == 1, tokens += a->query_lens[b];
        for (int dtype = 0; dtype < 2; dtype++)
            for (int kv_type = KV_SAME; kv_type <= (dtype ? KV_E5M2 : KV_SAME); kv_type++) {
                if (kv_type && c % 2) continue;   /* fp8 pools on every other case */
                Pool p = make_pool(a->seq_lens, a->num_seqs, a->kv_heads, a->d, dtype, kv_type);
                void *q = values(tokens * a->heads * a->d, 1.0f, dtype);
                snprintf(tag, sizeof tag, "case%zu/dtype%d/kv%d", c, dtype, kv_type);
                for (int64_t threads = 1; threads <= 3; threads += 2) {
                    if (single) decode(tag, &p, q, a->heads, dtype, kv_type, threads, NULL);
                    extend(tag, &p, q, a->query_lens, a->heads, dtype, kv_type, threads, NULL);
                }
                /* the same with half of the blocks read in place from a host tier */
                HostKV host;
                void *tier;
                int32_t *device_tables = p.tables;
                p.tables = move_to_host(&p, &host, &tier);
                for (int64_t threads = 1; threads <= 3; threads += 2) {
                    if (single) decode(tag, &p, q, a->heads, dtype, kv_type, threads, &host);
                    extend(tag, &p, q, a->query_lens, a->heads, dtype, kv_type, threads, &host);
                }
                free(p.tables);
                free(tier);
                p.tables = device_tables;
                free(q);
                free_pool(&p);
            }
    }
}

/* gh_decode_attention_block against its three steps (gh_rotary, gh_write_kv / _fp8, gh_decode_attention) */
static void attention_block(void) {
    char name[128];
    static const int64_t seq_lens[] = {1, 37, 90};
    int64_t heads = 6, kv_heads = 2, d = 64, num_seqs = 3, width = (heads + 2 * kv_heads) * d;
    for (int dtype = 0; dtype < 2; dtype++)
        for (int kv_type = KV_SAME; kv_type <= (dtype ? KV_E4M3 : KV_SAME); kv_type++) {
            int64_t esz = dtype ? 2 : 4;
            Pool p = make_pool(seq_lens, num_seqs, kv_heads, d, dtype, kv_type);
            int64_t slots[3], bytes = pool_bytes(&p), slot_stride = kv_heads * d, block_stride = 16 * slot_stride;
            for (int64_t b = 0; b < num_seqs; b++)
                slots[b] = p.tables[b * p.table_stride + (seq_lens[b] - 1) / 16] * 16 + (seq_lens[b] - 1) % 16;
            void *qkv = values(num_seqs * width, 1.0f, dtype), *cos = values(num_seqs * d / 2, 1.0f, dtype);
            void *sin = values(num_seqs * d / 2, 1.0f, dtype);
            void *k0 = alloc((size_t)bytes), *v0 = alloc((size_t)bytes);
            memcpy(k0, p.k, (size_t)bytes), memcpy(v0, p.v, (size_t)bytes);
            void *out = alloc((size_t)(num_seqs * heads * d * esz));
            int rc = gh_decode_attention_block(qkv, width, cos, sin, p.k, p.v, block_stride, slot_stride, d, 16,
                                               slots, p.tables, p.table_stride, p.seq_lens, num_seqs, heads,
                                               kv_heads, d, 0.125f, out, dtype, kv_type, kv_scales, 2, NULL);
            emit_int(NAME("rc/block/dtype%d/kv%d", dtype, kv_type), rc);
            emit(NAME("block/fused/dtype%d/kv%d/out", dtype, kv_type), dtype ? "u16" : "f32", out,
                 num_seqs * heads * d);
            emit(NAME("block/fused/dtype%d/kv%d/k", dtype, kv_type), "u8", p.k, bytes);
            emit(NAME("block/fused/dtype%d/kv%d/v", dtype, kv_type), "u8", p.v, bytes);
            /* the same three steps, one call each */
            char *rotated = alloc((size_t)(num_seqs * (heads + kv_heads) * d * esz));
            gh_rotary(qkv, num_seqs, heads + kv_heads, d / 2, width, d, cos, sin, rotated, dtype, 2);
            const char *k = rotated + heads * d * esz, *v = (const char *)qkv + (heads + kv_heads) * d * esz;
            if (kv_type)
                gh_write_kv_fp8(k0, v0, block_stride, slot_stride, d, 16, k, v, (heads + kv_heads) * d, d, width, d,
                                slots, num_seqs, kv_heads, d, dtype, kv_type, kv_scales);
            else
                gh_write_kv(k0, v0, block_stride, slot_stride, d, 16, k, v, (heads + kv_heads) * d, d, width, d, slots,
                            num_seqs, kv_heads, d, esz);
            gh_decode_attention(rotated, (heads + kv_heads) * d, d, k0, v0, block_stride, slot_stride, d, 16, p.tables,
                                p.table_stride, p.seq_lens, num_seqs, heads, kv_heads, d, 0.125f, out, dtype, kv_type,
                                kv_scales, 2, NULL);
            emit(NAME("block/steps/dtype%d/kv%d/out", dtype, kv_type), dtype ? "u16" : "f32", out,
                 num_seqs * heads * d);
            emit(NAME("block/steps/dtype%d/kv%d/k", dtype, kv_type), "u8", k0, bytes);
            emit(NAME("block/steps/dtype%d/kv%d/v", dtype, kv_type), "u8", v0, bytes);
            free(rotated);
            free(out);
            free(k0);
            free(v0);
            free(qkv);
            free(cos);
            free(sin);
            free_pool(&p);
        }
}

/* ---- one decoder layer ---- */

static LinearArgs dense_args(int64_t kind, int64_t n, int64_t k, const WeightArgs *packed) {
    LinearArgs l = {kind, NULL, k, packed, randoms(n, 0.1f), n, k, 2};
    if (kind == LINEAR_F32) {
        l.w = randoms(n * k, 0.2f);
    } else if (kind == LINEAR_F16) {
        float *widened = alloc((size_t)(n * k) * 4);
        l.w = halves(n * k, widened);
        free(widened);
    }
    return l;
}

static void decode_layer(void) {
    char name[128];
    int64_t hidden = 64, heads = 4, kv_heads = 2, d = 16, inter = 96, rows = 2, width = (heads + 2 * kv_heads) * d;
    static const int64_t seq_lens[] = {5, 20};
    for (int dtype = 0; dtype < 2; dtype++) {
        int64_t esz = dtype ? 2 : 4;
        WeightArgs o_w = packed_weight(1, hidden, heads * d, 32), down_w = packed_weight(0, hidden, inter, 32);
        WeightArgs qkv_w = packed_weight(0, width, hidden, 32), gate_up_w = packed_weight(1, 2 * inter, hidden, 32);
        Pool p = make_pool(seq_lens, rows, kv_heads, d, dtype, KV_SAME);
        int64_t slots[2];
        for (int64_t b = 0; b < rows; b++)
            slots[b] = p.tables[b * p.table_stride + (seq_lens[b] - 1) / 16] * 16 + (seq_lens[b] - 1) % 16;
        DecodeLayerArgs a;
        memset(&a, 0, sizeof a);
        /* float32: one linear of each kind; bf16: the quantized linears that route takes */
        a.qkv = dtype ? dense_args(LINEAR_QUANT, width, hidden, &qkv_w) : dense_args(LINEAR_F32, width, hidden, NULL);
        a.o = dense_args(LINEAR_QUANT, hidden, heads * d, &o_w);
        a.gate_up = dtype ? dense_args(LINEAR_QUANT, 2 * inter, hidden, &gate_up_w)
                          : dense_args(LINEAR_F16, 2 * inter, hidden, NULL);
        a.down = dense_args(LINEAR_QUANT, hidden, inter, &down_w);
        a.norm1 = values(hidden, 1.0f, dtype), a.norm2 = values(hidden, 1.0f, dtype);
        a.eps = 1e-6f, a.scale = 0.25f;
        a.cos = values(rows * d / 2, 1.0f, dtype), a.sin = values(rows * d / 2, 1.0f, dtype);
        a.k_cache = p.k, a.v_cache = p.v;
        a.block_stride = 16 * kv_heads * d, a.slot_stride = kv_heads * d, a.head_stride = d, a.block_size = 16;
        a.slots = slots, a.block_tables = p.tables, a.table_stride = p.table_stride, a.seq_lens = p.seq_lens;
        a.heads = heads, a.kv_heads = kv_heads, a.head_dim = d, a.hidden = hidden, a.inter = inter, a.threads = 2;
        a.kv_type = KV_SAME, a.kv_scale = kv_scales, a.dtype = dtype;
        void *x = values(rows * hidden, 1.0f, dtype), *out = alloc((size_t)(rows * hidden * esz));
        emit_int(NAME("rc/layer/dtype%d", dtype), gh_decode_layer(x, rows, &a, out));
        emit(NAME("layer/out/dtype%d", dtype), dtype ? "u16" : "f32", out, rows * hidden);
        /* the stack: the same layer three times over, the step's fields from their own block */
        DecodeStepArgs step = {a.cos, a.sin, a.slots, a.block_tables, a.table_stride, a.seq_lens};
        const DecodeLayerArgs *stack[] = {&a, &a, &a};
        void *stacked = alloc((size_t)(rows * hidden * esz));
        emit_int(NAME("rc/layers/dtype%d", dtype), gh_decode_layers(x, rows, stack, 3, &step, stacked));
        emit(NAME("layers/out/dtype%d", dtype), dtype ? "u16" : "f32", stacked, rows * hidden);
        free(stacked);
        LinearArgs *linears[] = {&a.qkv, &a.o, &a.gate_up, &a.down};
        for (int i = 0; i < 4; i++) {
            free((void *)linears[i]->w);
            free((void *)linears[i]->bias);
        }
        free((void *)a.norm1), free((void *)a.norm2), free((void *)a.cos), free((void *)a.sin);
        free(x);
        free(out);
        free_pool(&p);
        free_weight(&o_w), free_weight(&down_w), free_weight(&qkv_w), free_weight(&gate_up_w);
    }
}

/* ---- the tiled bf16 linears: the packing everywhere, the products where the CPU has them ---- */

static void tiled_linears(void) {
    char name[128];
    int64_t n = 40, k = 64, rows = 3, elems = gh_amx_packed_elems(n, k);
    emit_int("tiled/amx_available", gh_amx_available());
    emit_int("tiled/bf16_dot_available", gh_bf16_dot_available());
    emit_int("tiled/packed_elems", elems);
    uint16_t *w = values(n * k, 1.0f, 1), *x = values(rows * k, 1.0f, 1);
    uint16_t *packed = alloc((size_t)elems * 2), *y = alloc((size_t)(rows * n) * 2);
    for (int64_t gated = 0; gated <= 16; gated += 16) {
        int64_t nn = gated ? 32 : n;
        gh_amx_pack(w, nn, k, k, gated, packed);
        emit(NAME("tiled/pack/gated%lld", (long long)gated), "u16", packed, gh_amx_packed_elems(nn, k));
        int rc = gh_amx_linear(x, rows, k, packed, nn, k, NULL, y, n, 1, gated, 0);
        emit_int(NAME("rc/amx/gated%lld", (long long)gated), rc);
        if (rc == 0) emit(NAME("tiled/amx/gated%lld", (long long)gated), "u16", y, rows * n);
        rc = gh_bf16_dot_linear(x, rows, k, packed, nn, k, NULL, y, n, 1, gated, 0);
        emit_int(NAME("rc/bf16_dot/gated%lld", (long long)gated), rc);
        if (rc == 0) emit(NAME("tiled/bf16_dot/gated%lld", (long long)gated), "u16", y, rows * n);
    }
    free(w);
    free(x);
    free(packed);
    free(y);
}

int main(void) {
    dense_linears();
    quant_linears();
    row_ops();
    kv_ops();
    attention();
    attention_block();
    decode_layer();
    tiled_linears();
    return 0;
}
