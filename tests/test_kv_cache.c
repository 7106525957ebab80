/*
 * test_kv_cache.c — the KV-cache storage and attention-with-statistics:
 * parameter validation, append / keep / merge arithmetic and accounting,
 * capacity growth and shrinking, the target rule, one attention row
 * against a double-precision reference, statistics against direct
 * computation, output independence from the statistics requested, and a
 * whole forward through the cache (GQA mapping, causal visibility) against
 * a direct computation.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"
#include "testutil.h"

static uint64_t g_rng = 0xC0FFEE;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void test_new_validation(void) {
    struct ekv_kv *kv = (struct ekv_kv *)1;
    struct ekv_kv_params p = ekv_kv_default_params();
    p.budget = 1.5;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    CHECK(kv == NULL);
    CHECK_MSG(strstr(ekv_last_error(), "kv budget 1.5 out of range (0, 1]") != NULL, "%s", ekv_last_error());
    p.budget = 0.0;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    p.budget = NAN;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    p.budget = -0.5;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    p = ekv_kv_default_params();
    p.max_tokens = -1;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    p = ekv_kv_default_params();
    p.sinks = -2;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "sinks") != NULL);
    p = ekv_kv_default_params();
    p.pool_kind = (enum ekv_pool_kind)7;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    p = ekv_kv_default_params();
    p.beta = INFINITY;
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    p = ekv_kv_default_params();
    p.policy = "no-such-policy";
    CHECK(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "no-such-policy") != NULL);
    CHECK_MSG(strstr(ekv_last_error(), "(known: full, random, local") != NULL, "%s", ekv_last_error());
    CHECK(ekv_kv_new(2, 4, 3, 8, NULL, &kv) == EKV_ERR_INVALID_ARG); /* 4 % 3 */
    CHECK(ekv_kv_new(0, 4, 2, 8, NULL, &kv) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_new(2, 4, 2, 0, NULL, &kv) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_new(2, 4, 2, 8, NULL, NULL) == EKV_ERR_INVALID_ARG);

    /* NULL params and "" mean full; the name lives in the cache */
    CHECK_OK(ekv_kv_new(2, 4, 2, 8, NULL, &kv));
    if (kv) {
        CHECK(strcmp(kv->policy_name, "full") == 0 && kv->params.policy == kv->policy_name);
        CHECK(kv->n_layer == 2 && kv->n_head == 4 && kv->n_head_kv == 2 && kv->head_dim == 8);
        CHECK(kv->layers[1].budget == -1 && kv->layers[1].heads[1].len == 0);
        CHECK(kv->bytes_alloc == 0 && kv->stats == 0);
        ekv_kv_free(kv);
    }
    char name[8] = "h2o";
    p = ekv_kv_default_params();
    p.policy = name;
    p.budget = 0.25;
    CHECK_OK(ekv_kv_new(1, 2, 1, 4, &p, &kv));
    if (kv) {
        name[0] = 'X'; /* the caller's string is not kept */
        CHECK(strcmp(kv->params.policy, "h2o") == 0 && kv->params.budget == 0.25);
        ekv_kv_free(kv);
    }
    p.policy = "";
    CHECK_OK(ekv_kv_new(1, 2, 1, 4, &p, &kv));
    if (kv) CHECK(strcmp(kv->policy_name, "full") == 0);
    ekv_kv_free(kv);
    ekv_kv_free(NULL);
}

enum { D = 4 };
/* bytes per entry without statistics: K + V + pos + tag + weight */
static const uint64_t BASE = 2 * D * 4 + 4 + 1 + 4;

/* Storage tests check exact floats and byte counts of f32 rows; the other
 * storage types have their own tests (test_kv_types.c). */
static const struct ekv_kv_params *f32_params(void) {
    static struct ekv_kv_params p;
    p = ekv_kv_default_params();
    p.type_k = p.type_v = EKV_KV_F32;
    return &p;
}

/* Element c of entry j's key / value, read through the access API. */
static float key_at(const struct ekv_kv *kv, const struct ekv_kv_head *h, int j, int c) {
    float row[1024];
    if (kv->head_dim > 1024 || ekv_kv_head_get(kv, h, j, row, NULL) != EKV_OK) return NAN;
    return row[c];
}
static float val_at(const struct ekv_kv *kv, const struct ekv_kv_head *h, int j, int c) {
    float row[1024];
    if (kv->head_dim > 1024 || ekv_kv_head_get(kv, h, j, NULL, row) != EKV_OK) return NAN;
    return row[c];
}

static void fill(struct ekv_kv *kv, struct ekv_kv_head *h, int n, int pos_step) {
    for (int j = 0; j < n; j++) {
        float k[D], v[D];
        int id = h->len;
        for (int c = 0; c < D; c++) {
            k[c] = (float)(id * 10 + c);
            v[c] = -(float)(id * 10 + c);
        }
        ekv_kv_head_append(kv, h, k, v, id * pos_step, (uint8_t)(id % 3), NULL);
    }
}

