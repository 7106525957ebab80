/*
 * quant.c — the reference (plain C) side of ekv's weight formats: block
 * codecs for F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K and the Q8_K
 * activation format, and the dot products of a weight row with a
 * quantised or float activation. The SIMD paths (dot_avx2.c,
 * matmul_avx2.c) are tested against these.
 *
 * The Q8_0/Q4_0/Q8_K quantizers follow ggml's reference quantizers, so
 * that files written by `ekv mkmodel` match what llama.cpp would write.
 * The K-quant weight quantizers (Q4_K, Q5_K, Q6_K) are simple min/max
 * quantizers of ekv's own: they produce valid blocks for synthetic models
 * but are not llama.cpp's error-minimising search.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/util.h"
#include "kernels/quant.h"

/* roundf() as ggml's nearest_int for the ranges used here (ties away from 0). */
static inline int iround(float v) { return (int)roundf(v); }

/* ------------------------------------------------------------------ */
/* F16 / BF16                                                           */
/* ------------------------------------------------------------------ */

void ekv_dequant_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ekv_fp16_to_f32(s[i]);
}

void ekv_dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ekv_bf16_to_f32(s[i]);
}

void ekv_quant_f16(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = ekv_f32_to_fp16(src[i]);
}

void ekv_quant_bf16(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = ekv_f32_to_bf16(src[i]);
}

/* ------------------------------------------------------------------ */
/* Q8_0 / Q4_0                                                          */
/* ------------------------------------------------------------------ */

/* A block with a NaN or an infinity (a model whose weights or activations
 * overflowed) has no int8 codes: converting such a float to an integer is
 * undefined, so the block becomes zeros (d = 0) on every path (found by
 * tests/fuzz/fuzz_model.c). Finite blocks are unchanged. */
void ekv_quant_q8_0(const float *src, void *dst, int64_t n) {
    struct ekv_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / EKV_QK8_0; i++, src += EKV_QK8_0) {
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < EKV_QK8_0; j++) {
            amax = fmaxf(amax, fabsf(src[j]));
            finite &= fabsf(src[j]) <= FLT_MAX;
        }
        if (!finite) {
            b[i].d = 0;
            memset(b[i].qs, 0, sizeof b[i].qs);
            continue;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ekv_f32_to_fp16(d);
        for (int j = 0; j < EKV_QK8_0; j++) b[i].qs[j] = (int8_t)iround(src[j] * id);
    }
}

void ekv_quant_q8_0x_ref(const float *src, void *dst, int64_t n) {
    struct ekv_block_q8_0x *x = dst;
    struct ekv_block_q8_0 b;
    for (int64_t i = 0; i < n / EKV_QK8_0; i++, src += EKV_QK8_0) {
        ekv_quant_q8_0(src, &b, EKV_QK8_0);
        int32_t sum = 0;
        for (int j = 0; j < EKV_QK8_0; j++) sum += b.qs[j];
        x[i].d = ekv_fp16_to_f32(b.d);
        x[i].s = sum;
        memcpy(x[i].qs, b.qs, EKV_QK8_0);
    }
}

void ekv_dequant_q8_0(const void *src, float *dst, int64_t n) {
    const struct ekv_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / EKV_QK8_0; i++) {
        const float d = ekv_fp16_to_f32(b[i].d);
        for (int j = 0; j < EKV_QK8_0; j++) dst[i * EKV_QK8_0 + j] = b[i].qs[j] * d;
    }
}

