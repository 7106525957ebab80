/*
 * float_avx512.c — AVX-512 products of F32, F16 and BF16 weights with
 * float activations: register tiles of up to 4 weight rows x 6 activation
 * rows (24 zmm accumulators), half precision widened with vcvtph2ps.
 *
 * Per output the operations are those of the AVX2 kernels
 * (matmul_avx2.c): one 16-lane accumulator over steps of 16 columns (the
 * AVX2 code's two 8-lane accumulators side by side), one step of 8 on the
 * low lanes, the two halves added, the same 8-lane horizontal sum, then
 * the remaining columns in order. So this path gives the AVX2 path's bits,
 * whatever the tile (matmul == matvec, any thread count).
 *
 * Decode (one activation row) takes 4 rows at a time, one from each
 * quarter of its range, so that the weights stream as 4 sequences far
 * apart. Adjacent rows side by side (4 streams inside one 4 KiB page) made
 * the hardware prefetcher give up on an AMD EPYC Zen 4 host: ekv-ref-28m
 * F16 decode read 9.7 GB/s on one thread against the host's 19.5
 * (docs/performance.md, "AMD AVX-512 host").
 */
#include <immintrin.h>

#include "core/util.h"
#include "kernels/avx2_util.h"
#include "kernels/quant.h"

#define EKV_INLINE static inline __attribute__((always_inline))
#define RMAX 4
#define TMAX 6

enum fkind { FK_F32, FK_F16, FK_BF16 };

EKV_INLINE __m512 wload16(enum fkind k, const void *row, int64_t i) {
    switch (k) {
    case FK_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)row + i)));
    case FK_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)row + i))), 16));
    default: return _mm512_loadu_ps((const float *)row + i);
    }
}

/* 8 columns into the low lanes (high lanes zero). */
EKV_INLINE __m512 wload8(enum fkind k, const void *row, int64_t i) {
    __m256 v;
    switch (k) {
    case FK_F16: v = ekv_load_f16x8((const uint16_t *)row + i); break;
    case FK_BF16: v = ekv_load_bf16x8((const uint16_t *)row + i); break;
    default: v = _mm256_loadu_ps((const float *)row + i); break;
    }
    return _mm512_castps256_ps512(v);
}

