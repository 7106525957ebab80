/*
 * test_attention.c — the AVX2 attention-with-statistics path against the
 * plain-C reference and a double-precision computation, on random data of
 * odd sizes (query heads R, head sizes d that are multiples of 8 with and
 * without a 64-column block, key counts that are and are not multiples of
 * the 8-key group and the 128-key block):
 *   - probabilities within 2e-6 absolute of the double softmax (scores up
 *     to |s| ~ 15; ekv_exp8 is about 2 ulp from expf) and within 2e-6 of
 *     the reference path;
 *   - outputs within 4e-6 * (1 + |o|) of the double result (sums of
 *     probability-weighted values in [-1, 1));
 *   - statistics (all six kinds) equal to the reference's bit for bit, both
 *     from ekv_attn_accumulate and from a whole attention row;
 *   - outputs bit-identical whatever statistics are requested;
 *   - a key's score does not depend on how many keys follow it (same
 *     probabilities ratio in a prefill row and a longer decode row);
 *   - the dispatcher picks the reference when forced;
 *   - the AVX-512 path (when the CPU has it) equals the AVX2 path bit for
 *     bit: probabilities, outputs and statistics, over head counts 1-9,
 *     head sizes with and without 16- and 64-column blocks (256 = Gemma), key counts
 *     around the 16-key group and the blocks, scores up to |s| ~ 150 (exp
 *     underflow to 0), and with the kernels capped at AVX2 the dispatcher
 *     gives the same bits;
 *   - a logit bias on the key view (elastic-v2:bias=1): reference and AVX2
 *     against the double computation with the bias (the bounds above),
 *     AVX2 within 2e-6 of the reference, AVX-512 == AVX2 bit for bit, an
 *     all-zero bias == no bias bit for bit, a bias of log 2 on one key ==
 *     that key stored twice (outputs within 2e-6 (1 + |o|), its probability
 *     within 1e-6 of the two copies' sum), and the bias follows the view's
 *     first row (a sliding window's view == the same rows from 0).
 * Skipped (reported) on CPUs without AVX2/FMA/F16C.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"
#include "testutil.h"

static uint64_t g_rng = 0xA77E17;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* bias: [n] logit biases added after the scale, or NULL */
static void ref_double(const float *q, int R, int d, const float *k, const float *v, int n, double scale,
                       const float *bias, double *p, double *o) {
    for (int h = 0; h < R; h++) {
        double mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int c = 0; c < d; c++) s += (double)q[h * d + c] * k[j * d + c];
            p[h * n + j] = s * scale + (bias ? (double)bias[j] : 0.0);
            mx = fmax(mx, p[h * n + j]);
        }
        double sum = 0;
        for (int j = 0; j < n; j++) sum += (p[h * n + j] = exp(p[h * n + j] - mx));
        for (int j = 0; j < n; j++) p[h * n + j] /= sum;
        for (int c = 0; c < d; c++) {
            double acc = 0;
            for (int j = 0; j < n; j++) acc += p[h * n + j] * v[j * d + c];
            o[h * d + c] = acc;
        }
    }
}

struct stats_buf {
    double colsum[512], sumsq[512], winsum[512], sz, stot;
    int32_t count[512];
    float lastrow[512], bincount[512];
};

static struct ekv_attn_stats stats_of(struct stats_buf *b, unsigned flags, float sp) {
    struct ekv_attn_stats st = {.flags = flags, .colsum = b->colsum, .count = b->count, .sumsq = b->sumsq,
                                .lastrow = b->lastrow, .winsum = b->winsum, .bincount = b->bincount,
                                .sparse_zero = &b->sz, .sparse_total = &b->stot, .sparsity_p = sp};
    return st;
}