void ekv_quant_q4_0(const float *src, void *dst, int64_t n) {
    struct ekv_block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / EKV_QK4_0; i++, src += EKV_QK4_0) {
        float amax = 0.0f, max = 0.0f; /* max: the signed value of largest magnitude */
        for (int j = 0; j < EKV_QK4_0; j++) {
            if (amax < fabsf(src[j])) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ekv_f32_to_fp16(d);
        for (int j = 0; j < EKV_QK4_0 / 2; j++) {
            float v0 = src[j] * id + 8.5f, v1 = src[j + EKV_QK4_0 / 2] * id + 8.5f;
            int q0 = v0 <= 0.0f ? 0 : (int)v0, q1 = v1 <= 0.0f ? 0 : (int)v1; /* truncation */
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void ekv_dequant_q4_0(const void *src, float *dst, int64_t n) {
    const struct ekv_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / EKV_QK4_0; i++) {
        const float d = ekv_fp16_to_f32(b[i].d);
        float *y = dst + i * EKV_QK4_0;
        for (int j = 0; j < EKV_QK4_0 / 2; j++) {
            y[j] = ((b[i].qs[j] & 0xF) - 8) * d;
            y[j + EKV_QK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Q8_K (activations)                                                   */
/* ------------------------------------------------------------------ */

void ekv_quant_q8_K(const float *src, void *dst, int64_t n) {
    struct ekv_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / EKV_QK_K; i++, src += EKV_QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < EKV_QK_K; j++) {
            if (amax < fabsf(src[j])) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        }
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof(b[i]));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < EKV_QK_K; j++) {
            int v = (int)rintf(iscale * src[j]); /* ties to even, as ggml's nearest_int */
            b[i].qs[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        }
        for (int j = 0; j < EKV_QK_K / 16; j++) {
            int s = 0;
            for (int k = 0; k < 16; k++) s += b[i].qs[16 * j + k];
            b[i].bsums[j] = (int16_t)s;
        }
        b[i].d = 1.0f / iscale;
    }
}

void ekv_dequant_q8_K(const void *src, float *dst, int64_t n) {
    const struct ekv_block_q8_K *b = src;
    for (int64_t i = 0; i < n / EKV_QK_K; i++)
        for (int j = 0; j < EKV_QK_K; j++) dst[i * EKV_QK_K + j] = b[i].d * b[i].qs[j];
}

/* The smallest half >= v (v >= 0, finite): super-block scales round up so
 * that no sub-block scale needs more than its 6 or 8 bits. */
static uint16_t fp16_ceil(float v) {
    uint16_t h = ekv_f32_to_fp16(v);
    if (ekv_fp16_to_f32(h) < v && h < 0x7bff) h++;
    return h;
}

/* ------------------------------------------------------------------ */
/* Q4_K / Q5_K                                                          */
/* ------------------------------------------------------------------ */

static void pack_k_scales(const uint8_t ls[8], const uint8_t lm[8], uint8_t out[EKV_K_SCALE_SIZE]) {
    for (int j = 0; j < 4; j++) {
        out[j] = ls[j];
        out[j + 4] = lm[j];
    }
    for (int j = 4; j < 8; j++) {
        out[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
        out[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
        out[j] |= (uint8_t)((lm[j] >> 4) << 6);
    }
}

/* Min/max quantisation of one 256-value super-block to `levels` (15 or 31)
 * steps per 32-value sub-block: q[i] in [0, levels], value ~ d*sc*q - dmin*m. */
static void quant_k_minmax(const float *x, int levels, uint16_t *d_out, uint16_t *dmin_out,
                           uint8_t scales[EKV_K_SCALE_SIZE], uint8_t q[EKV_QK_K]) {
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = 0.0f; /* the range always includes 0 so that the min is >= 0 */
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        sc[j] = (hi - lo) / (float)levels;
        mn[j] = -lo;
        max_sc = fmaxf(max_sc, sc[j]);
        max_mn = fmaxf(max_mn, mn[j]);
    }
    const float d = ekv_fp16_to_f32(fp16_ceil(max_sc / 63.0f));
    const float dmin = ekv_fp16_to_f32(ekv_f32_to_fp16(max_mn / 63.0f));
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        /* scales round up so that the sub-block range fits in `levels` steps */
        int a = d > 0.0f ? (int)ceilf(sc[j] / d) : 0, b = dmin > 0.0f ? iround(mn[j] / dmin) : 0;
        ls[j] = (uint8_t)(a < 0 ? 0 : a > 63 ? 63 : a);
        lm[j] = (uint8_t)(b < 0 ? 0 : b > 63 ? 63 : b);
    }
    *d_out = ekv_f32_to_fp16(d);
    *dmin_out = ekv_f32_to_fp16(dmin);
    memset(scales, 0, EKV_K_SCALE_SIZE);
    pack_k_scales(ls, lm, scales);
    for (int j = 0; j < 8; j++) {
        const float s = d * ls[j], m = dmin * lm[j];
        for (int l = 0; l < 32; l++) {
            int v = s > 0.0f ? iround((x[32 * j + l] + m) / s) : 0;
            q[32 * j + l] = (uint8_t)(v < 0 ? 0 : v > levels ? levels : v);
        }
    }
}

void ekv_quant_q4_K(const float *src, void *dst, int64_t n) {
    struct ekv_block_q4_K *b = dst;
    uint8_t q[EKV_QK_K];
    for (int64_t i = 0; i < n / EKV_QK_K; i++, src += EKV_QK_K) {
        quant_k_minmax(src, 15, &b[i].d, &b[i].dmin, b[i].scales, q);
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * k + l] = (uint8_t)(q[64 * k + l] | (q[64 * k + 32 + l] << 4));
    }
}

void ekv_quant_q5_K(const float *src, void *dst, int64_t n) {
    struct ekv_block_q5_K *b = dst;
    uint8_t q[EKV_QK_K];
    for (int64_t i = 0; i < n / EKV_QK_K; i++, src += EKV_QK_K) {
        quant_k_minmax(src, 31, &b[i].d, &b[i].dmin, b[i].scales, q);
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int k = 0; k < 4; k++) {
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = q[64 * k + l], hi = q[64 * k + 32 + l];
                b[i].qs[32 * k + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                b[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * k)) | ((hi >> 4) << (2 * k + 1)));
            }
        }
    }
}

