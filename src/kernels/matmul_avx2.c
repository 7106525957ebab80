/*
 * matmul_avx2.c — AVX2/FMA/F16C products for F32, F16, BF16, Q8_0 and
 * Q4_0 weights: single-row dots, matrix-vector drivers that stream four
 * weight rows per pass, and register-tiled (weight rows x activation rows)
 * kernels for prefill, blocked over activation rows so that a block of
 * activations stays in cache while the weights stream past.
 *
 * Every output element is accumulated by the same sequence of vector
 * operations whichever kernel (1-row, 4-row, tile) computes it, so
 * results are bit-identical across thread counts and between matmul and
 * repeated matvec. The plain-C references are in quant.c; the K-quant
 * dots are in kquant_avx2.c.
 */
#include <string.h>

#include "core/util.h"
#include "kernels/avx2_util.h"
#include "kernels/quant.h"

#define EKV_INLINE static inline __attribute__((always_inline))

/* activation rows per cache block in the prefill kernels */
#define TOK_BLOCK 32

/* ------------------------------------------------------------------ */
/* Float weights (F32, F16, BF16): per output two 8-lane accumulators    */
/* over 16 columns per step, one 8-column step, then scalars.           */
/* ------------------------------------------------------------------ */

enum fkind { FK_F32, FK_F16, FK_BF16 };

EKV_INLINE __m256 fload(enum fkind k, const void *row, int64_t i) {
    switch (k) {
    case FK_F16: return ekv_load_f16x8((const uint16_t *)row + i);
    case FK_BF16: return ekv_load_bf16x8((const uint16_t *)row + i);
    default: return _mm256_loadu_ps((const float *)row + i);
    }
}

EKV_INLINE float fscalar(enum fkind k, const void *row, int64_t i) {
    switch (k) {
    case FK_F16: return _cvtsh_ss(((const uint16_t *)row)[i]);
    case FK_BF16: return ekv_bf16_to_f32(((const uint16_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

/* One output's accumulation step over 16 columns (and 8 columns). */
#define F16STEP(a0, a1, w0, w1, xp, i)                                  \
    do {                                                               \
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps((xp) + (i)), a0);     \
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps((xp) + (i) + 8), a1); \
    } while (0)
#define F8STEP(a0, w0, xp, i) a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps((xp) + (i)), a0)

EKV_INLINE float ffinish(enum fkind k, __m256 a0, __m256 a1, const void *w, const float *x, int64_t i, int64_t n) {
    float s = ekv_hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += fscalar(k, w, i) * x[i];
    return s;
}

/* The tile kernels below are written out per shape (R weight rows x T
 * activation rows) so that the accumulators stay in registers; out[t][r]. */
EKV_INLINE void ftile_1x1(enum fkind k, int64_t n, const void *const *w, const float *const *x, float out[4][4]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) F16STEP(a0, a1, fload(k, w[0], i), fload(k, w[0], i + 8), x[0], i);
    if (i + 8 <= n) {
        F8STEP(a0, fload(k, w[0], i), x[0], i);
        i += 8;
    }
    out[0][0] = ffinish(k, a0, a1, w[0], x[0], i, n);
}

EKV_INLINE void ftile_2x1(enum fkind k, int64_t n, const void *const *w, const float *const *x, float out[4][4]) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        F16STEP(a00, a01, fload(k, w[0], i), fload(k, w[0], i + 8), x[0], i);
        F16STEP(a10, a11, fload(k, w[1], i), fload(k, w[1], i + 8), x[0], i);
    }
    if (i + 8 <= n) {
        F8STEP(a00, fload(k, w[0], i), x[0], i);
        F8STEP(a10, fload(k, w[1], i), x[0], i);
        i += 8;
    }
    out[0][0] = ffinish(k, a00, a01, w[0], x[0], i, n);
    out[0][1] = ffinish(k, a10, a11, w[1], x[0], i, n);
}

