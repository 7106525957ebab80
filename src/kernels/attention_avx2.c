/*
 * attention_avx2.c — AVX2/FMA version of attention with statistics
 * (attention.h); attention.c holds the plain-C reference and dispatches
 * here when the CPU has AVX2 and the head size is a multiple of 8.
 *
 * One query position of the R query heads sharing a KV head:
 *   1. scores, eight keys at a time per head: eight 8-lane accumulators
 *      over the head dimension, reduced together by a horizontal-add tree
 *      into one vector of eight scores. A key's score is computed by the
 *      same operations whatever its place in the group (a short last
 *      group repeats its final key), so a key gets the same score in a
 *      prefill row and in a decode step;
 *   (a key view's logit bias, when it has one, is added to the scores
 *   here by ekv_attn_add_bias, as in the reference);
 *   2. softmax per head in fp32: vector maximum, ekv_exp8 (about 2 ulp
 *      from expf), lane sums, one reciprocal;
 *   3. out_h = sum_j p_hj v_j with the head's output held in registers.
 * Steps 1 and 3 walk the keys in blocks of EKV_ATT_KB, all R heads per
 * block, so a block of K or V is read from memory once for the R heads;
 * within a block, heads go in fours for scores (qk_block4) and in pairs
 * (qk_block2, pv_block2) so that each key or value vector loaded from
 * cache feeds several FMAs, with per-element operations identical to the
 * one-head kernels.
 *
 * Typed storage (ekv_attn_row_kv_avx2, kvquant.h): f32 rows are read in
 * place; any other type is decoded EKV_ATTN_ROWS entries at a time into
 * the caller's row buffer by the SIMD codecs (F16C for f16, exact int8 /
 * nibble / KIVI-code conversions), then the same f32 block kernels run on
 * it, so each block of K and of V is read from the cache once for all R
 * heads and the result equals the f32 path over the dequantised rows bit
 * for bit (a key's score and a value's FMA chain do not depend on block
 * boundaries).
 *
 * The statistics (ekv_attn_accumulate_avx2) are vectorised across keys
 * and perform, per key, exactly the operations of the reference in the
 * same order, so they are bit-identical to it; the attention output never
 * depends on them.
 */
#include <math.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/avx2_util.h"
#include "kernels/kvquant.h"

/* keys per block: 128 keys x 64 dims x 4 bytes = 32 KiB of K or V */
#define EKV_ATT_KB 128

/* Lane i of the result = horizontal sum of a_i, in the fixed order
 * ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). */
static inline __m256 reduce8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                               __m256 a7) {
    const __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
    const __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    /* u0 = [k0..k3 low halves | k0..k3 high halves], u1 likewise for k4..k7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* s[j] = scale * (q . k_j) for the nk rows k_j = k + j * d. */
static void qk_block(const float *q, size_t d, const float *k, size_t nk, float scale, float *s) {
    const __m256 vs = _mm256_set1_ps(scale);
    for (size_t j = 0; j < nk; j += 8) {
        const size_t m = nk - j < 8 ? nk - j : 8;
        const float *kp[8];
        for (size_t i = 0; i < 8; i++) kp[i] = k + (j + (i < m ? i : m - 1)) * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (size_t c = 0; c < d; c += 8) {
            const __m256 qc = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[0] + c), a0);
            a1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[1] + c), a1);
            a2 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[2] + c), a2);
            a3 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[3] + c), a3);
            a4 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[4] + c), a4);
            a5 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[5] + c), a5);
            a6 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[6] + c), a6);
            a7 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kp[7] + c), a7);
        }
        const __m256 r = _mm256_mul_ps(reduce8x8(a0, a1, a2, a3, a4, a5, a6, a7), vs);
        if (m == 8) {
            _mm256_storeu_ps(s + j, r);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, r);
            memcpy(s + j, tmp, m * sizeof(float));
        }
    }
}

/* Lane i of the result = horizontal sum of a_i, in the order of reduce8x8. */
static inline __m128 reduce4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* qk_block for two query heads at once: four keys per step, each key
 * vector loaded once for both heads (the loop is bound by loads). A key's
 * score gets exactly the operations of qk_block. */