static void test_storage(void) {
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 2, 1, D, f32_params(), &kv));
    if (!kv) return;
    struct ekv_kv_head *h = &kv->layers[0].heads[0];
    CHECK_OK(ekv_kv_reserve(kv, 0, 10));
    CHECK(h->cap == 16); /* max(need, 1.5 cap, 16) */
    CHECK(kv->bytes_alloc == 16 * BASE && kv->peak_bytes_alloc == 16 * BASE);
    fill(kv, h, 10, 2);
    CHECK(h->len == 10);
    CHECK(h->pos[9] == 18 && h->tag[4] == 1 && h->weight[3] == 1.0f && key_at(kv, h, 7, 2) == 72.0f &&
          val_at(kv, h, 7, 3) == -73.0f);
    /* appending past the reservation writes nothing */
    CHECK_OK(ekv_kv_reserve(kv, 0, 6));
    CHECK(h->cap == 16);
    fill(kv, h, 6, 2);
    CHECK(h->len == 16);
    fill(kv, h, 1, 2);
    CHECK(h->len == 16);
    CHECK_OK(ekv_kv_reserve(kv, 0, 1));
    CHECK(h->cap == 24); /* 1.5 x 16 */
    CHECK(kv->bytes_alloc == 24 * BASE);

    /* keep the even entries */
    uint8_t keep[16];
    for (int j = 0; j < 16; j++) keep[j] = (j % 2 == 0);
    CHECK_OK(ekv_kv_head_keep(kv, h, keep));
    CHECK(h->len == 8 && h->n_evicted == 8 && h->n_merged == 0);
    bool ok = true;
    for (int j = 0; j < 8; j++) {
        ok = ok && h->pos[j] == 4 * j && h->tag[j] == (2 * j) % 3 && key_at(kv, h, j, 1) == (float)(2 * j * 10 + 1) &&
             val_at(kv, h, j, 0) == -(float)(2 * j * 10);
    }
    CHECK(ok);
    CHECK(h->cap == 24); /* 24 <= 2 * 8 + 64: no shrink */

    /* keep_idx and its validation */
    const int32_t bad1[3] = {0, 2, 2}, bad2[2] = {1, 8}, bad3[2] = {3, 1};
    CHECK(ekv_kv_head_keep_idx(kv, h, bad1, 3) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_head_keep_idx(kv, h, bad2, 2) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_head_keep_idx(kv, h, bad3, 2) == EKV_ERR_INVALID_ARG);
    CHECK(h->len == 8 && h->n_evicted == 8);
    const int32_t idx[3] = {1, 5, 7};
    CHECK_OK(ekv_kv_head_keep_idx(kv, h, idx, 3));
    CHECK(h->len == 3 && h->n_evicted == 13);
    CHECK(h->pos[0] == 4 && h->pos[1] == 20 && h->pos[2] == 28 && key_at(kv, h, 2, 0) == 140.0f);

    /* large growth, then shrink after compaction; accounting follows */
    CHECK_OK(ekv_kv_reserve(kv, 0, 997));
    CHECK(h->cap == 1000);
    fill(kv, h, 997, 1);
    CHECK(kv->bytes_alloc == 1000 * BASE && kv->peak_bytes_alloc == 1000 * BASE);
    int32_t idx10[10];
    for (int j = 0; j < 10; j++) idx10[j] = 100 * j + 3;
    CHECK_OK(ekv_kv_head_keep_idx(kv, h, idx10, 10));
    CHECK(h->len == 10 && h->cap == 10 + 10 / 4 + 16);
    CHECK(kv->bytes_alloc == (uint64_t)h->cap * BASE && kv->peak_bytes_alloc == 1000 * BASE);
    CHECK(h->pos[1] == 103 && key_at(kv, h, 1, 0) == 1030.0f);

    /* statistics arrays follow kv->stats; accounting includes them */
    const uint64_t before = kv->bytes_alloc;
    kv->stats = EKV_STAT_COLSUM | EKV_STAT_LASTROW | EKV_STAT_SPARSITY;
    CHECK_OK(ekv_kv_ensure_stats(kv));
    CHECK(h->colsum && h->count && h->lastrow && !h->sumsq && !h->winsum && !h->bincount);
    CHECK(kv->bytes_alloc == before + (uint64_t)h->cap * (8 + 4 + 4));
    if (h->colsum) CHECK(h->colsum[9] == 0.0 && h->count[9] == 0 && h->lastrow[0] == 0.0f);
    CHECK_OK(ekv_kv_reserve(kv, 0, 100)); /* stats grow with the head */
    CHECK(kv->bytes_alloc == (uint64_t)h->cap * (BASE + 16));
    fill(kv, h, 1, 2000);
    if (h->colsum) {
        h->colsum[10] = 5.0;
        CHECK(h->count[10] == 0);
    }
    kv->stats = EKV_STAT_SUMSQ;
    CHECK_OK(ekv_kv_ensure_stats(kv));
    CHECK(!h->colsum && !h->count && !h->lastrow && h->sumsq);
    CHECK(kv->bytes_alloc == (uint64_t)h->cap * (BASE + 8));
    kv->stats = 0;
    CHECK_OK(ekv_kv_ensure_stats(kv));
    CHECK(kv->bytes_alloc == (uint64_t)h->cap * BASE);

    /* the other KV head was never touched */
    CHECK(kv->layers[0].heads[0].len == 11);
    ekv_kv_free(kv);
}

