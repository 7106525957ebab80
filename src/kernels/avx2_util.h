/*
 * avx2_util.h — small AVX2/FMA helpers shared by the *_avx2.c kernels
 * (horizontal sums, a vector expf, half-precision loads) and the row-block
 * rule of the prompt GEMMs (also used by float_avx512.c). Include only
 * from files compiled with -mavx2 -mfma -mf16c.
 */
#ifndef EKV_AVX2_UTIL_H
#define EKV_AVX2_UTIL_H

#include <immintrin.h>
#include <stdint.h>

/* Prompt GEMMs (matmul_avx2.c, float_avx512.c) walk a thread's weight rows
 * in blocks of about this many bytes, held in L2, so that every tile of
 * activation rows (in L1) meets every row group of a block
 * (docs/performance.md, "AMD AVX-512 host (Zen 5)"). */
#define EKV_GEMM_ROW_BLOCK (256 * 1024)

/* Rows per such block for rows of row_bytes: a multiple of group, at least one group. */
static inline int64_t ekv_gemm_row_block(size_t row_bytes, int64_t group) {
    const int64_t rb = (int64_t)(EKV_GEMM_ROW_BLOCK / (row_bytes ? row_bytes : 1)) / group * group;
    return rb < group ? group : rb;
}

/* Sum of the 8 lanes, in a fixed order. */
static inline float ekv_hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehl_ps(lo, lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_shuffle_ps(lo, lo, 1);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

/* Sums adjacent pairs of int16 lanes into int32 (for maddubs results). */
static inline __m256i ekv_sum_i16_pairs(__m256i v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }

/* 8 halves -> 8 floats; 8 bf16 -> 8 floats. */
static inline __m256 ekv_load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
static inline __m256 ekv_load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* expf for 8 lanes (Cephes-style range reduction + degree-6 polynomial,
 * about 2 ulp); inputs below -87.3 give 0. */
static inline __m256 ekv_exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    /* 2^fx: fx in [-126, 128]; split in two factors to stay in range */
    __m256i n = _mm256_cvtps_epi32(fx);
    __m256i n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
    __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
    return _mm256_andnot_ps(under, y);
}

#endif
