/*
 * test_kvquant.c — the KV-cache storage types (src/kernels/kvquant.*) and
 * attention over them:
 *   - the table: names, parsing, row sizes (f16 2 B, q8_0 34 B and q4_0
 *     18 B per 32, KIVI value rows and key groups), the head_dim checks;
 *   - KIVI's quantiser on a hand-worked vector ([0,.25,.9,1.5], b=2:
 *     q = [0,0,2,3], x^ = [0,0,1,1.5]), half-to-even ties at 4 bits, the
 *     constant-group rule (q = 0, x^ = mn);
 *   - round-trip error bounds on random rows: f16 |e| <= 2^-11 |x|;
 *     q8_0 <= 0.57 * amax/127 per block (d/2 plus the fp16 rounding of d);
 *     q4_0 <= 1.01 * amax/8 (GGML q4_0 maps -amax to 7d with d = max/-8); KIVI
 *     <= s16/2 + (2^b - 1) * s * 2^-10 + |mn - mn16| per group (the last
 *     two terms are the fp16 rounding of the scale and the minimum);
 *   - the SIMD decoders equal the references bit for bit (every type,
 *     KIVI key groups of several sizes, fp16 residual);
 *   - views: any range of entries over packed KIVI key groups of mixed
 *     sizes plus an fp16 tail decodes to the concatenation of the parts;
 *   - attention over a typed view equals the f32 attention over the
 *     dequantised rows bit for bit, on the reference path and on the AVX2
 *     path (for every K type x V type, key counts across block edges), and
 *     the typed AVX2 path is within the f32 bounds of test_attention.c of
 *     the typed reference (probabilities 2e-6, outputs 4e-6 (1 + |o|));
 *   - a sliding window (view.first > 0: inside KIVI key groups, in the
 *     fp16 residual) reads the rows first.. of every type, bit for bit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"
#include "testutil.h"

static uint64_t g_rng = 0x5EED11;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static const enum ekv_kv_type k_types[] = {EKV_KV_F32, EKV_KV_F16, EKV_KV_Q8_0, EKV_KV_Q4_0, EKV_KV_KIVI2, EKV_KV_KIVI4};
#define N_TYPES 6

static void test_table(void) {
    for (int i = 0; i < N_TYPES; i++) {
        enum ekv_kv_type t = EKV_KV_DEFAULT;
        CHECK_OK(ekv_kv_type_parse(ekv_kv_type_name(k_types[i]), &t));
        CHECK(t == k_types[i]);
    }
    enum ekv_kv_type t;
    CHECK_OK(ekv_kv_type_parse("Q8_0", &t));
    CHECK(t == EKV_KV_Q8_0);
    CHECK(ekv_kv_type_parse("q8", &t) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_type_parse("f16x", &t) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "kivi2") != NULL);
    CHECK(!strcmp(ekv_kv_type_name(EKV_KV_DEFAULT), "default") && !strcmp(ekv_kv_type_name((enum ekv_kv_type)99), "unknown"));
    CHECK(ekv_kv_row_bytes(EKV_KV_F32, 64, 32) == 256 && ekv_kv_row_bytes(EKV_KV_F16, 64, 32) == 128);
    CHECK(ekv_kv_row_bytes(EKV_KV_Q8_0, 64, 32) == 68 && ekv_kv_row_bytes(EKV_KV_Q4_0, 128, 32) == 72);
    CHECK(ekv_kv_row_bytes(EKV_KV_KIVI2, 64, 32) == 2 * (4 + 8) && ekv_kv_row_bytes(EKV_KV_KIVI4, 64, 32) == 2 * (4 + 16));
    CHECK(ekv_kivi_kgroup_bytes(64, 32, 2) == 64 * 4 + 32 * 16);
    CHECK(ekv_kv_type_check(EKV_KV_Q8_0, false, 8, 32) != NULL && ekv_kv_type_check(EKV_KV_F16, false, 8, 32) == NULL);
    CHECK(ekv_kv_type_check(EKV_KV_KIVI2, true, 8, 32) != NULL);  /* values: head_dim % G */
    CHECK(ekv_kv_type_check(EKV_KV_KIVI2, false, 8, 32) == NULL); /* keys group over entries */
    CHECK(ekv_kv_type_check(EKV_KV_KIVI2, false, 6, 32) != NULL); /* 6 * 2 bits is not whole bytes */
}

