/*
 * test_kernels.c — checks ekv's numeric kernels: half-precision
 * conversions (edge cases and exhaustive round trips), the thread pool,
 * block codecs with stated error bounds, matvec/matmul of every computable
 * type against double-precision dots (reference and SIMD paths, several
 * thread counts, odd shapes), and the element-wise ops against
 * straightforward double-precision formulas.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/util.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "testutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_uniform(void) { return (float)((rnd_u32() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }
static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd_uniform() * scale;
}
static float bits_f(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }

/* ------------------------------------------------------------------ */
static void test_fp16(void) {
    /* exact and special values */
    CHECK(ekv_f32_to_fp16(0.0f) == 0x0000);
    CHECK(ekv_f32_to_fp16(-0.0f) == 0x8000);
    CHECK(ekv_f32_to_fp16(1.0f) == 0x3c00);
    CHECK(ekv_f32_to_fp16(-2.0f) == 0xc000);
    CHECK(ekv_f32_to_fp16(65504.0f) == 0x7bff);
    CHECK(ekv_f32_to_fp16(65519.99f) == 0x7bff);   /* below the tie: rounds down to max */
    CHECK(ekv_f32_to_fp16(65520.0f) == 0x7c00);    /* tie to even -> inf */
    CHECK(ekv_f32_to_fp16(1e9f) == 0x7c00);
    CHECK(ekv_f32_to_fp16(-INFINITY) == 0xfc00);
    uint16_t hn = ekv_f32_to_fp16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    CHECK(isnan(ekv_fp16_to_f32(0x7e00)) && isnan(ekv_fp16_to_f32(0xfc01)));
    CHECK(isinf(ekv_fp16_to_f32(0x7c00)) && ekv_fp16_to_f32(0xfc00) < 0);
    /* subnormals */
    CHECK(ekv_fp16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(ekv_fp16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    CHECK(ekv_fp16_to_f32(0x8200) == -ldexpf(1.0f, -15));
    CHECK(ekv_f32_to_fp16(ldexpf(1.0f, -24)) == 0x0001);
    CHECK(ekv_f32_to_fp16(ldexpf(1.0f, -25)) == 0x0000);            /* tie -> even (0) */
    CHECK(ekv_f32_to_fp16(ldexpf(1.0001f, -25)) == 0x0001);         /* just above the tie */
    CHECK(ekv_f32_to_fp16(ldexpf(3.0f, -25)) == 0x0002);            /* 1.5 ulp tie -> even 2 */
    CHECK(ekv_f32_to_fp16(ldexpf(5.0f, -25)) == 0x0002);            /* 2.5 ulp tie -> even 2 */
    CHECK(ekv_f32_to_fp16(ldexpf(1.0f, -26)) == 0x0000);
    CHECK(ekv_f32_to_fp16(ldexpf(2047.0f, -25)) == 0x0400);         /* largest subnormal + half ulp, tie -> 0x400 (even) */
    CHECK(ekv_f32_to_fp16(ldexpf(1.0f, -14)) == 0x0400);            /* smallest normal */
    /* normal ties */
    CHECK(ekv_f32_to_fp16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);     /* tie -> even */
    CHECK(ekv_f32_to_fp16(1.0f + ldexpf(3.0f, -11)) == 0x3c02);     /* tie -> even (up) */
    CHECK(ekv_f32_to_fp16(1.0f + ldexpf(1.0f, -11) + ldexpf(1.0f, -20)) == 0x3c01);
    CHECK(ekv_f32_to_fp16(2047.5f) == ekv_f32_to_fp16(2048.0f));    /* carry into the exponent */
    /* exhaustive round trip of every non-nan half */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        if (ekv_f32_to_fp16(ekv_fp16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d halves do not round-trip", bad);
    /* random floats: result is a nearest half, ties to even */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float f = bits_f((rnd_u32() & 0x7fffffffu) % 0x47800000u) * ((i & 1) ? -1.0f : 1.0f);
        uint16_t h = ekv_f32_to_fp16(f);
        double v = ekv_fp16_to_f32(h), e = fabs((double)f - v);
        uint16_t mag = h & 0x7fff;
        double up = mag < 0x7c00 ? fabs((double)f - (double)ekv_fp16_to_f32((uint16_t)(h + 1))) : INFINITY;
        double dn = mag > 0 ? fabs((double)f - (double)ekv_fp16_to_f32((uint16_t)(h - 1))) : INFINITY;
        if (mag == 0x7c00) continue; /* overflow checked above */
        if (e > up || e > dn || ((e == up || e == dn) && (h & 1))) bad++;
    }
    CHECK_MSG(bad == 0, "%d floats not rounded to the nearest-even half", bad);
}

static void test_bf16(void) {
    CHECK(ekv_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(ekv_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(ekv_f32_to_bf16(1.0f + ldexpf(1.0f, -8)) == 0x3f80);                       /* tie -> even */
    CHECK(ekv_f32_to_bf16(1.0f + ldexpf(3.0f, -8)) == 0x3f82);                       /* tie -> even (up) */
    CHECK(ekv_f32_to_bf16(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)) == 0x3f81);
    CHECK(ekv_f32_to_bf16(INFINITY) == 0x7f80 && ekv_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(ekv_f32_to_bf16(bits_f(0x7f7fffffu)) == 0x7f80);                          /* FLT_MAX rounds to inf */
    CHECK(ekv_f32_to_bf16(bits_f(0x00000001u)) == 0x0000);                          /* tiny subnormal -> 0 */
    CHECK(ekv_f32_to_bf16(bits_f(0x00018000u)) == 0x0002);                          /* subnormal tie -> even */
    uint16_t n = ekv_f32_to_bf16(bits_f(0x7f800001u));                              /* signalling nan stays nan */
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    CHECK(isnan(ekv_bf16_to_f32(0x7fc0)));
    CHECK(ekv_bf16_to_f32(0xc040) == -3.0f);
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
        if (ekv_f32_to_bf16(ekv_bf16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d bf16 values do not round-trip", bad);
}

/* ------------------------------------------------------------------ */
struct pool_probe { int hits[8]; int nth_seen[8]; };
static void probe_task(void *ctx, int ith, int nth) {
    struct pool_probe *p = ctx;
    p->hits[ith]++;
    p->nth_seen[ith] = nth;
}

static void test_pool(void) {
    struct ekv_pool *p = NULL;
    CHECK(ekv_pool_new(0, &p) == EKV_ERR_INVALID_ARG && p == NULL);
    CHECK(ekv_pool_size(NULL) == 1);
    for (int nt = 1; nt <= 3; nt++) {
        CHECK_OK(ekv_pool_new(nt, &p));
        CHECK(ekv_pool_size(p) == nt);
        struct pool_probe pr = {{0}, {0}};
        for (int i = 0; i < 2000; i++) ekv_pool_run(p, probe_task, &pr);
        for (int i = 0; i < nt; i++) CHECK(pr.hits[i] == 2000 && pr.nth_seen[i] == nt);
        CHECK(pr.hits[nt] == 0);
        void *a = ekv_pool_scratch(p, nt - 1, 100);
        CHECK(a && ((uintptr_t)a & 63) == 0);
        memset(a, 1, 100);
        void *b = ekv_pool_scratch(p, nt - 1, 1 << 20);
        CHECK(b && ((uintptr_t)b & 63) == 0);
        memset(b, 2, 1 << 20);
        CHECK(ekv_pool_scratch(p, nt, 16) == NULL);
        void *s = ekv_pool_scratch_shared(p, 1000);
        CHECK(s && s != b && ((uintptr_t)s & 63) == 0);
        ekv_pool_free(p);
    }
    struct pool_probe pr = {{0}, {0}};
    ekv_pool_run(NULL, probe_task, &pr);
    CHECK(pr.hits[0] == 1 && pr.nth_seen[0] == 1);
    CHECK(ekv_pool_scratch(NULL, 0, 64) != NULL && ekv_pool_scratch(NULL, 1, 64) == NULL);
}

/* ------------------------------------------------------------------ */
/* Codec error bounds. */
static void test_codecs(void) {
    const int64_t n = 256 * 8;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    void *q = malloc(n * 4);
    /* random data at several scales plus a block of zeros and a spike */
    for (int rep = 0; rep < 3; rep++) {
        float scale = rep == 0 ? 1.0f : rep == 1 ? 1e-3f : 50.0f;
        fill(x, n, scale);
        for (int i = 256; i < 512; i++) x[i] = 0.0f;
        x[700] = 4.0f * scale;
        x[1500] = -5.0f * scale;

        /* F16: relative 2^-11 (normal range); BF16: relative 2^-8 */
        CHECK_OK(ekv_quantize_row(EKV_F16, x, q, n));
        CHECK_OK(ekv_dequantize_row(EKV_F16, q, y, n));
        double worst = 0;
        for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(x[i] - y[i]) - ldexp(fabs(x[i]), -11) - 6e-8);
        CHECK_MSG(worst <= 0, "f16 error exceeds bound by %g", worst);
        CHECK_OK(ekv_quantize_row(EKV_BF16, x, q, n));
        CHECK_OK(ekv_dequantize_row(EKV_BF16, q, y, n));
        worst = 0;
        for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(x[i] - y[i]) - ldexp(fabs(x[i]), -8));
        CHECK_MSG(worst <= 0, "bf16 error exceeds bound by %g", worst);

        /* Q8_0: with D = amax/127 and d = fp16(D) the stored scale,
         * |err| <= 0.5 d + 127 |d - D| (the second term is the fp16 rounding
         * of the scale: <= 2^-11 D for normal halves, more for tiny blocks) */
        CHECK_OK(ekv_quantize_row(EKV_Q8_0, x, q, n));
        CHECK_OK(ekv_dequantize_row(EKV_Q8_0, q, y, n));
        worst = 0;
        for (int64_t b = 0; b < n / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
            double D = amax / 127.0, d = ekv_fp16_to_f32(((const struct ekv_block_q8_0 *)q)[b].d);
            if (amax >= 1e-2f) CHECK(fabs(d - D) <= ldexp(D, -11));
            for (int j = 0; j < 32; j++)
                worst = fmax(worst, fabs(x[b * 32 + j] - y[b * 32 + j]) - (0.5 * d + 127 * fabs(d - D) + 1e-9 * amax));
        }
        CHECK_MSG(worst <= 0, "q8_0 error exceeds bound by %g", worst);

        /* Q4_0: step |d| = amax/8; |err| <= |d|/2 except values of the sign
         * opposite to the extreme, clamped at q=15: |err| <= |d| (+ fp16 slop) */
        CHECK_OK(ekv_quantize_row(EKV_Q4_0, x, q, n));
        CHECK_OK(ekv_dequantize_row(EKV_Q4_0, q, y, n));
        worst = 0;
        int half_ok = 1;
        for (int64_t b = 0; b < n / 32; b++) {
            float amax = 0, mx = 0;
            for (int j = 0; j < 32; j++)
                if (fabsf(x[b * 32 + j]) > amax) { amax = fabsf(x[b * 32 + j]); mx = x[b * 32 + j]; }
            for (int j = 0; j < 32; j++) {
                double e = fabs(x[b * 32 + j] - y[b * 32 + j]);
                worst = fmax(worst, e - 1.01 * amax / 8);
                if (x[b * 32 + j] * mx >= 0 && e > 0.51 * amax / 8 + 1e-9) half_ok = 0;
            }
        }
        CHECK_MSG(worst <= 0, "q4_0 error exceeds bound by %g", worst);
        CHECK(half_ok);

        /* Q8_K: |err| <= 0.5 d, d = amax/127 (float scale) */
        CHECK_OK(ekv_quantize_row(EKV_Q8_K, x, q, n));
        CHECK_OK(ekv_dequantize_row(EKV_Q8_K, q, y, n));
        worst = 0;
        const struct ekv_block_q8_K *bk = q;
        for (int64_t b = 0; b < n / 256; b++) {
            float amax = 0;
            for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[b * 256 + j]));
            for (int j = 0; j < 256; j++) worst = fmax(worst, fabs(x[b * 256 + j] - y[b * 256 + j]) - 0.501 * amax / 127);
            for (int s = 0; s < 16; s++) {
                int sum = 0;
                for (int j = 0; j < 16; j++) sum += bk[b].qs[16 * s + j];
                CHECK(bk[b].bsums[s] == sum);
            }
        }
        CHECK_MSG(worst <= 0, "q8_K error exceeds bound by %g", worst);

        /* Q4_K / Q5_K: per sub-block of 32 with effective scale s = d*sc_j and
         * min step dmin: |err| <= s/2 + dmin (+ float slop) */
        for (int kind = 0; kind < 2; kind++) {
            enum ekv_dtype t = kind ? EKV_Q5_K : EKV_Q4_K;
            CHECK_OK(ekv_quantize_row(t, x, q, n));
            CHECK_OK(ekv_dequantize_row(t, q, y, n));
            worst = 0;
            double se = 0, sx = 0;
            for (int64_t b = 0; b < n / 256; b++) {
                const uint8_t *blk = (const uint8_t *)q + b * (kind ? 176 : 144);
                uint16_t d16, m16;
                memcpy(&d16, blk, 2);
                memcpy(&m16, blk + 2, 2);
                float d = ekv_fp16_to_f32(d16), dmin = ekv_fp16_to_f32(m16);
                for (int j = 0; j < 8; j++) {
                    uint8_t sc, m;
                    ekv_k_scale_min(j, blk + 4, &sc, &m);
                    for (int l = 0; l < 32; l++) {
                        int64_t i = b * 256 + j * 32 + l;
                        double e = fabs(x[i] - y[i]);
                        worst = fmax(worst, e - (0.5 * d * sc + dmin + 1e-6 * scale));
                        se += e * e;
                        sx += (double)x[i] * x[i];
                    }
                }
            }
            CHECK_MSG(worst <= 0, "%s error exceeds bound by %g", ekv_dtype_name(t), worst);
            /* relative rms error: uniform data, ~ (2/levels)/sqrt(12)/rms */
            CHECK_MSG(sqrt(se / sx) < (kind ? 0.05 : 0.1), "%s rel rms %g", ekv_dtype_name(t), sqrt(se / sx));
        }

        /* Q6_K: |err| <= |d * sc_j| (one step; half a step except at the clamp) */
        CHECK_OK(ekv_quantize_row(EKV_Q6_K, x, q, n));
        CHECK_OK(ekv_dequantize_row(EKV_Q6_K, q, y, n));
        worst = 0;
        double se = 0, sx = 0;
        for (int64_t b = 0; b < n / 256; b++) {
            const struct ekv_block_q6_K *blk = (const struct ekv_block_q6_K *)q + b;
            float d = ekv_fp16_to_f32(blk->d);
            for (int j = 0; j < 256; j++) {
                int64_t i = b * 256 + j;
                double e = fabs(x[i] - y[i]);
                worst = fmax(worst, e - (fabs(d * blk->scales[j / 16]) * 1.001 + 1e-7 * scale));
                se += e * e;
                sx += (double)x[i] * x[i];
            }
        }
        CHECK_MSG(worst <= 0, "q6_K error exceeds bound by %g", worst);
        CHECK_MSG(sqrt(se / sx) < 0.03, "q6_K rel rms %g", sqrt(se / sx));
    }
    /* bad sizes and types */
    CHECK(ekv_quantize_row(EKV_Q8_0, x, q, 33) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_dequantize_row(EKV_Q4_K, q, y, 128) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_dequantize_row(EKV_IQ2_XXS, q, y, 256) == EKV_ERR_UNSUPPORTED);
    CHECK(ekv_dequantize_row((enum ekv_dtype)5, q, y, 32) == EKV_ERR_UNSUPPORTED);
    free(x);
    free(y);
    free(q);
}

/* Known-answer blocks built by hand from the documented layouts. */
static void test_layouts(void) {
    float y[256], x[256];
    /* Q4_0 quantizer (ggml's reference): x_j = (j-8)/2 for j < 16, 0 then, x_31 = -4;
     * the first value of largest magnitude is -4 -> d = -4/-8 = 0.5, q = trunc(x/d + 8.5) */
    for (int j = 0; j < 32; j++) x[j] = j < 16 ? (j - 8) * 0.5f : 0.0f;
    x[31] = -4.0f;
    struct ekv_block_q4_0 q4;
    CHECK_OK(ekv_quantize_row(EKV_Q4_0, x, &q4, 32));
    CHECK(q4.d == 0x3800); /* 0.5 */
    int bad = 0;
    for (int j = 0; j < 15; j++) bad += q4.qs[j] != (uint8_t)(j | 0x80);
    CHECK(bad == 0 && q4.qs[15] == 0x0F);
    /* Q8_0 quantizer: x_j = j -> d = 31/127, q_j = round(j * 127/31) */
    for (int j = 0; j < 32; j++) x[j] = (float)j;
    struct ekv_block_q8_0 q8;
    CHECK_OK(ekv_quantize_row(EKV_Q8_0, x, &q8, 32));
    CHECK(q8.d == ekv_f32_to_fp16(31.0f / 127.0f));
    CHECK(q8.qs[0] == 0 && q8.qs[1] == 4 && q8.qs[16] == 66 && q8.qs[31] == 127);
    /* Q4_0: d = 0.5, qs[0] = 0x9A -> element 0 = (0xA-8)*0.5 = 1, element 16 = (9-8)*0.5 = 0.5 */
    struct ekv_block_q4_0 b4 = {0};
    b4.d = ekv_f32_to_fp16(0.5f);
    memset(b4.qs, 0x88, sizeof(b4.qs));
    b4.qs[0] = 0x9A;
    b4.qs[15] = 0x07;
    CHECK_OK(ekv_dequantize_row(EKV_Q4_0, &b4, y, 32));
    CHECK(y[0] == 1.0f && y[16] == 0.5f && y[1] == 0.0f && y[15] == -0.5f && y[31] == -4.0f);
    /* Q8_0 */
    struct ekv_block_q8_0 b8 = {0};
    b8.d = ekv_f32_to_fp16(0.25f);
    b8.qs[3] = -7;
    CHECK_OK(ekv_dequantize_row(EKV_Q8_0, &b8, y, 32));
    CHECK(y[3] == -1.75f && y[4] == 0.0f);
    /* Q4_K: d = 1, dmin = 0.5; sub-block 0: sc 2, m 1; sub-block 5: sc 0x23 (35), m 0x31 (49)
     * packed as: sc5 low 4 bits in scales[9] low, high 2 bits in scales[1] bits 6-7;
     * m5 low in scales[9] high, high 2 bits in scales[5] bits 6-7. */
    struct ekv_block_q4_K k4;
    memset(&k4, 0, sizeof(k4));
    k4.d = ekv_f32_to_fp16(1.0f);
    k4.dmin = ekv_f32_to_fp16(0.5f);
    k4.scales[0] = 2;
    k4.scales[4] = 1;
    k4.scales[9] = (uint8_t)(0x3 | (0x1 << 4));
    k4.scales[1] |= (uint8_t)(0x2 << 6);
    k4.scales[5] |= (uint8_t)(0x3 << 6);
    k4.qs[0] = 0x35;      /* element 0 = low nibble 5, element 32 = high nibble 3 */
    k4.qs[64 + 7] = 0xC0; /* pair 2, l = 7: element 128+7 (sub-block 4) low 0, element 160+7 (sub-block 5) high 12 */
    CHECK_OK(ekv_dequantize_row(EKV_Q4_K, &k4, y, 256));
    CHECK(y[0] == 2.0f * 5 - 0.5f * 1);
    CHECK(y[32] == 0.0f);                              /* sub-block 1: sc 0, m 0 */
    CHECK(y[167] == 35.0f * 12 - 0.5f * 49);
    CHECK(y[166] == -0.5f * 49);
    /* Q5_K: same plus the fifth bit: element 32*? -> qh[l] bit 2k (low half) / 2k+1 (high half) */
    struct ekv_block_q5_K k5;
    memset(&k5, 0, sizeof(k5));
    k5.d = ekv_f32_to_fp16(1.0f);
    memcpy(k5.scales, k4.scales, 12);
    k5.qs[64 + 7] = 0xC0;
    k5.qh[7] = (uint8_t)(1u << 5); /* k = 2, high half: element 167 gets +16 */
    CHECK_OK(ekv_dequantize_row(EKV_Q5_K, &k5, y, 256));
    CHECK(y[167] == 35.0f * (12 + 16));
    CHECK(y[135] == 0.0f);
    /* Q6_K: element e of half h, l = e%32, g = (e%128)/32: low nibble in ql[64h + l + 32*(g&1)]
     * (high nibble when g >= 2), 2 high bits at qh[32h + l] bits 2g..2g+1; scale[e/16] */
    struct ekv_block_q6_K k6;
    memset(&k6, 0, sizeof(k6));
    k6.d = ekv_f32_to_fp16(2.0f);
    for (int j = 0; j < 16; j++) k6.scales[j] = (int8_t)(j - 8);
    /* element 128 + 96 + 5 = 229: h = 1, g = 3, l = 5 -> ql[64+32+5] high nibble, qh[32+5] bits 6..7 */
    k6.ql[101] = 0x70;
    k6.qh[37] = 0x80; /* high bits = 2 -> q = 7 | 32 = 39 -> 39 - 32 = 7 */
    CHECK_OK(ekv_dequantize_row(EKV_Q6_K, &k6, y, 256));
    CHECK(y[229] == 2.0f * (229 / 16 - 8) * 7);
    CHECK(y[0] == 2.0f * -8 * -32);  /* all-zero bits: q = -32 */
}

/* ------------------------------------------------------------------ */
/* Products. */
static const enum ekv_dtype k_types[] = {EKV_F32, EKV_F16, EKV_BF16, EKV_Q8_0, EKV_Q4_0,
                                         EKV_Q4_K, EKV_Q5_K, EKV_Q6_K};

static double dot_d(const float *a, const float *b, int64_t n, double *abs_sum) {
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        as += fabs((double)a[i] * b[i]);
    }
    if (abs_sum) *abs_sum = as;
    return s;
}

static bool same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * 4) == 0; }

