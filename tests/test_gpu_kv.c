/*
 * test_gpu_kv.c — the KV cache's storage types on a real Vulkan device
 * (lavapipe in CI, under the validation layer: any message fails;
 * EKV_TEST_DEVICE=vulkan:N picks another), split from test_gpu.c:
 *
 * - the device's quantisers (rope_store's q8_0/q4_0 rows, kivi.comp's KIVI
 *   keys and values) against the CPU's, bit for bit;
 * - attention reading every storage layout built on the host (codes, the
 *   KIVI ring, the forward's scratch) against the CPU's attention;
 * - whole models with every storage type for K and V, GPU against CPU.
 *
 * EKV_GPU_TEST_ONLY=kv_quant,attn_read,kv_types runs only those parts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "ekv_eval.h"
#include "engine/backend_vk.h"
#include "engine/engine.h"
#include "gpu/vk.h"
#include "gpu/vk_push.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"
#include "gputest.h"
#include "testutil.h"

static char g_dev[32];

/* Values a quantiser may meet: random, ties exactly halfway between codes,
 * constant stretches, zeros, a large outlier. */
static float kv_value(int i) {
    switch (i % 11) {
    case 0: return 0.0f;
    case 1: return 2.5f;  /* with amax 127 in its block: q8_0's d = 1, a tie for roundf */
    case 2: return -3.5f;
    case 3: return 127.0f;
    case 4: return 0.25f;
    default: return 4.0f * gt_frand();
    }
}

/* The device's quantisers against the CPU's, bit for bit: rope_store
 * (q8_0, q4_0 rows) and kivi.comp (KIVI keys per channel over groups,
 * values per entry over channel groups; sources in the ring and in the
 * forward's scratch), on values with exact ties and constant groups, and
 * test_kvquant.c's hand-worked KIVI key vector. */