static void test_kivi_vectors(void) {
    /* KIVI: key channel [0, .25, .9, 1.5], G = 4, b = 2 */
    const float x[4] = {0.0f, 0.25f, 0.9f, 1.5f};
    uint16_t s16, m16;
    uint8_t q[4];
    ekv_kivi_quant_group(x, 4, 1, 2, &s16, &m16, q);
    CHECK(ekv_fp16_to_f32(s16) == 0.5f && ekv_fp16_to_f32(m16) == 0.0f);
    CHECK(q[0] == 0 && q[1] == 0 && q[2] == 2 && q[3] == 3); /* .5 rounds to even 0 */
    /* the same through a key group of 4 entries x 4 channels (channel 1 holds the vector) */
    float kx[16], kd[16];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) kx[r * 4 + c] = c == 1 ? x[r] : (float)(r + c);
    uint8_t grp[64];
    ekv_kivi_quant_kgroup(kx, 4, 4, 2, grp);
    ekv_kivi_dequant_kgroup(grp, 4, 2, 0, 4, kd);
    CHECK(kd[1] == 0.0f && kd[5] == 0.0f && kd[9] == 1.0f && kd[13] == 1.5f);
    /* 4 bits, ties: [0, 1.5, 7.5, 15]: s = 1, 1.5 -> 2 and 7.5 -> 8 (even) */
    const float y[4] = {0.0f, 1.5f, 7.5f, 15.0f};
    ekv_kivi_quant_group(y, 4, 1, 4, &s16, &m16, q);
    CHECK(ekv_fp16_to_f32(s16) == 1.0f && q[1] == 2 && q[2] == 8 && q[3] == 15);
    /* 2 bits, ties at 0.5 and 2.5: [0, .5, 2.5, 3] -> [0, 0, 2, 3] */
    const float z[4] = {0.0f, 0.5f, 2.5f, 3.0f};
    ekv_kivi_quant_group(z, 4, 1, 2, &s16, &m16, q);
    CHECK(q[0] == 0 && q[1] == 0 && q[2] == 2 && q[3] == 3);
    /* constant group: q = 0, x^ = mn; a value row of two channel groups, one constant */
    float v[8] = {-2.5f, -2.5f, -2.5f, -2.5f, 1, 2, 3, 4}, vd[8];
    uint8_t row[2 * (4 + 1)];
    ekv_kivi_quant_vrow(v, 8, 4, 2, row);
    ekv_kivi_dequant_vrow(row, 8, 4, 2, vd);
    CHECK(vd[0] == -2.5f && vd[3] == -2.5f && row[0] == 0 && row[1] == 0 && row[4] == 0);
    CHECK(vd[4] == 1.0f && vd[7] == 4.0f);
}

