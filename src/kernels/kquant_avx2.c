/*
 * kquant_avx2.c — AVX2 products of Q4_K, Q5_K and Q6_K weight rows with
 * Q8_K activations (the references are in quant.c): the single-row dot,
 * and a prefill kernel that unpacks each weight super-block once for four
 * activation rows. Both run the reference's per-output float operations
 * on exact integer block sums, so they equal the reference (and matmul
 * equals repeated matvec) bit for bit.
 */
#include <stddef.h>
#include <string.h>

#include "core/util.h"
#include "kernels/avx2_util.h"
#include "kernels/quant.h"

#define EKV_INLINE static inline __attribute__((always_inline))
#define MAXT 4

enum kk { KK_Q4, KK_Q5, KK_Q6 };

static size_t block_bytes(enum kk k) {
    return k == KK_Q4 ? sizeof(struct ekv_block_q4_K) : k == KK_Q5 ? sizeof(struct ekv_block_q5_K)
                                                         : sizeof(struct ekv_block_q6_K);
}

/* Q4_K / Q5_K super-block against T activation blocks:
 * sumi[t] = sum_j sc_j * dot(q_j, y_t,j) as 8 int32 lanes (q unsigned 0..31),
 * summ[t] = sum_j m_j * sum(y_t,j). */
EKV_INLINE void k45_block(enum kk k, int T, const uint8_t *blk, const struct ekv_block_q8_K *const *y, int64_t i,
                          __m256i sumi[MAXT], int32_t summ[MAXT]) {
    const uint8_t *scales = blk + 4;
    const uint8_t *qh = k == KK_Q5 ? blk + 16 : NULL;
    const uint8_t *qs = k == KK_Q5 ? blk + 48 : blk + 16;
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) ekv_k_scale_min(j, scales, &sc[j], &m[j]);
    for (int t = 0; t < T; t++) {
        int32_t s = 0;
        for (int j = 0; j < 8; j++) s += m[j] * (y[t][i].bsums[2 * j] + y[t][i].bsums[2 * j + 1]);
        summ[t] = s;
        sumi[t] = _mm256_setzero_si256();
    }
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i hb = qh ? _mm256_loadu_si256((const __m256i *)(const void *)qh) : _mm256_setzero_si256();
    for (int kk = 0; kk < 4; kk++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * kk));
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (k == KK_Q5) {
            const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * kk))), b1 = _mm256_set1_epi8((char)(2 << (2 * kk)));
            const __m256i s16 = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b0), b0), s16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b1), b1), s16));
        }
        const __m256i s0 = _mm256_set1_epi16(sc[2 * kk]), s1 = _mm256_set1_epi16(sc[2 * kk + 1]);
        for (int t = 0; t < T; t++) {
            const int8_t *yq = y[t][i].qs + 64 * kk;
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)(const void *)yq);
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(const void *)(yq + 32));
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s0);
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s1);
            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
        }
    }
}

/* Q6_K super-block: q in 0..63 stored, sum (q - 32) y = maddubs(q, y) - 32 bsum;
 * sumi[t] gets the first part with the int8 scales, summ[t] = sum_j sc_j * bsum_j. */
EKV_INLINE void k6_block(int T, const struct ekv_block_q6_K *a, const struct ekv_block_q8_K *const *y, int64_t i,
                         __m256i sumi[MAXT], int32_t summ[MAXT]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    for (int t = 0; t < T; t++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++) s += a->scales[j] * y[t][i].bsums[j];
        summ[t] = s;
        sumi[t] = _mm256_setzero_si256();
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = a->ql + 64 * h, *qhp = a->qh + 32 * h;
        const int8_t *sc = a->scales + 8 * h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)qhp);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
        for (int g = 0; g < 4; g++) {
            const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * g + 1]), _mm_set1_epi16(sc[2 * g]));
            for (int t = 0; t < T; t++) {
                const int8_t *yq = y[t][i].qs + 128 * h + 32 * g;
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(const void *)yq);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], yv), scv));
            }
        }
    }
}

/* Exact int32 total of 8 lanes. */
EKV_INLINE int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* One weight row against T activation rows: out[t]. Per super-block the
 * integer sums are exact and the float steps are the reference's
 * (quant.c), so the result equals the reference bit for bit:
 * Q4_K/Q5_K: y += (d * dy) * sum_sc - (dmin * dy) * sum_m;
 * Q6_K: y += (d * dy) * (sum_sc - 32 * sum_m). */
EKV_INLINE void k_rows(enum kk k, int T, int64_t n, const void *w, const struct ekv_block_q8_K *const *y,
                       float *out) {
    float acc[MAXT];
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    const uint8_t *blk = w;
    const size_t bs = block_bytes(k);
    for (int64_t i = 0; i < n / EKV_QK_K; i++, blk += bs) {
        __m256i sumi[MAXT];
        int32_t summ[MAXT];
        if (k == KK_Q6) {
            const struct ekv_block_q6_K *a = (const struct ekv_block_q6_K *)(const void *)blk;
            k6_block(T, a, y, i, sumi, summ);
            const float d = _cvtsh_ss(a->d);
            for (int t = 0; t < T; t++) acc[t] += d * y[t][i].d * (float)(hsum_i32(sumi[t]) - 32 * summ[t]);
        } else {
            uint16_t d16, m16;
            memcpy(&d16, blk, 2);
            memcpy(&m16, blk + 2, 2);
            k45_block(k, T, blk, y, i, sumi, summ);
            const float d = _cvtsh_ss(d16), dm = _cvtsh_ss(m16);
            for (int t = 0; t < T; t++) {
                const float dy = y[t][i].d;
                acc[t] += d * dy * (float)hsum_i32(sumi[t]) - dm * dy * (float)summ[t];
            }
        }
    }
    for (int t = 0; t < T; t++) out[t] = acc[t];
}

EKV_INLINE void k_gemm(enum kk k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                       int64_t n, float *y, int64_t ldy) {
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
        const int64_t t1 = EKV_MIN(n, t0 + 16);
        for (int64_t r = r0; r < r1; r++) {
            const void *wr = (const char *)w->data + (size_t)r * w->row_bytes;
            int64_t t = t0;
            for (; t < t1; t += (t + MAXT <= t1 ? MAXT : 1)) {
                const struct ekv_block_q8_K *yr[MAXT];
                float out[MAXT];
                if (t + MAXT <= t1) {
                    for (int j = 0; j < MAXT; j++) yr[j] = (const void *)((const char *)xa + (size_t)(t + j) * xs);
                    k_rows(k, MAXT, w->ne0, wr, yr, out);
                    for (int j = 0; j < MAXT; j++) y[(t + j) * ldy + r] = out[j];
                } else {
                    yr[0] = (const void *)((const char *)xa + (size_t)t * xs);
                    k_rows(k, 1, w->ne0, wr, yr, out);
                    y[t * ldy + r] = out[0];
                }
            }
        }
    }
}

#define DEFINE_K(name, K)                                                                                 \
    void ekv_dot_##name##_q8_K_avx2(int64_t n, float *s, const void *w, const void *xa) {                  \
        const struct ekv_block_q8_K *y = xa;                                                              \
        k_rows(K, 1, n, w, &y, s);                                                                        \
    }                                                                                                     \
    void ekv_gemm_##name##_avx2(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa,        \
                                size_t xs, int64_t n, float *y, int64_t ldy) {                            \
        k_gemm(K, w, r0, r1, xa, xs, n, y, ldy);                                                          \
    }

DEFINE_K(q4_K, KK_Q4)
DEFINE_K(q5_K, KK_Q5)
DEFINE_K(q6_K, KK_Q6)
