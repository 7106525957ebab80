/*
 * attention.c — the plain-C reference of causal attention with statistics
 * (attention.h): one query position of the R query heads that share a KV
 * head against that head's cached keys, softmax in fp32 with the row
 * maximum subtracted, and in the same pass the per-key statistics that
 * KV-cache policies rank entries by (column sums, squares, last row, window
 * sums, ScissorHands bin counts, VL-Cache sparsity counts).
 *
 * ekv_attn_row_kv reads typed storage (kvquant.h views: f16, q8_0, q4_0,
 * KIVI groups and residual): blocks of EKV_ATTN_ROWS entries are decoded
 * once for all R heads (the reference codecs here, the SIMD ones in
 * attention_avx2.c) and attended as f32; ekv_attn_row is the f32 case.
 *
 * ekv_attn_row and ekv_attn_accumulate dispatch at run time to the AVX2
 * versions in attention_avx2.c (same statistics bit for bit; attention
 * outputs within the error bounds tests/test_attention.c states).
 *
 * An optional per-entry logit bias rides on the key view (kvquant.h,
 * k->bias: log(weight) of merged entries under elastic-v2:bias=1); every
 * path adds it with ekv_attn_add_bias between the scores and the softmax.
 *
 * The attention output is computed before, and independently of, the
 * statistics, so it is bit-identical whatever st->flags asks for. Nothing
 * here allocates: the caller passes the probability scratch.
 */
#include <math.h>
#include <stddef.h>

#include "kernels/attention.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"

void ekv_attn_accumulate_ref(const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st) {
    if (!st || !st->flags || n_keys <= 0 || R <= 0) return;
    const unsigned fl = st->flags;
    const size_t n = (size_t)n_keys;

    /* Per-key means over the R heads of p and p^2 feed colsum, sumsq,
     * lastrow and winsum. */
    const unsigned want_mean = EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_WINSUM;
    if (fl & want_mean) {
        double *colsum = (fl & EKV_STAT_COLSUM) ? st->colsum : NULL;
        int32_t *count = (fl & EKV_STAT_COLSUM) ? st->count : NULL;
        double *sumsq = (fl & EKV_STAT_SUMSQ) ? st->sumsq : NULL;
        float *lastrow = (fl & EKV_STAT_LASTROW) ? st->lastrow : NULL;
        double *winsum = (fl & EKV_STAT_WINSUM) ? st->winsum : NULL;
        ekv_attn_mean_stats_ref(probs, R, n, 0, colsum, count, sumsq, lastrow, winsum);
    }

    /* ScissorHands: a key counts for a head when its attention is at least
     * the uniform share 1/n_keys; the group mean of those indicators. */
    if ((fl & EKV_STAT_BINCOUNT) && st->bincount) {
        const float thr = 1.0f / (float)n_keys;
        for (size_t j = 0; j < n; j++) {
            int c = 0;
            for (int h = 0; h < R; h++) c += probs[(size_t)h * n + j] >= thr;
            if (c) st->bincount[j] += (float)c / (float)R;
        }
    }

    /* VL-Cache ThresholdFilter counts: entries below p * row max, per head. */
    if ((fl & EKV_STAT_SPARSITY) && st->sparse_zero && st->sparse_total) {
        double zeros = 0.0;
        for (int h = 0; h < R; h++) {
            const float *ph = probs + (size_t)h * n;
            float mx = ph[0];
            for (size_t j = 1; j < n; j++) mx = ph[j] > mx ? ph[j] : mx;
            const float thr = st->sparsity_p * mx;
            size_t z = 0;
            for (size_t j = 0; j < n; j++) z += ph[j] < thr;
            zeros += (double)z;
        }
        *st->sparse_zero += zeros;
        *st->sparse_total += (double)n * (double)R;
    }
}

/* q . k with eight partial sums (lane c % 8), added pairwise at the end:
 * a fixed order, so results are deterministic, and independent chains the
 * compiler can keep in one vector register. */