/* Largest |x - x^| over a row decoded by the reference, against the type's bound. */
static void test_roundtrip(void) {
    enum { D = 64, G = 32, N = 40 };
    float x[N][D], y[N][D];
    for (int j = 0; j < N; j++)
        for (int c = 0; c < D; c++) x[j][c] = 3.0f * frand() * (1.0f + (float)(c % 7));
    for (int i = 0; i < N_TYPES; i++) {
        const enum ekv_kv_type t = k_types[i];
        const struct ekv_kv_type_traits *tr = ekv_kv_traits(t);
        bool ok = true;
        if (!tr->bits) {
            uint8_t buf[D * 4];
            for (int j = 0; j < N; j++) {
                tr->from_float(x[j], buf, D);
                tr->to_float(buf, y[j], D);
                for (int b = 0; b < D; b += 32) {
                    float amax = 0;
                    for (int c = b; c < b + 32; c++) amax = fmaxf(amax, fabsf(x[j][c]));
                    for (int c = b; c < b + 32; c++) {
                        const double e = fabs((double)x[j][c] - y[j][c]);
                        double bound = 0;
                        if (t == EKV_KV_F32) bound = 0;
                        else if (t == EKV_KV_F16) bound = ldexp(fabs(x[j][c]), -11);
                        else if (t == EKV_KV_Q8_0) bound = 0.57 * amax / 127.0; /* d/2 + 127 d 2^-11 (fp16 d) */
                        else bound = 1.01 * amax / 8.0; /* -amax clamps to 7d (d = max/-8) */
                        if (e > bound) ok = false;
                    }
                }
            }
        } else {
            /* values: per row, groups of G channels; keys: per channel over N entries */
            const int qmax = (1 << tr->bits) - 1;
            uint8_t vrow[D * 2], grp[D * 4 + N * D];
            for (int j = 0; j < N; j++) {
                ekv_kivi_quant_vrow(x[j], D, G, tr->bits, vrow);
                ekv_kivi_dequant_vrow(vrow, D, G, tr->bits, y[j]);
                for (int c0 = 0; c0 < D; c0 += G) {
                    float mn = x[j][c0], mx = x[j][c0];
                    for (int c = c0; c < c0 + G; c++) mn = fminf(mn, x[j][c]), mx = fmaxf(mx, x[j][c]);
                    const double s = (mx - mn) / qmax, s16 = ekv_fp16_to_f32(ekv_f32_to_fp16((float)s));
                    const double b = s16 / 2 + qmax * s * ldexp(1, -10) + fabs(mn - ekv_fp16_to_f32(ekv_f32_to_fp16(mn)));
                    for (int c = c0; c < c0 + G; c++) ok &= fabs((double)x[j][c] - y[j][c]) <= b;
                }
            }
            ekv_kivi_quant_kgroup(&x[0][0], N, D, tr->bits, grp);
            ekv_kivi_dequant_kgroup(grp, D, tr->bits, 0, N, &y[0][0]);
            for (int c = 0; c < D; c++) {
                float mn = x[0][c], mx = x[0][c];
                for (int j = 0; j < N; j++) mn = fminf(mn, x[j][c]), mx = fmaxf(mx, x[j][c]);
                const double s = (mx - mn) / qmax, s16 = ekv_fp16_to_f32(ekv_f32_to_fp16((float)s));
                const double b = s16 / 2 + qmax * s * ldexp(1, -10) + fabs(mn - ekv_fp16_to_f32(ekv_f32_to_fp16(mn)));
                for (int j = 0; j < N; j++) ok &= fabs((double)x[j][c] - y[j][c]) <= b;
            }
        }
        CHECK_MSG(ok, "type %s: a round trip exceeds its error bound", tr->name);
    }
}

/* A KIVI key view over groups of sizes gn (packed) plus a tail, and its rows. */
struct kivi_fixture {
    uint8_t data[8 * (64 * 4 + 64 * 32)];
    uint16_t tail[16 * 64];
    int32_t gn[4];
    float rows[128][64]; /* decoded by parts */
    struct ekv_kv_view view;
};

static void kivi_fixture_make(struct kivi_fixture *f, int bits, const int32_t *gn, int ng, int ntail) {
    enum { D = 64 };
    size_t off = 0;
    int first = 0;
    float x[64][D];
    for (int g = 0; g < ng; g++) {
        for (int r = 0; r < gn[g]; r++)
            for (int c = 0; c < D; c++) x[r][c] = frand() * (1.0f + (float)c / 8.0f);
        ekv_kivi_quant_kgroup(&x[0][0], gn[g], D, bits, f->data + off);
        ekv_kivi_dequant_kgroup(f->data + off, D, bits, 0, gn[g], &f->rows[first][0]);
        f->gn[g] = gn[g];
        off += ekv_kivi_kgroup_bytes(D, gn[g], bits);
        first += gn[g];
    }
    for (int t = 0; t < ntail; t++)
        for (int c = 0; c < D; c++) {
            f->tail[t * D + c] = ekv_f32_to_fp16(frand());
            f->rows[first + t][c] = ekv_fp16_to_f32(f->tail[t * D + c]);
        }
    f->view = (struct ekv_kv_view){.type = bits == 2 ? EKV_KV_KIVI2 : EKV_KV_KIVI4, .d = D, .g = 32, .is_v = false,
                                   .n = first + ntail, .nq = first, .data = f->data, .tail = f->tail, .ng = ng,
                                   .gn = f->gn};
}