EKV_INLINE void ftile_4x1(enum fkind k, int64_t n, const void *const *w, const float *const *x, float out[4][4]) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        F16STEP(a00, a01, fload(k, w[0], i), fload(k, w[0], i + 8), x[0], i);
        F16STEP(a10, a11, fload(k, w[1], i), fload(k, w[1], i + 8), x[0], i);
        F16STEP(a20, a21, fload(k, w[2], i), fload(k, w[2], i + 8), x[0], i);
        F16STEP(a30, a31, fload(k, w[3], i), fload(k, w[3], i + 8), x[0], i);
    }
    if (i + 8 <= n) {
        F8STEP(a00, fload(k, w[0], i), x[0], i);
        F8STEP(a10, fload(k, w[1], i), x[0], i);
        F8STEP(a20, fload(k, w[2], i), x[0], i);
        F8STEP(a30, fload(k, w[3], i), x[0], i);
        i += 8;
    }
    out[0][0] = ffinish(k, a00, a01, w[0], x[0], i, n);
    out[0][1] = ffinish(k, a10, a11, w[1], x[0], i, n);
    out[0][2] = ffinish(k, a20, a21, w[2], x[0], i, n);
    out[0][3] = ffinish(k, a30, a31, w[3], x[0], i, n);
}

/* R weight rows (1 or 2) x 3 activation rows. */
EKV_INLINE void ftile_rx3(enum fkind k, int R, int64_t n, const void *const *w, const float *const *x,
                          float out[4][4]) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
    __m256 b00 = a00, b01 = a00, b10 = a00, b11 = a00, b20 = a00, b21 = a00;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = fload(k, w[0], i), w1 = fload(k, w[0], i + 8);
        F16STEP(a00, a01, w0, w1, x[0], i);
        F16STEP(a10, a11, w0, w1, x[1], i);
        F16STEP(a20, a21, w0, w1, x[2], i);
        if (R == 2) {
            const __m256 v0 = fload(k, w[1], i), v1 = fload(k, w[1], i + 8);
            F16STEP(b00, b01, v0, v1, x[0], i);
            F16STEP(b10, b11, v0, v1, x[1], i);
            F16STEP(b20, b21, v0, v1, x[2], i);
        }
    }
    if (i + 8 <= n) {
        const __m256 w0 = fload(k, w[0], i);
        F8STEP(a00, w0, x[0], i);
        F8STEP(a10, w0, x[1], i);
        F8STEP(a20, w0, x[2], i);
        if (R == 2) {
            const __m256 v0 = fload(k, w[1], i);
            F8STEP(b00, v0, x[0], i);
            F8STEP(b10, v0, x[1], i);
            F8STEP(b20, v0, x[2], i);
        }
        i += 8;
    }
    out[0][0] = ffinish(k, a00, a01, w[0], x[0], i, n);
    out[1][0] = ffinish(k, a10, a11, w[0], x[1], i, n);
    out[2][0] = ffinish(k, a20, a21, w[0], x[2], i, n);
    if (R == 2) {
        out[0][1] = ffinish(k, b00, b01, w[1], x[0], i, n);
        out[1][1] = ffinish(k, b10, b11, w[1], x[1], i, n);
        out[2][1] = ffinish(k, b20, b21, w[1], x[2], i, n);
    }
}

/* ------------------------------------------------------------------ */
/* Q8_0 / Q4_0 weights with Q8_0 activations: per output one 8-lane     */
/* accumulator, acc += (dw*dx) * int32 lanes of the block's products.   */
/* ------------------------------------------------------------------ */

enum qkind { QK_Q8_0, QK_Q4_0 };

EKV_INLINE __m256i qdecode(enum qkind k, const void *row, int64_t b, float *d) {
    if (k == QK_Q8_0) {
        const struct ekv_block_q8_0 *blk = (const struct ekv_block_q8_0 *)row + b;
        *d = _cvtsh_ss(blk->d);
        return _mm256_loadu_si256((const __m256i *)(const void *)blk->qs);
    }
    const struct ekv_block_q4_0 *blk = (const struct ekv_block_q4_0 *)row + b;
    *d = _cvtsh_ss(blk->d);
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)blk->qs);
    const __m128i m = _mm_set1_epi8(0xF);
    const __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

EKV_INLINE __m256i xload(const void *x, int64_t b, float *d) {
    const struct ekv_block_q8_0 *xb = (const struct ekv_block_q8_0 *)x + b;
    *d = _cvtsh_ss(xb->d);
    return _mm256_loadu_si256((const __m256i *)(const void *)xb->qs);
}

