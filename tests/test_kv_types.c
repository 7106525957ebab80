/*
 * test_kv_types.c — the KV cache in every storage type (src/kv/store.c,
 * cache.c), without a model:
 *   - creation checks (q8_0 needs head_dim % 32, KIVI values head_dim %
 *     G, R % G) with messages naming the type;
 *   - appends read back within the type's round-trip bound, bytes are the
 *     real bytes of the type (ekv_kv_bytes == the layout's formula, equal
 *     to ekv_kv_bytes_full before any eviction), allocation covers them;
 *   - eviction moves quantised rows: kept entries read back bit for bit;
 *   - KIVI's residual rule on a hand-worked case (R = 4, m = 10:
 *     keys 0..7 quantised and 8..9 fp16, values 0..5 quantised and 6..9
 *     fp16; step 1 quantises value 6; step 2 the key block 8..11), through
 *     ekv_kv_layer_forward;
 *   - eviction inside a KIVI key group keeps the other entries' codes (bit
 *     for bit) and shrinks the group; neighbours that fit in one group are
 *     re-quantised as one (bytes drop by a header, entries move by at most
 *     the new group's half step plus fp16 rounding); other groups are
 *     untouched;
 *   - writes into a key group re-quantise that group only; merging on
 *     every type gives the weighted mean within the type's bound.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kvquant.h"
#include "kv/kv.h"
#include "testutil.h"

static uint64_t g_rng = 0x7E57;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static const enum ekv_kv_type k_types[] = {EKV_KV_F32, EKV_KV_F16, EKV_KV_Q8_0, EKV_KV_Q4_0, EKV_KV_KIVI2, EKV_KV_KIVI4};
#define N_TYPES 6

static struct ekv_kv *new_cache(int d, enum ekv_kv_type tk, enum ekv_kv_type tv, int g, int r) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.type_k = tk;
    p.type_v = tv;
    p.kv_group = g;
    p.kv_residual = r;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 2, 1, d, &p, &kv));
    return kv;
}

/* Loose per-element bound of a round trip of values in [-1, 1) for type t. */
static double type_bound(enum ekv_kv_type t) {
    switch (t) {
    case EKV_KV_F32: return 0;
    case EKV_KV_F16: return 1.0 / 2048;
    case EKV_KV_Q8_0: return 0.57 / 127;
    case EKV_KV_Q4_0: return 1.01 / 8;
    case EKV_KV_KIVI2: return 0.5 * 2.0 / 3 + 3 * (2.0 / 3) / 1024 + 1.0 / 2048;
    default: return 0.5 * 2.0 / 15 + 15 * (2.0 / 15) / 1024 + 1.0 / 2048;
    }
}