static void test_kv_quantisers(void) {
    struct ekv_vk *vk = NULL;
    CHECK_OK(ekv_vk_open(g_dev, &vk));
    if (!vk) return;
    if (!ekv_vk_has_f64(vk)) {
        printf("%s: no shaderFloat64, quantised caches stay on the CPU\n", ekv_vk_name(vk));
        ekv_vk_close(vk);
        return;
    }
    enum { H = 2, C = 40, D = 64, ROWS = 24, E0 = 7 };
    /* row types: ROWS rows of [H][D] into entries E0.. of a cache of C */
    float *x = malloc(sizeof(float) * ROWS * H * D);
    for (int i = 0; i < ROWS * H * D; i++) x[i] = kv_value(i) * ((i / 7) % 3 == 0 ? -1.0f : 1.0f);
    for (int i = 0; i < D; i++) x[5 * H * D + i] = 1.5f; /* a constant row */
    struct ekv_vk_buf src;
    CHECK_OK(ekv_vk_buf_new(vk, sizeof(float) * ROWS * H * D, false, "src", &src));
    CHECK_OK(ekv_vk_upload(vk, &src, 0, x, sizeof(float) * ROWS * H * D));
    /* one rope_store dispatch (no rotation, no query heads): keys as q8_0, values as q4_0 */
    const enum ekv_kv_type rt[2] = {EKV_KV_Q8_0, EKV_KV_Q4_0};
    struct ekv_vk_buf dst[2];
    size_t p0[2], bytes[2];
    for (int ti = 0; ti < 2; ti++) {
        p0[ti] = (size_t)H * C * (ti == 0 ? D : D / 2);
        bytes[ti] = p0[ti] + (size_t)H * C * (D / 32) * 2 + 4;
        CHECK_OK(ekv_vk_buf_new(vk, bytes[ti], false, "dst", &dst[ti]));
    }
    struct ekv_vk_pc_rope_store pc = {.k = src.addr, .v = src.addr, .kdst = dst[0].addr, .vdst = dst[1].addr,
                                      .n_head = 0, .H = H, .D = D, .rows = ROWS, .kv_stride = H * D,
                                      .k_hstride = C, .k_e0 = E0, .v_hstride = C, .v_e0 = E0};
    const enum ekv_vk_pipe rsp = ekv_vk_rope_store_pipe(rt[0], rt[1]);
    CHECK_OK(ekv_vk_prepare(vk, rsp));
    CHECK_OK(ekv_vk_begin(vk));
    ekv_vk_dispatch(vk, rsp, &pc, sizeof pc, ROWS, H, 1);
    CHECK_OK(ekv_vk_submit(vk));
    for (int ti = 0; ti < 2; ti++) {
        const bool q8 = rt[ti] == EKV_KV_Q8_0;
        const size_t rowb = q8 ? D : D / 2, blk = q8 ? sizeof(struct ekv_block_q8_0) : sizeof(struct ekv_block_q4_0);
        uint8_t *got = malloc(bytes[ti]), *want = malloc(blk * (D / 32));
        CHECK_OK(ekv_vk_download(vk, &dst[ti], 0, got, bytes[ti]));
        int bad = 0;
        for (int r = 0; r < ROWS; r++)
            for (int h = 0; h < H; h++) {
                const size_t ent = (size_t)h * C + E0 + r;
                if (q8) ekv_quant_q8_0(x + ((size_t)r * H + h) * D, want, D);
                else ekv_quant_q4_0(x + ((size_t)r * H + h) * D, want, D);
                for (int b = 0; b < D / 32; b++) {
                    const uint8_t *wb = want + b * blk;
                    bad += memcmp(got + p0[ti] + (ent * (D / 32) + b) * 2, wb, 2) != 0;
                    bad += memcmp(got + ent * rowb + b * (rowb / (D / 32)), wb + 2, blk - 2) != 0;
                }
            }
        CHECK_MSG(bad == 0, "rope_store %s: %d blocks differ from the CPU's", ekv_kv_type_name(rt[ti]), bad);
        ekv_vk_buf_free(vk, &dst[ti]);
        free(got), free(want);
    }
    /* KIVI: entries [0, N) of which [0, P) in the ring (TC = P) and [P, N)
     * in the scratch; keys in groups of G from 0, values every entry */
    enum { N = 32, P = 12, G = 8 };
    uint16_t *h16 = malloc(sizeof(uint16_t) * N * H * D);
    float *xf = malloc(sizeof(float) * N * H * D); /* [h][j][c]: what the CPU quantises (fp16 values) */
    for (int h = 0; h < H; h++)
        for (int j = 0; j < N; j++)
            for (int c = 0; c < D; c++) {
                float v = kv_value(j * 13 + c * 5 + h) * ((c + j) % 4 == 0 ? -1.0f : 1.0f);
                if (c == 0) v = (float[]){0.0f, 0.25f, 0.9f, 1.5f}[j % 4]; /* KIVI: s .5, q [0,0,2,3] at G 4 */
                if (c == 1) v = 3.0f;                                      /* a constant channel */
                h16[((size_t)h * N + j) * D + c] = ekv_f32_to_fp16(v);
                xf[((size_t)h * N + j) * D + c] = ekv_fp16_to_f32(h16[((size_t)h * N + j) * D + c]);
            }
    for (int bits = 2; bits <= 4; bits += 2)
        for (int is_v = 0; is_v < 2; is_v++) {
            const size_t rw = D * bits / 32;
            const size_t p0w = (size_t)H * C * rw;
            const size_t pw = is_v ? (size_t)H * C * (D / G) : (size_t)H * ((C + G - 1) / G) * D;
            const size_t r0w = p0w + ((pw + 1) & ~(size_t)1), words = r0w + (size_t)H * P * D / 2;
            struct ekv_vk_buf base, scr;
            CHECK_OK(ekv_vk_buf_new(vk, words * 4, false, "kivi", &base));
            CHECK_OK(ekv_vk_buf_new(vk, sizeof(uint16_t) * H * (N - P) * D, false, "scratch", &scr));
            uint16_t *ring = malloc(sizeof(uint16_t) * H * P * D), *sc = malloc(sizeof(uint16_t) * H * (N - P) * D);
            for (int h = 0; h < H; h++) {
                for (int j = 0; j < P; j++) /* slot j % TC, TC = P */
                    memcpy(ring + ((size_t)h * P + j) * D, h16 + ((size_t)h * N + j) * D, 2 * D);
                for (int j = P; j < N; j++)
                    memcpy(sc + ((size_t)h * (N - P) + j - P) * D, h16 + ((size_t)h * N + j) * D, 2 * D);
            }
            CHECK_OK(ekv_vk_upload(vk, &base, r0w * 4, ring, sizeof(uint16_t) * H * P * D));
            CHECK_OK(ekv_vk_upload(vk, &scr, 0, sc, sizeof(uint16_t) * H * (N - P) * D));
            const enum ekv_vk_pipe pp = is_v ? (bits == 2 ? EKV_VK_KIVI_VALUES2 : EKV_VK_KIVI_VALUES4)
                                             : (bits == 2 ? EKV_VK_KIVI_KEYS2 : EKV_VK_KIVI_KEYS4);
            struct ekv_vk_pc_kivi pc = {.base = base.addr, .scr = scr.addr, .H = H, .C = C, .D = D, .G = G, .TC = P,
                                        .pos0 = P, .j0 = 0, .n = is_v ? N : N / G, .scr_stride = N - P};
            CHECK_OK(ekv_vk_prepare(vk, pp));
            CHECK_OK(ekv_vk_begin(vk));
            ekv_vk_dispatch(vk, pp, &pc, sizeof pc, pc.n, H, 1);
            CHECK_OK(ekv_vk_submit(vk));
            uint8_t *got = malloc(words * 4);
            CHECK_OK(ekv_vk_download(vk, &base, 0, got, words * 4));
            uint8_t want[4096];
            int bad = 0;
            for (int h = 0; h < H; h++) {
                if (is_v) {
                    const size_t cb = (size_t)G * bits / 8;
                    for (int j = 0; j < N; j++) {
                        ekv_kivi_quant_vrow(xf + ((size_t)h * N + j) * D, D, G, bits, want);
                        for (int g = 0; g < D / G; g++) {
                            const uint8_t *w = want + g * (4 + cb);
                            bad += memcmp(got + (p0w + ((size_t)h * C + j) * (D / G) + g) * 4, w, 4) != 0;
                            bad += memcmp(got + ((size_t)h * C + j) * rw * 4 + g * cb, w + 4, cb) != 0;
                        }
                    }
                } else {
                    for (int gi = 0; gi < N / G; gi++) {
                        ekv_kivi_quant_kgroup(xf + ((size_t)h * N + gi * G) * D, G, D, bits, want);
                        const uint16_t *ws = (const uint16_t *)(const void *)want;
                        for (int c = 0; c < D; c++) {
                            uint32_t pw2 = (uint32_t)ws[c] | ((uint32_t)ws[D + c] << 16), g32;
                            memcpy(&g32, got + (p0w + ((size_t)h * ((C + G - 1) / G) + gi) * D + c) * 4, 4);
                            bad += g32 != pw2;
                        }
                        bad += memcmp(got + ((size_t)h * C + gi * G) * rw * 4, want + (size_t)D * 4,
                                      (size_t)G * rw * 4) != 0;
                    }
                }
            }
            CHECK_MSG(bad == 0, "KIVI%d %s: %d groups differ from the CPU's", bits, is_v ? "values" : "keys", bad);
            free(got), free(ring), free(sc);
            ekv_vk_buf_free(vk, &base), ekv_vk_buf_free(vk, &scr);
        }
    CHECK_MSG(ekv_vk_validation_errors(vk) == 0, "%llu validation messages, first: %s",
              (unsigned long long)ekv_vk_validation_errors(vk), ekv_vk_validation_first(vk));
    printf("KV quantisers (q8_0, q4_0, KIVI 2/4 keys and values): the CPU's codes bit for bit\n");
    free(h16), free(xf), free(x);
    ekv_vk_buf_free(vk, &src);
    ekv_vk_close(vk);
}