static void test_row(int R, int d, int n) {
    const size_t qd = (size_t)R * d, kd = (size_t)n * d, pn = (size_t)R * n;
    float *q = malloc(qd * 4), *k = malloc(kd * 4), *v = malloc(kd * 4);
    float *o1 = malloc(qd * 4), *o2 = malloc(qd * 4), *o3 = malloc(qd * 4);
    float *p1 = malloc(pn * 4), *p2 = malloc(pn * 4), *p3 = malloc(pn * 4);
    double *rp = malloc(pn * 8), *ro = malloc(qd * 8);
    const float qs = 3.0f * 8.0f / sqrtf((float)d); /* scores spread over about +-15 */
    for (size_t i = 0; i < qd; i++) q[i] = qs * frand();
    for (size_t i = 0; i < kd; i++) k[i] = frand();
    for (size_t i = 0; i < kd; i++) v[i] = frand();
    const float scale = 1.0f / sqrtf((float)d);
    ekv_attn_row_ref(q, R, d, k, v, n, scale, o1, p1, NULL);
    ekv_attn_row_avx2(q, R, d, k, v, n, scale, o2, p2, NULL);
    ref_double(q, R, d, k, v, n, (double)scale, NULL, rp, ro);
    double pe = 0, pe_ref = 0, oe = 0;
    for (size_t i = 0; i < pn; i++) {
        pe = fmax(pe, fabs(p2[i] - rp[i]));
        pe_ref = fmax(pe_ref, fabs(p2[i] - p1[i]));
    }
    for (size_t i = 0; i < qd; i++) oe = fmax(oe, fabs(o2[i] - ro[i]) / (1.0 + fabs(ro[i])));
    CHECK_MSG(pe < 2e-6, "R=%d d=%d n=%d: probability error %g vs double", R, d, n, pe);
    CHECK_MSG(pe_ref < 2e-6, "R=%d d=%d n=%d: probability difference %g vs reference", R, d, n, pe_ref);
    CHECK_MSG(oe < 4e-6, "R=%d d=%d n=%d: output error %g vs double", R, d, n, oe);

    /* statistics: bit-identical to the reference fed the same probabilities,
     * and the output does not change when they are requested */
    if (n <= 512) {
        static struct stats_buf a, b;
        for (float sp = 0.01f; sp < 0.5f; sp += 0.2f) {
            memset(&a, 0, sizeof a);
            memset(&b, 0, sizeof b);
            for (int i = 0; i < n; i++) a.colsum[i] = b.colsum[i] = 0.25 * i; /* non-zero start */
            struct ekv_attn_stats sa = stats_of(&a, 0x3f, sp), sb = stats_of(&b, 0x3f, sp);
            ekv_attn_row_avx2(q, R, d, k, v, n, scale, o3, p3, &sa);
            ekv_attn_accumulate_ref(p3, R, n, &sb);
            CHECK(memcmp(o2, o3, qd * 4) == 0);
            CHECK(memcmp(p2, p3, pn * 4) == 0);
            CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "R=%d d=%d n=%d: statistics differ from the reference", R,
                      d, n);
            CHECK(a.stot == (double)R * n);
        }
    }
    free(q); free(k); free(v); free(o1); free(o2); free(o3); free(p1); free(p2); free(p3); free(rp); free(ro);
}

/* Hand-made rows with ties at the ScissorHands threshold and equal values
 * for the sparsity maximum: the two accumulators agree bit for bit. */
static void test_accumulate_ties(void) {
    static float P[3 * 37];
    for (int h = 0; h < 3; h++)
        for (int j = 0; j < 37; j++) P[h * 37 + j] = (j % 3 == h) ? 1.0f / 37.0f : (j % 5) * 0.01f;
    static struct stats_buf a, b;
    struct ekv_attn_stats sa = stats_of(&a, 0x3f, 0.5f), sb = stats_of(&b, 0x3f, 0.5f);
    for (int rep = 0; rep < 3; rep++) {
        ekv_attn_accumulate_avx2(P, 3, 37, &sa);
        ekv_attn_accumulate_ref(P, 3, 37, &sb);
    }
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK(a.count[0] == 3 && a.count[36] == 3);
    /* key 0: head 0 exactly at 1/37, heads 1 and 2 at 0 -> one of three heads, three times */
    CHECK_NEAR(a.bincount[0], 1.0, 1e-6);
    /* flags 0 and NULL stats touch nothing */
    static struct stats_buf c;
    struct ekv_attn_stats sc = stats_of(&c, 0, 0.5f);
    ekv_attn_accumulate_avx2(P, 3, 37, &sc);
    ekv_attn_accumulate_avx2(P, 3, 37, NULL);
    static const struct stats_buf zero;
    CHECK(memcmp(&c, &zero, sizeof c) == 0);
}