/* The ISA levels, in order; those the CPU runs are tested. */
static const char *const k_isas[] = {"reference", "avx2", "avxvnni", "avx512"};
#define N_ISA 4

static bool is_quantised(enum ekv_dtype t) { return ekv_act_type(t) != EKV_F32; }

/* One weight matrix (one layout) on every ISA level: against the double
 * dot of what the kernel multiplies, thread counts, matmul == matvec;
 * results per level in res[level] ([nt][ne1], from matmul). */
static void check_products(const struct ekv_weight *w, const float *wd, const float *x, const float *xd, int64_t nt,
                           struct ekv_pool **pools, float *res[N_ISA], bool ran[N_ISA]) {
    const enum ekv_dtype t = w->type;
    const int64_t ne0 = w->ne0, ne1 = w->ne1;
    float *y = malloc((size_t)(ne1 * nt) * 4), *tmp = malloc((size_t)ne1 * 4);
    const char *lay = w->layout == EKV_LAYOUT_X16 ? "x16" : "rows";
    for (int isa = 0; isa < N_ISA; isa++) {
        ran[isa] = ekv_kernels_set_isa(k_isas[isa]);
        if (!ran[isa]) continue;
        CHECK(strcmp(ekv_kernels_isa(), k_isas[isa]) == 0);
        float *r = res[isa];
        CHECK_OK(ekv_matmul(pools[0], w, x, nt, r));
        double worst = 0, worst_x = 0;
        for (int64_t i = 0; i < nt; i++)
            for (int64_t o = 0; o < ne1; o++) {
                double as, as2;
                double e = dot_d(wd + o * ne0, xd + i * ne0, ne0, &as);
                double ex = dot_d(wd + o * ne0, x + i * ne0, ne0, &as2);
                worst = fmax(worst, fabs(r[i * ne1 + o] - e) / (as + 1e-30));
                worst_x = fmax(worst_x, fabs(r[i * ne1 + o] - ex) / (as2 + 1e-30));
            }
        CHECK_MSG(worst < 2e-6 * sqrt((double)ne0), "%s %s %s [%lld x %lld] rel err %g", ekv_dtype_name(t), lay,
                  k_isas[isa], (long long)ne1, (long long)ne0, worst);
        /* activation quantisation costs at most ~1% of sum |w x| */
        CHECK_MSG(worst_x < 1e-2, "%s vs float x rel err %g", ekv_dtype_name(t), worst_x);
        /* every thread count, matmul row == matvec of that row */
        bool same = true;
        for (int pi = 0; pi < 4; pi++) {
            CHECK_OK(ekv_matmul(pools[pi], w, x, nt, y));
            same = same && same_bits(y, r, ne1 * nt);
            for (int64_t i = 0; i < nt; i++) {
                CHECK_OK(ekv_matvec(pools[pi], w, x + i * ne0, tmp));
                same = same && same_bits(tmp, r + i * ne1, ne1);
            }
        }
        CHECK_MSG(same, "%s %s %s [%lld x %lld]: results depend on threads or rows", ekv_dtype_name(t), lay,
                  k_isas[isa], (long long)ne1, (long long)ne0);
    }
    ekv_kernels_use_reference(false);
    ekv_kernels_set_isa(k_isas[ekv_cpu_isa()]);
    free(y);
    free(tmp);
}