/* The F16C encoder against ekv_f32_to_fp16 on every sign and exponent
 * with mantissas at the rounding boundaries (the 13 dropped bits just
 * below, at and above half, with an even and an odd kept part), every
 * NaN payload shape, infinities, and subnormal halves; lengths that are
 * not a multiple of 8 go through its scalar tail. */
static void test_f16_encoder(void) {
    static const uint32_t lo[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2fff, 0x3000, 0x3001,
                                  0x7fff, 0x8000, 0xf000, 0xffff, 0x7f0000, 0x7fe000, 0x7ff000, 0x7fffff, 0x400000,
                                  0x401000, 0x3ff000, 0x5a5a5a};
    enum { NL = sizeof lo / sizeof lo[0] };
    static float x[512 * NL];
    static uint16_t a[512 * NL], b[512 * NL];
    size_t n = 0;
    for (uint32_t se = 0; se < 512; se++) /* sign and exponent */
        for (size_t i = 0; i < NL; i++) {
            const uint32_t bits = se << 23 | (lo[i] & 0x7fffffu);
            memcpy(&x[n++], &bits, 4);
        }
    for (size_t i = 0; i < n; i++) a[i] = ekv_f32_to_fp16(x[i]);
    int bad = 0;
    for (size_t len = n - 5; len <= n; len++) { /* tails of 0-7 */
        memset(b, 0xAB, sizeof b);
        ekv_f32_to_f16_avx2(x, b, (int64_t)len);
        for (size_t i = 0; i < len; i++) bad += a[i] != b[i];
        for (size_t i = len; i < n; i++) bad += b[i] != 0xABAB; /* nothing written past n */
    }
    CHECK_MSG(bad == 0, "f16 encoder: %d halves differ from the reference", bad);
    /* and the row writer a cache uses, on whatever level this host runs */
    uint16_t c[64];
    ekv_kv_row_from_float(EKV_KV_F16, x + 1000, c, 64);
    CHECK(memcmp(c, a + 1000, sizeof c) == 0);
}

