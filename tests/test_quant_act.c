/*
 * test_quant_act.c — the AVX2 Q8_0x activation quantisers (used before
 * every Q8_0/Q4_0 product on the SIMD paths) against the reference
 * ekv_quant_q8_0 (values, scale) and ekv_quant_q8_0x_ref, bit for bit:
 * random blocks over many magnitudes, an all-zero block, blocks whose
 * scale is exactly 1 with every value on a rounding tie (k + 0.5, which
 * roundf sends away from zero and round-to-even would not), negative zeros,
 * blocks with a NaN or an infinity (zeros), and lengths of 1 to 9 blocks.
 * Skipped (reported) without AVX2.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"
#include "kernels/quant.h"
#include "testutil.h"

static uint64_t g_rng = 0x0AC7;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void same(const float *x, int64_t n, const char *what) {
    static struct ekv_block_q8_0 a[16];
    static struct ekv_block_q8_0x b[16], r[16];
    memset(a, 0x55, sizeof a);
    memset(b, 0x55, sizeof b);
    memset(r, 0x55, sizeof r);
    ekv_quant_q8_0(x, a, n);
    ekv_quant_q8_0x_avx2(x, b, n);
    int bad = 0;
    for (int64_t i = 0; i < n / EKV_QK8_0; i++) {
        int32_t sum = 0;
        for (int j = 0; j < EKV_QK8_0; j++) sum += a[i].qs[j];
        bad += memcmp(a[i].qs, b[i].qs, EKV_QK8_0) != 0;
        bad += b[i].d != ekv_fp16_to_f32(a[i].d);
        bad += b[i].s != sum;
    }
    CHECK_MSG(bad == 0, "%s: %lld values quantise differently (%d blocks)", what, (long long)n, bad);
    ekv_quant_q8_0x_ref(x, r, n);
    CHECK_MSG(memcmp(r, b, (size_t)(n / EKV_QK8_0) * sizeof r[0]) == 0, "%s: q8_0x reference differs", what);
}

int main(void) {
    if (!ekv_cpu_has_avx2()) {
        printf("test_quant_act: CPU without AVX2/FMA/F16C, SIMD path not tested\n");
        return test_finish("test_quant_act");
    }
    static float x[16 * EKV_QK8_0];
    for (int nb = 1; nb <= 9; nb++)
        for (int sc = -20; sc <= 20; sc += 4) {
            for (int i = 0; i < nb * EKV_QK8_0; i++) x[i] = ldexpf(frand(), sc);
            same(x, nb * EKV_QK8_0, "random");
        }
    memset(x, 0, sizeof x);
    same(x, 2 * EKV_QK8_0, "zeros");
    for (int i = 0; i < EKV_QK8_0; i++) x[i] = -0.0f;
    same(x, EKV_QK8_0, "negative zeros");
    /* scale exactly 1 (amax 127): ties k + 0.5 of both signs */
    for (int i = 0; i < EKV_QK8_0; i++) x[i] = (i % 2 ? -1.0f : 1.0f) * ((float)(i * 3 % 120) + 0.5f);
    x[7] = 127.0f;
    same(x, EKV_QK8_0, "ties");
    struct ekv_block_q8_0x q;
    ekv_quant_q8_0x_avx2(x, &q, EKV_QK8_0);
    CHECK(q.qs[0] == 1 && q.qs[1] == -4); /* 0.5 -> 1, -3.5 -> -4 (away from zero) */
    /* a block with a NaN or an infinity has no codes: zeros, d = 0, s = 0, on both paths (its
     * sum was the wrapped sum of INT_MIN lanes, which the Q4_0 correction then overflowed) */
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 2 * EKV_QK8_0; i++) x[i] = frand();
        x[EKV_QK8_0 + 5 + k] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
        same(x, 2 * EKV_QK8_0, "non-finite");
        struct ekv_block_q8_0x z[2];
        ekv_quant_q8_0x_avx2(x, z, 2 * EKV_QK8_0);
        int nz = 0;
        for (int j = 0; j < EKV_QK8_0; j++) nz += z[1].qs[j] != 0;
        CHECK_MSG(z[1].d == 0.0f && z[1].s == 0 && nz == 0 && z[0].d > 0.0f, "non-finite block %d: d %g s %d", k,
                  (double)z[1].d, (int)z[1].s);
    }
    return test_finish("test_quant_act");
}
