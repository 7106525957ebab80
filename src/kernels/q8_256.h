/*
 * q8_256.h — Q8_0 and Q4_0 weights times Q8_0x activations on 256-bit
 * vectors, for both weight layouts (rows as in GGUF, and X16: groups of 16
 * rows, repack.c). Included by q8_avx2.c (AVX2: maddubs) and
 * q8_avxvnni.c (AVX-VNNI: vpdpbusd); Q8_FN(name) gives each copy its names.
 *
 * Every output is computed exactly as the reference does (quant.c): per
 * block an exact int32 dot, then y += (float)dot * (dw * dx) in block
 * order, one rounding per operation. Integer sums are exact, so the ISA,
 * the tile shape and the number of activation rows never change a bit:
 * these kernels equal the reference, and matmul equals matvec.
 */
#include <string.h>

#include "core/util.h"
#include "kernels/avx2_util.h"
#include "kernels/quant.h"

#define EKV_INLINE static inline __attribute__((always_inline))

/* ---- int8 dot primitives ---- */

/* acc + per int32 lane the sum of 4 products u8 x s8 (no saturation:
 * callers keep |u| * |s| * 2 < 2^15 on the maddubs path). */
EKV_INLINE __m256i dp_us(__m256i acc, __m256i u, __m256i s) {
#if Q8_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* acc + per lane the sum of 4 products s8 x s8 (|w| <= 128, |x| <= 127). */
EKV_INLINE __m256i dp_ss(__m256i acc, __m256i w, __m256i x) {
    return dp_us(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

EKV_INLINE int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* The four sums of four int32x8 vectors: {sum a, sum b, sum c, sum d}. */
EKV_INLINE __m128i hsum4_i32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* ---- rows layout ---- */

enum qk { QK8, QK4 };

/* Weight block b of a row: the 32 values as int8 (Q4_0: nibbles 0..15,
 * unsigned) and the scale. */
EKV_INLINE __m256i wblock(enum qk k, const void *row, int64_t b, float *d) {
    if (k == QK8) {
        const struct ekv_block_q8_0 *blk = (const struct ekv_block_q8_0 *)row + b;
        *d = _cvtsh_ss(blk->d);
        return _mm256_loadu_si256((const __m256i *)(const void *)blk->qs);
    }
    const struct ekv_block_q4_0 *blk = (const struct ekv_block_q4_0 *)row + b;
    *d = _cvtsh_ss(blk->d);
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)blk->qs);
    const __m128i m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* Exact int32 lanes of the block dot (Q4_0: the -8 * sum(x) correction is
 * added by the caller from x->s). */
EKV_INLINE __m256i bdot(enum qk k, __m256i w, __m256i x) {
    return k == QK8 ? dp_ss(_mm256_setzero_si256(), w, x) : dp_us(_mm256_setzero_si256(), w, x);
}

/* One weight row against one activation row. */
EKV_INLINE float rdot(enum qk k, int64_t nb, const void *row, const struct ekv_block_q8_0x *x) {
    float y = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float dw;
        const __m256i w = wblock(k, row, b, &dw);
        int32_t s = hsum_i32(bdot(k, w, _mm256_loadu_si256((const __m256i *)(const void *)x[b].qs)));
        if (k == QK4) s -= 8 * x[b].s;
        y += (float)s * (dw * x[b].d);
    }
    return y;
}

/* Four weight rows against one activation row (decode). */
EKV_INLINE void rdot4(enum qk k, int64_t nb, const char *w0, size_t rb, const struct ekv_block_q8_0x *x,
                      float *y) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float d0, d1, d2, d3;
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(const void *)x[b].qs);
        const __m256i v0 = bdot(k, wblock(k, w0, b, &d0), xq), v1 = bdot(k, wblock(k, w0 + rb, b, &d1), xq);
        const __m256i v2 = bdot(k, wblock(k, w0 + 2 * rb, b, &d2), xq);
        const __m256i v3 = bdot(k, wblock(k, w0 + 3 * rb, b, &d3), xq);
        __m128i s = hsum4_i32(v0, v1, v2, v3);
        if (k == QK4) s = _mm_sub_epi32(s, _mm_set1_epi32(8 * x[b].s));
        int32_t si[4];
        _mm_storeu_si128((__m128i *)(void *)si, s);
        const float dx = x[b].d;
        a0 += (float)si[0] * (d0 * dx);
        a1 += (float)si[1] * (d1 * dx);
        a2 += (float)si[2] * (d2 * dx);
        a3 += (float)si[3] * (d3 * dx);
    }
    y[0] = a0;
    y[1] = a1;
    y[2] = a2;
    y[3] = a3;
}