EKV_INLINE float wscalar(enum fkind k, const void *row, int64_t i) {
    switch (k) {
    case FK_F16: return _cvtsh_ss(((const uint16_t *)row)[i]);
    case FK_BF16: return ekv_bf16_to_f32(((const uint16_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

/* The sums of 16 accumulators a[r][t] (4 weight rows x 4 activation rows),
 * each added in ekv_hsum8's order after its two 8-lane halves: lanes i and
 * i + 8, then i and i + 4 of that, then 0 + 2 and 1 + 3, then those two.
 * Every step does the same adds for 2-4 accumulators at once (float
 * addition commutes exactly, so the bits are those of the one-at-a-time
 * reduction). Result: 128-bit lane t holds rows 0-3 of activation row t. */
EKV_INLINE __m512 reduce4x4(const __m512 a[4][4]) {
    __m512 z[4];
    #pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __m512 h[2];
        #pragma GCC unroll 2
        for (int p = 0; p < 2; p++) { /* [a[r][2p] halves added | a[r][2p+1] ...] */
            const __m512 u = a[r][2 * p], v = a[r][2 * p + 1];
            h[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(3, 2, 3, 2)));
        }
        /* quarters: l of a[r][0], a[r][1], a[r][2], a[r][3] */
        z[r] = _mm512_add_ps(_mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    /* per 128-bit lane t: [m0, m1 of row 0 or 2 | m0, m1 of row 1 or 3] */
    const __m512 p = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 q = _mm512_add_ps(_mm512_shuffle_ps(z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(p, q, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(p, q, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* R weight rows x T activation rows: out[t * ldo + r]. */
EKV_INLINE void ftile(enum fkind k, int R, int T, int64_t n, const void *const *w, const float *const *x, float *out,
                      int64_t ldo) {
    __m512 acc[RMAX][TMAX];
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xv[TMAX];
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(x[t] + i);
        #pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const __m512 wv = wload16(k, w[r], i);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (i + 8 <= n) {
        #pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const __m512 wv = wload8(k, w[r], i);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_mask3_fmadd_ps(wv, _mm512_castps256_ps512(_mm256_loadu_ps(x[t] + i)), acc[r][t],
                                                  (__mmask16)0x00FF);
        }
        i += 8;
    }
    /* the sums, 4 rows x up to 4 activation rows per reduction tree; slots
     * beyond R or T repeat a real accumulator and are not stored */
    #pragma GCC unroll 2
    for (int t0 = 0; t0 < T; t0 += 4) {
        __m512 a4[4][4];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) a4[r][t] = acc[r < R ? r : R - 1][t0 + t < T ? t0 + t : T - 1];
        const __m512 s = reduce4x4(a4);
        #pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            if (t0 + t >= T) break;
            const __m128 q = t == 0 ? _mm512_castps512_ps128(s)
                             : t == 1 ? _mm512_extractf32x4_ps(s, 1)
                             : t == 2 ? _mm512_extractf32x4_ps(s, 2)
                                      : _mm512_extractf32x4_ps(s, 3);
            if (R == 4)
                _mm_storeu_ps(out + (t0 + t) * ldo, q);
            else
                _mm_mask_storeu_ps(out + (t0 + t) * ldo, (__mmask8)((1u << R) - 1), q);
        }
    }
    if (i < n) /* the remaining columns, in order, after the tree's sum */
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                float s = out[t * ldo + r];
                for (int64_t j = i; j < n; j++) s += wscalar(k, w[r], j) * x[t][j];
                out[t * ldo + r] = s;
            }
}

#define FT_CASE(R, T) \
    case (R) * 8 + (T): ftile(k, R, T, n, w, x, out, ldo); break;

EKV_INLINE void ftile_n(enum fkind k, int R, int T, int64_t n, const void *const *w, const float *const *x, float *out,
                        int64_t ldo) {
    switch (R * 8 + T) {
        FT_CASE(1, 1) FT_CASE(1, 2) FT_CASE(1, 3) FT_CASE(1, 4) FT_CASE(1, 5) FT_CASE(1, 6)
        FT_CASE(2, 1) FT_CASE(2, 2) FT_CASE(2, 3) FT_CASE(2, 4) FT_CASE(2, 5) FT_CASE(2, 6)
        FT_CASE(3, 1) FT_CASE(3, 2) FT_CASE(3, 3) FT_CASE(3, 4) FT_CASE(3, 5) FT_CASE(3, 6)
        FT_CASE(4, 1) FT_CASE(4, 2) FT_CASE(4, 3) FT_CASE(4, 4) FT_CASE(4, 5) FT_CASE(4, 6)
    default: break;
    }
}

/* Prompt: rows [r0, r1) in blocks of about EKV_GEMM_ROW_BLOCK bytes of weights
 * (they stay in the L2 cache); in each block, every tile of TMAX
 * activation rows (in L1) meets every group of RMAX weight rows. Blocks of
 * 48 activation rows meeting a group of weight rows held in L1 instead
 * ran 5-13 % slower on an AMD Zen 5 host (the activations streamed from
 * L2 at 6 rows x 64 bytes per step); docs/performance.md, "Zen 5". */
EKV_INLINE void fgemm(enum fkind k, const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs,
                      int64_t n, float *y, int64_t ldy) {
    const void *wr[RMAX] = {NULL};
    const float *xr[TMAX] = {NULL};
    const int64_t rb = ekv_gemm_row_block(w->row_bytes, RMAX);
    for (int64_t b0 = r0; b0 < r1; b0 += rb) {
        const int64_t b1 = EKV_MIN(r1, b0 + rb);
        for (int64_t t = 0; t < n; t += TMAX) {
            const int T = (int)EKV_MIN((int64_t)TMAX, n - t);
            #pragma GCC unroll 16
            for (int i = 0; i < T; i++) xr[i] = (const float *)(const void *)((const char *)xa + (size_t)(t + i) * xs);
            for (int64_t r = b0; r < b1; r += RMAX) {
                const int R = (int)EKV_MIN((int64_t)RMAX, b1 - r);
                #pragma GCC unroll 16
                for (int i = 0; i < R; i++) wr[i] = (const char *)w->data + (size_t)(r + i) * w->row_bytes;
                ftile_n(k, R, T, w->ne0, wr, xr, y + t * ldy + r, ldy);
            }
        }
    }
}

/* Decode: rows [r0, r1) times one activation row; rows i of the four
 * quarters of the range together (a 4 x 1 tile), the rest one by one. */
EKV_INLINE void fgemv(enum fkind k, const struct ekv_weight *w, int64_t r0, int64_t r1, const float *x, float *y) {
    const int64_t q = (r1 - r0) / 4;
    const char *base = w->data;
    const float *xr[1] = {x};
    float out[4];
    for (int64_t i = 0; i < q; i++) {
        const void *wr[4];
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) wr[p] = base + (size_t)(r0 + p * q + i) * w->row_bytes;
        ftile(k, 4, 1, w->ne0, wr, xr, out, 1);
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) y[r0 + p * q + i] = out[p];
    }
    for (int64_t r = r0 + 4 * q; r < r1; r++) {
        const void *wr[1] = {base + (size_t)r * w->row_bytes};
        ftile(k, 1, 1, w->ne0, wr, xr, y + r, 1);
    }
}

#define DEFINE_FLOAT(name, K)                                                                              \
    static void gemm_##name(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, size_t xs, \
                            int64_t n, float *y, int64_t ldy) {                                            \
        fgemm(K, w, r0, r1, xa, xs, n, y, ldy);                                                            \
    }                                                                                                      \
    static void gemv_##name(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, float *y) { \
        fgemv(K, w, r0, r1, xa, y);                                                                        \
    }                                                                                                      \
    static void dot_##name(int64_t n, float *s, const void *wrow, const void *xa) {                        \
        const void *wr[1] = {wrow};                                                                        \
        const float *xr[1] = {xa};                                                                         \
        ftile(K, 1, 1, n, wr, xr, s, 1);                                                                   \
    }

DEFINE_FLOAT(f32, FK_F32)
DEFINE_FLOAT(f16, FK_F16)
DEFINE_FLOAT(bf16, FK_BF16)

void ekv_float_fill_avx512(enum ekv_dtype t, struct ekv_type_kernels *k);
void ekv_float_fill_avx512(enum ekv_dtype t, struct ekv_type_kernels *k) {
    switch (t) {
    case EKV_F32: k->vec_dot = dot_f32; k->gemv = gemv_f32; k->gemm = gemm_f32; break;
    case EKV_F16: k->vec_dot = dot_f16; k->gemv = gemv_f16; k->gemm = gemm_f16; break;
    case EKV_BF16: k->vec_dot = dot_bf16; k->gemv = gemv_bf16; k->gemm = gemm_bf16; break;
    default: break;
    }
}