static void test_new_checks(void) {
    struct ekv_kv_params p = ekv_kv_default_params();
    struct ekv_kv *kv = NULL;
    p.type_k = EKV_KV_Q8_0;
    CHECK(ekv_kv_new(1, 2, 1, 8, &p, &kv) == EKV_ERR_INVALID_ARG && !kv);
    CHECK(strstr(ekv_last_error(), "q8_0") != NULL);
    p.type_k = EKV_KV_F16;
    p.type_v = EKV_KV_KIVI2;
    CHECK(ekv_kv_new(1, 2, 1, 8, &p, &kv) == EKV_ERR_INVALID_ARG); /* values: head_dim 8 % G 32 */
    p.kv_group = 8;
    p.kv_residual = 12;
    CHECK(ekv_kv_new(1, 2, 1, 8, &p, &kv) == EKV_ERR_INVALID_ARG); /* R % G */
    p.kv_residual = 16;
    CHECK_OK(ekv_kv_new(1, 2, 1, 8, &p, &kv));
    if (kv) CHECK(kv->params.type_k == EKV_KV_F16 && kv->params.type_v == EKV_KV_KIVI2 && kv->params.kv_group == 8);
    ekv_kv_free(kv);
    kv = NULL;
    p.type_v = (enum ekv_kv_type)42;
    CHECK(ekv_kv_new(1, 2, 1, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    p = ekv_kv_default_params();
    CHECK_OK(ekv_kv_new(1, 2, 1, 8, &p, &kv));
    if (kv) CHECK(kv->params.type_k == ekv_kv_type_default() && kv->params.kv_residual == 128);
    ekv_kv_free(kv);
}

/* Appends n random rows ([-1, 1)) to head h of layer 0; k/v get them. */
static void append_rows(struct ekv_kv *kv, int n, float *k, float *v) {
    const int d = kv->head_dim;
    struct ekv_kv_head *h = &kv->layers[0].heads[0];
    CHECK_OK(ekv_kv_reserve(kv, 0, n));
    for (int j = 0; j < n; j++) {
        for (int c = 0; c < d; c++) {
            k[j * d + c] = frand();
            v[j * d + c] = frand();
        }
        ekv_kv_head_append(kv, h, k + j * d, v + j * d, h->len ? h->pos[h->len - 1] + 1 : 0, 0, NULL);
    }
}

static void test_types_roundtrip_bytes(void) {
    enum { D = 64, N = 300 };
    static float k[N * D], v[N * D], rk[N * D], rv[N * D];
    for (int i = 0; i < N_TYPES; i++) {
        const enum ekv_kv_type t = k_types[i];
        struct ekv_kv *kv = new_cache(D, t, t, 32, 128);
        if (!kv) continue;
        struct ekv_kv_head *h = &kv->layers[0].heads[0];
        append_rows(kv, N, k, v);
        CHECK_OK(ekv_kv_flush(kv, 0));
        CHECK_OK(ekv_kv_head_gather(kv, h, NULL, N, rk, rv));
        double worst = 0;
        for (int j = 0; j < N * D; j++) worst = fmax(worst, fmax(fabs(k[j] - rk[j]), fabs(v[j] - rv[j])));
        CHECK_MSG(worst <= type_bound(t), "%s: round trip error %.3g > %.3g", ekv_kv_type_name(t), worst, type_bound(t));
        /* real bytes of the layout */
        uint64_t want;
        if (ekv_kv_type_is_kivi(t)) {
            const int b = ekv_kv_traits(t)->bits;
            /* keys: 256 quantised in 8 groups, 44 fp16; values: 172 quantised rows, 128 fp16 */
            want = 8 * ekv_kivi_kgroup_bytes(D, 32, b) + 44 * 2 * D + 172 * ekv_kv_row_bytes(t, D, 32) + 128 * 2 * D;
            CHECK(h->ks.nq == 256 && h->vs.nq == 172 && h->ks.ng == 8);
        } else {
            want = 2ull * N * ekv_kv_row_bytes(t, D, 32);
        }
        CHECK_MSG(ekv_kv_bytes(kv) == want && ekv_kv_bytes_full(kv, N) == want, "%s: %llu bytes, want %llu (full %llu)",
                  ekv_kv_type_name(t), (unsigned long long)ekv_kv_bytes(kv), (unsigned long long)want,
                  (unsigned long long)ekv_kv_bytes_full(kv, N));
        CHECK(kv->bytes_alloc >= want && kv->peak_bytes_alloc >= kv->bytes_alloc);
        /* eviction: every third entry goes; the others read back bit for bit */
        uint8_t keep[N];
        int n_keep = 0;
        for (int j = 0; j < N; j++) n_keep += keep[j] = j % 3 != 1;
        static float ek[N * D], ev[N * D];
        CHECK_OK(ekv_kv_head_keep(kv, h, keep));
        CHECK(h->len == n_keep);
        CHECK_OK(ekv_kv_head_gather(kv, h, NULL, h->len, ek, ev));
        bool same = true;
        for (int j = 0, w = 0; j < N; j++) {
            if (!keep[j]) continue;
            same &= memcmp(ek + w * D, rk + j * D, D * sizeof(float)) == 0 && memcmp(ev + w * D, rv + j * D, D * sizeof(float)) == 0;
            w++;
        }
        CHECK_MSG(same, "%s: kept entries changed on eviction", ekv_kv_type_name(t));
        CHECK(ekv_kv_bytes(kv) < want);
        /* merge: survivors get the weighted mean, within the type's bound */
        int32_t into[N];
        for (int j = 0; j < h->len; j++) into[j] = j - j % 2; /* pairs */
        CHECK_OK(ekv_kv_head_gather(kv, h, NULL, h->len, ek, ev));
        const int len0 = h->len;
        CHECK_OK(ekv_kv_head_merge(kv, h, into));
        CHECK(h->len == (len0 + 1) / 2);
        CHECK_OK(ekv_kv_head_gather(kv, h, NULL, h->len, rk, rv));
        worst = 0;
        for (int a = 0; a < h->len; a++) {
            const int j = 2 * a, m = j + 1 < len0 ? 2 : 1;
            for (int c = 0; c < D; c++) {
                const double mk = m == 2 ? (ek[j * D + c] + ek[(j + 1) * D + c]) / 2 : ek[j * D + c];
                worst = fmax(worst, fabs(mk - rk[a * D + c]));
            }
        }
        CHECK_MSG(worst <= type_bound(t) * 1.01 + 1e-6, "%s: merged keys off by %.3g", ekv_kv_type_name(t), worst);
        ekv_kv_free(kv);
    }
}

/* KIVI residual test vector: R = 4, G = 4, prefill of 10 then two decode steps. */
static void test_kivi_residual(void) {
    enum { D = 8, H = 2 };
    struct ekv_kv_params p = ekv_kv_default_params();
    p.type_k = p.type_v = EKV_KV_KIVI2;
    p.kv_group = 4;
    p.kv_residual = 4;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, H, 1, D, &p, &kv));
    if (!kv) return;
    float q[10 * H * D], k[10 * D], v[10 * D], out[10 * H * D];
    for (int i = 0; i < 10 * H * D; i++) q[i] = frand();
    for (int i = 0; i < 10 * D; i++) k[i] = frand(), v[i] = frand();
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    int64_t pos = 0;
    const int steps[3] = {10, 1, 1};
    const int32_t kq[3] = {8, 8, 12}, vq[3] = {6, 7, 8};
    for (int s = 0; s < 3; s++) {
        struct ekv_kv_step st = {.is_prompt = s == 0, .last_chunk = s == 0, .pos0 = pos, .n_new = steps[s],
                                 .prompt_len = 10};
        CHECK_OK(ekv_kv_begin(kv, &st));
        CHECK_OK(ekv_kv_layer_forward(kv, NULL, 0, &st, q, k, v, out));
        CHECK_OK(ekv_kv_end(kv, &st));
        pos += steps[s];
        CHECK_MSG(h->ks.nq == kq[s] && h->vs.nq == vq[s], "step %d: %d keys and %d values quantised, want %d and %d", s,
                  (int)h->ks.nq, (int)h->vs.nq, (int)kq[s], (int)vq[s]);
    }
    CHECK(h->len == 12 && h->ks.ng == 3);
    ekv_kv_free(kv);
}