static void qk_block2(const float *q0, const float *q1, size_t d, const float *k, size_t nk, float scale, float *s0,
                      float *s1) {
    const __m128 vs = _mm_set1_ps(scale);
    for (size_t j = 0; j < nk; j += 4) {
        const size_t m = nk - j < 4 ? nk - j : 4;
        const float *kp[4];
        for (size_t i = 0; i < 4; i++) kp[i] = k + (j + (i < m ? i : m - 1)) * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (size_t c = 0; c < d; c += 8) {
            const __m256 x0 = _mm256_loadu_ps(q0 + c), x1 = _mm256_loadu_ps(q1 + c);
            __m256 kv = _mm256_loadu_ps(kp[0] + c);
            a0 = _mm256_fmadd_ps(x0, kv, a0);
            b0 = _mm256_fmadd_ps(x1, kv, b0);
            kv = _mm256_loadu_ps(kp[1] + c);
            a1 = _mm256_fmadd_ps(x0, kv, a1);
            b1 = _mm256_fmadd_ps(x1, kv, b1);
            kv = _mm256_loadu_ps(kp[2] + c);
            a2 = _mm256_fmadd_ps(x0, kv, a2);
            b2 = _mm256_fmadd_ps(x1, kv, b2);
            kv = _mm256_loadu_ps(kp[3] + c);
            a3 = _mm256_fmadd_ps(x0, kv, a3);
            b3 = _mm256_fmadd_ps(x1, kv, b3);
        }
        const __m128 r0 = _mm_mul_ps(reduce4x8(a0, a1, a2, a3), vs);
        const __m128 r1 = _mm_mul_ps(reduce4x8(b0, b1, b2, b3), vs);
        if (m == 4) {
            _mm_storeu_ps(s0 + j, r0);
            _mm_storeu_ps(s1 + j, r1);
        } else {
            float t0[4], t1[4];
            _mm_storeu_ps(t0, r0);
            _mm_storeu_ps(t1, r1);
            memcpy(s0 + j, t0, m * sizeof(float));
            memcpy(s1 + j, t1, m * sizeof(float));
        }
    }
}

/* qk_block for four query heads at once, two keys per step: each key
 * vector loaded once for the four heads (for GQA groups of 4 or 8 the
 * loop is then bound by FMAs, not loads). A key's score gets exactly the
 * operations of qk_block (an 8-lane FMA chain over the head dimension,
 * then reduce8x8's fixed-order horizontal sum). q: [4][d]; s: head h's
 * scores at s + h * sn. */
static void qk_block4(const float *q, size_t d, const float *k, size_t nk, float scale, float *s, size_t sn) {
    const __m256 vs = _mm256_set1_ps(scale);
    for (size_t j = 0; j < nk; j += 2) {
        const size_t m = nk - j < 2 ? 1 : 2;
        const float *k0 = k + j * d, *k1 = k + (j + m - 1) * d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (size_t c = 0; c < d; c += 8) {
            const __m256 x0 = _mm256_loadu_ps(k0 + c), x1 = _mm256_loadu_ps(k1 + c);
            __m256 qq = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(qq, x0, a0);
            b0 = _mm256_fmadd_ps(qq, x1, b0);
            qq = _mm256_loadu_ps(q + d + c);
            a1 = _mm256_fmadd_ps(qq, x0, a1);
            b1 = _mm256_fmadd_ps(qq, x1, b1);
            qq = _mm256_loadu_ps(q + 2 * d + c);
            a2 = _mm256_fmadd_ps(qq, x0, a2);
            b2 = _mm256_fmadd_ps(qq, x1, b2);
            qq = _mm256_loadu_ps(q + 3 * d + c);
            a3 = _mm256_fmadd_ps(qq, x0, a3);
            b3 = _mm256_fmadd_ps(qq, x1, b3);
        }
        float t[8];
        _mm256_storeu_ps(t, _mm256_mul_ps(reduce8x8(a0, a1, a2, a3, b0, b1, b2, b3), vs));
        for (size_t h = 0; h < 4; h++) s[h * sn + j] = t[h];
        if (m == 2)
            for (size_t h = 0; h < 4; h++) s[h * sn + j + 1] = t[4 + h];
    }
}