/* The score of key j does not depend on the number of keys after it: in a
 * row over n keys and a row over n + 5, p_i / p_0 agree to rounding of the
 * normalisation only (scores identical, so the exp ratios are identical). */
static void test_score_position_independent(void) {
    enum { R = 2, D = 64, N = 21 };
    static float q[R * D], k[(N + 5) * D], v[(N + 5) * D], o[R * D], pa[R * N], pb[R * (N + 5)];
    for (int i = 0; i < R * D; i++) q[i] = frand();
    for (int i = 0; i < (N + 5) * D; i++) k[i] = frand(), v[i] = frand();
    ekv_attn_row_avx2(q, R, D, k, v, N, 0.125f, o, pa, NULL);
    ekv_attn_row_avx2(q, R, D, k, v, N + 5, 0.125f, o, pb, NULL);
    double worst = 0;
    for (int h = 0; h < R; h++)
        for (int j = 1; j < N; j++) {
            double ra = (double)pa[h * N + j] / pa[h * N], rb = (double)pb[h * (N + 5) + j] / pb[h * (N + 5)];
            worst = fmax(worst, fabs(ra - rb) / rb);
        }
    CHECK_MSG(worst < 3e-7, "score ratios differ by %g", worst);
}

static void test_dispatch(void) {
    enum { R = 2, D = 16, N = 11 };
    static float q[R * D], k[N * D], v[N * D], o1[R * D], o2[R * D], p1[R * N], p2[R * N];
    for (int i = 0; i < R * D; i++) q[i] = frand();
    for (int i = 0; i < N * D; i++) k[i] = frand(), v[i] = frand();
    ekv_kernels_use_reference(true);
    ekv_attn_row(q, R, D, k, v, N, 0.25f, o1, p1, NULL);
    ekv_kernels_use_reference(false);
    ekv_attn_row_ref(q, R, D, k, v, N, 0.25f, o2, p2, NULL);
    CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(p1, p2, sizeof p1) == 0);
    ekv_attn_row(q, R, D, k, v, N, 0.25f, o1, p1, NULL);
    ekv_attn_row_avx2(q, R, D, k, v, N, 0.25f, o2, p2, NULL);
    CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(p1, p2, sizeof p1) == 0);
    /* a head size that is not a multiple of 8 takes the reference */
    static float q6[6], k6[3 * 6], v6[3 * 6], oa[6], ob[6], pa[3], pb[3];
    for (int i = 0; i < 6; i++) q6[i] = frand();
    for (int i = 0; i < 18; i++) k6[i] = frand(), v6[i] = frand();
    ekv_attn_row(q6, 1, 6, k6, v6, 3, 0.5f, oa, pa, NULL);
    ekv_attn_row_ref(q6, 1, 6, k6, v6, 3, 0.5f, ob, pb, NULL);
    CHECK(memcmp(oa, ob, sizeof oa) == 0);
}

static struct ekv_kv_view f32_view(const float *x, int d, int32_t n) {
    return (struct ekv_kv_view){.type = EKV_KV_F32, .d = d, .n = n, .nq = n, .data = (const uint8_t *)(const void *)x,
                                .row_bytes = (size_t)d * sizeof(float)};
}