static void test_products_type(enum ekv_dtype t, struct ekv_pool **pools) {
    const int64_t ne1s[] = {1, 3, 17, 32, 48, 257};
    const int bs = (int)ekv_dtype_get(t)->block_size;
    /* blocks of 3 and 37 (not multiples of 8 blocks); float types also get
     * 77 = 4*16 + 8 + 5 and 172 (stories260K's hidden size) to reach every tail */
    int64_t ne0s[] = {bs == 256 ? 256 * 3 : 32 * 3, bs == 256 ? 256 : 64, bs == 256 ? 256 * 9 : 32 * 37, 0, 0, 0};
    if (bs == 1) {
        ne0s[3] = 77;
        ne0s[4] = 172;
        ne0s[5] = 1101; /* 68*16 + 8 + 5: a long row with both tails */
    } else {
        ne0s[3] = bs;
        ne0s[4] = bs * 5;
        ne0s[5] = bs * 2;
    }
    for (size_t a = 0; a < EKV_ARRAY_LEN(ne0s); a++) {
        for (size_t b = 0; b < EKV_ARRAY_LEN(ne1s); b++) {
            const int64_t ne0 = ne0s[a], ne1 = ne1s[b], nt = b % 2 ? 5 : 7; /* prefill tiles of 3 tokens end with 2 or 1 */
            size_t rb;
            CHECK(ekv_dtype_row_bytes(t, ne0, &rb));
            const size_t stride = rb + 16; /* row padding as GGUF alignment may leave */
            float *wf = malloc(ne0 * ne1 * 4), *wd = malloc(ne0 * ne1 * 4);
            char *wq = calloc(ne1, stride), *wt = calloc(ne1, rb);
            float *x = malloc(ne0 * nt * 4), *xd = malloc(ne0 * nt * 4);
            float *res[2][N_ISA];
            bool ran[2][N_ISA];
            for (int l = 0; l < 2; l++)
                for (int i = 0; i < N_ISA; i++) res[l][i] = malloc(ne1 * nt * 4);
            fill(wf, ne0 * ne1, 0.5f);
            fill(x, ne0 * nt, 2.0f);
            for (int64_t r = 0; r < ne1; r++) {
                CHECK_OK(ekv_quantize_row(t, wf + r * ne0, wq + r * stride, ne0));
                CHECK_OK(ekv_dequantize_row(t, wq + r * stride, wd + r * ne0, ne0));
                memcpy(wt + r * rb, wq + r * stride, rb);
            }
            /* what the kernel multiplies: the activation in its quantised form */
            enum ekv_dtype at = ekv_act_type(t);
            void *xq = malloc(ne0 * 4 + 1024);
            for (int64_t i = 0; i < nt; i++) {
                if (at == EKV_F32) {
                    memcpy(xd + i * ne0, x + i * ne0, ne0 * 4);
                } else {
                    CHECK_OK(ekv_quantize_row(at, x + i * ne0, xq, ne0));
                    CHECK_OK(ekv_dequantize_row(at, xq, xd + i * ne0, ne0));
                }
            }
            struct ekv_weight w = {.type = t, .ne0 = ne0, .ne1 = ne1, .row_bytes = stride, .data = wq};
            check_products(&w, wd, x, xd, nt, pools, res[0], ran[0]);
            /* the X16 layout (Q8_0/Q4_0, 16k rows): the same bits as the rows layout */
            struct ekv_weight wx = {.type = t, .ne0 = ne0, .ne1 = ne1, .row_bytes = rb, .data = wt};
            const bool x16 = ekv_weight_can_repack(&wx);
            CHECK(x16 == ((t == EKV_Q8_0 || t == EKV_Q4_0) && ne1 % 16 == 0));
            CHECK(!ekv_weight_can_repack(&w) || stride == rb);
            if (x16) {
                void *packed = malloc(ne1 * rb);
                CHECK_OK(ekv_weight_repack(&wx, packed));
                CHECK(wx.layout == EKV_LAYOUT_X16 && wx.data == packed);
                memset(wt, 0, ne1 * rb); /* the packed copy must not read the source */
                check_products(&wx, wd, x, xd, nt, pools, res[1], ran[1]);
                for (int i = 0; i < N_ISA; i++)
                    if (ran[1][i])
                        CHECK_MSG(same_bits(res[1][i], res[0][i], ne1 * nt), "%s %s: x16 != rows layout",
                                  ekv_dtype_name(t), k_isas[i]);
                /* rows read back from the packed layout */
                float *row = malloc(ne0 * 4);
                int bad = 0;
                for (int64_t r = 0; r < ne1; r++) {
                    CHECK_OK(ekv_weight_get_row(&wx, r, row));
                    bad += !same_bits(row, wd + r * ne0, ne0);
                }
                CHECK_MSG(bad == 0, "%s x16 get_row: %d rows differ", ekv_dtype_name(t), bad);
                free(row);
                free(packed);
            }
            /* SIMD levels against each other and the reference: quantised types
             * compute exactly the reference's operations (exact integer block
             * dots, the same float steps): equal bits. Float types share one
             * order across SIMD levels; against the reference, a bound. */
            int first_simd = -1;
            for (int i = 1; i < N_ISA; i++) {
                if (!ran[0][i]) continue;
                if (first_simd < 0) first_simd = i;
                if (is_quantised(t))
                    CHECK_MSG(same_bits(res[0][i], res[0][0], ne1 * nt), "%s [%lld x %lld] %s != reference",
                              ekv_dtype_name(t), (long long)ne1, (long long)ne0, k_isas[i]);
                else
                    CHECK_MSG(same_bits(res[0][i], res[0][first_simd], ne1 * nt), "%s %s != %s", ekv_dtype_name(t),
                              k_isas[i], k_isas[first_simd]);
                double worst = 0;
                for (int64_t o = 0; o < ne1 * nt; o++) {
                    double as;
                    dot_d(wd + (o % ne1) * ne0, xd + (o / ne1) * ne0, ne0, &as);
                    worst = fmax(worst, fabs(res[0][i][o] - res[0][0][o]) / (as + 1e-30));
                }
                CHECK_MSG(worst < 2e-6 * sqrt((double)ne0), "%s simd vs ref rel err %g", ekv_dtype_name(t), worst);
            }
            /* get_row */
            int64_t r = ne1 / 2;
            CHECK_OK(ekv_weight_get_row(&w, r, xd));
            CHECK(same_bits(xd, wd + r * ne0, ne0));
            for (int l = 0; l < 2; l++)
                for (int i = 0; i < N_ISA; i++) free(res[l][i]);
            free(wf); free(wd); free(wq); free(wt); free(x); free(xd); free(xq);
        }
    }
}