/* In place: p = exp(s - max) / sum over n values. */
static void softmax_row(float *p, size_t n) {
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    size_t j = 0;
    for (; j + 8 <= n; j += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(p + j));
    float mxs[8];
    _mm256_storeu_ps(mxs, vmx);
    float mx = mxs[0];
    for (int l = 1; l < 8; l++) mx = mxs[l] > mx ? mxs[l] : mx;
    for (; j < n; j++) mx = p[j] > mx ? p[j] : mx;

    vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = ekv_exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), vmx));
        _mm256_storeu_ps(p + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    if (j < n) { /* the tail through the same exp, padded with -inf (-> 0) */
        float tmp[8];
        const size_t m = n - j;
        for (size_t l = 0; l < 8; l++) tmp[l] = l < m ? p[j + l] : -INFINITY;
        const __m256 e = ekv_exp8(_mm256_sub_ps(_mm256_loadu_ps(tmp), vmx));
        _mm256_storeu_ps(tmp, e);
        memcpy(p + j, tmp, m * sizeof(float));
        vsum = _mm256_add_ps(vsum, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / ekv_hsum8(vsum));
    j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(p + j, _mm256_mul_ps(_mm256_loadu_ps(p + j), inv));
    for (; j < n; j++) p[j] *= _mm256_cvtss_f32(inv);
}

/* o[0:d] += sum_{j < nv} p[j] * v_j[0:d] with v_j = v + j * d; 64 columns in
 * registers at a time, then single 8-column chunks. */
static void pv_block(float *o, const float *p, const float *v, size_t d, size_t nv) {
    const size_t j0 = 0, j1 = nv;
    size_t c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) {
        __m256 a0 = _mm256_loadu_ps(o + c0), a1 = _mm256_loadu_ps(o + c0 + 8);
        __m256 a2 = _mm256_loadu_ps(o + c0 + 16), a3 = _mm256_loadu_ps(o + c0 + 24);
        __m256 a4 = _mm256_loadu_ps(o + c0 + 32), a5 = _mm256_loadu_ps(o + c0 + 40);
        __m256 a6 = _mm256_loadu_ps(o + c0 + 48), a7 = _mm256_loadu_ps(o + c0 + 56);
        for (size_t j = j0; j < j1; j++) {
            const __m256 pj = _mm256_broadcast_ss(p + j);
            const float *vj = v + j * d + c0;
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
            a4 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 32), a4);
            a5 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 40), a5);
            a6 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 48), a6);
            a7 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 56), a7);
        }
        _mm256_storeu_ps(o + c0, a0);
        _mm256_storeu_ps(o + c0 + 8, a1);
        _mm256_storeu_ps(o + c0 + 16, a2);
        _mm256_storeu_ps(o + c0 + 24, a3);
        _mm256_storeu_ps(o + c0 + 32, a4);
        _mm256_storeu_ps(o + c0 + 40, a5);
        _mm256_storeu_ps(o + c0 + 48, a6);
        _mm256_storeu_ps(o + c0 + 56, a7);
    }
    for (; c0 < d; c0 += 8) {
        __m256 a = _mm256_loadu_ps(o + c0);
        for (size_t j = j0; j < j1; j++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v + j * d + c0), a);
        _mm256_storeu_ps(o + c0, a);
    }
}

/* pv_block for two heads: each value vector loaded once for both; 32
 * columns of each head in registers. Every output element gets the FMA
 * chain of pv_block. */
static void pv_block2(float *o0, float *o1, const float *p0, const float *p1, const float *v, size_t d, size_t nv) {
    const size_t j0 = 0, j1 = nv;
    size_t c0 = 0;
    for (; c0 + 32 <= d; c0 += 32) {
        __m256 a0 = _mm256_loadu_ps(o0 + c0), a1 = _mm256_loadu_ps(o0 + c0 + 8);
        __m256 a2 = _mm256_loadu_ps(o0 + c0 + 16), a3 = _mm256_loadu_ps(o0 + c0 + 24);
        __m256 b0 = _mm256_loadu_ps(o1 + c0), b1 = _mm256_loadu_ps(o1 + c0 + 8);
        __m256 b2 = _mm256_loadu_ps(o1 + c0 + 16), b3 = _mm256_loadu_ps(o1 + c0 + 24);
        for (size_t j = j0; j < j1; j++) {
            const __m256 x = _mm256_broadcast_ss(p0 + j), y = _mm256_broadcast_ss(p1 + j);
            const float *vj = v + j * d + c0;
            __m256 w = _mm256_loadu_ps(vj);
            a0 = _mm256_fmadd_ps(x, w, a0);
            b0 = _mm256_fmadd_ps(y, w, b0);
            w = _mm256_loadu_ps(vj + 8);
            a1 = _mm256_fmadd_ps(x, w, a1);
            b1 = _mm256_fmadd_ps(y, w, b1);
            w = _mm256_loadu_ps(vj + 16);
            a2 = _mm256_fmadd_ps(x, w, a2);
            b2 = _mm256_fmadd_ps(y, w, b2);
            w = _mm256_loadu_ps(vj + 24);
            a3 = _mm256_fmadd_ps(x, w, a3);
            b3 = _mm256_fmadd_ps(y, w, b3);
        }
        _mm256_storeu_ps(o0 + c0, a0);
        _mm256_storeu_ps(o0 + c0 + 8, a1);
        _mm256_storeu_ps(o0 + c0 + 16, a2);
        _mm256_storeu_ps(o0 + c0 + 24, a3);
        _mm256_storeu_ps(o1 + c0, b0);
        _mm256_storeu_ps(o1 + c0 + 8, b1);
        _mm256_storeu_ps(o1 + c0 + 16, b2);
        _mm256_storeu_ps(o1 + c0 + 24, b3);
    }
    for (; c0 < d; c0 += 8) {
        __m256 a = _mm256_loadu_ps(o0 + c0), b = _mm256_loadu_ps(o1 + c0);
        for (size_t j = j0; j < j1; j++) {
            const __m256 w = _mm256_loadu_ps(v + j * d + c0);
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), w, a);
            b = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), w, b);
        }
        _mm256_storeu_ps(o0 + c0, a);
        _mm256_storeu_ps(o1 + c0, b);
    }
}