/* One side of a cache built on the host in kvq.glsl's layout (written here
 * independently of the shaders: if the two disagree, the test below fails)
 * from the floats x [H][E][D]: entries [0, nq) stored in the type (KIVI:
 * codes), [nq, pos0) in the KIVI ring (slot j % tc), [pos0, E) in the
 * scratch scr [H][E - pos0][D] (fp16). deq gets what the CPU reads. */
enum { AT_H = 2, AT_C = 64, AT_D = 64, AT_G = 8 };
static uint8_t *build_side(enum ekv_kv_type t, bool is_v, const float *x, int E, int nq, int pos0, int tc,
                           size_t *bytes, uint16_t *scr, float *deq) {
    const int H = AT_H, C = AT_C, D = AT_D, G = AT_G;
    const bool kivi = ekv_kv_type_is_kivi(t);
    const int bits = t == EKV_KV_KIVI2 ? 2 : 4;
    const int rwi = t == EKV_KV_F32 ? D : t == EKV_KV_F16 ? D / 2 : t == EKV_KV_Q8_0 ? D / 4 : t == EKV_KV_Q4_0 ? D / 8
                                                                                        : D * bits / 32;
    const size_t rw = (size_t)rwi;
    const size_t p0 = (size_t)H * C * rw;
    size_t pw = 0;
    if (t == EKV_KV_Q8_0 || t == EKV_KV_Q4_0) pw = ((size_t)H * C * (D / 32) + 1) / 2;
    else if (kivi) pw = is_v ? (size_t)H * C * (D / G) : (size_t)H * ((C + G - 1) / G) * D;
    const size_t r0 = p0 + ((pw + 1) & ~(size_t)1), words = r0 + (kivi ? (size_t)H * tc * D / 2 : 0);
    uint8_t *b = calloc(words, 4);
    *bytes = words * 4;
    uint8_t tmp[4096];
    for (int h = 0; h < H; h++) {
        const float *xh = x + (size_t)h * E * D;
        float *dh = deq + (size_t)h * E * D;
        for (int j = 0; j < E; j++) {
            const float *xj = xh + (size_t)j * D;
            float *dj = dh + (size_t)j * D;
            uint8_t *row = b + ((size_t)h * C + j) * rw * 4;
            if (kivi && j >= nq) { /* full precision: ring or scratch */
                uint16_t *dst = j < pos0 ? (uint16_t *)(void *)(b + r0 * 4) + ((size_t)h * tc + j % tc) * D
                                         : scr + ((size_t)h * (E - pos0) + j - pos0) * D;
                for (int c = 0; c < D; c++) dst[c] = ekv_f32_to_fp16(xj[c]), dj[c] = ekv_fp16_to_f32(dst[c]);
            } else if (t == EKV_KV_F32) {
                memcpy(row, xj, 4 * D), memcpy(dj, xj, 4 * D);
            } else if (t == EKV_KV_F16) {
                for (int c = 0; c < D; c++) {
                    uint16_t v = ekv_f32_to_fp16(xj[c]);
                    memcpy(row + 2 * c, &v, 2), dj[c] = ekv_fp16_to_f32(v);
                }
            } else if (t == EKV_KV_Q8_0 || t == EKV_KV_Q4_0) {
                const bool q8 = t == EKV_KV_Q8_0;
                const size_t blk = q8 ? sizeof(struct ekv_block_q8_0) : sizeof(struct ekv_block_q4_0);
                (q8 ? ekv_quant_q8_0 : ekv_quant_q4_0)(xj, tmp, D);
                (q8 ? ekv_dequant_q8_0 : ekv_dequant_q4_0)(tmp, dj, D);
                for (int k = 0; k < D / 32; k++) {
                    memcpy(b + p0 * 4 + (((size_t)h * C + j) * (D / 32) + k) * 2, tmp + k * blk, 2);
                    memcpy(row + k * (blk - 2), tmp + k * blk + 2, blk - 2);
                }
            } else if (is_v) { /* KIVI value row: [s][mn][codes] per channel group */
                const size_t cb = (size_t)G * bits / 8;
                ekv_kivi_quant_vrow(xj, D, G, bits, tmp);
                ekv_kivi_dequant_vrow(tmp, D, G, bits, dj);
                for (int g = 0; g < D / G; g++) {
                    memcpy(b + (p0 + ((size_t)h * C + j) * (D / G) + g) * 4, tmp + g * (4 + cb), 4);
                    memcpy(row + g * cb, tmp + g * (4 + cb) + 4, cb);
                }
            } else if (j % G == 0) { /* KIVI key group of G entries from j: [s: D][mn: D][codes: G rows] */
                ekv_kivi_quant_kgroup(xj, G, D, bits, tmp);
                ekv_kivi_dequant_kgroup(tmp, D, bits, 0, G, dj);
                const uint16_t *sm = (const uint16_t *)(void *)tmp;
                for (int c = 0; c < D; c++) {
                    const uint32_t w = (uint32_t)sm[c] | ((uint32_t)sm[D + c] << 16);
                    memcpy(b + (p0 + ((size_t)h * ((C + G - 1) / G) + j / G) * D + c) * 4, &w, 4);
                }
                memcpy(row, tmp + (size_t)D * 4, (size_t)G * rw * 4);
            }
        }
    }
    return b;
}