static void test_merge(void) {
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 1, 1, 2, f32_params(), &kv));
    if (!kv) return;
    kv->stats = EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_WINSUM | EKV_STAT_BINCOUNT;
    CHECK_OK(ekv_kv_ensure_stats(kv));
    CHECK_OK(ekv_kv_reserve(kv, 0, 6));
    struct ekv_kv_head *h = &kv->layers[0].heads[0];
    for (int j = 0; j < 6; j++) {
        const float k[2] = {(float)j, (float)(2 * j)}, v[2] = {(float)-j, (float)(j * j)};
        ekv_kv_head_append(kv, h, k, v, 10 + j, (uint8_t)j, NULL);
        h->colsum[j] = 0.5 * j;
        h->count[j] = j + 1;
        h->sumsq[j] = 0.25 * j;
        h->lastrow[j] = 0.125f * (float)j;
        h->winsum[j] = j;
        h->bincount[j] = (float)(2 * j);
    }
    /* invalid: 1 joins 2, which itself joins 3 */
    const int32_t bad[6] = {0, 2, 3, 3, 4, 5};
    CHECK(ekv_kv_head_merge(kv, h, bad) == EKV_ERR_INVALID_ARG);
    const int32_t bad2[6] = {0, 9, 2, 3, 4, 5};
    CHECK(ekv_kv_head_merge(kv, h, bad2) == EKV_ERR_INVALID_ARG);
    CHECK(h->len == 6 && h->n_merged == 0);

    /* {0,1} -> 0, {2,3,4} -> 3 (member before the survivor), 5 dropped */
    const int32_t into[6] = {0, 0, 3, 3, 3, -1};
    CHECK_OK(ekv_kv_head_merge(kv, h, into));
    CHECK(h->len == 2 && h->n_merged == 3 && h->n_evicted == 1);
    CHECK(h->pos[0] == 10 && h->pos[1] == 13 && h->tag[1] == 3);
    CHECK(h->weight[0] == 2.0f && h->weight[1] == 3.0f);
    CHECK_NEAR(key_at(kv, h, 0, 0), 0.5, 1e-7);
    CHECK_NEAR(key_at(kv, h, 0, 1), 1.0, 1e-7);
    CHECK_NEAR(val_at(kv, h, 0, 0), -0.5, 1e-7);
    CHECK_NEAR(val_at(kv, h, 0, 1), 0.5, 1e-7);
    CHECK_NEAR(key_at(kv, h, 1, 0), 3.0, 1e-7);
    CHECK_NEAR(key_at(kv, h, 1, 1), 6.0, 1e-7);
    CHECK_NEAR(val_at(kv, h, 1, 0), -3.0, 1e-7);
    CHECK_NEAR(val_at(kv, h, 1, 1), (4.0 + 9.0 + 16.0) / 3.0, 1e-6);
    CHECK_NEAR(h->colsum[0], 0.5, 1e-12);
    CHECK_NEAR(h->colsum[1], 0.5 * 9, 1e-12);
    CHECK(h->count[0] == 3 && h->count[1] == 3 + 4 + 5);
    CHECK_NEAR(h->sumsq[1], 0.25 * 9, 1e-12);
    CHECK_NEAR(h->lastrow[1], 0.125 * 9, 1e-7);
    CHECK_NEAR(h->winsum[0], 1.0, 1e-12);
    CHECK(h->bincount[1] == 18.0f);

    /* weighted: (2 x 0.5 + 3 x 3) / 5 = 2 */
    const int32_t into2[2] = {1, 1};
    CHECK_OK(ekv_kv_head_merge(kv, h, into2));
    CHECK(h->len == 1 && h->weight[0] == 5.0f && h->pos[0] == 13);
    CHECK(h->n_merged == 5 && h->n_evicted == 1);
    CHECK_NEAR(key_at(kv, h, 0, 0), 2.0, 1e-6);
    CHECK_NEAR(key_at(kv, h, 0, 1), 4.0, 1e-6);
    CHECK_NEAR(val_at(kv, h, 0, 0), -2.0, 1e-6);
    CHECK_NEAR(val_at(kv, h, 0, 1), (2 * 0.5 + 3 * (29.0 / 3.0)) / 5.0, 1e-6);
    CHECK(fabs(h->weight[0] + (double)h->n_evicted - 6.0) < 1e-9);

    /* dropping a merged entry counts all its tokens as evicted */
    const uint8_t none[1] = {0};
    CHECK_OK(ekv_kv_head_keep(kv, h, none));
    CHECK(h->len == 0 && h->n_evicted == 6 && h->n_merged == 5);

    /* reset_stats zeroes only what is asked */
    CHECK_OK(ekv_kv_reserve(kv, 0, 2));
    fill(kv, h, 0, 1);
    const float z[2] = {0, 0};
    ekv_kv_head_append(kv, h, z, z, 100, 0, NULL);
    h->colsum[0] = 1;
    h->count[0] = 1;
    h->lastrow[0] = 1;
    kv->layers[0].sparse_zero = 3;
    kv->layers[0].sparse_total = 4;
    ekv_kv_reset_stats(kv, EKV_STAT_COLSUM | EKV_STAT_SPARSITY);
    CHECK(h->colsum[0] == 0 && h->count[0] == 0 && h->lastrow[0] == 1.0f);
    CHECK(kv->layers[0].sparse_zero == 0 && kv->layers[0].sparse_total == 0);
    ekv_kv_free(kv);
}

