/*
 * kernels.h — the numeric kernels of ekv: a thread pool, matrix-vector and
 * matrix-matrix products over GGUF weight types, quantisation formats, and
 * the element-wise operations of a transformer. Every SIMD path has a
 * plain-C reference beside it; the dispatcher picks AVX2/FMA at run time
 * when the CPU has it, and tests compare the two.
 *
 * Kernels know nothing about models or caches (they sit at the bottom of
 * the layering of docs/architecture.md "Layers") and never allocate on the hot path except
 * through the pool's scratch memory.
 */
#ifndef EKV_KERNELS_H
#define EKV_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "ekv.h"

/* ------------------------------------------------------------------ */
/* Thread pool                                                          */
/* ------------------------------------------------------------------ */

struct ekv_pool;

/* Work item: called once per thread index ith in [0, nth). */
typedef void (*ekv_task_fn)(void *ctx, int ith, int nth);

/* A pool of n_threads workers (the caller counts as one). n_threads >= 1. */
enum ekv_status ekv_pool_new(int n_threads, struct ekv_pool **out);
void ekv_pool_free(struct ekv_pool *p);
int ekv_pool_size(const struct ekv_pool *p); /* 1 for NULL */
/* Runs fn(ctx, ith, nth) for every ith < nth (nth = pool size) and returns
 * when all are done. Each part ith runs exactly once, on whichever pool
 * thread claims it first (the caller included), so a part must depend on
 * ith only, never on the OS thread. p == NULL runs fn(ctx, 0, 1) inline.
 * Not re-entrant: do not call from inside a task. */
void ekv_pool_run(struct ekv_pool *p, ekv_task_fn fn, void *ctx);
/* Scratch of part ith of at least `bytes` (64-byte aligned), valid until
 * the next call with the same ith; NULL on allocation failure. */
void *ekv_pool_scratch(struct ekv_pool *p, int ith, size_t bytes);
/* One more scratch buffer, for the calling thread to fill before a run and
 * the tasks to read (e.g. a quantised activation). Same rules as above;
 * call it outside tasks only. */
void *ekv_pool_scratch_shared(struct ekv_pool *p, size_t bytes);

/* ------------------------------------------------------------------ */
/* Weights and products                                                 */
/* ------------------------------------------------------------------ */

/* How a weight matrix's bytes are arranged. */
enum ekv_layout {
    /* as stored in GGUF: row r at data + r * row_bytes */
    EKV_LAYOUT_ROWS = 0,
    /* Q8_0/Q4_0 repacked by ekv_weight_repack: groups of 16 rows, group g
     * at data + g * 16 * row_bytes holding, per block column b, the 16
     * fp16 scales and then the quants interleaved 4 bytes per row
     * (Q8_0 as w + 128; Q4_0 as stored bytes), so that one 64-byte load
     * feeds an int8 dot of 4 elements for 16 rows (src/kernels/repack.c) */
    EKV_LAYOUT_X16 = 1,
};

/* A 2-D weight matrix: ne1 rows of ne0 elements each, row_bytes per row
 * (rows are at data + r * row_bytes unless layout says otherwise). */
struct ekv_weight {
    enum ekv_dtype type;
    int64_t ne0;          /* columns = input dimension  */
    int64_t ne1;          /* rows    = output dimension */
    size_t row_bytes;
    const void *data;
    enum ekv_layout layout;
};

/* True when ekv_weight_repack can interleave w (Q8_0 or Q4_0, rows layout,
 * ne1 a multiple of 16, rows packed without padding). */
bool ekv_weight_can_repack(const struct ekv_weight *w);
/* Writes w's bytes in EKV_LAYOUT_X16 to dst (the same number of bytes,
 * ne1 * row_bytes; dst may equal w->data: in place) and sets w->data = dst
 * and w->layout. The values are unchanged: products give the same bits. */
enum ekv_status ekv_weight_repack(struct ekv_weight *w, void *dst);
/* Memory holding repacked weights (owned by whoever loaded the model). */
struct ekv_repack_arena {
    void *base;       /* the weights: bytes of them from base */
    size_t bytes;
    void *map;        /* the mapping holding them (base aligned to 2 MiB inside) */
    size_t map_bytes;
};
/* Repacks the weights among ws[0..n) that can be (ekv_weight_can_repack),
 * and copies the F32/F16/BF16 ones unchanged (rows without padding),
 * into one new anonymous arena, and releases the pages of their old bytes
 * from the process when those lie in a read-only file mapping (madvise
 * MADV_DONTNEED: the file is re-read if they are ever touched again), so
 * resident memory holds one copy. Weights sharing a data pointer (tied
 * embeddings) are repacked once and all point at the copy. Others are left
 * alone. *arena receives the memory (free with ekv_repack_arena_free). */