static void test_views_and_simd(void) {
    static struct kivi_fixture f;
    const int32_t gn[3] = {32, 5, 17};
    const bool simd = ekv_cpu_has_avx2();
    for (int bits = 2; bits <= 4; bits += 2) {
        kivi_fixture_make(&f, bits, gn, 3, 9);
        bool ok = true, ok_simd = true;
        static float out[128][64];
        const int32_t ranges[][2] = {{0, 63}, {3, 40}, {32, 37}, {36, 54}, {50, 63}, {54, 63}, {0, 1}, {20, 21}};
        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
            const int32_t j0 = ranges[r][0], j1 = ranges[r][1];
            struct ekv_kv_cursor cur = {0, 0, 0};
            ekv_kv_view_rows(&f.view, j0, j1, &out[0][0], &cur, false);
            ok &= memcmp(out, f.rows[j0], (size_t)(j1 - j0) * 64 * sizeof(float)) == 0;
            if (simd) {
                memset(out, 0, sizeof out);
                ekv_kv_view_rows(&f.view, j0, j1, &out[0][0], NULL, true);
                ok_simd &= memcmp(out, f.rows[j0], (size_t)(j1 - j0) * 64 * sizeof(float)) == 0;
            }
        }
        /* ascending calls through one cursor */
        struct ekv_kv_cursor cur = {0, 0, 0};
        for (int32_t j0 = 0; j0 < 63; j0 += 7) {
            const int32_t j1 = j0 + 7 < 63 ? j0 + 7 : 63;
            ekv_kv_view_rows(&f.view, j0, j1, &out[0][0], &cur, false);
            ok &= memcmp(out, f.rows[j0], (size_t)(j1 - j0) * 64 * sizeof(float)) == 0;
        }
        CHECK_MSG(ok, "kivi%d key view rows differ from the groups decoded one by one", bits);
        CHECK_MSG(ok_simd, "kivi%d SIMD key view rows differ from the reference", bits);
    }
    if (!simd) {
        printf("SIMD decoders skipped: this CPU has no AVX2/FMA/F16C\n");
        return;
    }
    /* row types and KIVI value rows: SIMD == reference over random rows */
    enum { D = 64, N = 37 };
    static float x[N][D], a[N][D], b[N][D];
    static uint8_t buf[N * D * 4];
    for (int j = 0; j < N; j++)
        for (int c = 0; c < D; c++) x[j][c] = 4.0f * frand();
    for (int i = 0; i < N_TYPES; i++) {
        const enum ekv_kv_type t = k_types[i];
        const struct ekv_kv_type_traits *tr = ekv_kv_traits(t);
        const size_t rb = ekv_kv_row_bytes(t, D, 32);
        for (int j = 0; j < N; j++) {
            if (tr->bits) {
                ekv_kivi_quant_vrow(x[j], D, 32, tr->bits, buf + j * rb);
                ekv_kivi_dequant_vrow(buf + j * rb, D, 32, tr->bits, a[j]);
            } else {
                tr->from_float(x[j], buf + j * rb, D);
                tr->to_float(buf + j * rb, a[j], D);
            }
        }
        ekv_kv_rows_to_float_avx2(t, buf, rb, N, D, 32, &b[0][0]);
        CHECK_MSG(memcmp(a, b, sizeof a) == 0, "type %s: SIMD rows differ from the reference", tr->name);
    }
    uint16_t h[29];
    float r1[29], r2[29];
    for (int i = 0; i < 29; i++) h[i] = ekv_f32_to_fp16(frand() * 1e-5f); /* subnormal halves too */
    for (int i = 0; i < 29; i++) r1[i] = ekv_fp16_to_f32(h[i]);
    ekv_f16_to_float_avx2(h, r2, 29);
    CHECK(memcmp(r1, r2, sizeof r1) == 0);
    test_f16_encoder();
}

/* A view of type t over n random rows (written into store); deq gets the
 * dequantised rows. KIVI keys: groups of 32 then 11 (when n allows), the
 * rest fp16; KIVI values: the last 9 rows fp16. */