/* AVX-512 == AVX2 bit for bit (one shape). */
static bool avx512_same(int R, int d, int n, float qs) {
    const size_t qd = (size_t)R * d, kd = (size_t)n * d, pn = (size_t)R * n;
    float *q = malloc(qd * 4), *k = malloc(kd * 4), *v = malloc(kd * 4);
    float *o1 = malloc(qd * 4), *o2 = malloc(qd * 4), *p1 = malloc(pn * 4), *p2 = malloc(pn * 4);
    for (size_t i = 0; i < qd; i++) q[i] = qs * frand();
    for (size_t i = 0; i < kd; i++) k[i] = frand(), v[i] = frand();
    const struct ekv_kv_view kw = f32_view(k, d, n), vw = f32_view(v, d, n);
    static struct stats_buf b1, b2;
    memset(&b1, 0, sizeof b1);
    memset(&b2, 0, sizeof b2);
    const unsigned all = EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_WINSUM | EKV_STAT_BINCOUNT |
                         EKV_STAT_SPARSITY;
    struct ekv_attn_stats s1 = stats_of(&b1, all, 0.01f), s2 = stats_of(&b2, all, 0.01f);
    const bool big = n > 512; /* stats_buf holds 512 keys */
    ekv_attn_row_kv_avx2(q, R, &kw, &vw, n, 1.0f / sqrtf((float)d), o1, p1, NULL, big ? NULL : &s1);
    ekv_attn_row_kv_avx512(q, R, &kw, &vw, n, 1.0f / sqrtf((float)d), o2, p2, NULL, big ? NULL : &s2);
    bool same = memcmp(o1, o2, qd * 4) == 0 && memcmp(p1, p2, pn * 4) == 0 && memcmp(&b1, &b2, sizeof b1) == 0;
    if (!same) printf("AVX-512 differs from AVX2: R %d, d %d, n %d, q scale %g\n", R, d, n, (double)qs);
    free(q), free(k), free(v), free(o1), free(o2), free(p1), free(p2);
    return same;
}

static void test_avx512(void) {
    if (ekv_cpu_isa() < EKV_ISA_AVX512) {
        printf("test_attention: CPU without AVX-512, AVX-512 path not tested\n");
        return;
    }
    static const int Rs[] = {1, 2, 3, 4, 5, 8, 9};
    static const int Ds[] = {8, 16, 24, 64, 72, 80, 128, 256};
    static const int Ns[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 300, 1031};
    int bad = 0, runs = 0;
    for (size_t a = 0; a < sizeof Rs / sizeof Rs[0]; a++)
        for (size_t b = 0; b < sizeof Ds / sizeof Ds[0]; b++)
            for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++) {
                const float qs = (c & 1) ? 3.0f * 8.0f / sqrtf((float)Ds[b]) : 30.0f * 8.0f / sqrtf((float)Ds[b]);
                bad += !avx512_same(Rs[a], Ds[b], Ns[c], qs);
                runs++;
            }
    CHECK_MSG(bad == 0, "AVX-512 attention differs from AVX2 in %d of %d shapes", bad, runs);
    /* the dispatcher: AVX-512 level, and capped at AVX2, give the same bits */
    enum { R = 8, D = 64, N = 77 };
    static float q[R * D], k[N * D], v[N * D], o1[R * D], o2[R * D], p1[R * N], p2[R * N];
    for (int i = 0; i < R * D; i++) q[i] = frand();
    for (int i = 0; i < N * D; i++) k[i] = frand(), v[i] = frand();
    CHECK(ekv_kernels_set_isa("avx2"));
    ekv_attn_row(q, R, D, k, v, N, 0.125f, o1, p1, NULL);
    CHECK(ekv_kernels_set_isa("avx512"));
    ekv_attn_row(q, R, D, k, v, N, 0.125f, o2, p2, NULL);
    CHECK(memcmp(o1, o2, sizeof o1) == 0 && memcmp(p1, p2, sizeof p1) == 0);
    printf("test_attention: AVX-512 == AVX2 bit for bit in %d shapes\n", runs);
}

/* The reference, AVX2 and (when the CPU has it) AVX-512 rows over f32 views. */
typedef void (*row_kv_fn)(const float *, int, const struct ekv_kv_view *, const struct ekv_kv_view *, int32_t, float,
                          float *, float *, float *, const struct ekv_attn_stats *);

