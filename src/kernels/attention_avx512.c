/*
 * attention_avx512.c — AVX-512 version of attention over typed K/V views
 * (attention.h). Chosen at run time when the kernels run at the AVX-512
 * level; its results equal ekv_attn_row_kv_avx2's bit for bit, so the
 * level changes the speed only (on CPUs with full-width 512-bit FMA units,
 * such as AMD Zen 5, twice the arithmetic per instruction).
 *
 * How each number keeps the AVX2 path's operations:
 *   - score of key j: AVX2 runs one 8-lane FMA chain over the head
 *     dimension in steps of 8 columns, then sums the lanes in the fixed
 *     order ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). Here one 512-bit
 *     register holds that chain for two keys, j in the low and j + 8 in the
 *     high 256 bits (the query's 8 columns broadcast to both halves), so
 *     each key's lanes see the same FMAs; the 16-key reduction uses in-lane
 *     shuffles that add exactly the pairs AVX2's hadd/permute tree adds;
 *   - a key view's logit bias: added to the scores by ekv_attn_add_bias,
 *     the same adds as the AVX2 path;
 *   - softmax: the same exp polynomial lane by lane, the running sum kept
 *     as AVX2's 8-lane vector (two adds per 16 keys, low half first);
 *   - output: every output column is its own FMA chain over the keys in
 *     key order, 16 columns per register instead of 8.
 * Typed storage is decoded EKV_ATTN_ROWS rows at a time into the caller's
 * row buffer by the SIMD codecs (kvquant.h), as in attention_avx2.c; f32 is
 * read in place. Statistics come from ekv_attn_accumulate_avx2.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/avx2_util.h"
#include "kernels/kvquant.h"

/* keys per block for f32 read in place: 128 x 64 dims x 4 bytes = 32 KiB */
#define ATT_KB 128

/* Per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3] (= _mm256_hadd_ps per lane). */
static inline __m512 hadd512(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

/* 8 accumulators, acc[i] = [key i | key 8 + i] 8-lane chains -> the 16
 * key sums in key order, each added as reduce8x8 in attention_avx2.c. */
static inline __m512 reduce16(const __m512 *acc) {
    const __m512 t0 = hadd512(acc[0], acc[1]), t1 = hadd512(acc[2], acc[3]);
    const __m512 t2 = hadd512(acc[4], acc[5]), t3 = hadd512(acc[6], acc[7]);
    const __m512 u0 = hadd512(t0, t1), u1 = hadd512(t2, t3);
    /* u0 = [k0-3 lo | k0-3 hi | k8-11 lo | k8-11 hi], u1 likewise for k4-7, k12-15 */
    const __m512 lo = _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)); /* k0-3 lo, k8-11 lo, k4-7 lo, k12-15 lo */
    const __m512 hi = _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 s = _mm512_add_ps(lo, hi); /* keys 0-3, 8-11, 4-7, 12-15 */
    return _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(3, 1, 2, 0));
}

static inline __m512 load2x8(const float *lo, const float *hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(lo)), _mm256_loadu_ps(hi), 1);
}

static inline void store_m(float *dst, __m512 r, size_t m) {
    if (m == 16) {
        _mm512_storeu_ps(dst, r);
    } else {
        _mm512_mask_storeu_ps(dst, (__mmask16)((1u << m) - 1u), r);
    }
}

/* Scores of nh (1 or 2) heads against 16 keys at kj (rows of d), 16 - m
 * of them repeats: head h's query at q + h * d, its scores at s + h * sn. */
static inline void qk16_step(const float *q, size_t d, int nh, const float *kj, size_t m, const __m512 vs, float *s,
                             size_t sn) {
    __m512 a[8], b[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) a[i] = b[i] = _mm512_setzero_ps();
    const float *kh = kj + 8 * d;
    if (nh == 2) {
        for (size_t c = 0; c < d; c += 8) {
            const __m512 x0 = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + c));
            const __m512 x1 = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + d + c));
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m512 kk = load2x8(kj + (size_t)i * d + c, kh + (size_t)i * d + c);
                a[i] = _mm512_fmadd_ps(x0, kk, a[i]);
                b[i] = _mm512_fmadd_ps(x1, kk, b[i]);
            }
        }
        store_m(s, _mm512_mul_ps(reduce16(a), vs), m);
        store_m(s + sn, _mm512_mul_ps(reduce16(b), vs), m);
    } else {
        for (size_t c = 0; c < d; c += 8) {
            const __m512 x0 = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + c));
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                a[i] = _mm512_fmadd_ps(x0, load2x8(kj + (size_t)i * d + c, kh + (size_t)i * d + c), a[i]);
        }
        store_m(s, _mm512_mul_ps(reduce16(a), vs), m);
    }
}

