/*
 * q8_avx2.c — AVX2 copy of the Q8_0/Q4_0 kernels of q8_256.h (int8 dots
 * through maddubs), and the Q8_0x activation quantisers every SIMD level
 * uses (bit-identical to ekv_quant_q8_0, plus the correction term).
 */
#define Q8_VNNI 0
#define Q8_FN(name) name##_avx2
#include "kernels/q8_256.h"

#include <float.h>
#include <string.h>

/* roundf (ties away from zero) of 8 lanes, rebuilt from truncation. */
static inline __m256i round_away(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(x, t)); /* exact */
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_or_ps(_mm256_and_ps(x, sign), _mm256_set1_ps(1.0f)); /* +-1 */
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, step)));
}

/* Q8_0 values exactly as ekv_quant_q8_0 (exact |x| maximum, the same scale
 * arithmetic, roundf), the scale widened back from fp16, and the sums. */
void ekv_quant_q8_0x_avx2(const float *src, void *dst, int64_t n) {
    struct ekv_block_q8_0x *b = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / EKV_QK8_0; i++, src += EKV_QK8_0) {
        const __m256 v0 = _mm256_loadu_ps(src), v1 = _mm256_loadu_ps(src + 8);
        const __m256 v2 = _mm256_loadu_ps(src + 16), v3 = _mm256_loadu_ps(src + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float amax = _mm_cvtss_f32(h);
        /* a NaN or an infinity: the block is zeros, as ekv_quant_q8_0 makes it */
        const __m256 big = _mm256_set1_ps(FLT_MAX);
        const __m256 ok = _mm256_and_ps(
            _mm256_and_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v0), big, _CMP_LE_OQ),
                          _mm256_cmp_ps(_mm256_andnot_ps(sign, v1), big, _CMP_LE_OQ)),
            _mm256_and_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v2), big, _CMP_LE_OQ),
                          _mm256_cmp_ps(_mm256_andnot_ps(sign, v3), big, _CMP_LE_OQ)));
        if (_mm256_movemask_ps(ok) != 0xff) {
            b[i].d = 0.0f;
            b[i].s = 0;
            memset(b[i].qs, 0, sizeof b[i].qs);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ekv_fp16_to_f32(ekv_f32_to_fp16(d));
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i i0 = round_away(_mm256_mul_ps(v0, vid)), i1 = round_away(_mm256_mul_ps(v1, vid));
        const __m256i i2 = round_away(_mm256_mul_ps(v2, vid)), i3 = round_away(_mm256_mul_ps(v3, vid));
        b[i].s = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(void *)b[i].qs, _mm256_permutevar8x32_epi32(p, perm));
    }
}


void ekv_q8_fill_avx2(enum ekv_dtype t, struct ekv_type_kernels *k);
void ekv_q8_fill_avx2(enum ekv_dtype t, struct ekv_type_kernels *k) { fill_avx2(t, k); }