/* Eviction inside KIVI key groups, coalescing, and writes. */
static void test_kivi_groups(void) {
    enum { D = 8, N = 24 };
    struct ekv_kv *kv = new_cache(D, EKV_KV_KIVI4, EKV_KV_F32, 8, 8);
    if (!kv) return;
    struct ekv_kv_head *h = &kv->layers[0].heads[0];
    static float k[N * D], v[N * D], r0[N * D], r1[N * D];
    append_rows(kv, N, k, v);
    CHECK_OK(ekv_kv_flush(kv, 0));
    CHECK(h->ks.nq == 24 && h->ks.ng == 3 && h->ks.gn[0] == 8);
    CHECK_OK(ekv_kv_head_gather(kv, h, NULL, N, r0, NULL));
    const uint64_t b0 = ekv_kv_bytes(kv);
    /* evict 1, 2, 5 (group 0) and 9, 10, 11, 12 (group 1) */
    uint8_t keep[N];
    for (int j = 0; j < N; j++) keep[j] = !(j == 1 || j == 2 || j == 5 || (j >= 9 && j <= 12));
    CHECK_OK(ekv_kv_head_keep(kv, h, keep));
    CHECK(h->len == 17 && h->ks.ng == 3 && h->ks.gn[0] == 5 && h->ks.gn[1] == 4 && h->ks.gn[2] == 8);
    CHECK(ekv_kv_bytes(kv) == b0 - 7 * (D * 4 / 8) - 7 * D * 4); /* 7 code rows of K (4 bits) and 7 f32 rows of V */
    CHECK_OK(ekv_kv_head_gather(kv, h, NULL, h->len, r1, NULL));
    bool same = true;
    for (int j = 0, w = 0; j < N; j++)
        if (keep[j]) same &= memcmp(r1 + (w++) * D, r0 + j * D, D * sizeof(float)) == 0;
    CHECK_MSG(same, "entries left in a key group changed on eviction");
    /* one more from group 0: 4 + 4 <= 8, the two groups become one */
    memcpy(r0, r1, sizeof r1);
    uint8_t keep2[17];
    for (int j = 0; j < 17; j++) keep2[j] = j != 3;
    const uint64_t b1 = ekv_kv_bytes(kv);
    CHECK_OK(ekv_kv_head_keep(kv, h, keep2));
    CHECK(h->len == 16 && h->ks.ng == 2 && h->ks.gn[0] == 8 && h->ks.gn[1] == 8);
    CHECK(ekv_kv_bytes(kv) == b1 - D * 4 - D * 4 / 8 - D * 4); /* a header, a code row, a value row */
    CHECK_OK(ekv_kv_head_gather(kv, h, NULL, h->len, r1, NULL));
    double worst = 0;
    for (int j = 0, w = 0; j < 17; j++) {
        if (!keep2[j]) continue;
        if (w < 8) {
            for (int c = 0; c < D; c++) worst = fmax(worst, fabs(r1[w * D + c] - r0[j * D + c]));
        } else {
            same &= memcmp(r1 + w * D, r0 + j * D, D * sizeof(float)) == 0;
        }
        w++;
    }
    CHECK_MSG(worst <= 0.5 * 2.0 / 15 + 2.0 / 1024 && worst > 0, "coalesced group moved entries by %.3g", worst);
    CHECK_MSG(same, "the untouched group changed");
    /* a write re-quantises its group only; the written row reads back within the bound */
    float row[D];
    for (int c = 0; c < D; c++) row[c] = 0.25f * (float)c - 0.9f;
    memcpy(r0, r1, sizeof r1);
    CHECK_OK(ekv_kv_head_set(kv, h, 10, row, NULL));
    CHECK_OK(ekv_kv_head_gather(kv, h, NULL, h->len, r1, NULL));
    CHECK(memcmp(r1, r0, 8 * D * sizeof(float)) == 0);
    worst = 0;
    for (int c = 0; c < D; c++) worst = fmax(worst, fabs(r1[10 * D + c] - row[c]));
    CHECK_MSG(worst <= 0.5 * 2.0 / 15 + 2.0 / 1024, "written key off by %.3g", worst);
    ekv_kv_free(kv);
}

int main(void) {
    test_new_checks();
    test_types_roundtrip_bytes();
    test_kivi_residual();
    test_kivi_groups();
    return test_finish("test_kv_types");
}