static inline float dot8(const float *a, const float *b, size_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[c + l] * b[c + l];
    for (; c < n; c++) acc[c & 7] += a[c] * b[c];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* o += sum_j p[j] * v[j][:], one key at a time (out does not alias v). */
static void axpy_rows(float *restrict o, const float *restrict p, const float *restrict v, size_t n,
                      size_t d) {
    for (size_t j = 0; j < n; j++) {
        const float pj = p[j];
        const float *restrict vj = v + j * d;
        size_t c = 0;
        for (; c + 8 <= d; c += 8) /* fixed-width blocks the compiler vectorises */
            for (int l = 0; l < 8; l++) o[c + l] += pj * vj[c + l];
        for (; c < d; c++) o[c] += pj * vj[c];
    }
}

void ekv_attn_row_kv_ref(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                         int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                         const struct ekv_attn_stats *st) {
    const int d = k->d;
    if (R <= 0 || d <= 0) return;
    const size_t n = n_keys > 0 ? (size_t)n_keys : 0;
    const size_t dd = (size_t)d;
    for (size_t c = 0; c < (size_t)R * dd; c++) out[c] = 0.0f;
    if (n == 0) return;

    /* scores, a block of keys decoded once for the R heads */
    struct ekv_kv_cursor kc = {0, 0, 0}, vc = {0, 0, 0};
    for (size_t j0 = 0; j0 < n; j0 += EKV_ATTN_ROWS) {
        const size_t j1 = j0 + EKV_ATTN_ROWS < n ? j0 + EKV_ATTN_ROWS : n;
        const float *kb = ekv_kv_view_block(k, (int32_t)j0, (int32_t)j1, rowbuf, &kc, false);
        for (int h = 0; h < R; h++) {
            const float *qh = q + (size_t)h * dd;
            float *ph = probs + (size_t)h * n;
            for (size_t j = j0; j < j1; j++) ph[j] = dot8(qh, kb + (j - j0) * dd, dd) * scale;
        }
    }
    if (k->bias) ekv_attn_add_bias(probs, R, n, k->bias + k->first);
    /* softmax per head: exp with the maximum subtracted, normalised */
    for (int h = 0; h < R; h++) {
        float *ph = probs + (size_t)h * n;
        float mx = -INFINITY;
        for (size_t j = 0; j < n; j++) mx = ph[j] > mx ? ph[j] : mx;
        float sum = 0.0f;
        for (size_t j = 0; j < n; j++) {
            float e = expf(ph[j] - mx);
            ph[j] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
        for (size_t j = 0; j < n; j++) ph[j] *= inv;
    }
    /* out = sum_j p_j v_j, a block of values decoded once for the R heads */
    for (size_t j0 = 0; j0 < n; j0 += EKV_ATTN_ROWS) {
        const size_t j1 = j0 + EKV_ATTN_ROWS < n ? j0 + EKV_ATTN_ROWS : n;
        const float *vb = ekv_kv_view_block(v, (int32_t)j0, (int32_t)j1, rowbuf, &vc, false);
        for (int h = 0; h < R; h++) axpy_rows(out + (size_t)h * dd, probs + (size_t)h * n + j0, vb, j1 - j0, dd);
    }
    if (st) ekv_attn_accumulate_ref(probs, R, n_keys, st);
}

/* An f32 view of n rows of d floats. */
static struct ekv_kv_view f32_view(const float *x, int d, int32_t n) {
    return (struct ekv_kv_view){.type = EKV_KV_F32, .d = d, .n = n, .nq = n, .data = (const uint8_t *)(const void *)x,
                                .row_bytes = (size_t)d * sizeof(float)};
}

void ekv_attn_row_ref(const float *q, int R, int d, const float *k, const float *v, int32_t n_keys,
                      float scale, float *out, float *probs, const struct ekv_attn_stats *st) {
    const int32_t n = n_keys > 0 ? n_keys : 0;
    const struct ekv_kv_view kv = f32_view(k, d, n), vv = f32_view(v, d, n);
    ekv_attn_row_kv_ref(q, R, &kv, &vv, n_keys, scale, out, probs, NULL, st);
}

void ekv_attn_row_avx2(const float *q, int R, int d, const float *k, const float *v, int32_t n_keys, float scale,
                       float *out, float *probs, const struct ekv_attn_stats *st) {
    const int32_t n = n_keys > 0 ? n_keys : 0;
    const struct ekv_kv_view kv = f32_view(k, d, n), vv = f32_view(v, d, n);
    ekv_attn_row_kv_avx2(q, R, &kv, &vv, n_keys, scale, out, probs, NULL, st);
}

/* Run-time choice by the kernels' level (ekv_kernels_level): AVX-512
 * (attention_avx512.c) or AVX2 (attention_avx2.c), which give the same
 * bits, when the head size is a multiple of 8, else the reference. */
void ekv_attn_row(const float *q, int R, int d, const float *k, const float *v, int32_t n_keys, float scale,
                  float *out, float *probs, const struct ekv_attn_stats *st) {
    const int32_t n = n_keys > 0 ? n_keys : 0;
    const struct ekv_kv_view kv = f32_view(k, d, n), vv = f32_view(v, d, n);
    ekv_attn_row_kv(q, R, &kv, &vv, n_keys, scale, out, probs, NULL, st);
}

void ekv_attn_row_kv(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                     int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                     const struct ekv_attn_stats *st) {
    const enum ekv_isa isa = k->d > 0 && k->d % 8 == 0 ? ekv_kernels_level() : EKV_ISA_REF;
    if (isa >= EKV_ISA_AVX512)
        ekv_attn_row_kv_avx512(q, R, k, v, n_keys, scale, out, probs, rowbuf, st);
    else if (isa >= EKV_ISA_AVX2)
        ekv_attn_row_kv_avx2(q, R, k, v, n_keys, scale, out, probs, rowbuf, st);
    else
        ekv_attn_row_kv_ref(q, R, k, v, n_keys, scale, out, probs, rowbuf, st);
}

void ekv_attn_row_stats(int d, const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st) {
    if (!st) return;
    /* ekv_attn_row_kv's choice: the SIMD rows (AVX2 and AVX-512) add their
     * statistics with ekv_attn_accumulate_avx2, the reference with its own */
    if (d > 0 && d % 8 == 0 && ekv_kernels_level() >= EKV_ISA_AVX2)
        ekv_attn_accumulate_avx2(probs, R, n_keys, st);
    else
        ekv_attn_accumulate_ref(probs, R, n_keys, st);
}

void ekv_attn_add_bias(float *s, int R, size_t n, const float *bias) {
    for (int h = 0; h < R; h++) {
        float *sh = s + (size_t)h * n;
        for (size_t j = 0; j < n; j++) sh[j] += bias[j];
    }
}

void ekv_attn_mean_stats_ref(const float *probs, int R, size_t n, size_t j0, double *colsum, int32_t *count,
                             double *sumsq, float *lastrow, double *winsum) {
    const double inv_r = 1.0 / (double)R;
    for (size_t j = j0; j < n; j++) {
        double s = 0.0, s2 = 0.0;
        for (int h = 0; h < R; h++) {
            const double p = (double)probs[(size_t)h * n + j];
            s += p;
            s2 += p * p;
        }
        const double m = s * inv_r;
        if (colsum) colsum[j] += m;
        if (count) count[j] += 1;
        if (sumsq) sumsq[j] += s2 * inv_r;
        if (lastrow) lastrow[j] = (float)m;
        if (winsum) winsum[j] += m;
    }
}

void ekv_attn_accumulate(const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st) {
    if (ekv_kernels_simd())
        ekv_attn_accumulate_avx2(probs, R, n_keys, st);
    else
        ekv_attn_accumulate_ref(probs, R, n_keys, st);
}