static void test_products(void) {
    /* the comparisons below are only meaningful when the levels run */
    for (int i = 0; i < N_ISA; i++) {
        const bool runs = i <= (int)ekv_cpu_isa() && (i != EKV_ISA_AVXVNNI || ekv_kernels_set_isa("avxvnni"));
        CHECK(ekv_kernels_set_isa(k_isas[i]) == runs);
        if (!runs) fprintf(stderr, "note: this CPU does not run %s: that path is not tested here\n", k_isas[i]);
    }
    CHECK(!ekv_kernels_set_isa("sse9"));
    ekv_kernels_set_isa(k_isas[ekv_cpu_isa()]);
    CHECK(strcmp(ekv_kernels_isa(), k_isas[ekv_cpu_isa()]) == 0);
    ekv_kernels_use_reference(true);
    CHECK(strcmp(ekv_kernels_isa(), "reference") == 0);
    ekv_kernels_use_reference(false);
    struct ekv_pool *pools[4] = {NULL};
    for (int i = 1; i < 4; i++) CHECK_OK(ekv_pool_new(i, &pools[i]));
    for (size_t i = 0; i < EKV_ARRAY_LEN(k_types); i++) {
        CHECK(ekv_dtype_can_compute(k_types[i]));
        test_products_type(k_types[i], pools);
    }
    ekv_kernels_use_reference(false);
    CHECK(!ekv_dtype_can_compute(EKV_Q2_K) && !ekv_dtype_can_compute(EKV_Q8_K) &&
          !ekv_dtype_can_compute((enum ekv_dtype)99));
    /* repack refuses what it cannot lay out */
    uint8_t q8[32 * 34] = {0};
    struct ekv_weight wp = {.type = EKV_Q8_0, .ne0 = 32, .ne1 = 32, .row_bytes = 34, .data = q8};
    CHECK(ekv_weight_can_repack(&wp));
    wp.ne1 = 24;
    CHECK(!ekv_weight_can_repack(&wp) && ekv_weight_repack(&wp, q8) == EKV_ERR_INVALID_ARG);
    wp.ne1 = 32;
    wp.type = EKV_F16;
    CHECK(!ekv_weight_can_repack(&wp));
    wp.type = EKV_Q8_0;
    wp.row_bytes = 36;
    CHECK(!ekv_weight_can_repack(&wp));
    /* in place */
    wp.row_bytes = 34;
    for (int i = 0; i < (int)sizeof q8; i++) q8[i] = (uint8_t)(i * 7);
    float before[32], after[32];
    CHECK_OK(ekv_weight_get_row(&wp, 5, before));
    CHECK_OK(ekv_weight_repack(&wp, q8));
    CHECK(!ekv_weight_can_repack(&wp));
    CHECK_OK(ekv_weight_get_row(&wp, 5, after));
    CHECK(same_bits(before, after, 32));
    /* errors */
    float x[64] = {0}, y[4];
    uint8_t data[4 * 64 * 4] = {0};
    struct ekv_weight w = {.type = EKV_Q2_K, .ne0 = 256, .ne1 = 1, .row_bytes = 84, .data = data};
    CHECK(ekv_matvec(NULL, &w, x, y) == EKV_ERR_UNSUPPORTED);
    struct ekv_weight w2 = {.type = EKV_F32, .ne0 = 64, .ne1 = 4, .row_bytes = 100, .data = data}; /* rows need 256 bytes */
    CHECK(ekv_matvec(NULL, &w2, x, y) == EKV_ERR_INVALID_ARG);
    struct ekv_weight w3 = {.type = EKV_Q8_0, .ne0 = 48, .ne1 = 4, .row_bytes = 64, .data = data}; /* 48 not a multiple of 32 */
    CHECK(ekv_matvec(NULL, &w3, x, y) == EKV_ERR_INVALID_ARG);
    struct ekv_weight w4 = {.type = EKV_F32, .ne0 = 64, .ne1 = 4, .row_bytes = 256, .data = data};
    CHECK(ekv_weight_get_row(&w4, 4, y) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_weight_get_row(&w4, -1, y) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_matmul(NULL, &w4, x, -1, y) == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_matmul(NULL, &w4, x, 0, y));
    for (int i = 1; i < 4; i++) ekv_pool_free(pools[i]);
}