static void test_bias_shape(int R, int d, int n) {
    const size_t qd = (size_t)R * d, kd = (size_t)n * d, pn = (size_t)R * n;
    float *q = malloc(qd * 4), *k = malloc(kd * 4), *v = malloc(kd * 4), *bias = malloc((size_t)n * 4);
    float *zero = calloc((size_t)n, 4);
    float *o[4], *p[4];
    for (int i = 0; i < 4; i++) o[i] = malloc(qd * 4), p[i] = malloc(pn * 4);
    double *rp = malloc(pn * 8), *ro = malloc(qd * 8);
    const float qs = 3.0f * 8.0f / sqrtf((float)d), scale = 1.0f / sqrtf((float)d);
    for (size_t i = 0; i < qd; i++) q[i] = qs * frand();
    for (size_t i = 0; i < kd; i++) k[i] = frand(), v[i] = frand();
    for (int j = 0; j < n; j++) bias[j] = j % 3 ? 1.5f * (frand() + 1.0f) : 0.0f; /* log(w) of w up to e^3 */
    struct ekv_kv_view kw = f32_view(k, d, n);
    const struct ekv_kv_view vw = f32_view(v, d, n);
    kw.bias = bias;
    ref_double(q, R, d, k, v, n, (double)scale, bias, rp, ro);
    const bool has512 = ekv_cpu_isa() >= EKV_ISA_AVX512;
    const row_kv_fn fns[3] = {ekv_attn_row_kv_ref, ekv_attn_row_kv_avx2, ekv_attn_row_kv_avx512};
    for (int f = 0; f < (has512 ? 3 : 2); f++) {
        fns[f](q, R, &kw, &vw, n, scale, o[f], p[f], NULL, NULL);
        double pe = 0, oe = 0;
        for (size_t i = 0; i < pn; i++) pe = fmax(pe, fabs(p[f][i] - rp[i]));
        for (size_t i = 0; i < qd; i++) oe = fmax(oe, fabs(o[f][i] - ro[i]) / (1.0 + fabs(ro[i])));
        CHECK_MSG(pe < 2e-6 && oe < 4e-6, "bias, path %d, R=%d d=%d n=%d: probability error %g, output error %g", f,
                  R, d, n, pe, oe);
        /* an all-zero bias is no bias, bit for bit */
        struct ekv_kv_view kz = kw;
        kz.bias = zero;
        fns[f](q, R, &kz, &vw, n, scale, o[3], p[3], NULL, NULL);
        kz.bias = NULL;
        float *o4 = malloc(qd * 4), *p4 = malloc(pn * 4);
        fns[f](q, R, &kz, &vw, n, scale, o4, p4, NULL, NULL);
        CHECK_MSG(memcmp(o[3], o4, qd * 4) == 0 && memcmp(p[3], p4, pn * 4) == 0,
                  "zero bias differs from none, path %d, R=%d d=%d n=%d", f, R, d, n);
        free(o4), free(p4);
    }
    double pd = 0;
    for (size_t i = 0; i < pn; i++) pd = fmax(pd, fabs(p[1][i] - p[0][i]));
    CHECK_MSG(pd < 2e-6, "bias: AVX2 vs reference probabilities differ by %g (R=%d d=%d n=%d)", pd, R, d, n);
    if (has512)
        CHECK_MSG(memcmp(o[1], o[2], qd * 4) == 0 && memcmp(p[1], p[2], pn * 4) == 0,
                  "bias: AVX-512 differs from AVX2 (R=%d d=%d n=%d)", R, d, n);
    free(q), free(k), free(v), free(bias), free(zero), free(rp), free(ro);
    for (int i = 0; i < 4; i++) free(o[i]), free(p[i]);
}