/* The entry access calls: reads, writes, bulk forms, their validation, and
 * merge_set's caller-given rows. */
static void test_access(void) {
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 2, 1, D, f32_params(), &kv));
    if (!kv) return;
    struct ekv_kv_head *h = &kv->layers[0].heads[0];
    CHECK_OK(ekv_kv_reserve(kv, 0, 6));
    fill(kv, h, 6, 1); /* key c of entry j = 10 j + c, value = -(10 j + c) */
    float k[3 * D], v[3 * D];
    CHECK(ekv_kv_head_get(kv, h, 6, k, v) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_head_get(kv, h, -1, k, NULL) == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_kv_head_get(kv, h, 5, NULL, NULL));
    const int32_t idx[3] = {4, 1, 4};
    CHECK_OK(ekv_kv_head_gather(kv, h, idx, 3, k, v));
    CHECK(k[0] == 40.0f && k[D + 3] == 13.0f && k[2 * D + 1] == 41.0f && v[D] == -10.0f && v[2 * D + 2] == -42.0f);
    CHECK_OK(ekv_kv_head_gather(kv, h, NULL, 2, k, NULL));
    CHECK(k[D + 2] == 12.0f);
    const int32_t badi[2] = {0, 6};
    CHECK(ekv_kv_head_gather(kv, h, badi, 2, k, v) == EKV_ERR_INVALID_ARG);

    /* writes: one side, both sides, and validation before anything is written */
    float row[D];
    for (int c = 0; c < D; c++) row[c] = 0.5f + (float)c;
    CHECK_OK(ekv_kv_head_set(kv, h, 2, row, NULL));
    CHECK(key_at(kv, h, 2, 3) == 3.5f && val_at(kv, h, 2, 3) == -23.0f);
    const int32_t dup[2] = {3, 3}, wi[2] = {5, 0};
    CHECK(ekv_kv_head_scatter(kv, h, dup, 2, k, v) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_head_scatter(kv, h, badi, 2, k, v) == EKV_ERR_INVALID_ARG);
    CHECK(key_at(kv, h, 0, 1) == 1.0f && key_at(kv, h, 3, 0) == 30.0f);
    for (int c = 0; c < 2 * D; c++) {
        k[c] = 100.0f + (float)c;
        v[c] = -100.0f - (float)c;
    }
    CHECK_OK(ekv_kv_head_scatter(kv, h, wi, 2, k, v));
    CHECK(key_at(kv, h, 5, 0) == 100.0f && val_at(kv, h, 0, D - 1) == -100.0f - (float)(2 * D - 1));
    CHECK(key_at(kv, h, 4, 0) == 40.0f && h->len == 6 && h->pos[5] == 5);

    /* merge_set: survivor 1 takes {1, 2, 3} with a caller-given key, the mean value */
    float kset[6 * D];
    for (int j = 0; j < 6 * D; j++) kset[j] = NAN; /* only the row of the survivor is read */
    for (int c = 0; c < D; c++) kset[1 * D + c] = 7.0f;
    const int32_t into[6] = {0, 1, 1, 1, 4, -1};
    float v1[D], v2[D], v3[D];
    CHECK_OK(ekv_kv_head_get(kv, h, 1, NULL, v1));
    CHECK_OK(ekv_kv_head_get(kv, h, 2, NULL, v2));
    CHECK_OK(ekv_kv_head_get(kv, h, 3, NULL, v3));
    CHECK_OK(ekv_kv_head_merge_set(kv, h, into, kset, NULL));
    CHECK(h->len == 3 && h->weight[1] == 3.0f && h->n_merged == 2 && h->n_evicted == 1);
    CHECK(key_at(kv, h, 1, 0) == 7.0f && key_at(kv, h, 1, D - 1) == 7.0f);
    CHECK_NEAR(val_at(kv, h, 1, 2), (v1[2] + v2[2] + v3[2]) / 3.0, 1e-5);
    CHECK(key_at(kv, h, 2, 0) == 40.0f); /* entry 4, untouched */
    ekv_kv_free(kv);
}