/* ------------------------------------------------------------------ */
/* Element-wise ops against double formulas, on both paths. */
static void test_ops(void) {
    const int64_t sizes[] = {1, 7, 8, 33, 4096};
    for (int simd = 0; simd < 2; simd++) {
        ekv_kernels_use_reference(!simd);
        for (size_t si = 0; si < EKV_ARRAY_LEN(sizes); si++) {
            const int64_t n = sizes[si];
            float *a = malloc(n * 4), *b = malloc(n * 4), *w = malloc(n * 4), *o = malloc(n * 4), *c = malloc(n * 4);
            fill(a, n, 3.0f);
            fill(b, n, 3.0f);
            fill(w, n, 1.5f);
            double as, e = dot_d(a, b, n, &as);
            CHECK_MSG(fabs(ekv_dot_f32(a, b, n) - e) <= 1e-6 * sqrt((double)n) * as + 1e-30, "dot n=%lld", (long long)n);
            /* axpy */
            memcpy(c, b, n * 4);
            ekv_axpy_f32(c, 0.75f, a, n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) bad += fabs(c[i] - (b[i] + 0.75 * a[i])) > 1e-6 * (fabs(b[i]) + fabs(a[i]));
            CHECK(bad == 0);
            /* add */
            memcpy(c, b, n * 4);
            ekv_add(c, a, n);
            bad = 0;
            for (int64_t i = 0; i < n; i++) bad += c[i] != b[i] + a[i];
            CHECK(bad == 0);
            /* rmsnorm: y = x / sqrt(mean(x^2) + eps) * w, rel 1e-6 */
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)a[i] * a[i];
            double sc = 1.0 / sqrt(ss / n + 1e-5);
            ekv_rmsnorm(o, a, w, n, 1e-5f);
            bad = 0;
            for (int64_t i = 0; i < n; i++) bad += fabs(o[i] - a[i] * sc * w[i]) > 1e-6 * fabs(a[i] * sc * w[i]) + 1e-7;
            CHECK_MSG(bad == 0, "rmsnorm n=%lld %s: %d bad", (long long)n, ekv_kernels_isa(), bad);
            /* layernorm */
            double mean = 0, var = 0;
            for (int64_t i = 0; i < n; i++) mean += a[i];
            mean /= n;
            for (int64_t i = 0; i < n; i++) var += (a[i] - mean) * (a[i] - mean);
            var /= n;
            ekv_layernorm(o, a, w, b, n, 1e-5f);
            bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double r = (a[i] - mean) / sqrt(var + 1e-5) * w[i] + b[i];
                bad += fabs(o[i] - r) > 1e-5 * (fabs(r) + 1);
            }
            CHECK_MSG(bad == 0, "layernorm n=%lld: %d bad", (long long)n, bad);
            ekv_layernorm(o, a, NULL, NULL, n, 1e-5f);
            CHECK(fabs(o[0] - (a[0] - mean) / sqrt(var + 1e-5)) < 1e-5 * (1 + fabs(o[0])));
            /* softmax (scaled up so that the max subtraction matters) */
            for (int64_t i = 0; i < n; i++) c[i] = a[i] * 30.0f + 60.0f;
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < n; i++) mx = fmax(mx, c[i]);
            for (int64_t i = 0; i < n; i++) sum += exp((double)c[i] - mx);
            memcpy(o, c, n * 4);
            ekv_softmax(o, n);
            bad = 0;
            double tot = 0;
            for (int64_t i = 0; i < n; i++) {
                double r = exp((double)c[i] - mx) / sum;
                /* the kernel forms x - max in float: an absolute error of up to
                 * |x - max| 2^-24 in the exponent, i.e. relative in the result */
                bad += fabs(o[i] - r) > (2e-6 + fabs(c[i] - mx) * 0x1p-24) * r + 1e-37;
                tot += o[i];
            }
            CHECK_MSG(bad == 0, "softmax n=%lld %s: %d bad", (long long)n, ekv_kernels_isa(), bad);
            CHECK(fabs(tot - 1.0) < 1e-5);
            /* swiglu */
            ekv_swiglu(o, a, b, n);
            bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double r = a[i] / (1.0 + exp(-(double)a[i])) * b[i];
                bad += fabs(o[i] - r) > 2e-6 * fabs(r) + 1e-7;
            }
            CHECK_MSG(bad == 0, "swiglu n=%lld %s: %d bad", (long long)n, ekv_kernels_isa(), bad);
            /* gelu */
            memcpy(o, a, n * 4);
            ekv_gelu(o, n);
            bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double v = a[i], r = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
                bad += fabs(o[i] - r) > 2e-6 * fabs(r) + 1e-7;
            }
            CHECK_MSG(bad == 0, "gelu n=%lld: %d bad", (long long)n, bad);
            free(a); free(b); free(w); free(o); free(c);
        }
    }
    ekv_kernels_use_reference(false);
    /* softmax extremes: one huge value, and -inf entries (masked) */
    float s[9] = {0, 1000, 0, -INFINITY, 0, 0, 0, 0, 0};
    ekv_softmax(s, 9);
    CHECK(s[1] == 1.0f && s[0] == 0.0f && s[3] == 0.0f);
    float g[3] = {-100.0f, 0.0f, 100.0f}, u[3] = {1, 1, 1}, o3[3];
    ekv_swiglu(o3, g, u, 3);
    CHECK(fabsf(o3[0]) < 1e-30f && o3[1] == 0.0f && o3[2] == 100.0f);

    /* RoPE: 3 heads of 10 dims, rope_dim 8, against a double formula */
    for (int neox = 0; neox < 2; neox++) {
        float x[30], x0[30];
        fill(x0, 30, 1.0f);
        memcpy(x, x0, sizeof(x));
        const int64_t pos = 1234;
        ekv_rope(x, 3, 10, 8, pos, 10000.0f, neox);
        int bad = 0;
        for (int h = 0; h < 3; h++) {
            const float *v = x0 + h * 10;
            for (int i = 0; i < 4; i++) {
                double th = pos * pow(10000.0, -2.0 * i / 8);
                int i0 = neox ? i : 2 * i, i1 = neox ? i + 4 : 2 * i + 1;
                double r0 = v[i0] * cos(th) - v[i1] * sin(th), r1 = v[i0] * sin(th) + v[i1] * cos(th);
                bad += fabs(x[h * 10 + i0] - r0) > 1e-6 || fabs(x[h * 10 + i1] - r1) > 1e-6;
            }
            bad += x[h * 10 + 8] != v[8] || x[h * 10 + 9] != v[9]; /* dims >= rope_dim untouched */
        }
        CHECK_MSG(bad == 0, "rope neox=%d: %d bad", neox, bad);
        /* the two-step form gives the same bits */
        float y[30], cs[8];
        memcpy(y, x0, sizeof(y));
        ekv_rope_sincos(cs, 8, pos, 10000.0f);
        ekv_rope_apply(y, 3, 10, 8, cs, neox);
        CHECK(same_bits(x, y, 30));
        /* position 0 is the identity */
        memcpy(x, x0, sizeof(x));
        ekv_rope(x, 3, 10, 8, 0, 10000.0f, neox);
        CHECK(same_bits(x, x0, 30));
    }
    /* the dot of a rotated q and k depends only on the distance */
    float q[8], k[8], q1[8], k1[8];
    fill(q, 8, 1.0f);
    fill(k, 8, 1.0f);
    memcpy(q1, q, 32); memcpy(k1, k, 32);
    ekv_rope(q1, 1, 8, 8, 10, 500000.0f, false);
    ekv_rope(k1, 1, 8, 8, 3, 500000.0f, false);
    float d1 = ekv_dot_f32(q1, k1, 8);
    memcpy(q1, q, 32); memcpy(k1, k, 32);
    ekv_rope(q1, 1, 8, 8, 1007, 500000.0f, false);
    ekv_rope(k1, 1, 8, 8, 1000, 500000.0f, false);
    CHECK_NEAR(d1, ekv_dot_f32(q1, k1, 8), 1e-5);
}