/* acc += (dw * dx) * sum of the int8 products, ggml-style: maddubs(|w|, sign(x, w)). */
#define QSTEP(acc, wq, aw, dw, xq, dx)                                                                    \
    acc = _mm256_fmadd_ps(_mm256_set1_ps((dw) * (dx)),                                                   \
                          _mm256_cvtepi32_ps(ekv_sum_i16_pairs(                                          \
                              _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, wq)))),                      \
                          acc)

EKV_INLINE void qtile_1x1(enum qkind k, int64_t nb, const void *const *w, const void *const *x, float out[4][4]) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        float dx, d0;
        const __m256i xq = xload(x[0], b, &dx);
        const __m256i w0 = qdecode(k, w[0], b, &d0);
        QSTEP(a, w0, _mm256_sign_epi8(w0, w0), d0, xq, dx);
    }
    out[0][0] = ekv_hsum8(a);
}

EKV_INLINE void qtile_2x1(enum qkind k, int64_t nb, const void *const *w, const void *const *x, float out[4][4]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int64_t b = 0; b < nb; b++) {
        float dx, d0, d1;
        const __m256i xq = xload(x[0], b, &dx);
        const __m256i w0 = qdecode(k, w[0], b, &d0);
        QSTEP(a0, w0, _mm256_sign_epi8(w0, w0), d0, xq, dx);
        const __m256i w1 = qdecode(k, w[1], b, &d1);
        QSTEP(a1, w1, _mm256_sign_epi8(w1, w1), d1, xq, dx);
    }
    out[0][0] = ekv_hsum8(a0);
    out[0][1] = ekv_hsum8(a1);
}

EKV_INLINE void qtile_4x1(enum qkind k, int64_t nb, const void *const *w, const void *const *x, float out[4][4]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t b = 0; b < nb; b++) {
        float dx, d0, d1, d2, d3;
        const __m256i xq = xload(x[0], b, &dx);
        const __m256i w0 = qdecode(k, w[0], b, &d0);
        QSTEP(a0, w0, _mm256_sign_epi8(w0, w0), d0, xq, dx);
        const __m256i w1 = qdecode(k, w[1], b, &d1);
        QSTEP(a1, w1, _mm256_sign_epi8(w1, w1), d1, xq, dx);
        const __m256i w2 = qdecode(k, w[2], b, &d2);
        QSTEP(a2, w2, _mm256_sign_epi8(w2, w2), d2, xq, dx);
        const __m256i w3 = qdecode(k, w[3], b, &d3);
        QSTEP(a3, w3, _mm256_sign_epi8(w3, w3), d3, xq, dx);
    }
    out[0][0] = ekv_hsum8(a0);
    out[0][1] = ekv_hsum8(a1);
    out[0][2] = ekv_hsum8(a2);
    out[0][3] = ekv_hsum8(a3);
}

/* R weight rows (1 or 2) x 4 activation rows. */
EKV_INLINE void qtile_rx4(enum qkind k, int R, int64_t nb, const void *const *w, const void *const *x,
                          float out[4][4]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t b = 0; b < nb; b++) {
        float dx0, dx1, dx2, dx3, d0, d1 = 0.0f;
        const __m256i x0 = xload(x[0], b, &dx0), x1 = xload(x[1], b, &dx1);
        const __m256i x2 = xload(x[2], b, &dx2), x3 = xload(x[3], b, &dx3);
        const __m256i w0 = qdecode(k, w[0], b, &d0), aw0 = _mm256_sign_epi8(w0, w0);
        QSTEP(a0, w0, aw0, d0, x0, dx0);
        QSTEP(a1, w0, aw0, d0, x1, dx1);
        QSTEP(a2, w0, aw0, d0, x2, dx2);
        QSTEP(a3, w0, aw0, d0, x3, dx3);
        if (R == 2) {
            const __m256i w1 = qdecode(k, w[1], b, &d1), aw1 = _mm256_sign_epi8(w1, w1);
            QSTEP(b0, w1, aw1, d1, x0, dx0);
            QSTEP(b1, w1, aw1, d1, x1, dx1);
            QSTEP(b2, w1, aw1, d1, x2, dx2);
            QSTEP(b3, w1, aw1, d1, x3, dx3);
        }
    }
    out[0][0] = ekv_hsum8(a0);
    out[1][0] = ekv_hsum8(a1);
    out[2][0] = ekv_hsum8(a2);
    out[3][0] = ekv_hsum8(a3);
    if (R == 2) {
        out[0][1] = ekv_hsum8(b0);
        out[1][1] = ekv_hsum8(b1);
        out[2][1] = ekv_hsum8(b2);
        out[3][1] = ekv_hsum8(b3);
    }
}