/* One weight row against four activation rows (prefill). */
EKV_INLINE void rdot1x4(enum qk k, int64_t nb, const void *row, const struct ekv_block_q8_0x *const *x, float *y) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float dw;
        const __m256i w = wblock(k, row, b, &dw);
        const __m256i v0 = bdot(k, w, _mm256_loadu_si256((const __m256i *)(const void *)x[0][b].qs));
        const __m256i v1 = bdot(k, w, _mm256_loadu_si256((const __m256i *)(const void *)x[1][b].qs));
        const __m256i v2 = bdot(k, w, _mm256_loadu_si256((const __m256i *)(const void *)x[2][b].qs));
        const __m256i v3 = bdot(k, w, _mm256_loadu_si256((const __m256i *)(const void *)x[3][b].qs));
        __m128i s = hsum4_i32(v0, v1, v2, v3);
        if (k == QK4) s = _mm_sub_epi32(s, _mm_setr_epi32(8 * x[0][b].s, 8 * x[1][b].s, 8 * x[2][b].s, 8 * x[3][b].s));
        int32_t si[4];
        _mm_storeu_si128((__m128i *)(void *)si, s);
        a0 += (float)si[0] * (dw * x[0][b].d);
        a1 += (float)si[1] * (dw * x[1][b].d);
        a2 += (float)si[2] * (dw * x[2][b].d);
        a3 += (float)si[3] * (dw * x[3][b].d);
    }
    y[0] = a0;
    y[1] = a1;
    y[2] = a2;
    y[3] = a3;
}

EKV_INLINE void rows_gemm(enum qk k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                          int64_t n, float *y, int64_t ldy) {
    const int64_t nb = w->ne0 / EKV_QK8_0;
    const char *base = w->data;
    if (n == 1) {
        const struct ekv_block_q8_0x *x = xa;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) rdot4(k, nb, base + (size_t)r * w->row_bytes, w->row_bytes, x, y + r);
        for (; r < r1; r++) y[r] = rdot(k, nb, base + (size_t)r * w->row_bytes, x);
        return;
    }
    for (int64_t t0 = 0; t0 < n; t0 += 32) {
        const int64_t t1 = EKV_MIN(n, t0 + 32);
        for (int64_t r = r0; r < r1; r++) {
            const char *row = base + (size_t)r * w->row_bytes;
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4) {
                const struct ekv_block_q8_0x *xr[4];
                float o[4];
                #pragma GCC unroll 16
                for (int i = 0; i < 4; i++) xr[i] = (const void *)((const char *)xa + (size_t)(t + i) * xs);
                rdot1x4(k, nb, row, xr, o);
                #pragma GCC unroll 16
                for (int i = 0; i < 4; i++) y[(t + i) * ldy + r] = o[i];
            }
            for (; t < t1; t++) y[t * ldy + r] = rdot(k, nb, row, (const void *)((const char *)xa + (size_t)t * xs));
        }
    }
}

/* ---- X16 layout: a half group (8 rows) per vector ---- */

/* Exact int32 dots of the 8 rows of half h of block column o with one
 * activation block (including the Q4_0 / biased-Q8_0 correction). */
EKV_INLINE __m256i xdot(enum qk k, const uint8_t *o, int h, const struct ekv_block_q8_0x *xb) {
    const uint8_t *q = o + 32 + 32 * h;
#if Q8_VNNI
    __m256i acc = _mm256_set1_epi32((k == QK8 ? -128 : -8) * xb->s);
    if (k == QK8) {
        #pragma GCC unroll 16
        for (int j = 0; j < 8; j++) {
            int32_t x4;
            memcpy(&x4, xb->qs + 4 * j, 4);
            acc = dp_us(acc, _mm256_loadu_si256((const __m256i *)(const void *)(q + 64 * j)), _mm256_set1_epi32(x4));
        }
    } else {
        const __m256i m4 = _mm256_set1_epi8(0xF);
        #pragma GCC unroll 16
        for (int j = 0; j < 4; j++) {
            int32_t lo, hi;
            memcpy(&lo, xb->qs + 4 * j, 4);
            memcpy(&hi, xb->qs + 16 + 4 * j, 4);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(q + 64 * j));
            acc = dp_us(acc, _mm256_and_si256(v, m4), _mm256_set1_epi32(lo));
            acc = dp_us(acc, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_set1_epi32(hi));
        }
    }
    return acc;
