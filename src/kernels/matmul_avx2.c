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

/* pf > 0: the rows pf bytes further on are prefetched as these stream
 * (matvec: short rows end before the hardware prefetcher has ramped up). */
EKV_INLINE void ftile_4x1(enum fkind k, int64_t n, const void *const *w, const float *const *x, float out[4][4],
                          size_t pf) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    const size_t esz = k == FK_F32 ? 4 : 2;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (pf && ((size_t)i * esz) % 64 == 0)
            for (int r = 0; r < 4; r++) _mm_prefetch((const char *)w[r] + pf + (size_t)i * esz, _MM_HINT_T0);
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

/* R weight rows x T activation rows (R, T <= 4) with one accumulator
 * per output at a time. An output's two 8-lane accumulators read disjoint
 * column blocks (a0: columns 16j..16j+7 and the trailing 8-column step;
 * a1: 16j+8..16j+15), so they are computed one after the other: pass 0
 * sums the even blocks, pass 1 the odd ones. Each lane sees the FMAs of
 * ftile_1x1 in the same order, so the bits are the matvec kernels', with
 * half the registers per output: tiles of 4 x 3 (12 accumulators, the
 * activations read as memory operands) instead of 2 x 3. */
EKV_INLINE void ftile_split(enum fkind k, int R, int T, int64_t n, const void *const *w, const float *const *x,
                            float out[4][4]) {
    __m256 half[4][4], acc[4][4];
    int64_t i = 0;
    for (int p = 0; p < 2; p++) {
        const int64_t off = p * 8;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
        for (i = 0; i + 16 <= n; i += 16) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m256 wv = fload(k, w[r], i + off);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) F8STEP(acc[r][t], wv, x[t], i + off);
            }
        }
        if (p == 1) break;
        if (i + 8 <= n) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m256 wv = fload(k, w[r], i);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) F8STEP(acc[r][t], wv, x[t], i);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) half[r][t] = acc[r][t];
    }
    if (i + 8 <= n) i += 8;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[t][r] = ffinish(k, half[r][t], acc[r][t], w[r], x[t], i, n);
}

/* ------------------------------------------------------------------ */
/* Drivers, specialised per type by constant arguments.                 */
/* ------------------------------------------------------------------ */

enum kind { K_F32, K_F16, K_BF16 };

/* Shapes used: 1x1, 2x1, 4x1 (matvec) and R x T, R <= 4, T <= 3 (prefill). */
EKV_INLINE void tile(enum kind k, int R, int T, const struct ekv_weight *w, int64_t r, const char *xa,
                     size_t xs, int64_t t, float out[4][4]) {
    const void *wr[4] = {NULL};
    const float *xr[4] = {NULL};
    for (int i = 0; i < R; i++) wr[i] = (const char *)w->data + (size_t)(r + i) * w->row_bytes;
    for (int i = 0; i < T; i++) xr[i] = (const float *)(const void *)(xa + (size_t)(t + i) * xs);
    const enum fkind f = k == K_F32 ? FK_F32 : k == K_F16 ? FK_F16 : FK_BF16;
    if (T > 1 || R == 3) {
        switch (R * 8 + T) { /* constant shapes, so the accumulators stay in registers */
        case 4 * 8 + 3: ftile_split(f, 4, 3, w->ne0, wr, xr, out); break;
        case 4 * 8 + 2: ftile_split(f, 4, 2, w->ne0, wr, xr, out); break;
        case 3 * 8 + 3: ftile_split(f, 3, 3, w->ne0, wr, xr, out); break;
        case 3 * 8 + 2: ftile_split(f, 3, 2, w->ne0, wr, xr, out); break;
        case 2 * 8 + 3: ftile_split(f, 2, 3, w->ne0, wr, xr, out); break;
        case 2 * 8 + 2: ftile_split(f, 2, 2, w->ne0, wr, xr, out); break;
        case 3 * 8 + 1: ftile_split(f, 3, 1, w->ne0, wr, xr, out); break;
        case 1 * 8 + 3: ftile_split(f, 1, 3, w->ne0, wr, xr, out); break;
        default: ftile_split(f, 1, 2, w->ne0, wr, xr, out); break;
        }
    } else if (R == 4)
        ftile_4x1(f, w->ne0, wr, xr, out, xs == 0 ? 8 * w->row_bytes : 0);
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

/* Tiles of 4 weight rows x 3 activation rows (smaller at the edges): rows
 * [r0, r1) in blocks of about EKV_GEMM_ROW_BLOCK bytes of weights (held in L2), in
 * each block every tile of activation rows meets every group of weight
 * rows, as float_avx512.c does. */
EKV_INLINE void gemm_k(enum kind k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                       int64_t n, float *y, int64_t ldy) {
    float out[4][4];
    const int64_t rb = ekv_gemm_row_block(w->row_bytes, 4);
    for (int64_t b0 = r0; b0 < r1; b0 += rb) {
        const int64_t b1 = EKV_MIN(r1, b0 + rb);
        for (int64_t t = 0; t < n; t += 3) {
            const int T = (int)EKV_MIN((int64_t)3, n - t);
            for (int64_t r = b0; r < b1; r += 4) {
                const int R = (int)EKV_MIN((int64_t)4, b1 - r);
                tile(k, R, T, w, r, xa, xs, t, out);
                for (int i = 0; i < T; i++) memcpy(y + (t + i) * ldy + r, out[i], (size_t)R * sizeof(float));
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