static void test_target(void) {
    struct ekv_kv_params p = ekv_kv_default_params();
    struct ekv_kv *kv = NULL;
    p.budget = 0.2;
    CHECK_OK(ekv_kv_new(2, 2, 2, 2, &p, &kv));
    if (!kv) return;
    CHECK(ekv_kv_target(kv, 0) == 1); /* empty: at least 1 */
    CHECK_OK(ekv_kv_reserve(kv, 0, 64));
    struct ekv_kv_head *h0 = &kv->layers[0].heads[0], *h1 = &kv->layers[0].heads[1];
    const float z[2] = {0, 0};
    for (int j = 0; j < 64; j++) ekv_kv_head_append(kv, h0, z, z, j, 0, NULL);
    for (int j = 0; j < 30; j++) ekv_kv_head_append(kv, h1, z, z, j, 0, NULL);
    kv->n_seen = 64;
    CHECK(ekv_kv_target(kv, 0) == 13); /* ceil(12.8) */
    CHECK(ekv_kv_target(kv, 1) == 1);  /* layer 1 is empty */
    kv->params.budget = 0.3;
    kv->n_seen = 10; /* 0.3 * 10 = 3.0000000000000004 */
    CHECK(ekv_kv_target(kv, 0) == 3);
    kv->params.budget = 1.0;
    kv->n_seen = 64;
    CHECK(ekv_kv_target(kv, 0) == 64);
    kv->n_seen = 1000001;
    CHECK(ekv_kv_target(kv, 0) == 64); /* min with the longest head */
    kv->params.budget = 0.7;
    kv->n_seen = 70; /* 0.7 * 70 = 48.99999999999999 */
    CHECK(ekv_kv_target(kv, 0) == 49);
    kv->params.max_tokens = 20;
    CHECK(ekv_kv_target(kv, 0) == 20);
    kv->layers[0].budget = 5;
    CHECK(ekv_kv_target(kv, 0) == 5);
    kv->layers[0].budget = 0;
    CHECK(ekv_kv_target(kv, 0) == 1);
    CHECK(ekv_kv_target(kv, 7) == 1);
    ekv_kv_free(kv);
}

/* ---- attention ---- */

/* Double-precision reference of one row: probs [R][n], out [R][d]. */
static void ref_row(const float *q, int R, int d, const float *k, const float *v, int n, double scale,
                    double *probs, double *out) {
    for (int h = 0; h < R; h++) {
        double mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int c = 0; c < d; c++) s += (double)q[h * d + c] * k[j * d + c];
            probs[h * n + j] = s * scale;
            mx = fmax(mx, s * scale);
        }
        double sum = 0;
        for (int j = 0; j < n; j++) sum += probs[h * n + j] = exp(probs[h * n + j] - mx);
        for (int j = 0; j < n; j++) probs[h * n + j] /= sum;
        for (int c = 0; c < d; c++) {
            double o = 0;
            for (int j = 0; j < n; j++) o += probs[h * n + j] * v[j * d + c];
            out[h * d + c] = o;
        }
    }
}

static void test_attn_row(void) {
    enum { R = 3, DD = 16, N = 37 };
    static float q[R * DD], k[N * DD], v[N * DD], out[R * DD], out2[R * DD], probs[R * N], probs2[R * N];
    static double rp[R * N], ro[R * DD];
    for (int i = 0; i < R * DD; i++) q[i] = 3.0f * frand();
    for (int i = 0; i < N * DD; i++) k[i] = frand();
    for (int i = 0; i < N * DD; i++) v[i] = frand();
    const float scale = 1.0f / sqrtf((float)DD);
    ekv_attn_row(q, R, DD, k, v, N, scale, out, probs, NULL);
    ref_row(q, R, DD, k, v, N, (double)scale, rp, ro);
    /* fp32 softmax of scores up to |s| ~ 12: 1e-6 absolute on probabilities,
     * 2e-6 on outputs (sums of 37 terms below 1) */
    double perr = 0, oerr = 0;
    for (int i = 0; i < R * N; i++) perr = fmax(perr, fabs(probs[i] - rp[i]));
    for (int i = 0; i < R * DD; i++) oerr = fmax(oerr, fabs(out[i] - ro[i]));
    CHECK_MSG(perr < 1e-6, "prob error %g", perr);
    CHECK_MSG(oerr < 2e-6, "output error %g", oerr);
    for (int h = 0; h < R; h++) {
        double s = 0;
        for (int j = 0; j < N; j++) s += probs[h * N + j];
        CHECK_NEAR(s, 1.0, 1e-5);
    }

    /* statistics must not change the output, bit for bit */
    static double colsum[N], sumsq[N], winsum[N];
    static int32_t count[N];
    static float lastrow[N], bincount[N];
    double sz = 0, stot = 0;
    struct ekv_attn_stats st = {.flags = 0x3f, .colsum = colsum, .count = count, .sumsq = sumsq,
                                .lastrow = lastrow, .winsum = winsum, .bincount = bincount,
                                .sparse_zero = &sz, .sparse_total = &stot, .sparsity_p = 0.3f};
    ekv_attn_row(q, R, DD, k, v, N, scale, out2, probs2, &st);
    CHECK(memcmp(out, out2, sizeof out) == 0);
    CHECK(memcmp(probs, probs2, sizeof probs) == 0);
    st.flags = EKV_STAT_LASTROW;
    ekv_attn_row(q, R, DD, k, v, N, scale, out2, probs2, &st);
    CHECK(memcmp(out, out2, sizeof out) == 0);
    CHECK(stot == (double)R * N);

    /* a single key: probability 1, output = v */
    ekv_attn_row(q, R, DD, k, v, 1, scale, out2, probs2, NULL);
    for (int h = 0; h < R; h++) {
        CHECK(probs2[h] == 1.0f);
        CHECK(memcmp(out2 + h * DD, v, DD * sizeof(float)) == 0);
    }
    /* large scores do not overflow (max subtraction) */
    for (int i = 0; i < DD; i++) q[i] = 400.0f;
    ekv_attn_row(q, 1, DD, k, v, N, 1.0f, out2, probs2, NULL);
    bool fin = true;
    for (int i = 0; i < DD; i++) fin = fin && isfinite(out2[i]);
    CHECK(fin);
}