enum ekv_status ekv_weights_repack_mapped(struct ekv_weight *const *ws, int n, struct ekv_repack_arena *arena);
void ekv_repack_arena_free(struct ekv_repack_arena *arena);

/* True when matvec/matmul/dequantize handle the type. */
bool ekv_dtype_can_compute(enum ekv_dtype t);

/* y[r] = sum_c W[r][c] * x[c], r < ne1.  x: [ne0], y: [ne1]. */
enum ekv_status ekv_matvec(struct ekv_pool *p, const struct ekv_weight *w, const float *x, float *y);

/* Y[t][r] = sum_c W[r][c] * X[t][c] for t < n.  X: [n][ne0], Y: [n][ne1],
 * both row-major. Batch invariance (a contract, tests/test_batch_invariance.c):
 * row t of the result equals ekv_matvec of row t bit for bit, whatever n,
 * the row's place in X and the pool's thread count. Every kernel keeps one
 * per-output reduction order and quantises each activation row alone. */
enum ekv_status ekv_matmul(struct ekv_pool *p, const struct ekv_weight *w, const float *x, int64_t n,
                           float *y);

/* Several products of the same input, Y_i = X W_i^T for i < n_w (e.g. the
 * Q, K and V projections): X is quantised once and all products run as one
 * pool job. Results equal n_w ekv_matmul calls bit for bit. Weights whose
 * activation format differs from the first's run as separate products. */
enum ekv_status ekv_matmul_multi(struct ekv_pool *p, const struct ekv_weight *const *w, int n_w, const float *x,
                                 int64_t n, float *const *y);

/* Row r of w as floats (embedding lookup). dst: [ne0]. */
enum ekv_status ekv_weight_get_row(const struct ekv_weight *w, int64_t r, float *dst);

/* Block (de)quantisation of n elements (n a multiple of the block size). */
enum ekv_status ekv_dequantize_row(enum ekv_dtype t, const void *src, float *dst, int64_t n);
enum ekv_status ekv_quantize_row(enum ekv_dtype t, const float *src, void *dst, int64_t n);

/* SIMD selection. The best path the CPU runs is chosen at first use
 * (AVX-512 with VNNI, AVX-VNNI, AVX2, or the plain-C reference); the
 * environment variable EKV_ISA (avx512, avxvnni, avx2, reference) caps it.
 * ekv_kernels_use_reference(true) forces the plain-C paths (tests,
 * debugging); ekv_kernels_set_isa() picks a level by name (false when the
 * CPU cannot run it). ekv_kernels_isa() names what is in use. */
void ekv_kernels_use_reference(bool on);
bool ekv_kernels_set_isa(const char *name);
const char *ekv_kernels_isa(void);

/* ------------------------------------------------------------------ */
/* Element-wise and small ops (src/kernels/ops.c)                       */
/* ------------------------------------------------------------------ */

float ekv_dot_f32(const float *a, const float *b, int64_t n);
/* y += a * x */
void ekv_axpy_f32(float *y, float a, const float *x, int64_t n);
/* out = x / rms(x) * w */
void ekv_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* out = (x - mean) / std * w + b  (w/b may be NULL) */
void ekv_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n, float eps);
/* In-place softmax over n values. */
void ekv_softmax(float *x, int64_t n);
/* Rotary embedding of n_heads vectors of head_dim at position pos; the first
 * rope_dim dims are rotated: pairs (2i, 2i+1) when !neox, halves (i, i+rope_dim/2) when neox. */
void ekv_rope(float *x, int n_heads, int head_dim, int rope_dim, int64_t pos, float freq_base, bool neox);
/* The same in two steps, to compute the rotation once per position and
 * apply it to the queries and keys of every layer (identical results):
 * cs: [rope_dim/2][2] = {cos, sin} of theta_i = pos * base^(-2i/rope_dim). */
void ekv_rope_sincos(float *cs, int rope_dim, int64_t pos, float freq_base);
void ekv_rope_apply(float *x, int n_heads, int head_dim, int rope_dim, const float *cs, bool neox);

