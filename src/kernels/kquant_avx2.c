/*
 * kquant_avx2.c — AVX2 dot products of Q4_K, Q5_K and Q6_K weight rows
 * with Q8_K activations (the references are in quant.c). Integer block
 * sums are exact; only the float accumulation order differs from the
 * reference. matmul.c drives these row by row.
 */
#include <stddef.h>
#include <string.h>

#include "core/util.h"
#include "kernels/avx2_util.h"
#include "kernels/quant.h"

/* sum_j sc_j * dot(q_j, y_j) over the 8 sub-blocks of 32 of a Q4_K/Q5_K
 * super-block, as 8 int32 lanes; q values are unsigned (0..31). */
static inline __m256i k_block_sum(const uint8_t *qs, const uint8_t *qh, const int8_t *yq, const uint8_t sc[8]) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i hb = qh ? _mm256_loadu_si256((const __m256i *)(const void *)qh) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * k));
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) {
            const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * k))), b1 = _mm256_set1_epi8((char)(2 << (2 * k)));
            const __m256i s16 = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b0), b0), s16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b1), b1), s16));
        }
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)(const void *)(yq + 64 * k));
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)(const void *)(yq + 64 * k + 32));
        const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[2 * k]));
        const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(sc[2 * k + 1]));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    return sumi;
}

static void dot_k(int64_t n, float *s, const uint8_t *w, size_t bsize, size_t off_scales, size_t off_qh,
                  size_t off_qs, const struct ekv_block_q8_K *y) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t i = 0; i < n / EKV_QK_K; i++, w += bsize) {
        uint16_t d16, m16;
        memcpy(&d16, w, 2);
        memcpy(&m16, w + 2, 2);
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++) ekv_k_scale_min(j, w + off_scales, &sc[j], &m[j]);
        int32_t sum_m = 0;
        for (int j = 0; j < 8; j++) sum_m += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        const __m256i sumi = k_block_sum(w + off_qs, off_qh ? w + off_qh : NULL, y[i].qs, sc);
        const float dy = y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(ekv_fp16_to_f32(d16) * dy), _mm256_cvtepi32_ps(sumi), acc);
        mins += ekv_fp16_to_f32(m16) * dy * (float)sum_m;
    }
    *s = ekv_hsum8(acc) - mins;
}

void ekv_dot_q4_K_q8_K_avx2(int64_t n, float *s, const void *w, const void *xa) {
    dot_k(n, s, w, sizeof(struct ekv_block_q4_K), offsetof(struct ekv_block_q4_K, scales), 0,
          offsetof(struct ekv_block_q4_K, qs), xa);
}

void ekv_dot_q5_K_q8_K_avx2(int64_t n, float *s, const void *w, const void *xa) {
    dot_k(n, s, w, sizeof(struct ekv_block_q5_K), offsetof(struct ekv_block_q5_K, scales),
          offsetof(struct ekv_block_q5_K, qh), offsetof(struct ekv_block_q5_K, qs), xa);
}

/* Q6_K: q in 0..63 stored; sum (q - 32) y = maddubs(q, y) - 32 * bsum. */
void ekv_dot_q6_K_q8_K_avx2(int64_t n, float *s, const void *w, const void *xa) {
    const struct ekv_block_q6_K *a = w;
    const struct ekv_block_q8_K *y = xa;
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float offs = 0.0f;
    for (int64_t i = 0; i < n / EKV_QK_K; i++) {
        int32_t off = 0;
        for (int j = 0; j < 16; j++) off += a[i].scales[j] * y[i].bsums[j];
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = a[i].ql + 64 * h, *qhp = a[i].qh + 32 * h;
            const int8_t *sc = a[i].scales + 8 * h;
            const int8_t *yq = y[i].qs + 128 * h;
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
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(const void *)(yq + 32 * g));
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * g + 1]), _mm_set1_epi16(sc[2 * g]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], yv), scv));
            }
        }
        const float dd = ekv_fp16_to_f32(a[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
        offs += dd * (float)(32 * off);
    }
    *s = ekv_hsum8(acc) - offs;
}