static void test_stats_direct(void) {
    enum { R = 4, ROWS = 9 };
    /* rows of growing length with random normalised probabilities */
    static float P[ROWS][R * (ROWS + 2)];
    const int n0 = 3;
    for (int i = 0; i < ROWS; i++) {
        const int n = n0 + i;
        for (int h = 0; h < R; h++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += P[i][h * n + j] = (frand() + 1.0f) * (frand() + 1.0f);
            for (int j = 0; j < n; j++) P[i][h * n + j] = (float)(P[i][h * n + j] / s);
        }
    }
    const int NMAX = n0 + ROWS - 1;
    double colsum[16] = {0}, sumsq[16] = {0}, winsum[16] = {0}, sz = 0, stot = 0;
    int32_t count[16] = {0};
    float lastrow[16] = {0}, bincount[16] = {0};
    const float sp = 0.2f;
    const int win_from = 5; /* rows >= 5 feed winsum and sparsity */
    for (int i = 0; i < ROWS; i++) {
        struct ekv_attn_stats st = {.flags = EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_BINCOUNT,
                                    .colsum = colsum, .count = count, .sumsq = sumsq, .lastrow = lastrow,
                                    .winsum = winsum, .bincount = bincount, .sparse_zero = &sz,
                                    .sparse_total = &stot, .sparsity_p = sp};
        if (i >= win_from) st.flags |= EKV_STAT_WINSUM | EKV_STAT_SPARSITY;
        ekv_attn_accumulate(P[i], R, n0 + i, &st);
    }
    /* direct computation */
    double ecol[16] = {0}, esq[16] = {0}, ewin[16] = {0}, ebin[16] = {0}, elast[16] = {0}, ez = 0, etot = 0;
    int ecount[16] = {0};
    for (int i = 0; i < ROWS; i++) {
        const int n = n0 + i;
        for (int h = 0; h < R; h++) {
            float mx = 0;
            for (int j = 0; j < n; j++) mx = fmaxf(mx, P[i][h * n + j]);
            for (int j = 0; j < n; j++) {
                const double p = P[i][h * n + j];
                ecol[j] += p / R;
                esq[j] += p * p / R;
                if (i == ROWS - 1) elast[j] += p / R;
                if (i >= win_from) {
                    ewin[j] += p / R;
                    ez += P[i][h * n + j] < sp * mx;
                    etot += 1;
                }
                ebin[j] += (P[i][h * n + j] >= 1.0f / (float)n) ? 1.0 / R : 0.0;
            }
        }
        for (int j = 0; j < n; j++) ecount[j]++;
    }
    for (int j = 0; j < NMAX; j++) {
        CHECK_NEAR(colsum[j], ecol[j], 1e-12);
        CHECK_NEAR(sumsq[j], esq[j], 1e-12);
        CHECK_NEAR(winsum[j], ewin[j], 1e-12);
        CHECK_NEAR(lastrow[j], elast[j], 1e-7);
        CHECK_NEAR(bincount[j], ebin[j], 1e-6);
        CHECK(count[j] == ecount[j]);
    }
    CHECK(sz == ez && stot == etot && etot > 0 && ez > 0);
    CHECK(colsum[NMAX] == 0 && count[NMAX] == 0); /* beyond the longest row: untouched */
    /* flags gate each array; NULL arrays are skipped */
    double c2[16] = {0};
    struct ekv_attn_stats st2 = {.flags = EKV_STAT_SUMSQ, .colsum = c2};
    ekv_attn_accumulate(P[0], R, n0, &st2);
    CHECK(c2[0] == 0);
    st2.flags = EKV_STAT_COLSUM; /* count NULL: colsum still fed */
    ekv_attn_accumulate(P[0], R, n0, &st2);
    CHECK(c2[0] > 0);
}

/* A forward of a GQA cache (full policy, all statistics forced) against a
 * direct computation: 4 query heads over 2 KV heads, a 6-token prompt then
 * 2 decode steps, 2 layers. */