/* RoPE with the scalings llama.cpp reads from GGUF (ggml_rope_ext), in
 * double: theta_i = pos * base^(-2i/dim) / freq_factors[i] (the "extrapolated"
 * angle); freq_scale * theta_i is the interpolated one (linear scaling:
 * freq_scale = 1/factor). YaRN (ext_factor != 0) mixes them per pair i with
 * a ramp falling from 1 at corr_lo to 0 at corr_hi (times ext_factor) and
 * scales cos/sin by attn_factor * (1 + 0.1 ln(1/freq_scale)); otherwise by
 * attn_factor alone. With every factor 1 it equals ekv_rope_sincos bit for
 * bit. */
struct ekv_rope_params {
    int dim;                   /* rotated dimensions (even) */
    bool neox;                 /* halves (i, i + dim/2) instead of pairs (2i, 2i+1) */
    double freq_base;
    double freq_scale;         /* 1 = none */
    double ext_factor;         /* 0 = no YaRN mixing */
    double attn_factor;        /* cos/sin multiplier (1 = none) */
    double corr_lo, corr_hi;   /* YaRN ramp, from ekv_rope_yarn_corr_dims */
    const float *freq_factors; /* [dim/2] divisors of theta, or NULL */
    int sections[4];           /* M-RoPE (Qwen2-VL): pair i takes position component c where
                                  i mod (sum of sections) falls in section c (time, height,
                                  width, extra); all 0 = one position */
};
/* cs: [dim/2][2] = {cos, sin} for position pos. */
void ekv_rope_sincos_ext(const struct ekv_rope_params *p, int64_t pos, float *cs);
/* Moves n_heads vectors of head_dim that carry this RoPE at some position
 * to position + delta: pair i of the first dim dims (p->neox's layout) is
 * turned by the angle of pair i at delta, the same angle function as
 * ekv_rope_sincos_ext (linear in the position, scalings included) without
 * its cos/sin multiplier (a rotation keeps a key's length, so a key that
 * already carries attn_factor keeps it). delta 0 leaves x untouched; a
 * negative delta turns back. */
void ekv_rope_shift_ext(const struct ekv_rope_params *p, int64_t delta, float *x, int n_heads, int head_dim);
/* M-RoPE (llama.cpp's ggml_rope_multi, GGML_ROPE_TYPE_MROPE): as
 * ekv_rope_sincos_ext, pair i at position pos[c] with c its section
 * (p->sections); pos[3] is used by the fourth section. With no sections,
 * or all four positions equal, it equals ekv_rope_sincos_ext(pos[0]) bit
 * for bit. */
void ekv_rope_sincos_multi(const struct ekv_rope_params *p, const int64_t pos[4], float *cs);
/* The {cos, sin} of each rotated pair that ekv_rope_shift_ext (delta[0]) or,
 * for M-RoPE parameters, ekv_rope_shift_multi (delta per component) turns
 * by, into cs [2 * pairs]: the same numbers those functions use, and {1, 0}
 * for a pair they leave alone (a zero delta). Returns 2 * pairs (the pairs
 * of min(p->dim, head_dim)). For a device that turns keys itself. */
int ekv_rope_shift_cs(const struct ekv_rope_params *p, const int64_t delta[4], int head_dim, float *cs);
/* ekv_rope_shift_ext with a delta per component: pair i turns by the angle
 * of delta[c], c its section. */
void ekv_rope_shift_multi(const struct ekv_rope_params *p, const int64_t delta[4], float *x, int n_heads,
                          int head_dim);
/* Whether p has M-RoPE sections (positions of three or four components). */
static inline bool ekv_rope_is_multi(const struct ekv_rope_params *p) {
    return p->sections[0] || p->sections[1] || p->sections[2] || p->sections[3];
}
/* The section (0-3) of pair i under p->sections; 0 when there are none. */
int ekv_rope_section(const struct ekv_rope_params *p, int i);
/* YaRN's correction range: the pair indices whose rotation at the original
 * context makes beta_fast (lo, floored) and beta_slow (hi, ceiled) turns,
 * clamped to [0, dim - 1]. */
void ekv_rope_yarn_corr_dims(int dim, int n_ctx_orig, double freq_base, double beta_fast, double beta_slow,
                             double out[2]);
/* out[i] = silu(gate[i]) * up[i] */
void ekv_swiglu(float *out, const float *gate, const float *up, int64_t n);
/* tanh approximation of GELU, in place */
void ekv_gelu(float *x, int64_t n);
void ekv_add(float *y, const float *x, int64_t n); /* y += x */

#endif