/* attn.comp + attn_combine.comp over caches built on the host (build_side)
 * in every key type x value type, against attention in double over the
 * values the CPU reads: the shader's reading of each layout (codes, group
 * parameters, ring, scratch, quantised prefix) is exact, so only the order
 * of sums differs (bound 1e-5 of the largest output). Three query rows at
 * positions 40-42 of 43 entries, with 1, 2 and 10 query heads per KV head
 * (10: one workgroup's 8 heads and a second, partial group); KIVI: keys
 * quantised up to 32, values up to 30, the rest in the ring (16 slots) and
 * the scratch. */
static void test_attn_read(void) {
    struct ekv_vk *vk = NULL;
    CHECK_OK(ekv_vk_open(g_dev, &vk));
    if (!vk) return;
    enum { NHMAX = 10 * AT_H, ROWS = 3, POS0 = 40, E = POS0 + ROWS, TC = 16 };
    const int H = AT_H, D = AT_D;
    float *k = malloc(sizeof(float) * H * E * D), *v = malloc(sizeof(float) * H * E * D);
    float *kd = malloc(sizeof(float) * H * E * D), *vd = malloc(sizeof(float) * H * E * D);
    static float q[ROWS * NHMAX * AT_D], out[ROWS * NHMAX * AT_D];
    for (int i = 0; i < H * E * D; i++) k[i] = 2.0f * gt_frand(), v[i] = gt_frand() + (i % 7 == 0 ? 1.0f : 0.0f);
    for (int i = 0; i < ROWS * NHMAX * D; i++) q[i] = gt_frand();
    uint16_t *kscr = calloc((size_t)H * ROWS * D, 2), *vscr = calloc((size_t)H * ROWS * D, 2);
    struct ekv_vk_buf bq, bo, bpart, bks, bvs, bk, bv;
    CHECK_OK(ekv_vk_buf_new(vk, sizeof q, false, "q", &bq));
    CHECK_OK(ekv_vk_buf_new(vk, sizeof out, false, "out", &bo));
    CHECK_OK(ekv_vk_buf_new(vk, sizeof(float) * ROWS * NHMAX * (D + 2), false, "part", &bpart));
    CHECK_OK(ekv_vk_buf_new(vk, (size_t)H * ROWS * D * 2, false, "kscr", &bks));
    CHECK_OK(ekv_vk_buf_new(vk, (size_t)H * ROWS * D * 2, false, "vscr", &bvs));
    CHECK_OK(ekv_vk_upload(vk, &bq, 0, q, sizeof q));
    double worst = 0.0;
    int cases = 0;
    static const int gqa[] = {1, 2, 10};
    for (int gq = 0; gq < 3; gq++)
    for (int kt = EKV_KV_F32; kt <= EKV_KV_KIVI4; kt++)
        for (int vt = EKV_KV_F32; vt <= EKV_KV_KIVI4; vt++) {
            if (gq != 1 && kt != vt) continue; /* the other ratios: keys and values of one type */
            const int NH = gqa[gq] * H;
            size_t kb = 0, vb = 0;
            const bool kk = ekv_kv_type_is_kivi((enum ekv_kv_type)kt), vk2 = ekv_kv_type_is_kivi((enum ekv_kv_type)vt);
            const int nqk = kk ? 32 : E, nqv = vk2 ? 30 : E;
            uint8_t *hk = build_side((enum ekv_kv_type)kt, false, k, E, nqk, POS0, TC, &kb, kscr, kd);
            uint8_t *hv = build_side((enum ekv_kv_type)vt, true, v, E, nqv, POS0, TC, &vb, vscr, vd);
            CHECK_OK(ekv_vk_buf_new(vk, kb, false, "k", &bk));
            CHECK_OK(ekv_vk_buf_new(vk, vb, false, "v", &bv));
            CHECK_OK(ekv_vk_upload(vk, &bk, 0, hk, kb));
            CHECK_OK(ekv_vk_upload(vk, &bv, 0, hv, vb));
            CHECK_OK(ekv_vk_upload(vk, &bks, 0, kscr, (size_t)H * ROWS * D * 2));
            CHECK_OK(ekv_vk_upload(vk, &bvs, 0, vscr, (size_t)H * ROWS * D * 2));
            const enum ekv_vk_pipe ap = ekv_vk_attn_pipe((enum ekv_kv_type)kt, (enum ekv_kv_type)vt);
            CHECK_OK(ekv_vk_prepare(vk, ap));
            CHECK_OK(ekv_vk_prepare(vk, EKV_VK_ATTN_COMBINE));
            struct ekv_vk_pc_attn at = {.q = bq.addr, .kc = bk.addr, .vc = bv.addr, .part = bpart.addr, .kscr = bks.addr,
                                        .vscr = bvs.addr, .n_head = NH, .n_head_kv = H, .head_dim = D, .n_ctx = AT_C,
                                        .pos0 = POS0, .rows = ROWS, .q_stride = NH * D, .n_split = 1, .split_len = 128,
                                        .window = 0, .scale = 0.125f, .g = AT_G, .tc_k = kk ? TC : 0,
                                        .tc_v = vk2 ? TC : 0, .nq_k = (uint32_t)nqk, .nq_v = (uint32_t)nqv,
                                        .scr_stride = ROWS, .kv_pos0 = POS0};
            struct ekv_vk_pc_combine cb = {.part = bpart.addr, .out = bo.addr, .n_head = NH, .head_dim = D,
                                           .rows = ROWS, .n_split = 1, .out_stride = NH * D};
            CHECK_OK(ekv_vk_begin(vk));
            ekv_vk_dispatch(vk, ap, &at, sizeof at, ekv_vk_attn_groups(NH, H), ROWS, 1);
            ekv_vk_dispatch(vk, EKV_VK_ATTN_COMBINE, &cb, sizeof cb, NH, ROWS, 1);
            CHECK_OK(ekv_vk_submit(vk));
            CHECK_OK(ekv_vk_download(vk, &bo, 0, out, sizeof out));
            double maxd = 0.0, maxv = 0.0;
            for (int r = 0; r < ROWS; r++)
                for (int h = 0; h < NH; h++) {
                    const int hk2 = h / (NH / H), pos = POS0 + r;
                    double sc[E], mx = -1e300, sum = 0.0;
                    for (int j = 0; j <= pos; j++) {
                        double d = 0.0;
                        for (int c = 0; c < D; c++)
                            d += (double)q[(r * NH + h) * D + c] * kd[((size_t)hk2 * E + j) * D + c];
                        sc[j] = d * 0.125;
                        mx = fmax(mx, sc[j]);
                    }
                    for (int j = 0; j <= pos; j++) sum += (sc[j] = exp(sc[j] - mx));
                    for (int c = 0; c < D; c++) {
                        double o = 0.0;
                        for (int j = 0; j <= pos; j++) o += sc[j] / sum * vd[((size_t)hk2 * E + j) * D + c];
                        maxd = fmax(maxd, fabs(o - out[(r * NH + h) * D + c]));
                        maxv = fmax(maxv, fabs(o));
                    }
                }
            worst = fmax(worst, maxd / maxv);
            CHECK_MSG(maxd <= 1e-5 * maxv, "attn K %s V %s, %d query heads per KV head: max |gpu - ref| %.3g of %.3g",
                      ekv_kv_type_name((enum ekv_kv_type)kt), ekv_kv_type_name((enum ekv_kv_type)vt), gqa[gq], maxd,
                      maxv);
            cases++;
            ekv_vk_buf_free(vk, &bk), ekv_vk_buf_free(vk, &bv);
            free(hk), free(hv);
        }
    printf("attention over every key x value storage type (%d cases, GQA 1/2/10), stored by the host: max |gpu - ref| / "
           "max |out| %.3g\n", cases, worst);
    CHECK_MSG(ekv_vk_validation_errors(vk) == 0, "%llu validation messages, first: %s",
              (unsigned long long)ekv_vk_validation_errors(vk), ekv_vk_validation_first(vk));
    ekv_vk_buf_free(vk, &bq), ekv_vk_buf_free(vk, &bo), ekv_vk_buf_free(vk, &bpart);
    ekv_vk_buf_free(vk, &bks), ekv_vk_buf_free(vk, &bvs);
    free(k), free(v), free(kd), free(vd), free(kscr), free(vscr);
    ekv_vk_close(vk);
}