#else
    if (k == QK8) {
        /* weights stored + 128: back to signed for the sign trick (maddubs
         * of 255 x 127 pairs would saturate) */
        const __m256i bias = _mm256_set1_epi8((char)0x80);
        __m256i acc = _mm256_setzero_si256();
        #pragma GCC unroll 16
        for (int j = 0; j < 8; j++) {
            int32_t x4;
            memcpy(&x4, xb->qs + 4 * j, 4);
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(q + 64 * j)), bias);
            acc = dp_ss(acc, w, _mm256_set1_epi32(x4));
        }
        return acc;
    }
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256i acc = _mm256_set1_epi32(-8 * xb->s);
    #pragma GCC unroll 16
    for (int j = 0; j < 4; j++) {
        int32_t lo, hi;
        memcpy(&lo, xb->qs + 4 * j, 4);
        memcpy(&hi, xb->qs + 16 + 4 * j, 4);
        const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(q + 64 * j));
        acc = dp_us(acc, _mm256_and_si256(v, m4), _mm256_set1_epi32(lo));
        acc = dp_us(acc, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_set1_epi32(hi));
    }
    return acc;
#endif
}

/* Half h of a group (8 rows) against T activation rows: y[t*ldy + i]. */
EKV_INLINE void xtile(enum qk k, int T, int64_t nb, const uint8_t *g, int h, const struct ekv_block_q8_0x *const *x,
                      float *y, int64_t ldy) {
    const size_t gb = k == QK8 ? EKV_X16_Q8_0_BYTES : EKV_X16_Q4_0_BYTES;
    __m256 acc[4];
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g + (size_t)b * gb;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(o + 16 * h)));
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const struct ekv_block_q8_0x *xb = x[t] + b;
            const __m256 s = _mm256_cvtepi32_ps(xdot(k, o, h, xb));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(s, _mm256_mul_ps(dw, _mm256_set1_ps(xb->d))));
        }
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);
}

EKV_INLINE void x16_gemm(enum qk k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                         int64_t n, float *y, int64_t ldy) {
    const int64_t nb = w->ne0 / EKV_QK8_0;
    const uint8_t *base = w->data;
    for (int64_t t0 = 0; t0 < n; t0 += 32) {
        const int64_t t1 = EKV_MIN(n, t0 + 32);
        for (int64_t r = r0; r < r1; r += 16) {
            const uint8_t *g = base + (size_t)r * w->row_bytes;
            for (int h = 0; h < 2; h++) {
                int64_t t = t0;
                const struct ekv_block_q8_0x *xr[4];
                for (; t + 4 <= t1; t += 4) {
                    #pragma GCC unroll 16
                    for (int i = 0; i < 4; i++) xr[i] = (const void *)((const char *)xa + (size_t)(t + i) * xs);
                    xtile(k, 4, nb, g, h, xr, y + t * ldy + r + 8 * h, ldy);
                }
                for (; t < t1; t++) {
                    xr[0] = (const void *)((const char *)xa + (size_t)t * xs);
                    xtile(k, 1, nb, g, h, xr, y + t * ldy + r + 8 * h, ldy);
                }
            }
        }
    }
}

static void Q8_FN(gemm_q8_0)(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                             int64_t n, float *y, int64_t ldy) {
    rows_gemm(QK8, w, r0, r1, xa, xs, n, y, ldy);
}
static void Q8_FN(gemm_q4_0)(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                             int64_t n, float *y, int64_t ldy) {
    rows_gemm(QK4, w, r0, r1, xa, xs, n, y, ldy);
}
static void Q8_FN(gemm_x16_q8_0)(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                                 int64_t n, float *y, int64_t ldy) {
    x16_gemm(QK8, w, r0, r1, xa, xs, n, y, ldy);
}
static void Q8_FN(gemm_x16_q4_0)(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                                 int64_t n, float *y, int64_t ldy) {
    x16_gemm(QK4, w, r0, r1, xa, xs, n, y, ldy);
}
static void Q8_FN(dot_q8_0)(int64_t n, float *s, const void *w, const void *xa) {
    *s = rdot(QK8, n / EKV_QK8_0, w, xa);
}
static void Q8_FN(dot_q4_0)(int64_t n, float *s, const void *w, const void *xa) {
    *s = rdot(QK4, n / EKV_QK8_0, w, xa);
}

/* Fills the Q8_0 / Q4_0 entries of a table with this file's kernels. */
static void Q8_FN(fill)(enum ekv_dtype t, struct ekv_type_kernels *k) {
    if (t != EKV_Q8_0 && t != EKV_Q4_0) return;
    const bool q8 = t == EKV_Q8_0;
    k->vec_dot = q8 ? Q8_FN(dot_q8_0) : Q8_FN(dot_q4_0);
    k->gemv = NULL;
    k->gemm = q8 ? Q8_FN(gemm_q8_0) : Q8_FN(gemm_q4_0);
    k->gemm_x16 = q8 ? Q8_FN(gemm_x16_q8_0) : Q8_FN(gemm_x16_q4_0);
    k->quantize_act = ekv_quant_q8_0x_avx2;
    k->act_block_bytes = sizeof(struct ekv_block_q8_0x);
    k->act_block = EKV_QK8_0;
}
