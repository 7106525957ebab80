/*
 * q8_avx512.c — AVX-512 VNNI products of X16 Q8_0 / Q4_0 weights (groups
 * of 16 rows, repack.c) with Q8_0x activations: one zmm lane per weight
 * row, so a 64-byte load and one vpdpbusd per activation row advance 16
 * row dots by 4 elements, and no horizontal sums are needed.
 *
 * Decode (one activation row) streams the weights once, one linear stream
 * per thread, with no software prefetch: on an AMD Zen 4 host a prefetch 8
 * block columns ahead cost 6-15 % of TinyLlama's Q8_0/Q4_0 decode, and 20-35 %
 * with two streams a thread (docs/performance.md, "Zen 4 again"); prefill uses the same tile with up to 16 activation rows,
 * the weights of a block column held in registers across them. Every
 * output is computed as the reference does (quant.c): exact int32 block
 * dots, then y += (float)dot * (dw * dx) in block order, so results equal
 * the reference bit for bit whatever the tile, row count or thread count.
 * Rows-layout weights use the 256-bit kernels (q8_avx2.c), same results.
 */
#include <immintrin.h>
#include <string.h>

#include "core/util.h"
#include "kernels/quant.h"

#define EKV_INLINE static inline __attribute__((always_inline))
#define TMAX 16        /* activation rows per tile */
#define TOK_BLOCK 64   /* activation rows per cache block in prefill */

enum qk { QK8, QK4 };

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* One group (16 rows) against T activation rows; y[t * ldy + i]. */
EKV_INLINE void xtile(enum qk k, int T, int64_t nb, const uint8_t *g, const struct ekv_block_q8_0x *const *x,
                      float *y, int64_t ldy) {
    const size_t gb = k == QK8 ? EKV_X16_Q8_0_BYTES : EKV_X16_Q4_0_BYTES;
    const int32_t bias = k == QK8 ? -128 : -8; /* weights stored + 128 / nibbles 0..15 */
    __m512 acc[TMAX];
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g + (size_t)b * gb;
        __m512i w[8];
        if (k == QK8) {
            #pragma GCC unroll 16
            for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512((const void *)(o + 32 + 64 * j));
        } else {
            const __m512i m4 = _mm512_set1_epi8(0xF);
            #pragma GCC unroll 16
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512((const void *)(o + 32 + 64 * j));
                w[j] = _mm512_and_si512(v, m4);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)o));
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            const struct ekv_block_q8_0x *xb = x[t] + b;
            __m512i s;
            if (T <= 2) {
                /* two dependency chains: decode has no other rows to overlap */
                __m512i a0 = _mm512_set1_epi32(bias * xb->s), a1 = _mm512_setzero_si512();
                /* unrolled, so that w[] stays in registers (a loop here made GCC 12 store the
                 * weights to the stack and load them back: Q4_0 decode at half speed) */
                #pragma GCC unroll 4
                for (int j = 0; j < 8; j += 2) {
                    a0 = _mm512_dpbusd_epi32(a0, w[j], bcast4(xb->qs + 4 * j));
                    a1 = _mm512_dpbusd_epi32(a1, w[j + 1], bcast4(xb->qs + 4 * j + 4));
                }
                s = _mm512_add_epi32(a0, a1);
            } else {
                s = _mm512_set1_epi32(bias * xb->s);
                #pragma GCC unroll 16
                for (int j = 0; j < 8; j++) s = _mm512_dpbusd_epi32(s, w[j], bcast4(xb->qs + 4 * j));
            }
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(xb->d));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(s), sc));
        }
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

#define XT_CASE(K, T) \
    case T: xtile(K, T, nb, g, x, y, ldy); break;

/* Dispatch to a tile of a compile-time row count. */
EKV_INLINE void xtile_n(enum qk k, int T, int64_t nb, const uint8_t *g, const struct ekv_block_q8_0x *const *x,
                        float *y, int64_t ldy) {
    switch (T) {
        XT_CASE(k, 1) XT_CASE(k, 2) XT_CASE(k, 3) XT_CASE(k, 4) XT_CASE(k, 5) XT_CASE(k, 6) XT_CASE(k, 7)
        XT_CASE(k, 8) XT_CASE(k, 9) XT_CASE(k, 10) XT_CASE(k, 11) XT_CASE(k, 12) XT_CASE(k, 13)
        XT_CASE(k, 14) XT_CASE(k, 15) XT_CASE(k, 16)
    default: break;
    }
}

EKV_INLINE void x16_gemm(enum qk k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                         int64_t n, float *y, int64_t ldy) {
    const int64_t nb = w->ne0 / EKV_QK8_0;
    const uint8_t *base = w->data;
    const struct ekv_block_q8_0x *xr[TMAX] = {NULL};
    for (int64_t t0 = 0; t0 < n; t0 += TOK_BLOCK) {
        const int64_t t1 = EKV_MIN(n, t0 + TOK_BLOCK);
        for (int64_t r = r0; r < r1; r += 16) {
            const uint8_t *g = base + (size_t)r * w->row_bytes;
            for (int64_t t = t0; t < t1; t += TMAX) {
                const int T = (int)EKV_MIN((int64_t)TMAX, t1 - t);
                #pragma GCC unroll 16
                for (int i = 0; i < T; i++) xr[i] = (const void *)((const char *)xa + (size_t)(t + i) * xs);
                xtile_n(k, T, nb, g, xr, y + t * ldy + r, ldy);
            }
        }
    }
}

static void gemm_x16_q8_0(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs, int64_t n,
                          float *y, int64_t ldy) {
    x16_gemm(QK8, w, r0, r1, xa, xs, n, y, ldy);
}

static void gemm_x16_q4_0(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs, int64_t n,
                          float *y, int64_t ldy) {
    x16_gemm(QK4, w, r0, r1, xa, xs, n, y, ldy);
}

void ekv_q8_fill_avx512(enum ekv_dtype t, struct ekv_type_kernels *k);
void ekv_q8_fill_avx512(enum ekv_dtype t, struct ekv_type_kernels *k) {
    if (t == EKV_Q8_0) k->gemm_x16 = gemm_x16_q8_0;
    if (t == EKV_Q4_0) k->gemm_x16 = gemm_x16_q4_0;
}