/* Every cache storage type, keys and values independently, on the GPU
 * against the CPU (the quantisers give the CPU's codes bit for bit:
 * test_kv_quantisers). KIVI with
 * a small group and residual, so that the prompt and the decode steps
 * cross several quantisation blocks; tiny-mistral adds a sliding window. */
static void test_kv_types(void) {
    static const struct {
        const char *preset;
        enum ekv_kv_type k, v;
        int32_t g, r;
    } cases[] = {
        {"tiny-llama3", EKV_KV_Q8_0, EKV_KV_Q8_0, 0, -1},  {"tiny-llama3", EKV_KV_Q4_0, EKV_KV_Q4_0, 0, -1},
        {"tiny-llama3", EKV_KV_KIVI2, EKV_KV_KIVI2, 16, 32}, {"tiny-llama3", EKV_KV_KIVI4, EKV_KV_KIVI4, 16, 32},
        {"tiny-llama3", EKV_KV_F16, EKV_KV_Q4_0, 0, -1},   {"tiny-llama3", EKV_KV_KIVI2, EKV_KV_F32, 16, 16},
        {"tiny-llama3", EKV_KV_Q8_0, EKV_KV_KIVI4, 32, 0},  {"tiny-mistral", EKV_KV_KIVI4, EKV_KV_KIVI2, 8, 24},
        {"tiny-mistral", EKV_KV_Q4_0, EKV_KV_Q8_0, 0, -1},  {"tiny-llama3", EKV_KV_F16, EKV_KV_F32, 0, -1},
    };
    const char *presets[2] = {"tiny-llama3", "tiny-mistral"};
    struct ekv_model *models[2] = {NULL, NULL};
    char paths[2][96];
    for (int i = 0; i < 2; i++) {
        char cmd[512];
        snprintf(paths[i], sizeof paths[i], "/tmp/ekv-test-gpu-%ld-kv%d.gguf", (long)getpid(), i);
        snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset %s --type f32 -o '%s' > /dev/null 2>&1", tu_bin(),
                 presets[i], paths[i]);
        CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
        CHECK_OK(ekv_model_load(paths[i], NULL, &models[i]));
    }
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        struct ekv_model *m = models[strcmp(cases[ci].preset, "tiny-llama3") != 0];
        if (!m) continue;
        struct ekv_context *cg = gt_ctx_on(m, g_dev, 512), *cc = gt_ctx_on(m, "cpu", 512);
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.type_k = cases[ci].k;
        kp.type_v = cases[ci].v;
        kp.kv_group = cases[ci].g;
        kp.kv_residual = cases[ci].r;
        struct ekv_seq *sg = NULL, *sc = NULL;
        CHECK_OK(ekv_seq_new(cg, &kp, &sg));
        CHECK_OK(ekv_seq_new(cc, &kp, &sc));
        CHECK(sg && ekv_seq_on_device(sg));
        if (!sg || !sc) {
            ekv_seq_free(sg), ekv_seq_free(sc), ekv_context_free(cg), ekv_context_free(cc);
            continue;
        }
        const int32_t V = m->info.n_vocab, N = 100, STEPS = 40;
        int32_t toks[100];
        for (int32_t i = 0; i < N; i++) toks[i] = 1 + (i * 37 + 11) % (V - 1);
        float *lg = malloc(sizeof(float) * (size_t)V * N), *lc = malloc(sizeof(float) * (size_t)V * N);
        double maxv = 0.0, maxd = gt_prompt_diff(sg, sc, toks, N, V, lg, lc, &maxv);
        double maxd_dec = 0.0;
        memmove(lc, lc + (size_t)V * (N - 1), sizeof(float) * V);
        for (int step = 0; step < STEPS; step++) { /* both follow the CPU's greedy token */
            const int32_t t = gt_argmax(lc, V);
            CHECK_OK(ekv_seq_decode(sg, t, lg));
            CHECK_OK(ekv_seq_decode(sc, t, lc));
            for (int32_t i = 0; i < V; i++) maxd_dec = fmax(maxd_dec, fabs(lg[i] - lc[i])), maxv = fmax(maxv, fabs(lc[i]));
        }
        struct ekv_kv_stats st;
        ekv_seq_kv_stats(sg, &st);
        printf("%s, K %s, V %s (G %d, R %d): %d prompt rows + %d decode steps, max |gpu - cpu| / max |logit| "
               "prompt %.3g, decode %.3g; %llu bytes on the device for %lld entries\n",
               cases[ci].preset, ekv_kv_type_name(cases[ci].k), ekv_kv_type_name(cases[ci].v), (int)cases[ci].g,
               (int)cases[ci].r, N, STEPS, maxd / maxv, maxd_dec / maxv, (unsigned long long)st.bytes,
               (long long)st.n_seen);
        /* The GPU computes keys and values in another order of sums than
         * the CPU, so a value that close to a rounding boundary of its
         * storage lands on the other side: for fp16 a last-bit change
         * (measured: up to 9.4e-6 of the largest logit), for a quantised
         * type one code step, a third of its group's range for 2-bit KIVI
         * (H200, 2026-11-26: kivi2 9.4e-4, kivi4 2.2e-4, q8_0 3.7e-6;
         * lavapipe saw no such flip in these cases). Storing and reading
         * are exact (test_kv_quantisers, test_attn_read); what this test
         * adds is the whole path — residual rule, ring, scratch, decode
         * steps — whose mistakes (an entry not quantised, a wrong slot)
         * move the logits by far more than 1e-2. */
        const bool quantised = (cases[ci].k != EKV_KV_F32 && cases[ci].k != EKV_KV_F16) ||
                               (cases[ci].v != EKV_KV_F32 && cases[ci].v != EKV_KV_F16);
        const double bound = quantised ? 1e-2 : 5e-5;
        CHECK_MSG(maxv > 0 && maxd <= bound * maxv && maxd_dec <= bound * maxv,
                  "K %s V %s: max |gpu - cpu| prompt %.3g decode %.3g of max |logit| %.3g",
                  ekv_kv_type_name(cases[ci].k), ekv_kv_type_name(cases[ci].v), maxd, maxd_dec, maxv);
        gt_check_validation(cg);
        free(lg), free(lc);
        ekv_seq_free(sg), ekv_seq_free(sc);
        ekv_context_free(cg), ekv_context_free(cc);
    }
    for (int i = 0; i < 2; i++) {
        ekv_model_free(models[i]);
        remove(paths[i]);
    }
}

int main(void) {
    if (!gt_start("test_gpu_kv", g_dev, sizeof g_dev)) return test_finish("test_gpu_kv");
    if (gt_only("kv_quant")) test_kv_quantisers();
    if (gt_only("attn_read")) test_attn_read();
    if (gt_only("kv_types")) test_kv_types();
    return test_finish("test_gpu_kv");
}