void ekv_attn_row_kv_avx2(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                          int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                          const struct ekv_attn_stats *st) {
    const int d = k->d;
    if (R <= 0 || d <= 0) return;
    const size_t n = n_keys > 0 ? (size_t)n_keys : 0;
    const size_t dd = (size_t)d;
    memset(out, 0, (size_t)R * dd * sizeof(float));
    if (n == 0) return;
    struct ekv_kv_cursor kc = {0, 0, 0}, vc = {0, 0, 0};
    const size_t kb_rows = k->type == EKV_KV_F32 ? EKV_ATT_KB : EKV_ATTN_ROWS;
    for (size_t j0 = 0; j0 < n; j0 += kb_rows) {
        const size_t j1 = j0 + kb_rows < n ? j0 + kb_rows : n;
        const float *kb = ekv_kv_view_block(k, (int32_t)j0, (int32_t)j1, rowbuf, &kc, true);
        int h = 0;
        for (; h + 4 <= R; h += 4)
            qk_block4(q + (size_t)h * dd, dd, kb, j1 - j0, scale, probs + (size_t)h * n + j0, n);
        for (; h + 2 <= R; h += 2)
            qk_block2(q + (size_t)h * dd, q + (size_t)(h + 1) * dd, dd, kb, j1 - j0, scale, probs + (size_t)h * n + j0,
                      probs + (size_t)(h + 1) * n + j0);
        if (h < R) qk_block(q + (size_t)h * dd, dd, kb, j1 - j0, scale, probs + (size_t)h * n + j0);
    }
    if (k->bias) ekv_attn_add_bias(probs, R, n, k->bias + k->first);
    for (int h = 0; h < R; h++) softmax_row(probs + (size_t)h * n, n);
    const size_t vb_rows = v->type == EKV_KV_F32 ? EKV_ATT_KB : EKV_ATTN_ROWS;
    for (size_t j0 = 0; j0 < n; j0 += vb_rows) {
        const size_t j1 = j0 + vb_rows < n ? j0 + vb_rows : n;
        const float *vb = ekv_kv_view_block(v, (int32_t)j0, (int32_t)j1, rowbuf, &vc, true);
        int h = 0;
        for (; h + 2 <= R; h += 2)
            pv_block2(out + (size_t)h * dd, out + (size_t)(h + 1) * dd, probs + (size_t)h * n + j0,
                      probs + (size_t)(h + 1) * n + j0, vb, dd, j1 - j0);
        if (h < R) pv_block(out + (size_t)h * dd, probs + (size_t)h * n + j0, vb, dd, j1 - j0);
    }
    if (st) ekv_attn_accumulate_avx2(probs, R, n_keys, st);
}

/* ------------------------------------------------------------------ */
/* Statistics: the reference's per-key arithmetic, four keys per vector */
/* ------------------------------------------------------------------ */