/* Scores of nh (1 or 2) heads against nk keys, 16 keys per step. A short
 * last step runs on a copy of its keys padded with repeats of the final
 * one (as AVX2 repeats it), so a key's score never depends on where a
 * block starts. tail: scratch [16][d]. */
static void qk16(const float *q, size_t d, int nh, const float *k, size_t nk, float scale, float *s, size_t sn,
                 float *tail) {
    const __m512 vs = _mm512_set1_ps(scale);
    size_t j = 0;
    for (; j + 16 <= nk; j += 16) qk16_step(q, d, nh, k + j * d, 16, vs, s + j, sn);
    if (j < nk) {
        const size_t m = nk - j;
        for (size_t i = 0; i < 16; i++) memcpy(tail + i * d, k + (j + (i < m ? i : m - 1)) * d, d * sizeof(float));
        qk16_step(q, d, nh, tail, m, vs, s + j, sn);
    }
}

/* ekv_exp8 of attention_avx2.c's softmax, 16 lanes: the same operations
 * per lane (avx2_util.h). */
static inline __m512 exp16(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365478515625f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i n = _mm512_cvtps_epi32(fx);
    const __m512i n1 = _mm512_srai_epi32(n, 1), n2 = _mm512_sub_epi32(n, n1);
    const __m512 p1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
    const __m512 p2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
    y = _mm512_mul_ps(_mm512_mul_ps(y, p1), p2);
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

/* In place: p = exp(s - max) / sum over n values, as softmax_row in
 * attention_avx2.c (the sum an 8-lane vector over keys in order). */
static void softmax16(float *p, size_t n) {
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    size_t j = 0;
    for (; j + 16 <= n; j += 16) vmx = _mm512_max_ps(vmx, _mm512_loadu_ps(p + j));
    float mx = _mm512_reduce_max_ps(vmx);
    for (; j < n; j++) mx = p[j] > mx ? p[j] : mx;

    vmx = _mm512_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p + j), vmx));
        _mm512_storeu_ps(p + j, e);
        vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
        vsum = _mm256_add_ps(vsum, _mm512_extractf32x8_ps(e, 1));
    }
    if (j < n) { /* the rest: 8 keys, then a tail padded with -inf (-> 0), as AVX2 */
        const size_t m = n - j;
        const __mmask16 mk = (__mmask16)((1u << m) - 1u);
        const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, p + j);
        const __m512 e = exp16(_mm512_sub_ps(x, vmx));
        _mm512_mask_storeu_ps(p + j, mk, e);
        vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
        if (m > 8) vsum = _mm256_add_ps(vsum, _mm512_extractf32x8_ps(e, 1));
    }
    const float inv = 1.0f / ekv_hsum8(vsum);
    const __m512 vinv = _mm512_set1_ps(inv);
    j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(p + j, _mm512_mul_ps(_mm512_loadu_ps(p + j), vinv));
    for (; j < n; j++) p[j] *= inv;
}

/* o_h[0:d] += sum_{j < nv} p_h[j] * v_j[0:d] for nh <= 4 heads (o_h = o +
 * h * d, p_h = p + h * pn): each value vector loaded once for the heads,
 * 64 columns of each head in registers. Every output element is one FMA
 * chain over the keys in order. */