static void dequant_k(const uint8_t *scales, float d, float dmin, const uint8_t *qs, const uint8_t *qh,
                      float *y) {
    for (int k = 0; k < 4; k++) {
        uint8_t s0, m0, s1, m1;
        ekv_k_scale_min(2 * k, scales, &s0, &m0);
        ekv_k_scale_min(2 * k + 1, scales, &s1, &m1);
        const float d0 = d * s0, d1 = d * s1, n0 = dmin * m0, n1 = dmin * m1;
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * k + l] & 0xF, hi = qs[32 * k + l] >> 4;
            if (qh) {
                lo |= ((qh[l] >> (2 * k)) & 1) << 4;
                hi |= ((qh[l] >> (2 * k + 1)) & 1) << 4;
            }
            y[64 * k + l] = d0 * lo - n0;
            y[64 * k + 32 + l] = d1 * hi - n1;
        }
    }
}

void ekv_dequant_q4_K(const void *src, float *dst, int64_t n) {
    const struct ekv_block_q4_K *b = src;
    for (int64_t i = 0; i < n / EKV_QK_K; i++)
        dequant_k(b[i].scales, ekv_fp16_to_f32(b[i].d), ekv_fp16_to_f32(b[i].dmin), b[i].qs, NULL,
                  dst + i * EKV_QK_K);
}

void ekv_dequant_q5_K(const void *src, float *dst, int64_t n) {
    const struct ekv_block_q5_K *b = src;
    for (int64_t i = 0; i < n / EKV_QK_K; i++)
        dequant_k(b[i].scales, ekv_fp16_to_f32(b[i].d), ekv_fp16_to_f32(b[i].dmin), b[i].qs, b[i].qh,
                  dst + i * EKV_QK_K);
}

/* ------------------------------------------------------------------ */
/* Q6_K                                                                 */
/* ------------------------------------------------------------------ */

/* Index helpers: value e (0..255) of a Q6_K block lives in half h = e/128,
 * at l = e%32 of quarter g = (e%128)/32. */
void ekv_quant_q6_K(const float *src, void *dst, int64_t n) {
    struct ekv_block_q6_K *b = dst;
    for (int64_t i = 0; i < n / EKV_QK_K; i++, src += EKV_QK_K) {
        float sc[16], max_abs_sc = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f, max = 0.0f;
            for (int l = 0; l < 16; l++) {
                if (amax < fabsf(src[16 * j + l])) {
                    amax = fabsf(src[16 * j + l]);
                    max = src[16 * j + l];
                }
            }
            sc[j] = max / -32.0f;
            max_abs_sc = fmaxf(max_abs_sc, fabsf(sc[j]));
        }
        const float d = ekv_fp16_to_f32(fp16_ceil(max_abs_sc / 127.0f));
        b[i].d = ekv_f32_to_fp16(d);
        uint8_t q[EKV_QK_K];
        for (int j = 0; j < 16; j++) {
            /* |scale| rounds up so that no value needs more than 32 steps */
            int ls = d > 0.0f ? (int)copysignf(ceilf(fabsf(sc[j]) / d), sc[j]) : 0;
            ls = ls < -127 ? -127 : ls > 127 ? 127 : ls;
            b[i].scales[j] = (int8_t)ls;
            const float s = d * ls;
            for (int l = 0; l < 16; l++) {
                int v = s != 0.0f ? iround(src[16 * j + l] / s) : 0;
                v = v < -32 ? -32 : v > 31 ? 31 : v;
                q[16 * j + l] = (uint8_t)(v + 32);
            }
        }
        memset(b[i].ql, 0, sizeof(b[i].ql));
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                  ((qq[l + 96] >> 4) << 6));
            }
        }
    }
}