static void test_forward(void) {
    enum { L = 2, H = 4, G = 2, DD = 8, P = 6, T = 8 };
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(L, H, G, DD, f32_params(), &kv));
    if (!kv) return;
    kv->extra_stats = EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_WINSUM | EKV_STAT_BINCOUNT |
                EKV_STAT_SPARSITY;
    kv->win_start = 4;
    kv->params.sparsity_p = 0.1;
    static float q[L][T][H][DD], k[L][T][G][DD], v[L][T][G][DD], out[L][T][H][DD];
    for (int il = 0; il < L; il++)
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++)
                for (int c = 0; c < DD; c++) q[il][t][h][c] = 2.0f * frand();
            for (int g = 0; g < G; g++)
                for (int c = 0; c < DD; c++) {
                    k[il][t][g][c] = 2.0f * frand();
                    v[il][t][g][c] = frand();
                }
        }
    uint8_t tags[P] = {0, 0, 1, 1, 0, 0};
    for (int t = 0; t < T;) {
        const int n = t == 0 ? P : 1;
        struct ekv_kv_step st = {.is_prompt = t == 0, .last_chunk = t == 0, .pos0 = t, .n_new = n,
                                 .prompt_len = P, .prompt_tags = tags, .tags = t == 0 ? tags : NULL};
        CHECK_OK(ekv_kv_begin(kv, &st));
        CHECK(kv->n_seen == t + n);
        for (int il = 0; il < L; il++)
            CHECK_OK(ekv_kv_layer_forward(kv, NULL, il, &st, &q[il][t][0][0], &k[il][t][0][0], &v[il][t][0][0],
                                          &out[il][t][0][0]));
        CHECK_OK(ekv_kv_end(kv, &st));
        t += n;
    }
    /* positions, tags, stored keys */
    const struct ekv_kv_head *h1 = &kv->layers[1].heads[1];
    CHECK(h1->len == T);
    CHECK(h1->pos[7] == 7 && h1->tag[2] == EKV_TAG_IMAGE && h1->tag[6] == EKV_TAG_GENERATED);
    {
        float row[DD];
        CHECK_OK(ekv_kv_head_get(kv, h1, 0, row, NULL));
        CHECK(memcmp(row, &k[1][0][1][0], DD * sizeof(float)) == 0);
        CHECK_OK(ekv_kv_head_get(kv, h1, 5, NULL, row));
        CHECK(memcmp(row, &v[1][5][1][0], DD * sizeof(float)) == 0);
    }
    /* direct causal GQA attention and statistics */
    double maxerr = 0;
    for (int il = 0; il < L; il++) {
        double col[G][T] = {{0}}, win[G][T] = {{0}}, last[G][T] = {{0}}, sz = 0, stot = 0;
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                const int g = h / (H / G);
                float kk[T * DD], vv[T * DD];
                for (int j = 0; j <= t; j++) {
                    memcpy(kk + j * DD, k[il][j][g], sizeof kk[0] * DD);
                    memcpy(vv + j * DD, v[il][j][g], sizeof vv[0] * DD);
                }
                double pr[T], o[DD];
                ref_row(q[il][t][h], 1, DD, kk, vv, t + 1, 1.0 / sqrt((double)DD), pr, o);
                for (int c = 0; c < DD; c++) maxerr = fmax(maxerr, fabs(o[c] - out[il][t][h][c]));
                double mx = 0;
                for (int j = 0; j <= t; j++) mx = fmax(mx, pr[j]);
                for (int j = 0; j <= t; j++) {
                    col[g][j] += pr[j] / (H / G);
                    if (t == T - 1) last[g][j] += pr[j] / (H / G);
                    if (t >= 4) {
                        win[g][j] += pr[j] / (H / G);
                        /* skip near-threshold entries: fp32 vs fp64 */
                        sz += pr[j] < 0.1 * mx;
                        stot += 1;
                    }
                }
            }
        }
        for (int g = 0; g < G; g++) {
            const struct ekv_kv_head *hh = &kv->layers[il].heads[g];
            for (int j = 0; j < T; j++) {
                CHECK_NEAR(hh->colsum[j], col[g][j], 1e-5);
                CHECK_NEAR(hh->winsum[j], win[g][j], 1e-5);
                CHECK_NEAR(hh->lastrow[j], last[g][j], 1e-5);
                CHECK(hh->count[j] == T - j);
                CHECK(hh->weight[j] == 1.0f);
            }
        }
        CHECK(kv->layers[il].sparse_total == stot);
        CHECK_NEAR(kv->layers[il].sparse_zero, sz, 1.0); /* a threshold tie may flip one */
    }
    CHECK_MSG(maxerr < 2e-6, "forward output error %g", maxerr);

    /* positions must increase */
    struct ekv_kv_step again = {.pos0 = 7, .n_new = 1};
    CHECK_OK(ekv_kv_begin(kv, &again));
    CHECK(ekv_kv_layer_forward(kv, NULL, 0, &again, &q[0][0][0][0], &k[0][0][0][0], &v[0][0][0][0],
                               &out[0][0][0][0]) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_layer_forward(kv, NULL, 2, &again, &q[0][0][0][0], &k[0][0][0][0], &v[0][0][0][0],
                               &out[0][0][0][0]) == EKV_ERR_INVALID_ARG);
    struct ekv_kv_step badstep = {.pos0 = -1, .n_new = 1};
    CHECK(ekv_kv_begin(kv, &badstep) == EKV_ERR_INVALID_ARG);
    ekv_kv_free(kv);
}