/* ------------------------------------------------------------------ */
/* Drivers, specialised per type by constant arguments.                 */
/* ------------------------------------------------------------------ */

enum kind { K_F32, K_F16, K_BF16, K_Q8_0, K_Q4_0 };

/* Shapes used: 1x1, 2x1, 4x1 and (1|2) x TT, TT = 3 (float) or 4 (quantised). */
EKV_INLINE void tile(enum kind k, int R, int T, const struct ekv_weight *w, int64_t r, const char *xa,
                     size_t xs, int64_t t, float out[4][4]) {
    const void *wr[4];
    const void *xr[4];
    for (int i = 0; i < R; i++) wr[i] = (const char *)w->data + (size_t)(r + i) * w->row_bytes;
    for (int i = 0; i < T; i++) xr[i] = xa + (size_t)(t + i) * xs;
    const float *const *xf = (const float *const *)xr;
    if (k == K_Q8_0 || k == K_Q4_0) {
        const enum qkind q = k == K_Q8_0 ? QK_Q8_0 : QK_Q4_0;
        const int64_t nb = w->ne0 / EKV_QK8_0;
        if (T > 1)
            qtile_rx4(q, R, nb, wr, xr, out);
        else if (R == 4)
            qtile_4x1(q, nb, wr, xr, out);
        else if (R == 2)
            qtile_2x1(q, nb, wr, xr, out);
        else
            qtile_1x1(q, nb, wr, xr, out);
    } else {
        const enum fkind f = k == K_F32 ? FK_F32 : k == K_F16 ? FK_F16 : FK_BF16;
        if (T > 1)
            ftile_rx3(f, R, w->ne0, wr, xf, out);
        else if (R == 4)
            ftile_4x1(f, w->ne0, wr, xf, out);
        else if (R == 2)
            ftile_2x1(f, w->ne0, wr, xf, out);
        else
            ftile_1x1(f, w->ne0, wr, xf, out);
    }
}

EKV_INLINE void gemv_k(enum kind k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, float *y) {
    float out[4][4];
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        tile(k, 4, 1, w, r, xa, 0, 0, out);
        memcpy(y + r, out[0], 4 * sizeof(float));
    }
    for (; r < r1; r++) {
        tile(k, 1, 1, w, r, xa, 0, 0, out);
        y[r] = out[0][0];
    }
}

/* Tiles of 2 weight rows x 3 (float) or 4 (quantised) activation rows. */
EKV_INLINE void gemm_k(enum kind k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                       int64_t n, float *y, int64_t ldy) {
    const int TT = (k == K_Q8_0 || k == K_Q4_0) ? 4 : 3;
    float out[4][4];
    for (int64_t t0 = 0; t0 < n; t0 += TOK_BLOCK) {
        const int64_t t1 = EKV_MIN(n, t0 + TOK_BLOCK);
        int64_t r = r0;
        for (; r + 2 <= r1; r += 2) {
            int64_t t = t0;
            for (; t + TT <= t1; t += TT) {
                if (TT == 4)
                    tile(k, 2, 4, w, r, xa, xs, t, out);
                else
                    tile(k, 2, 3, w, r, xa, xs, t, out);
                for (int i = 0; i < TT; i++) memcpy(y + (t + i) * ldy + r, out[i], 2 * sizeof(float));
            }
            for (; t < t1; t++) {
                tile(k, 2, 1, w, r, xa, xs, t, out);
                memcpy(y + t * ldy + r, out[0], 2 * sizeof(float));
            }
        }
        for (; r < r1; r++) {
            int64_t t = t0;
            for (; t + TT <= t1; t += TT) {
                if (TT == 4)
                    tile(k, 1, 4, w, r, xa, xs, t, out);
                else
                    tile(k, 1, 3, w, r, xa, xs, t, out);
                for (int i = 0; i < TT; i++) y[(t + i) * ldy + r] = out[i][0];
            }
            for (; t < t1; t++) {
                tile(k, 1, 1, w, r, xa, xs, t, out);
                y[t * ldy + r] = out[0][0];
            }
        }
    }
}