/* The 6-bit values (0..63) of one Q6_K block, in element order. */
static void unpack_q6_K(const struct ekv_block_q6_K *b, int8_t q[EKV_QK_K]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *y = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            y[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

void ekv_dequant_q6_K(const void *src, float *dst, int64_t n) {
    const struct ekv_block_q6_K *b = src;
    int8_t q[EKV_QK_K];
    for (int64_t i = 0; i < n / EKV_QK_K; i++) {
        const float d = ekv_fp16_to_f32(b[i].d);
        unpack_q6_K(&b[i], q);
        for (int e = 0; e < EKV_QK_K; e++) dst[i * EKV_QK_K + e] = d * b[i].scales[e / 16] * q[e];
    }
}

/* ------------------------------------------------------------------ */
/* Reference dot products                                               */
/* ------------------------------------------------------------------ */

void ekv_dot_f32_f32_ref(int64_t n, float *s, const void *w, const void *xa) {
    *s = ekv_dot_f32_ref(w, xa, n);
}

void ekv_dot_f16_f32_ref(int64_t n, float *s, const void *w, const void *xa) {
    const uint16_t *a = w;
    const float *x = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += ekv_fp16_to_f32(a[i]) * x[i];
    *s = sum;
}

void ekv_dot_bf16_f32_ref(int64_t n, float *s, const void *w, const void *xa) {
    const uint16_t *a = w;
    const float *x = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += ekv_bf16_to_f32(a[i]) * x[i];
    *s = sum;
}

void ekv_dot_q8_0_q8_0_ref(int64_t n, float *s, const void *w, const void *xa) {
    const struct ekv_block_q8_0 *a = w, *b = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / EKV_QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < EKV_QK8_0; j++) sumi += a[i].qs[j] * b[i].qs[j];
        sum += (float)sumi * (ekv_fp16_to_f32(a[i].d) * ekv_fp16_to_f32(b[i].d));
    }
    *s = sum;
}

void ekv_dot_q4_0_q8_0_ref(int64_t n, float *s, const void *w, const void *xa) {
    const struct ekv_block_q4_0 *a = w;
    const struct ekv_block_q8_0 *b = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / EKV_QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < EKV_QK4_0 / 2; j++) {
            sumi += ((a[i].qs[j] & 0xF) - 8) * b[i].qs[j];
            sumi += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + EKV_QK4_0 / 2];
        }
        sum += (float)sumi * (ekv_fp16_to_f32(a[i].d) * ekv_fp16_to_f32(b[i].d));
    }
    *s = sum;
}

/* Q4_K/Q5_K: per super-block, sum_j d*sc_j*dot(q_j, y_j)*yd - dmin*m_j*yd*sum(y_j). */
static float dot_k_block(const uint8_t *scales, uint16_t d16, uint16_t dmin16, const uint8_t *qs,
                         const uint8_t *qh, const struct ekv_block_q8_K *y) {
    int32_t sum_sc = 0, sum_m = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t s0, m0, s1, m1;
        ekv_k_scale_min(2 * k, scales, &s0, &m0);
        ekv_k_scale_min(2 * k + 1, scales, &s1, &m1);
        int32_t i0 = 0, i1 = 0;
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * k + l] & 0xF, hi = qs[32 * k + l] >> 4;
            if (qh) {
                lo |= ((qh[l] >> (2 * k)) & 1) << 4;
                hi |= ((qh[l] >> (2 * k + 1)) & 1) << 4;
            }
            i0 += lo * y->qs[64 * k + l];
            i1 += hi * y->qs[64 * k + 32 + l];
        }
        sum_sc += s0 * i0 + s1 * i1;
        sum_m += m0 * (y->bsums[4 * k] + y->bsums[4 * k + 1]) + m1 * (y->bsums[4 * k + 2] + y->bsums[4 * k + 3]);
    }
    return ekv_fp16_to_f32(d16) * y->d * (float)sum_sc - ekv_fp16_to_f32(dmin16) * y->d * (float)sum_m;
}

