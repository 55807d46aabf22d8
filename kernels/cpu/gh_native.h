/* What the native CPU sources share: the packed-weight argument block and the entry points one source calls
 * in another (all are built into one library by gh200rt/backends/cpu/native.py). */
#ifndef GH_NATIVE_H
#define GH_NATIVE_H
#include <stdint.h>

typedef struct {
    const void *q;           /* int8 [N, K] (fmt 0) or uint8 [N, K/2] (fmt 1, column k in byte k/2, low nibble even k) */
    const float *scale;      /* [N, groups] */
    const float *minimum;    /* [N, groups] for int4, else NULL */
    int64_t fmt, n, k, group;
} WeightArgs;

/* Host KV blocks that attention reads in place (gh200rt/kv/host_blocks.py): a block table entry from `first` on
 * names block entry - first of the host tier's K and V planes of the layer, `block_stride` elements apart, with the
 * pool's slot and head strides. An attention entry point given NULL reads the pool's blocks only. */
typedef struct {
    int64_t first;
    const void *k, *v;
    int64_t block_stride;
} HostKV;

int gh_quant_linear(const float *x, int64_t rows, int64_t x_stride, const WeightArgs *args, float *out,
                    int64_t out_stride, int64_t threads);
void gh_f32_linear(const float *x, int64_t rows, int64_t x_stride, const float *w, int64_t n, int64_t k,
                   int64_t w_stride, const float *bias, float *out, int64_t out_stride, int64_t threads);
void gh_f16_linear(const float *x, int64_t rows, int64_t x_stride, const uint16_t *w, int64_t n, int64_t k,
                   int64_t w_stride, const float *bias, float *out, int64_t out_stride, int64_t threads);
int gh_amx_linear(const uint16_t *x, int64_t rows, int64_t x_stride, const uint16_t *wp, int64_t n, int64_t k,
                  const float *bias, uint16_t *y, int64_t y_stride, int64_t threads, int64_t gated_inter, int silu);
int gh_bf16_dot_linear(const uint16_t *x, int64_t rows, int64_t x_stride, const uint16_t *wp, int64_t n, int64_t k,
                       const float *bias, uint16_t *y, int64_t y_stride, int64_t threads, int64_t gated_inter,
                       int silu);
void gh_fp8_linear(const float *x, int64_t rows, int64_t x_stride, const uint8_t *q, int64_t n, int64_t k,
                   int64_t w_stride, const float *scale, int64_t scale_stride, int64_t group, const float *bias,
                   float *out, int64_t out_stride, int64_t threads);
void gh_rms_norm(const void *x, int64_t rows, int64_t dim, int64_t x_stride, const void *w, void *out, float eps,
                 int dtype, int64_t threads);
void gh_silu_mul(const void *gate_up, int64_t rows, int64_t inter, void *out, int dtype, int64_t threads);
void gh_rotary(const void *x, int64_t tokens, int64_t heads, int64_t half, int64_t tok_stride, int64_t head_stride,
               const void *cos, const void *sin, void *out, int dtype, int64_t threads);
void gh_write_kv(void *k_cache, void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                 int64_t block_size, const void *k, const void *v, int64_t k_tok_stride, int64_t k_head_stride,
                 int64_t v_tok_stride, int64_t v_head_stride, const int64_t *slots, int64_t tokens,
                 int64_t kv_heads, int64_t head_dim, int64_t elem_size);
void gh_write_kv_fp8(void *k_cache, void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                     int64_t block_size, const void *k, const void *v, int64_t k_tok_stride, int64_t k_head_stride,
                     int64_t v_tok_stride, int64_t v_head_stride, const int64_t *slots, int64_t tokens,
                     int64_t kv_heads, int64_t head_dim, int dtype, int kv_type, const float *kv_scale);
void gh_decode_attention(const void *q, int64_t q_seq_stride, int64_t q_head_stride, const void *k_cache,
                         const void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                         int64_t block_size, const int32_t *block_tables, int64_t table_stride,
                         const int64_t *seq_lens, int64_t num_seqs, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, float scale, void *out, int dtype, int kv_type, const float *kv_scale,
                         int64_t threads, const HostKV *host);
int gh_decode_attention_block(const void *qkv, int64_t qkv_stride, const void *cos, const void *sin, void *k_cache,
                              void *v_cache, int64_t block_stride, int64_t slot_stride, int64_t head_stride,
                              int64_t block_size, const int64_t *slots, const int32_t *block_tables,
                              int64_t table_stride, const int64_t *seq_lens, int64_t num_seqs, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, float scale, void *out, int dtype,
                              int kv_type, const float *kv_scale, int64_t threads, const HostKV *host);
#endif