#define DEFINE_KERNELS(name, K)                                                                           \
    static void gemv_##name(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, float *y) { \
        gemv_k(K, w, r0, r1, xa, y);                                                                      \
    }                                                                                                     \
    static void gemm_##name(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs, \
                            int64_t n, float *y, int64_t ldy) {                                           \
        gemm_k(K, w, r0, r1, xa, xs, n, y, ldy);                                                          \
    }                                                                                                     \
    static void dot_##name(int64_t n, float *s, const void *wrow, const void *xa) {                        \
        struct ekv_weight w1 = {EKV_F32, n, 1, 0, wrow};                                                  \
        float out[4][4];                                                                                  \
        tile(K, 1, 1, &w1, 0, xa, 0, 0, out);                                                             \
        *s = out[0][0];                                                                                   \
    }

DEFINE_KERNELS(f32, K_F32)
DEFINE_KERNELS(f16, K_F16)
DEFINE_KERNELS(bf16, K_BF16)
DEFINE_KERNELS(q8_0, K_Q8_0)
DEFINE_KERNELS(q4_0, K_Q4_0)

/* ------------------------------------------------------------------ */
/* Q8_0 activation quantisation, bit-identical to ekv_quant_q8_0:       */
/* exact |x| maximum, the same scale arithmetic, and roundf (ties away  */
/* from zero) rebuilt from truncation.                                   */
/* ------------------------------------------------------------------ */

static inline __m256i round_away_epi32(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(x, t)); /* exact */
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_or_ps(_mm256_and_ps(x, sign), _mm256_set1_ps(1.0f)); /* +-1 */
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, step)));
}

void ekv_quant_q8_0_avx2(const float *src, void *dst, int64_t n) {
    struct ekv_block_q8_0 *b = dst;
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
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ekv_f32_to_fp16(d);
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i i0 = round_away_epi32(_mm256_mul_ps(v0, vid)), i1 = round_away_epi32(_mm256_mul_ps(v1, vid));
        const __m256i i2 = round_away_epi32(_mm256_mul_ps(v2, vid)), i3 = round_away_epi32(_mm256_mul_ps(v3, vid));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(void *)b[i].qs, _mm256_permutevar8x32_epi32(p, perm));
    }
}

/* K-quant dots (kquant_avx2.c) */
void ekv_dot_q4_K_q8_K_avx2(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_q5_K_q8_K_avx2(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_q6_K_q8_K_avx2(int64_t n, float *s, const void *w, const void *xa);
void ekv_gemm_q4_K_avx2(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs, int64_t n,
                        float *y, int64_t ldy);
void ekv_gemm_q5_K_avx2(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs, int64_t n,
                        float *y, int64_t ldy);
void ekv_gemm_q6_K_avx2(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs, int64_t n,
                        float *y, int64_t ldy);

void ekv_kernels_avx2_fill(enum ekv_dtype t, struct ekv_type_kernels *k) {
    switch (t) {
    case EKV_F32: k->vec_dot = dot_f32; k->gemv = gemv_f32; k->gemm = gemm_f32; break;
    case EKV_F16: k->vec_dot = dot_f16; k->gemv = gemv_f16; k->gemm = gemm_f16; break;
    case EKV_BF16: k->vec_dot = dot_bf16; k->gemv = gemv_bf16; k->gemm = gemm_bf16; break;
    case EKV_Q8_0:
        k->vec_dot = dot_q8_0; k->gemv = gemv_q8_0; k->gemm = gemm_q8_0;
        k->quantize_act = ekv_quant_q8_0_avx2;
        break;
    case EKV_Q4_0:
        k->vec_dot = dot_q4_0; k->gemv = gemv_q4_0; k->gemm = gemm_q4_0;
        k->quantize_act = ekv_quant_q8_0_avx2;
        break;
    case EKV_Q4_K: k->vec_dot = ekv_dot_q4_K_q8_K_avx2; k->gemm = ekv_gemm_q4_K_avx2; break;
    case EKV_Q5_K: k->vec_dot = ekv_dot_q5_K_q8_K_avx2; k->gemm = ekv_gemm_q5_K_avx2; break;
    case EKV_Q6_K: k->vec_dot = ekv_dot_q6_K_q8_K_avx2; k->gemm = ekv_gemm_q6_K_avx2; break;
    default: break;
    }
}