static struct ekv_kv_view make_view(enum ekv_kv_type t, bool is_v, int d, int n, uint8_t *store, uint16_t *tail,
                                    int32_t *gn, float *deq) {
    const struct ekv_kv_type_traits *tr = ekv_kv_traits(t);
    struct ekv_kv_view v = {.type = t, .d = d, .g = 32, .is_v = is_v, .n = n, .nq = n, .data = store, .tail = tail};
    float *x = malloc((size_t)n * (size_t)d * sizeof *x);
    for (int i = 0; i < n * d; i++) x[i] = frand();
    if (!tr->bits) {
        v.row_bytes = ekv_kv_row_bytes(t, d, 32);
        for (int j = 0; j < n; j++) {
            tr->from_float(x + (size_t)j * d, store + (size_t)j * v.row_bytes, d);
            tr->to_float(store + (size_t)j * v.row_bytes, deq + (size_t)j * d, d);
        }
    } else if (is_v) {
        v.row_bytes = ekv_kv_row_bytes(t, d, 32);
        v.nq = n > 9 ? n - 9 : 0;
        for (int j = 0; j < v.nq; j++) {
            ekv_kivi_quant_vrow(x + (size_t)j * d, d, 32, tr->bits, store + (size_t)j * v.row_bytes);
            ekv_kivi_dequant_vrow(store + (size_t)j * v.row_bytes, d, 32, tr->bits, deq + (size_t)j * d);
        }
    } else {
        v.row_bytes = (size_t)d * (size_t)tr->bits / 8;
        size_t off = 0;
        int32_t first = 0;
        v.gn = gn;
        while (v.ng < 2 && n - first >= (v.ng == 0 ? 32 : 11)) {
            const int32_t m = v.ng == 0 ? 32 : 11;
            ekv_kivi_quant_kgroup(x + (size_t)first * d, m, d, tr->bits, store + off);
            ekv_kivi_dequant_kgroup(store + off, d, tr->bits, 0, m, deq + (size_t)first * d);
            gn[v.ng++] = m;
            off += ekv_kivi_kgroup_bytes(d, m, tr->bits);
            first += m;
        }
        v.nq = first;
    }
    for (int j = v.nq; j < n; j++)
        for (int c = 0; c < d; c++) {
            tail[(size_t)(j - v.nq) * d + c] = ekv_f32_to_fp16(x[(size_t)j * d + c]);
            deq[(size_t)j * d + c] = ekv_fp16_to_f32(tail[(size_t)(j - v.nq) * d + c]);
        }
    free(x);
    return v;
}

static void test_attention_typed(void) {
    enum { D = 64, R = 3, NMAX = 150 };
    static uint8_t ks[NMAX * D * 4], vs[NMAX * D * 4];
    static uint16_t kt[NMAX * D], vt[NMAX * D];
    static int32_t kgn[4], vgn[4];
    static float kd[NMAX * D], vd[NMAX * D], q[R * D], o1[R * D], o2[R * D], o3[R * D];
    static float p1[R * NMAX], p2[R * NMAX], p3[R * NMAX], rowbuf[EKV_ATTN_ROWS * D];
    const bool simd = ekv_cpu_has_avx2();
    const int ns[] = {1, 7, 64, 65, 150};
    bool ref_same = true, avx_same = true, near = true;
    double worst_p = 0, worst_o = 0;
    for (int ik = 0; ik < N_TYPES; ik++)
        for (int iv = 0; iv < N_TYPES; iv++)
            for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
                const int n = ns[in];
                const struct ekv_kv_view kw = make_view(k_types[ik], false, D, n, ks, kt, kgn, kd);
                const struct ekv_kv_view vw = make_view(k_types[iv], true, D, n, vs, vt, vgn, vd);
                for (int i = 0; i < R * D; i++) q[i] = 2.0f * frand();
                const float scale = 1.0f / 8.0f;
                ekv_attn_row_kv_ref(q, R, &kw, &vw, n, scale, o1, p1, rowbuf, NULL);
                ekv_attn_row_ref(q, R, D, kd, vd, n, scale, o2, p2, NULL);
                ref_same &= memcmp(o1, o2, sizeof o1) == 0 && memcmp(p1, p2, (size_t)R * n * sizeof(float)) == 0;
                if (!simd) continue;
                ekv_attn_row_kv_avx2(q, R, &kw, &vw, n, scale, o3, p3, rowbuf, NULL);
                ekv_attn_row_avx2(q, R, D, kd, vd, n, scale, o2, p2, NULL);
                avx_same &= memcmp(o3, o2, sizeof o2) == 0 && memcmp(p3, p2, (size_t)R * n * sizeof(float)) == 0;
                if (ekv_cpu_isa() >= EKV_ISA_AVX512) { /* AVX-512 over typed views == AVX2 */
                    ekv_attn_row_kv_avx512(q, R, &kw, &vw, n, scale, o2, p2, rowbuf, NULL);
                    avx_same &= memcmp(o3, o2, sizeof o2) == 0 && memcmp(p3, p2, (size_t)R * n * sizeof(float)) == 0;
                }
                for (int i = 0; i < R * n; i++) worst_p = fmax(worst_p, fabs((double)p3[i] - p1[i]));
                for (int i = 0; i < R * D; i++) worst_o = fmax(worst_o, fabs((double)o3[i] - o1[i]) / (1 + fabs(o1[i])));
            }
    near = worst_p <= 2e-6 && worst_o <= 4e-6;
    CHECK_MSG(ref_same, "typed reference attention differs from f32 attention over the dequantised rows");
    if (simd) {
        CHECK_MSG(avx_same, "typed AVX2 attention differs from f32 AVX2 attention over the dequantised rows");
        CHECK_MSG(near, "typed AVX2 vs reference: probabilities %.3g, outputs %.3g", worst_p, worst_o);
        printf("typed attention, AVX2 vs reference: max |dp| %.3g, max |do|/(1+|o|) %.3g\n", worst_p, worst_o);
    } else {
        printf("AVX2 attention skipped: this CPU has no AVX2/FMA/F16C\n");
    }
}