/* Budget 1.0 with a statistics-collecting policy gives the same attention
 * output as the full cache, bit for bit. */
static void test_same_output(void) {
    enum { H = 4, G = 2, DD = 8, T = 20 };
    const char *names[2] = {"full", "h2o"};
    static float q[T][H][DD], k[T][G][DD], v[T][G][DD], out[2][T][H][DD];
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < H * DD; i++) (&q[t][0][0])[i] = frand();
        for (int i = 0; i < G * DD; i++) (&k[t][0][0])[i] = frand();
        for (int i = 0; i < G * DD; i++) (&v[t][0][0])[i] = frand();
    }
    for (int r = 0; r < 2; r++) {
        struct ekv_kv_params p = ekv_kv_default_params();
        p.policy = names[r];
        struct ekv_kv *kv = NULL;
        CHECK_OK(ekv_kv_new(1, H, G, DD, &p, &kv));
        if (!kv) return;
        for (int t = 0; t < T;) {
            const int n = t == 0 ? 12 : 1;
            struct ekv_kv_step st = {.is_prompt = t == 0, .last_chunk = t == 0, .pos0 = t, .n_new = n,
                                     .prompt_len = 12};
            CHECK_OK(ekv_kv_begin(kv, &st));
            CHECK_OK(ekv_kv_layer_forward(kv, NULL, 0, &st, &q[t][0][0], &k[t][0][0], &v[t][0][0], &out[r][t][0][0]));
            CHECK_OK(ekv_kv_end(kv, &st));
            t += n;
        }
        CHECK(r == 0 ? kv->layers[0].heads[0].colsum == NULL : kv->layers[0].heads[0].colsum != NULL);
        ekv_kv_free(kv);
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
}

/* The forward split over KV heads on a thread pool gives the same output
 * and statistics, bit for bit, as inline (pool NULL). */
static void test_pool(void) {
    enum { L = 2, H = 8, G = 4, DD = 8, T = 30, P = 24 };
    static float q[L][T][H][DD], k[L][T][G][DD], v[L][T][G][DD], out[2][L][T][H][DD];
    for (int il = 0; il < L; il++)
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < H * DD; i++) (&q[il][t][0][0])[i] = 2.0f * frand();
            for (int i = 0; i < G * DD; i++) (&k[il][t][0][0])[i] = 2.0f * frand();
            for (int i = 0; i < G * DD; i++) (&v[il][t][0][0])[i] = frand();
        }
    struct ekv_pool *pool = NULL;
    CHECK_OK(ekv_pool_new(3, &pool));
    if (!pool) return;
    struct ekv_kv *kv[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++) {
        struct ekv_kv_params p = ekv_kv_default_params();
        p.policy = "h2o";
        p.budget = 0.5;
        CHECK_OK(ekv_kv_new(L, H, G, DD, &p, &kv[r]));
        if (!kv[r]) goto done;
        for (int t = 0; t < T;) {
            const int n = t == 0 ? P : 1;
            struct ekv_kv_step st = {.is_prompt = t == 0, .last_chunk = t == 0, .pos0 = t, .n_new = n,
                                     .prompt_len = P};
            CHECK_OK(ekv_kv_begin(kv[r], &st));
            for (int il = 0; il < L; il++)
                CHECK_OK(ekv_kv_layer_forward(kv[r], r ? pool : NULL, il, &st, &q[il][t][0][0], &k[il][t][0][0],
                                              &v[il][t][0][0], &out[r][il][t][0][0]));
            CHECK_OK(ekv_kv_end(kv[r], &st));
            t += n;
        }
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
    for (int il = 0; il < L; il++)
        for (int g = 0; g < G; g++) {
            const struct ekv_kv_head *a = &kv[0]->layers[il].heads[g], *b = &kv[1]->layers[il].heads[g];
            CHECK(a->len == b->len && a->len == 15);
            CHECK(memcmp(a->pos, b->pos, (size_t)a->len * sizeof *a->pos) == 0);
            CHECK(memcmp(a->colsum, b->colsum, (size_t)a->len * sizeof *a->colsum) == 0);
        }
done:
    ekv_kv_free(kv[0]);
    ekv_kv_free(kv[1]);
    ekv_pool_free(pool);
}

int main(void) {
    test_new_validation();
    test_storage();
    test_merge();
    test_access();
    test_target();
    test_attn_row();
    test_stats_direct();
    test_forward();
    test_same_output();
    test_pool();
    return test_finish("test_kv_cache");
}