static void pv4(float *o, const float *p, size_t pn, int nh, const float *v, size_t d, size_t nv) {
    size_t c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) {
        __m512 a[4][4];
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) a[h][u] = _mm512_loadu_ps(o + (size_t)h * d + c0 + 16 * (size_t)u);
        if (nh == 4) {
            for (size_t j = 0; j < nv; j++) {
                const float *vj = v + j * d + c0;
                const __m512 w0 = _mm512_loadu_ps(vj), w1 = _mm512_loadu_ps(vj + 16);
                const __m512 w2 = _mm512_loadu_ps(vj + 32), w3 = _mm512_loadu_ps(vj + 48);
                #pragma GCC unroll 8
                for (int h = 0; h < 4; h++) {
                    const __m512 x = _mm512_set1_ps(p[(size_t)h * pn + j]);
                    a[h][0] = _mm512_fmadd_ps(x, w0, a[h][0]);
                    a[h][1] = _mm512_fmadd_ps(x, w1, a[h][1]);
                    a[h][2] = _mm512_fmadd_ps(x, w2, a[h][2]);
                    a[h][3] = _mm512_fmadd_ps(x, w3, a[h][3]);
                }
            }
        } else {
            for (size_t j = 0; j < nv; j++) {
                const float *vj = v + j * d + c0;
                const __m512 w0 = _mm512_loadu_ps(vj), w1 = _mm512_loadu_ps(vj + 16);
                const __m512 w2 = _mm512_loadu_ps(vj + 32), w3 = _mm512_loadu_ps(vj + 48);
                for (int h = 0; h < nh; h++) {
                    const __m512 x = _mm512_set1_ps(p[(size_t)h * pn + j]);
                    a[h][0] = _mm512_fmadd_ps(x, w0, a[h][0]);
                    a[h][1] = _mm512_fmadd_ps(x, w1, a[h][1]);
                    a[h][2] = _mm512_fmadd_ps(x, w2, a[h][2]);
                    a[h][3] = _mm512_fmadd_ps(x, w3, a[h][3]);
                }
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) _mm512_storeu_ps(o + (size_t)h * d + c0 + 16 * (size_t)u, a[h][u]);
    }
    for (; c0 + 16 <= d; c0 += 16) {
        for (int h = 0; h < nh; h++) {
            float *oh = o + (size_t)h * d + c0;
            const float *ph = p + (size_t)h * pn;
            __m512 a = _mm512_loadu_ps(oh);
            for (size_t j = 0; j < nv; j++) a = _mm512_fmadd_ps(_mm512_set1_ps(ph[j]), _mm512_loadu_ps(v + j * d + c0), a);
            _mm512_storeu_ps(oh, a);
        }
    }
    for (; c0 < d; c0 += 8) { /* d % 16 == 8 */
        for (int h = 0; h < nh; h++) {
            float *oh = o + (size_t)h * d + c0;
            const float *ph = p + (size_t)h * pn;
            __m256 a = _mm256_loadu_ps(oh);
            for (size_t j = 0; j < nv; j++) a = _mm256_fmadd_ps(_mm256_set1_ps(ph[j]), _mm256_loadu_ps(v + j * d + c0), a);
            _mm256_storeu_ps(oh, a);
        }
    }
}

void ekv_attn_row_kv_avx512(const float *q, int R, const struct ekv_kv_view *k, const struct ekv_kv_view *v,
                            int32_t n_keys, float scale, float *out, float *probs, float *rowbuf,
                            const struct ekv_attn_stats *st) {
    const int d = k->d;
    if (R <= 0 || d <= 0) return;
    const size_t n = n_keys > 0 ? (size_t)n_keys : 0;
    const size_t dd = (size_t)d;
    memset(out, 0, (size_t)R * dd * sizeof(float));
    if (n == 0) return;
    struct ekv_kv_cursor kc = {0, 0, 0}, vc = {0, 0, 0};
    float tail_small[16 * 128];
    float *tail = dd <= 128 ? tail_small : NULL;
    if (!tail && (tail = malloc(16 * dd * sizeof(float))) == NULL) { /* d > 128: rare; on failure the AVX2 path */
        ekv_attn_row_kv_avx2(q, R, k, v, n_keys, scale, out, probs, rowbuf, st);
        return;
    }
    const size_t kb_rows = k->type == EKV_KV_F32 ? ATT_KB : EKV_ATTN_ROWS;
    for (size_t j0 = 0; j0 < n; j0 += kb_rows) {
        const size_t j1 = j0 + kb_rows < n ? j0 + kb_rows : n;
        const float *kb = ekv_kv_view_block(k, (int32_t)j0, (int32_t)j1, rowbuf, &kc, true);
        for (int h = 0; h < R; h += 2)
            qk16(q + (size_t)h * dd, dd, R - h >= 2 ? 2 : 1, kb, j1 - j0, scale, probs + (size_t)h * n + j0, n, tail);
    }
    if (k->bias) ekv_attn_add_bias(probs, R, n, k->bias + k->first);
    for (int h = 0; h < R; h++) softmax16(probs + (size_t)h * n, n);
    const size_t vb_rows = v->type == EKV_KV_F32 ? ATT_KB : EKV_ATTN_ROWS;
    for (size_t j0 = 0; j0 < n; j0 += vb_rows) {
        const size_t j1 = j0 + vb_rows < n ? j0 + vb_rows : n;
        const float *vb = ekv_kv_view_block(v, (int32_t)j0, (int32_t)j1, rowbuf, &vc, true);
        for (int h = 0; h < R; h += 4)
            pv4(out + (size_t)h * dd, probs + (size_t)h * n + j0, n, R - h >= 4 ? 4 : R - h, vb, dd, j1 - j0);
    }
    if (tail != tail_small) free(tail);
    if (st) ekv_attn_accumulate_avx2(probs, R, n_keys, st);
}
