/*
 * attention.h — causal attention for one KV head and the query heads that
 * share it, one query row at a time (never a T x T matrix), collecting in
 * the same pass the statistics KV-cache policies rank tokens by.
 */
#ifndef EKV_ATTENTION_H
#define EKV_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

/* Statistics a policy can ask for (bit flags). */
#define EKV_STAT_COLSUM   (1u << 0) /* column sums over all queries, with counts */
#define EKV_STAT_SUMSQ    (1u << 1) /* sums of squared attention (RoCo std) */
#define EKV_STAT_LASTROW  (1u << 2) /* attention of the latest query (TOVA) */
#define EKV_STAT_WINSUM   (1u << 3) /* column sums over a window of queries (SnapKV, VL-Cache) */
#define EKV_STAT_BINCOUNT (1u << 4) /* count of attention >= 1/visible keys (ScissorHands) */
#define EKV_STAT_SPARSITY (1u << 5) /* VL-Cache threshold-filter counts, per layer */

/* Where one query row's statistics go. Arrays are [n_keys] and are added
 * to (lastrow is overwritten); each receives the mean over the R query
 * heads. NULL arrays are skipped. */
struct ekv_attn_stats {
    unsigned flags;        /* which of the statistics below this row feeds */
    double *colsum;
    int32_t *count;
    double *sumsq;
    float *lastrow;
    double *winsum;
    float *bincount;
    double *sparse_zero;   /* scalar: entries below sparsity_p * row max, summed over heads */
    double *sparse_total;  /* scalar: causal entries, summed over heads */
    float sparsity_p;
};

/* One query position against n_keys cached keys.
 *   q:     [R][d] query vectors (RoPE applied) of the R heads sharing the KV head
 *   k, v:  [n_keys][d]
 *   out:   [R][d] attention outputs
 *   probs: scratch [R][n_keys]
 * Softmax in fp32 with max subtraction; scale is usually 1/sqrt(d). */
void ekv_attn_row(const float *q, int R, int d, const float *k, const float *v, int32_t n_keys,
                  float scale, float *out, float *probs, const struct ekv_attn_stats *st);

/* Adds one row of attention probabilities probs [R][n_keys] (the R query
 * heads of one KV head) into the statistics of st, exactly as ekv_attn_row
 * does. Exposed so tests can feed hand-written attention matrices. */
void ekv_attn_accumulate(const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st);

/* The statistics ekv_attn_row_kv adds for a row over keys of head size d,
 * from its normalised probabilities probs [R][n_keys], by the same code
 * ekv_attn_row_kv would choose for d on this CPU: a cache that reads a
 * shared prompt (kv.h "shadows") gets exactly the statistics its own
 * attention would have given. */
void ekv_attn_row_stats(int d, const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st);

/* One query position over typed storage (kvquant.h views; K and V types
 * may differ): the attention of ekv_attn_row over the dequantised rows,
 * with the same statistics. When the key view has a bias (k->bias), the
 * score of key j is scale * (q . k_j) + k->bias[k->first + j] in every
 * path (one float add per score, after the dot product and before the
 * softmax); without one the results are those of no bias, bit for bit. Rows are decoded EKV_ATTN_ROWS at a time into
 * rowbuf [EKV_ATTN_ROWS][d] (may be NULL when both views are f32), each
 * block of K and of V once for all R heads, so a row streams the cache
 * once. n_keys <= k->n == v->n. */
#define EKV_ATTN_ROWS 64
struct ekv_kv_view;
void ekv_attn_row_kv(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                     int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                     const struct ekv_attn_stats *st);
void ekv_attn_row_kv_ref(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                         int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                         const struct ekv_attn_stats *st);
/* needs d % 8 == 0 and a CPU with AVX2+FMA+F16C */
void ekv_attn_row_kv_avx2(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                          int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                          const struct ekv_attn_stats *st);

/* The AVX-512 version (attention_avx512.c): the same results as the AVX2
 * one bit for bit; needs d % 8 == 0 and a CPU at the AVX-512 level. */
void ekv_attn_row_kv_avx512(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                            int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                            const struct ekv_attn_stats *st);

/* The plain-C references and the AVX2/FMA versions behind the two calls
 * above (ekv_attn_row_avx2 needs d % 8 == 0 and a CPU with AVX2+FMA; the
 * statistics of ekv_attn_accumulate_avx2 equal the reference's bit for bit). */
void ekv_attn_row_ref(const float *q, int R, int d, const float *k, const float *v, int32_t n_keys,
                      float scale, float *out, float *probs, const struct ekv_attn_stats *st);
void ekv_attn_row_avx2(const float *q, int R, int d, const float *k, const float *v, int32_t n_keys,
                       float scale, float *out, float *probs, const struct ekv_attn_stats *st);
void ekv_attn_accumulate_ref(const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st);
void ekv_attn_accumulate_avx2(const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st);

/* Adds bias[j] to the scores s [R][n] of the R heads (the key view's
 * bias, already offset to its first row): the one place every attention
 * path applies it, so all give the same biased scores bit for bit. */
void ekv_attn_add_bias(float *s, int R, size_t n, const float *bias);

/* Plain-C per-key means over the R heads, for keys [j0, n): the reference
 * path and the tail of the AVX2 path share it. probs: [R][n]; arrays may be NULL. */
void ekv_attn_mean_stats_ref(const float *probs, int R, size_t n, size_t j0, double *colsum, int32_t *count,
                             double *sumsq, float *lastrow, double *winsum);

#endif