void ekv_dot_q4_K_q8_K_ref(int64_t n, float *s, const void *w, const void *xa) {
    const struct ekv_block_q4_K *a = w;
    const struct ekv_block_q8_K *b = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / EKV_QK_K; i++) sum += dot_k_block(a[i].scales, a[i].d, a[i].dmin, a[i].qs, NULL, &b[i]);
    *s = sum;
}

void ekv_dot_q5_K_q8_K_ref(int64_t n, float *s, const void *w, const void *xa) {
    const struct ekv_block_q5_K *a = w;
    const struct ekv_block_q8_K *b = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / EKV_QK_K; i++)
        sum += dot_k_block(a[i].scales, a[i].d, a[i].dmin, a[i].qs, a[i].qh, &b[i]);
    *s = sum;
}

void ekv_dot_q6_K_q8_K_ref(int64_t n, float *s, const void *w, const void *xa) {
    const struct ekv_block_q6_K *a = w;
    const struct ekv_block_q8_K *b = xa;
    int8_t q[EKV_QK_K];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / EKV_QK_K; i++) {
        unpack_q6_K(&a[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++) {
            int32_t isum = 0;
            for (int l = 0; l < 16; l++) isum += q[16 * j + l] * b[i].qs[16 * j + l];
            sumi += a[i].scales[j] * isum;
        }
        sum += ekv_fp16_to_f32(a[i].d) * b[i].d * (float)sumi;
    }
    *s = sum;
}

/* ------------------------------------------------------------------ */
/* Reference table                                                      */
/* ------------------------------------------------------------------ */

enum ekv_dtype ekv_act_type(enum ekv_dtype t) {
    switch (t) {
    case EKV_Q8_0: case EKV_Q4_0: return EKV_Q8_0;
    case EKV_Q4_K: case EKV_Q5_K: case EKV_Q6_K: return EKV_Q8_K;
    default: return EKV_F32;
    }
}

const struct ekv_type_kernels *ekv_kernels_ref(enum ekv_dtype t) {
    static const struct ekv_type_kernels none = {0};
#define REF(dot, q, bytes, blk) {.vec_dot = dot, .quantize_act = q, .act_block_bytes = bytes, .act_block = blk}
    static const struct ekv_type_kernels f32 = REF(ekv_dot_f32_f32_ref, NULL, 0, 1);
    static const struct ekv_type_kernels f16 = REF(ekv_dot_f16_f32_ref, NULL, 0, 1);
    static const struct ekv_type_kernels bf16 = REF(ekv_dot_bf16_f32_ref, NULL, 0, 1);
    static const struct ekv_type_kernels q8_0 =
        REF(ekv_dot_q8_0_q8_0_ref, ekv_quant_q8_0, sizeof(struct ekv_block_q8_0), EKV_QK8_0);
    static const struct ekv_type_kernels q4_0 =
        REF(ekv_dot_q4_0_q8_0_ref, ekv_quant_q8_0, sizeof(struct ekv_block_q8_0), EKV_QK8_0);
    static const struct ekv_type_kernels q4_K =
        REF(ekv_dot_q4_K_q8_K_ref, ekv_quant_q8_K, sizeof(struct ekv_block_q8_K), EKV_QK_K);
    static const struct ekv_type_kernels q5_K =
        REF(ekv_dot_q5_K_q8_K_ref, ekv_quant_q8_K, sizeof(struct ekv_block_q8_K), EKV_QK_K);
    static const struct ekv_type_kernels q6_K =
        REF(ekv_dot_q6_K_q8_K_ref, ekv_quant_q8_K, sizeof(struct ekv_block_q8_K), EKV_QK_K);
#undef REF
    switch (t) {
    case EKV_F32: return &f32;
    case EKV_F16: return &f16;
    case EKV_BF16: return &bf16;
    case EKV_Q8_0: return &q8_0;
    case EKV_Q4_0: return &q4_0;
    case EKV_Q4_K: return &q4_K;
    case EKV_Q5_K: return &q5_K;
    case EKV_Q6_K: return &q6_K;
    default: return &none;
    }
}