/* A sliding window (Mistral) hides the entries before view.first: attention
 * over entries [lo, n) of a typed view equals the f32 attention over the
 * dequantised rows lo.. bit for bit, for every K type x V type, with lo
 * inside the first KIVI key group, inside the second (of 11 entries) and in
 * the fp16 residual, on the reference path and on the AVX2 path. */
static void test_attention_window(void) {
    enum { D = 64, R = 2, N = 150 };
    static uint8_t ks[N * D * 4], vs[N * D * 4];
    static uint16_t kt[N * D], vt[N * D];
    static int32_t kgn[4], vgn[4];
    static float kd[N * D], vd[N * D], q[R * D], o1[R * D], o2[R * D];
    static float p1[R * N], p2[R * N], rowbuf[EKV_ATTN_ROWS * D];
    const bool simd = ekv_cpu_has_avx2();
    const int los[] = {5, 37, 45, 149};
    int bad_ref = 0, bad_avx = 0, cases = 0;
    for (int ik = 0; ik < N_TYPES; ik++)
        for (int iv = 0; iv < N_TYPES; iv++) {
            struct ekv_kv_view kw = make_view(k_types[ik], false, D, N, ks, kt, kgn, kd);
            struct ekv_kv_view vw = make_view(k_types[iv], true, D, N, vs, vt, vgn, vd);
            for (size_t il = 0; il < sizeof los / sizeof los[0]; il++) {
                const int lo = los[il], n = N - lo;
                for (int i = 0; i < R * D; i++) q[i] = 2.0f * frand();
                kw.first = vw.first = lo;
                cases++;
                ekv_attn_row_kv_ref(q, R, &kw, &vw, n, 0.125f, o1, p1, rowbuf, NULL);
                ekv_attn_row_ref(q, R, D, kd + (size_t)lo * D, vd + (size_t)lo * D, n, 0.125f, o2, p2, NULL);
                bad_ref += memcmp(o1, o2, sizeof o1) != 0 || memcmp(p1, p2, (size_t)R * n * sizeof(float)) != 0;
                if (!simd) continue;
                ekv_attn_row_kv_avx2(q, R, &kw, &vw, n, 0.125f, o1, p1, rowbuf, NULL);
                ekv_attn_row_avx2(q, R, D, kd + (size_t)lo * D, vd + (size_t)lo * D, n, 0.125f, o2, p2, NULL);
                bad_avx += memcmp(o1, o2, sizeof o1) != 0 || memcmp(p1, p2, (size_t)R * n * sizeof(float)) != 0;
            }
        }
    CHECK_MSG(bad_ref == 0, "windowed typed reference attention differs from f32 over the rows lo.. in %d of %d cases",
              bad_ref, cases);
    CHECK_MSG(bad_avx == 0, "windowed typed AVX2 attention differs from f32 over the rows lo.. in %d of %d cases", bad_avx,
              cases);
}

int main(void) {
    test_table();
    test_kivi_vectors();
    test_roundtrip();
    test_views_and_simd();
    test_attention_typed();
    test_attention_window();
    return test_finish("test_kvquant");
}
