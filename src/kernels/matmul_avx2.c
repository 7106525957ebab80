/*
 * matmul_avx2.c — AVX2/FMA/F16C products for F32, F16 and BF16 weights:
 * single-row dots, matrix-vector drivers that stream four weight rows per
 * pass, and register-tiled (weight rows x activation rows) kernels for
 * prefill, blocked over activation rows so that a block of activations
 * stays in cache while the weights stream past; and the AVX2 table.
 *
 * Every output element is accumulated by the same sequence of vector
 * operations whichever kernel (1-row, 4-row, tile) computes it: per output
 * 16 lanes (two 8-lane accumulators) over steps of 16 columns, one
 * step of 8, a fixed horizontal sum, then the remaining columns in order.
 * So results are bit-identical across thread counts and between matmul
 * and repeated matvec (and equal to the AVX-512 kernels, which keep the
 * same order). The plain-C references are in quant.c; Q8_0/Q4_0 are in
 * q8_avx2.c, the K-quants in kquant_avx2.c.
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
/* Drivers, specialised per type by constant arguments.                 */
/* ------------------------------------------------------------------ */

enum kind { K_F32, K_F16, K_BF16 };

/* Shapes used: 1x1, 2x1, 4x1 and (1|2) x 3. */
EKV_INLINE void tile(enum kind k, int R, int T, const struct ekv_weight *w, int64_t r, const char *xa,
                     size_t xs, int64_t t, float out[4][4]) {
    const void *wr[4];
    const float *xr[4];
    for (int i = 0; i < R; i++) wr[i] = (const char *)w->data + (size_t)(r + i) * w->row_bytes;
    for (int i = 0; i < T; i++) xr[i] = (const float *)(const void *)(xa + (size_t)(t + i) * xs);
    const enum fkind f = k == K_F32 ? FK_F32 : k == K_F16 ? FK_F16 : FK_BF16;
    if (T > 1)
        ftile_rx3(f, R, w->ne0, wr, xr, out);
    else if (R == 4)
        ftile_4x1(f, w->ne0, wr, xr, out);
    else if (R == 2)
        ftile_2x1(f, w->ne0, wr, xr, out);
    else
        ftile_1x1(f, w->ne0, wr, xr, out);
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

/* Tiles of 2 weight rows x 3 activation rows. */
EKV_INLINE void gemm_k(enum kind k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                       int64_t n, float *y, int64_t ldy) {
    const int TT = 3;
    float out[4][4];
    for (int64_t t0 = 0; t0 < n; t0 += TOK_BLOCK) {
        const int64_t t1 = EKV_MIN(n, t0 + TOK_BLOCK);
        int64_t r = r0;
        for (; r + 2 <= r1; r += 2) {
            int64_t t = t0;
            for (; t + TT <= t1; t += TT) {
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
        struct ekv_weight w1 = {.type = EKV_F32, .ne0 = n, .ne1 = 1, .row_bytes = 0, .data = wrow};                                                  \
        float out[4][4];                                                                                  \
        tile(K, 1, 1, &w1, 0, xa, 0, 0, out);                                                             \
        *s = out[0][0];                                                                                   \
    }

DEFINE_KERNELS(f32, K_F32)
DEFINE_KERNELS(f16, K_F16)
DEFINE_KERNELS(bf16, K_BF16)

/* Q8_0 / Q4_0 (q8_avx2.c) */
void ekv_q8_fill_avx2(enum ekv_dtype t, struct ekv_type_kernels *k);
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
    case EKV_Q8_0: case EKV_Q4_0: ekv_q8_fill_avx2(t, k); break;
    case EKV_Q4_K: k->vec_dot = ekv_dot_q4_K_q8_K_avx2; k->gemm = ekv_gemm_q4_K_avx2; break;
    case EKV_Q5_K: k->vec_dot = ekv_dot_q5_K_q8_K_avx2; k->gemm = ekv_gemm_q5_K_avx2; break;
    case EKV_Q6_K: k->vec_dot = ekv_dot_q6_K_q8_K_avx2; k->gemm = ekv_gemm_q6_K_avx2; break;
    default: break;
    }
}
