/*
 * kvquant_avx2.c — AVX2/F16C decoders of the KV-cache storage types
 * (kvquant.h), eight elements per step, and the f16 encoder that stores
 * every key and value of an f16 cache. Each element gets exactly the
 * reference's arithmetic (an exact product, then one rounding), so the
 * results equal kvquant.c's bit for bit; tests/test_kvquant.c checks it.
 */
#include <string.h>

#include "core/util.h"
#include "kernels/avx2_util.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"

void ekv_f16_to_float_avx2(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ekv_load_f16x8(src + i));
    for (; i < n; i++) dst[i] = ekv_fp16_to_f32(src[i]);
}

/* vcvtps2ph rounds half to even as ekv_f32_to_fp16 does (overflow to
 * infinity, subnormal halves included); only a NaN differs: the hardware
 * keeps the top of the payload, the reference gives the one quiet NaN
 * (sign | 0x7e00), so NaN lanes are replaced by that. */
void ekv_f32_to_f16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        if (!_mm256_testz_ps(nan, nan)) {
            const __m256i m32 = _mm256_castps_si256(nan);
            const __m128i m16 = _mm_packs_epi32(_mm256_castsi256_si128(m32), _mm256_extracti128_si256(m32, 1));
            const __m128i q = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)), _mm_set1_epi16(0x7e00));
            h = _mm_blendv_epi8(h, q, m16);
        }
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = ekv_f32_to_fp16(src[i]);
}

static void q8_0_row(const struct ekv_block_q8_0 *b, int d, float *dst) {
    for (int i = 0; i < d / EKV_QK8_0; i++, dst += EKV_QK8_0) {
        const __m256 s = _mm256_set1_ps(ekv_fp16_to_f32(b[i].d));
        for (int l = 0; l < EKV_QK8_0; l += 8) {
            const __m128i q8 = _mm_loadl_epi64((const __m128i *)(const void *)(b[i].qs + l));
            _mm256_storeu_ps(dst + l, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), s));
        }
    }
}

static void q4_0_row(const struct ekv_block_q4_0 *b, int d, float *dst) {
    const __m128i lo = _mm_set1_epi8(0x0F);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int i = 0; i < d / EKV_QK4_0; i++, dst += EKV_QK4_0) {
        const __m256 s = _mm256_set1_ps(ekv_fp16_to_f32(b[i].d));
        const __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)b[i].qs);
        const __m128i ql = _mm_and_si128(raw, lo), qh = _mm_and_si128(_mm_srli_epi16(raw, 4), lo);
        const __m128i parts[4] = {ql, _mm_srli_si128(ql, 8), qh, _mm_srli_si128(qh, 8)};
        for (int l = 0; l < 4; l++) {
            const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[l]), eight);
            _mm256_storeu_ps(dst + 8 * l, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
        }
    }
}

/* Eight b-bit codes starting at channel c (c % 8 == 0) as floats. */
static inline __m256 kivi_codes8(const uint8_t *codes, int c, int bits) {
    uint32_t w = 0;
    if (bits == 2) {
        uint16_t h;
        memcpy(&h, codes + c / 4, 2);
        w = h;
        const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        return _mm256_cvtepi32_ps(
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32(3)));
    }
    memcpy(&w, codes + c / 2, 4);
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32(15)));
}

static inline int kivi_code1(const uint8_t *codes, int c, int bits) {
    const int per = 8 / bits;
    return (codes[c / per] >> (bits * (c % per))) & ((1 << bits) - 1);
}

static void kivi_vrow(const uint8_t *p, int d, int g, int bits, float *dst) {
    const size_t cb = (size_t)g * (size_t)bits / 8;
    for (int c0 = 0; c0 < d; c0 += g) {
        uint16_t s16, m16;
        memcpy(&s16, p, 2);
        memcpy(&m16, p + 2, 2);
        const float s = ekv_fp16_to_f32(s16), mn = ekv_fp16_to_f32(m16);
        const __m256 vs = _mm256_set1_ps(s), vm = _mm256_set1_ps(mn);
        int c = 0;
        for (; c + 8 <= g; c += 8) _mm256_storeu_ps(dst + c0 + c, _mm256_fmadd_ps(kivi_codes8(p + 4, c, bits), vs, vm));
        for (; c < g; c++) dst[c0 + c] = (float)kivi_code1(p + 4, c, bits) * s + mn;
        p += 4 + cb;
    }
}

void ekv_kv_rows_to_float_avx2(enum ekv_kv_type t, const void *src, size_t row_bytes, int32_t n, int d, int g,
                               float *dst) {
    const uint8_t *p = src;
    switch (t) {
    case EKV_KV_F32: memcpy(dst, src, (size_t)n * (size_t)d * sizeof(float)); return;
    case EKV_KV_F16: ekv_f16_to_float_avx2(src, dst, (int64_t)n * d); return;
    case EKV_KV_Q8_0:
        for (int32_t j = 0; j < n; j++, p += row_bytes, dst += d) q8_0_row((const void *)p, d, dst);
        return;
    case EKV_KV_Q4_0:
        for (int32_t j = 0; j < n; j++, p += row_bytes, dst += d) q4_0_row((const void *)p, d, dst);
        return;
    case EKV_KV_KIVI2:
    case EKV_KV_KIVI4: {
        const int bits = t == EKV_KV_KIVI2 ? 2 : 4;
        for (int32_t j = 0; j < n; j++, p += row_bytes, dst += d) kivi_vrow(p, d, g, bits, dst);
        return;
    }
    default: return;
    }
}

void ekv_kivi_dequant_kgroup_avx2(const void *grp, int d, int bits, int r0, int r1, float *dst) {
    const uint8_t *p = grp;
    const uint16_t *s16 = (const uint16_t *)(const void *)p, *m16 = s16 + d;
    const uint8_t *codes = p + (size_t)d * 4;
    const size_t rb = (size_t)d * (size_t)bits / 8;
    int c = 0;
    for (; c + 8 <= d; c += 8) {
        const __m256 vs = ekv_load_f16x8(s16 + c), vm = ekv_load_f16x8(m16 + c);
        for (int r = r0; r < r1; r++)
            _mm256_storeu_ps(dst + (size_t)(r - r0) * (size_t)d + (size_t)c,
                             _mm256_fmadd_ps(kivi_codes8(codes + (size_t)r * rb, c, bits), vs, vm));
    }
    for (; c < d; c++) {
        uint16_t a, b;
        memcpy(&a, s16 + c, 2);
        memcpy(&b, m16 + c, 2);
        const float s = ekv_fp16_to_f32(a), mn = ekv_fp16_to_f32(b);
        for (int r = r0; r < r1; r++)
            dst[(size_t)(r - r0) * (size_t)d + (size_t)c] = (float)kivi_code1(codes + (size_t)r * rb, c, bits) * s + mn;
    }
}