/* log 2 on key J == key J stored twice; the bias follows view.first. */
static void test_bias_duplicate_and_window(void) {
    enum { R = 3, D = 64, N = 37, J = 5, LO = 7 };
    static float q[R * D], k[N * D], v[N * D], k2[(N + 1) * D], v2[(N + 1) * D], bias[N];
    static float oa[R * D], ob[R * D], pa[R * N], pb[R * (N + 1)];
    for (int i = 0; i < R * D; i++) q[i] = 2.0f * frand();
    for (int i = 0; i < N * D; i++) k[i] = frand(), v[i] = frand();
    for (int j = 0, r = 0; j < N; j++) /* k2, v2: row J twice */
        for (int c = 0; c < (j == J ? 2 : 1); c++, r++) {
            memcpy(k2 + r * D, k + j * D, D * 4);
            memcpy(v2 + r * D, v + j * D, D * 4);
        }
    bias[J] = logf(2.0f);
    struct ekv_kv_view kw = f32_view(k, D, N);
    const struct ekv_kv_view vw = f32_view(v, D, N), kd = f32_view(k2, D, N + 1), vd = f32_view(v2, D, N + 1);
    kw.bias = bias;
    const bool has512 = ekv_cpu_isa() >= EKV_ISA_AVX512;
    const row_kv_fn fns[3] = {ekv_attn_row_kv_ref, ekv_attn_row_kv_avx2, ekv_attn_row_kv_avx512};
    for (int f = 0; f < (has512 ? 3 : 2); f++) {
        fns[f](q, R, &kw, &vw, N, 0.125f, oa, pa, NULL, NULL);
        fns[f](q, R, &kd, &vd, N + 1, 0.125f, ob, pb, NULL, NULL);
        double oe = 0, pe = 0;
        for (int i = 0; i < R * D; i++) oe = fmax(oe, fabs(oa[i] - ob[i]) / (1.0 + fabs(ob[i])));
        for (int h = 0; h < R; h++)
            pe = fmax(pe, fabs(pa[h * N + J] - (pb[h * (N + 1) + J] + pb[h * (N + 1) + J + 1])));
        CHECK_MSG(oe < 2e-6 && pe < 1e-6, "path %d: log 2 bias vs duplicated key: output %g, probability %g", f, oe,
                  pe);
        /* a window's view (first = LO) == the rows from LO with the bias from LO */
        for (int j = 0; j < N; j++) bias[j] = (float)(j % 4) * 0.5f;
        struct ekv_kv_view kf = kw, vf = vw;
        kf.first = vf.first = LO;
        struct ekv_kv_view ks = f32_view(k + LO * D, D, N - LO);
        const struct ekv_kv_view vs = f32_view(v + LO * D, D, N - LO);
        ks.bias = bias + LO;
        fns[f](q, R, &kf, &vf, N - LO, 0.125f, oa, pa, NULL, NULL);
        fns[f](q, R, &ks, &vs, N - LO, 0.125f, ob, pb, NULL, NULL);
        CHECK_MSG(memcmp(oa, ob, sizeof oa) == 0 && memcmp(pa, pb, (size_t)R * (N - LO) * 4) == 0,
                  "path %d: the bias does not follow view.first", f);
        memset(bias, 0, sizeof bias);
        bias[J] = logf(2.0f);
    }
}

int main(void) {
    if (!ekv_cpu_has_avx2()) {
        printf("test_attention: CPU without AVX2/FMA/F16C, SIMD path not tested\n");
        return test_finish("test_attention");
    }
    static const int Rs[] = {1, 3, 8};
    static const int Ds[] = {8, 24, 64, 72, 128};
    static const int Ns[] = {1, 2, 7, 8, 9, 63, 127, 128, 129, 300, 1031};
    for (size_t a = 0; a < sizeof Rs / sizeof Rs[0]; a++)
        for (size_t b = 0; b < sizeof Ds / sizeof Ds[0]; b++)
            for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++) test_row(Rs[a], Ds[b], Ns[c]);
    test_accumulate_ties();
    test_score_position_independent();
    test_dispatch();
    test_avx512();
    static const int bR[] = {1, 3, 8}, bD[] = {8, 64, 72}, bN[] = {1, 9, 129, 300};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t c = 0; c < 4; c++) test_bias_shape(bR[a], bD[b], bN[c]);
    test_bias_duplicate_and_window();
    return test_finish("test_attention");
}