/* ------------------------------------------------------------------ */
/* ekv_weights_repack_mapped on a read-only file mapping: Q8_0 repacked,
 * F16 copied as it is, a tied view of the F16 bytes follows them (one
 * copy in the arena), and products give the same bits as from the file. */
static void test_repack_mapped(void) {
    char path[] = "/tmp/ekv-test-repack-XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const int64_t ne0 = 64, ne1 = 32;
    const size_t f16_bytes = (size_t)(ne0 * ne1) * 2, q8_bytes = (size_t)ne1 * 2 * 34;
    const size_t q8_off = 4096, total = q8_off + q8_bytes;
    uint8_t *img = calloc(1, total);
    float *wf = malloc((size_t)(ne0 * ne1) * sizeof(float));
    fill(wf, ne0 * ne1, 0.5f);
    for (int64_t r = 0; r < ne1; r++) {
        CHECK_OK(ekv_quantize_row(EKV_F16, wf + r * ne0, img + (size_t)r * (size_t)ne0 * 2, ne0));
        CHECK_OK(ekv_quantize_row(EKV_Q8_0, wf + r * ne0, img + q8_off + (size_t)r * 68, ne0));
    }
    CHECK(write(fd, img, total) == (ssize_t)total);
    void *map = mmap(NULL, total, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(map != MAP_FAILED);
    close(fd);
    unlink(path);
    if (map == MAP_FAILED) return;
    struct ekv_weight f16 = {.type = EKV_F16, .ne0 = ne0, .ne1 = ne1, .row_bytes = (size_t)ne0 * 2, .data = map};
    struct ekv_weight tied = f16;
    struct ekv_weight q8 = {.type = EKV_Q8_0, .ne0 = ne0, .ne1 = ne1, .row_bytes = 68, .data = (char *)map + q8_off};
    float x[64], before[2][32], after[3][32];
    fill(x, ne0, 2.0f);
    CHECK_OK(ekv_matvec(NULL, &f16, x, before[0]));
    CHECK_OK(ekv_matvec(NULL, &q8, x, before[1]));
    struct ekv_weight *ws[3] = {&f16, &q8, &tied};
    struct ekv_repack_arena arena;
    CHECK_OK(ekv_weights_repack_mapped(ws, 3, &arena));
    const char *lo = arena.base, *hi = lo + arena.bytes;
    CHECK_MSG(arena.bytes == ((f16_bytes + 63) & ~(size_t)63) + ((q8_bytes + 63) & ~(size_t)63),
              "arena %zu bytes: one copy of each matrix expected", arena.bytes);
    CHECK(f16.layout == EKV_LAYOUT_ROWS && tied.data == f16.data && tied.layout == EKV_LAYOUT_ROWS);
    CHECK(q8.layout == EKV_LAYOUT_X16);
    CHECK((const char *)f16.data >= lo && (const char *)f16.data < hi && (const char *)q8.data >= lo &&
          (const char *)q8.data < hi);
    CHECK(memcmp(f16.data, img, f16_bytes) == 0);
    CHECK_OK(ekv_matvec(NULL, &f16, x, after[0]));
    CHECK_OK(ekv_matvec(NULL, &q8, x, after[1]));
    CHECK_OK(ekv_matvec(NULL, &tied, x, after[2]));
    CHECK(same_bits(before[0], after[0], 32) && same_bits(before[1], after[1], 32) && same_bits(before[0], after[2], 32));
    /* the file's bytes read again through the released mapping are intact */
    CHECK(memcmp(map, img, total) == 0);
    ekv_repack_arena_free(&arena);
    ekv_repack_arena_free(NULL);
    munmap(map, total);
    free(wf);
    free(img);
    /* an arena of 2 MiB or more starts on a 2 MiB boundary (huge pages) */
    const int64_t bn0 = 1024, bn1 = 1040;
    const size_t bb = (size_t)(bn0 * bn1) * 2;
    uint16_t *big = malloc(bb);
    for (size_t i = 0; i < bb / 2; i++) big[i] = (uint16_t)(0x3C00u ^ (i & 0x3FFu));
    char bpath[] = "/tmp/ekv-test-repack-big-XXXXXX";
    const int bfd = mkstemp(bpath);
    CHECK(bfd >= 0 && write(bfd, big, bb) == (ssize_t)bb);
    void *bmap = bfd >= 0 ? mmap(NULL, bb, PROT_READ, MAP_PRIVATE, bfd, 0) : MAP_FAILED;
    if (bfd >= 0) close(bfd);
    unlink(bpath);
    CHECK(bmap != MAP_FAILED);
    if (bmap != MAP_FAILED) {
        struct ekv_weight bw = {.type = EKV_F16, .ne0 = bn0, .ne1 = bn1, .row_bytes = (size_t)bn0 * 2, .data = bmap};
        struct ekv_weight *bws[1] = {&bw};
        CHECK_OK(ekv_weights_repack_mapped(bws, 1, &arena));
        CHECK(arena.bytes == bb && ((uintptr_t)arena.base & (((uintptr_t)2 << 20) - 1)) == 0 && bw.data == arena.base);
        CHECK(memcmp(bw.data, big, bb) == 0);
        ekv_repack_arena_free(&arena);
        munmap(bmap, bb);
    }
    free(big);
}

int main(void) {
    test_fp16();
    test_bf16();
    test_pool();
    test_codecs();
    test_layouts();
    test_products();
    test_repack_mapped();
    test_ops();
    return test_finish("test_kernels");
}