void ekv_attn_accumulate_avx2(const float *probs, int R, int32_t n_keys, const struct ekv_attn_stats *st) {
    if (!st || !st->flags || n_keys <= 0 || R <= 0) return;
    const unsigned fl = st->flags;
    const double inv_r = 1.0 / (double)R;
    const size_t n = (size_t)n_keys;

    const unsigned want_mean = EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_WINSUM;
    if (fl & want_mean) {
        double *colsum = (fl & EKV_STAT_COLSUM) ? st->colsum : NULL;
        int32_t *count = (fl & EKV_STAT_COLSUM) ? st->count : NULL;
        double *sumsq = (fl & EKV_STAT_SUMSQ) ? st->sumsq : NULL;
        float *lastrow = (fl & EKV_STAT_LASTROW) ? st->lastrow : NULL;
        double *winsum = (fl & EKV_STAT_WINSUM) ? st->winsum : NULL;
        const __m256d vinv = _mm256_set1_pd(inv_r);
        size_t j = 0;
        for (; j + 4 <= n; j += 4) {
            __m256d s = _mm256_setzero_pd(), s2 = _mm256_setzero_pd();
            if (sumsq) {
                for (int h = 0; h < R; h++) {
                    const __m256d p = _mm256_cvtps_pd(_mm_loadu_ps(probs + (size_t)h * n + j));
                    s = _mm256_add_pd(s, p);
                    s2 = _mm256_add_pd(s2, _mm256_mul_pd(p, p));
                }
            } else {
                for (int h = 0; h < R; h++) s = _mm256_add_pd(s, _mm256_cvtps_pd(_mm_loadu_ps(probs + (size_t)h * n + j)));
            }
            const __m256d m = _mm256_mul_pd(s, vinv);
            if (colsum) _mm256_storeu_pd(colsum + j, _mm256_add_pd(_mm256_loadu_pd(colsum + j), m));
            if (count) {
                __m128i *c4 = (__m128i *)(void *)(count + j);
                _mm_storeu_si128(c4, _mm_add_epi32(_mm_loadu_si128(c4), _mm_set1_epi32(1)));
            }
            if (sumsq)
                _mm256_storeu_pd(sumsq + j, _mm256_add_pd(_mm256_loadu_pd(sumsq + j), _mm256_mul_pd(s2, vinv)));
            if (lastrow) _mm_storeu_ps(lastrow + j, _mm256_cvtpd_ps(m));
            if (winsum) _mm256_storeu_pd(winsum + j, _mm256_add_pd(_mm256_loadu_pd(winsum + j), m));
        }
        ekv_attn_mean_stats_ref(probs, R, n, j, colsum, count, sumsq, lastrow, winsum); /* tail */
    }

    if ((fl & EKV_STAT_BINCOUNT) && st->bincount) {
        const float thr = 1.0f / (float)n_keys;
        const __m256 vthr = _mm256_set1_ps(thr), one = _mm256_set1_ps(1.0f), vr = _mm256_set1_ps((float)R);
        size_t j = 0;
        for (; j + 8 <= n; j += 8) {
            __m256 c = _mm256_setzero_ps(); /* small integer counts, exact in float */
            for (int h = 0; h < R; h++)
                c = _mm256_add_ps(c, _mm256_and_ps(one, _mm256_cmp_ps(_mm256_loadu_ps(probs + (size_t)h * n + j),
                                                                      vthr, _CMP_GE_OQ)));
            /* the reference adds only when c > 0; bincount is never -0, so x + 0 == x */
            _mm256_storeu_ps(st->bincount + j,
                             _mm256_add_ps(_mm256_loadu_ps(st->bincount + j), _mm256_div_ps(c, vr)));
        }
        for (; j < n; j++) {
            int c = 0;
            for (int h = 0; h < R; h++) c += probs[(size_t)h * n + j] >= thr;
            if (c) st->bincount[j] += (float)c / (float)R;
        }
    }

    if ((fl & EKV_STAT_SPARSITY) && st->sparse_zero && st->sparse_total) {
        double zeros = 0.0;
        for (int h = 0; h < R; h++) {
            const float *ph = probs + (size_t)h * n;
            __m256 vmx = _mm256_set1_ps(ph[0]);
            size_t j = 0;
            for (; j + 8 <= n; j += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(ph + j));
            float mxs[8];
            _mm256_storeu_ps(mxs, vmx);
            float mx = mxs[0];
            for (int l = 1; l < 8; l++) mx = mxs[l] > mx ? mxs[l] : mx;
            for (; j < n; j++) mx = ph[j] > mx ? ph[j] : mx;
            const float thr = st->sparsity_p * mx;
            const __m256 vthr = _mm256_set1_ps(thr);
            __m256i z8 = _mm256_setzero_si256();
            j = 0;
            for (; j + 8 <= n; j += 8) /* lanes of the compare mask are -1 where p < thr */
                z8 = _mm256_sub_epi32(z8, _mm256_castps_si256(_mm256_cmp_ps(_mm256_loadu_ps(ph + j), vthr, _CMP_LT_OQ)));
            int32_t zl[8];
            _mm256_storeu_si256((__m256i *)(void *)zl, z8);
            size_t z = 0;
            for (int l = 0; l < 8; l++) z += (size_t)(uint32_t)zl[l];
            for (; j < n; j++) z += ph[j] < thr;
            zeros += (double)z;
        }
        *st->sparse_zero += zeros;
        *st->sparse_total += (double)n * (double)R;
    }
}
