/*
 * test_policies_adv.c — RoCo, SnapKV, PyramidKV, VL-Cache and Elastic Cache
 * against hand-worked vectors (the rules of docs/policies.md "Each policy's
 * exact rule") and the 8-token attention matrix A below: statistics are
 * fed from hand-written attention rows through ekv_attn_accumulate exactly
 * as attend.c does (window rows only for WINSUM/SPARSITY), the policy's
 * layer()/end() run, and the kept positions, merged values, weights and
 * counters are compared with hand-computed results. The pure schedule /
 * allocation / selection functions are checked on their own vectors, and a
 * random-data run through ekv_kv_layer_forward checks the invariants every
 * policy must keep (exact lengths, ascending positions, token accounting).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"
#include "kv/policies_adv.h"
#include "testutil.h"

/* The test matrix A: row i = query i, attention over keys 0..i */
static const float A[8][8] = {
    {1.00f},
    {.70f, .30f},
    {.50f, .10f, .40f},
    {.40f, .05f, .25f, .30f},
    {.35f, .05f, .20f, .10f, .30f},
    {.30f, .02f, .30f, .08f, .05f, .25f},
    {.25f, .03f, .10f, .07f, .30f, .05f, .20f},
    {.20f, .04f, .15f, .06f, .25f, .11f, .09f, .10f},
};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static struct ekv_kv_params params_for(const char *policy, double budget) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = policy;
    p.budget = budget;
    p.type_k = p.type_v = EKV_KV_F32; /* the vectors' means are exact in f32 */
    return p;
}

static struct ekv_kv_step prompt_step(int32_t pos0, int32_t n_new, int32_t prompt_len, const uint8_t *tags,
                                      bool last) {
    struct ekv_kv_step s = {.is_prompt = true, .last_chunk = last, .pos0 = pos0, .n_new = n_new,
                            .prompt_pos0 = 0, .prompt_len = prompt_len, .prompt_tags = tags,
                            .tags = tags ? tags + pos0 : NULL};
    return s;
}

/* Appends entries pos0 .. pos0+n-1 to every head of layer il with
 * k = (t, 2t), v = (-t, 100 + t) when head_dim is 2 (k = v = t when 1). */
static void append_entries(struct ekv_kv *kv, int il, int32_t pos0, int32_t n, const uint8_t *tags) {
    CHECK_OK(ekv_kv_reserve(kv, il, n));
    for (int32_t hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        for (int32_t i = 0; i < n; i++) {
            const float t = (float)(pos0 + i);
            float k[2] = {t, 2 * t}, v[2] = {-t, 100 + t};
            if (kv->head_dim == 1) v[0] = t;
            ekv_kv_head_append(kv, h, k, v, pos0 + i, tags ? tags[pos0 + i] : EKV_TAG_TEXT, NULL);
        }
    }
}

/* Feeds query row at position `pos` (probabilities over the first n_keys
 * entries, same row for every head and KV head) as attend.c would. */
static void feed_row(struct ekv_kv *kv, int il, int64_t pos, const float *probs, int32_t n_keys) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int R = kv->n_head / kv->n_head_kv;
    float *pr = malloc((size_t)R * (size_t)n_keys * sizeof *pr);
    for (int r = 0; r < R; r++) memcpy(pr + (size_t)r * n_keys, probs, (size_t)n_keys * sizeof *pr);
    const unsigned row = kv->stats & (EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_BINCOUNT);
    const unsigned win = kv->stats & (EKV_STAT_WINSUM | EKV_STAT_SPARSITY);
    for (int32_t hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &ly->heads[hk];
        struct ekv_attn_stats st = {.flags = row | (pos >= kv->win_start ? win : 0u), .colsum = h->colsum,
                                    .count = h->count, .sumsq = h->sumsq, .lastrow = h->lastrow,
                                    .winsum = h->winsum, .bincount = h->bincount,
                                    .sparse_zero = &ly->sparse_zero, .sparse_total = &ly->sparse_total,
                                    .sparsity_p = (float)kv->params.sparsity_p};
        ekv_attn_accumulate(pr, R, n_keys, &st);
    }
    free(pr);
}

/* One 8-token prompt with the matrix A in one layer/one head; runs the
 * policy's layer() and end(). */
static struct ekv_kv *run_matrix(struct ekv_kv_params p, int head_dim) {
    struct ekv_kv *kv = NULL;
    enum ekv_status s = ekv_kv_new(1, 1, 1, head_dim, &p, &kv);
    CHECK_OK(s);
    if (s != EKV_OK) return NULL;
    static const uint8_t tags[8] = {0};
    struct ekv_kv_step step = prompt_step(0, 8, 8, tags, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    append_entries(kv, 0, 0, 8, tags);
    for (int i = 0; i < 8; i++) feed_row(kv, 0, i, A[i], i + 1);
    if (kv->ops->layer) CHECK_OK(kv->ops->layer(kv, 0, &step));
    CHECK_OK(ekv_kv_end(kv, &step));
    return kv;
}

static bool positions_are(const struct ekv_kv_head *h, const int32_t *want, int n) {
    if (h->len != n) {
        fprintf(stderr, "  len %d, want %d\n", (int)h->len, n);
        return false;
    }
    for (int j = 0; j < n; j++)
        if (h->pos[j] != want[j]) {
            fprintf(stderr, "  pos[%d] = %d, want %d\n", j, (int)h->pos[j], (int)want[j]);
            return false;
        }
    return true;
}

static double weight_sum(const struct ekv_kv_head *h) {
    double s = 0;
    for (int32_t j = 0; j < h->len; j++) s += h->weight[j];
    return s;
}

/* ------------------------------------------------------------------ */
/* RoCo                                                               */
/* ------------------------------------------------------------------ */

/* Brute-force RoCo round: selection sort with ekv's tie rules. */
static void roco_brute(const double *mean, const double *sd, int n, int sinks, int window, int K, int E,
                       uint8_t *keep) {
    uint8_t cand[64] = {0}, used[64] = {0};
    for (int j = 0; j < n; j++) keep[j] = 1;
    for (int c = 0; c < K; c++) { /* K times: lowest std, lowest index */
        int b = -1;
        for (int j = sinks; j < n - window; j++)
            if (!used[j] && (b < 0 || sd[j] < sd[b])) b = j;
        if (b < 0) break;
        used[b] = cand[b] = 1;
    }
    for (int e = 0; e < E; e++) { /* E times: lowest mean among candidates */
        int b = -1;
        for (int j = 0; j < n; j++)
            if (cand[j] && keep[j] && (b < 0 || mean[j] < mean[b])) b = j;
        if (b < 0) break;
        keep[b] = 0;
    }
}

/* Both selection paths of ekv_roco_select (few or most candidates) against
 * the brute force, on values with many ties. */
static void test_roco_select_random(void) {
    int bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        const int n = 8 + trial % 40;
        double mean[64], sd[64];
        for (int j = 0; j < n; j++) {
            mean[j] = (double)(int)(rnd() * 5) / 5.0;
            sd[j] = (double)(int)(rnd() * 4) / 4.0;
        }
        const int sinks = trial % 3, window = 1 + trial % 4;
        const int unprot = n - sinks - window;
        const int K = 1 + (int)(rnd() * unprot);
        const int E = 1 + (int)(rnd() * K);
        uint8_t a[64], b[64];
        if (ekv_roco_select(mean, sd, n, sinks, window, K, E, a) != E) bad++;
        roco_brute(mean, sd, n, sinks, window, K, E, b);
        if (memcmp(a, b, (size_t)n) != 0) bad++;
    }
    CHECK_MSG(bad == 0, "%d mismatches", bad);
}

static void test_roco(void) {
    test_roco_select_random();
    /* mean / std of A */
    static const double mean[8] = {.4625, .0843, .2333, .1220, .2250, .1367, .1450, .1000};
    static const double sd[8] = {.2509, .0912, .0986, .0900, .1031, .0838, .0550, 0};
    uint8_t keep[8];
    /* one-shot vector: sink 1, last 2 protected, K = 3, one eviction -> key 1 */
    CHECK(ekv_roco_select(mean, sd, 8, 1, 2, 3, 1, keep) == 1);
    for (int j = 0; j < 8; j++) CHECK_MSG(keep[j] == (j != 1), "key %d", j);
    /* K = 3, two evictions: candidates {1,3,5}, lowest means 1 and 3 */
    CHECK(ekv_roco_select(mean, sd, 8, 1, 2, 3, 2, keep) == 2);
    CHECK(!keep[1] && !keep[3] && keep[5] && keep[0] && keep[6] && keep[7]);

    /* statistics from A: std/mean match the hand-computed table */
    struct ekv_kv_params p = params_for("roco", 1.0);
    struct ekv_kv *kv = run_matrix(p, 1);
    if (kv) {
        const struct ekv_kv_head *h = &kv->layers[0].heads[0];
        CHECK(h->len == 8);
        for (int j = 0; j < 8; j++) {
            const double m = h->colsum[j] / h->count[j];
            const double var = h->sumsq[j] / h->count[j] - m * m;
            CHECK_NEAR(m, mean[j], 6e-5);
            CHECK_NEAR(sqrt(var > 0 ? var : 0), sd[j], 6e-5);
            CHECK(h->count[j] == 8 - j);
        }
        ekv_kv_free(kv);
    }

    /* the policy: target 7 (budget 7/8), sinks 1, window 2:
     * K = max(7-2-1, 1) = 4 lowest std of keys 1..5 = {5,3,1,2}; lowest mean 1 */
    p = params_for("roco", 7.0 / 8.0);
    p.sinks = 1;
    p.window = 2;
    kv = run_matrix(p, 1);
    if (kv) {
        static const int32_t want[] = {0, 2, 3, 4, 5, 6, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], want, 7));
        CHECK(kv->layers[0].heads[0].n_evicted == 1);
        ekv_kv_free(kv);
    }
    /* target 6: K = max(6-2-1, 2) = 3 -> {5,3,1}; evict 1 and 3 */
    p = params_for("roco", 6.0 / 8.0);
    p.sinks = 1;
    p.window = 2;
    kv = run_matrix(p, 1);
    if (kv) {
        static const int32_t want[] = {0, 2, 4, 5, 6, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], want, 6));
        ekv_kv_free(kv);
    }
    /* defaults: sinks 4, window max(1, trunc(0.1*4)) = 1, target 4 leaves
     * sinks 3 (budget exact): keys 0,1,2 + key 7 */
    p = params_for("roco", 0.5);
    kv = run_matrix(p, 1);
    if (kv) {
        CHECK(kv->params.sinks == 4);
        static const int32_t want[] = {0, 1, 2, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], want, 4));
        ekv_kv_free(kv);
    }
}

/* ------------------------------------------------------------------ */
/* SnapKV                                                             */
/* ------------------------------------------------------------------ */

static void snap_case(int32_t pool, enum ekv_pool_kind kind, const int32_t *want) {
    struct ekv_kv_params p = params_for("snapkv", 0.5); /* C = 4 */
    p.obs_window = 2;
    p.pool = pool;
    p.pool_kind = kind;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 1, 1, 1, &p, &kv));
    if (!kv) return;
    static const uint8_t tags[8] = {0};
    struct ekv_kv_step step = prompt_step(0, 8, 8, tags, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    CHECK(kv->win_start == 6);
    CHECK(kv->stats == EKV_STAT_WINSUM);
    append_entries(kv, 0, 0, 8, tags);
    for (int i = 0; i < 8; i++) feed_row(kv, 0, i, A[i], i + 1);
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    static const double s[6] = {.45, .07, .25, .13, .55, .16};
    for (int j = 0; j < 6; j++) CHECK_NEAR(h->winsum[j], s[j], 1e-6);
    CHECK_OK(kv->ops->layer(kv, 0, &step));
    CHECK_OK(ekv_kv_end(kv, &step));
    CHECK(positions_are(h, want, 4));
    /* no decode-time eviction: the cache grows */
    struct ekv_kv_step d = {.is_prompt = false, .pos0 = 8, .n_new = 1};
    CHECK_OK(ekv_kv_begin(kv, &d));
    CHECK(kv->stats == 0);
    append_entries(kv, 0, 8, 1, NULL);
    CHECK_OK(kv->ops->layer(kv, 0, &d));
    CHECK(h->len == 5);
    ekv_kv_free(kv);
}

/* max and avg pooling disagree on s = [.9, 0, 0, .5, .5, .5] (C = 3, w = 2,
 * one prefix key kept): max -> [.9,.9,.5,.5,.5,.5] keeps key 0, avg ->
 * [.3,.3,.167,.333,.5,.333] keeps key 4. */
static void snap_pool_kind(enum ekv_pool_kind kind, int32_t want0) {
    struct ekv_kv_params p = params_for("snapkv", 3.0 / 8.0);
    p.obs_window = 2;
    p.pool = 3;
    p.pool_kind = kind;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 1, 1, 1, &p, &kv));
    if (!kv) return;
    struct ekv_kv_step step = prompt_step(0, 8, 8, NULL, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    append_entries(kv, 0, 0, 8, NULL);
    static const double s[8] = {.9, 0, 0, .5, .5, .5, 1, 1};
    for (int j = 0; j < 8; j++) kv->layers[0].heads[0].winsum[j] = s[j];
    CHECK_OK(kv->ops->layer(kv, 0, &step));
    const int32_t want[3] = {want0, 6, 7};
    CHECK(positions_are(&kv->layers[0].heads[0], want, 3));
    ekv_kv_free(kv);
}

static void test_snapkv(void) {
    snap_pool_kind(EKV_POOL_MAX, 0);
    snap_pool_kind(EKV_POOL_AVG, 4);
    static const int32_t avg3[] = {3, 4, 6, 7}, none[] = {0, 4, 6, 7}, max3[] = {3, 4, 6, 7};
    snap_case(3, EKV_POOL_AVG, avg3);
    snap_case(1, EKV_POOL_AVG, none);
    snap_case(0, EKV_POOL_MAX, none);
    snap_case(3, EKV_POOL_MAX, max3);
    /* defaults */
    struct ekv_kv_params p = params_for("snapkv", 0.5);
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 1, 1, 1, &p, &kv));
    if (kv) {
        CHECK(kv->params.obs_window == 32 && kv->params.pool == 7 && kv->params.pool_kind == EKV_POOL_MAX);
        ekv_kv_free(kv);
    }
    p.pool = 4;
    kv = NULL;
    CHECK(ekv_kv_new(1, 1, 1, 1, &p, &kv) == EKV_ERR_INVALID_ARG && kv == NULL);
    /* target below the window: the last C entries (C = 2 with w = 4) */
    p = params_for("snapkv", 0.25);
    p.obs_window = 4;
    kv = run_matrix(p, 1);
    if (kv) {
        static const int32_t want[] = {6, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], want, 2));
        ekv_kv_free(kv);
    }
}

/* ------------------------------------------------------------------ */
/* PyramidKV                                                          */
/* ------------------------------------------------------------------ */

static void test_pyramid_schedule(void) {
    int32_t caps[32];
    ekv_pyramid_caps(1000, 128, 8, 4, 20.0, caps);
    static const int32_t f4[4] = {234, 158, 82, 6};
    for (int l = 0; l < 4; l++) CHECK_MSG(caps[l] == f4[l] + 8, "layer %d: %d", l, (int)caps[l]);
    ekv_pyramid_caps(100000, 2048, 8, 32, 20.0, caps);
    int64_t sum = 0;
    for (int l = 0; l < 32; l++) sum += caps[l] - 8;
    CHECK(caps[0] - 8 == 3978);
    CHECK(caps[31] - 8 == 103);
    CHECK(sum == 65296);
    /* no compression below C; uniform below 2(C-w); the clamp at T-w */
    ekv_pyramid_caps(100, 128, 8, 4, 20.0, caps);
    CHECK(caps[0] == 100 && caps[3] == 100);
    ekv_pyramid_caps(200, 128, 8, 4, 20.0, caps);
    CHECK(caps[0] == 128 && caps[3] == 128);
    /* T = 300, C = 128, w = 8: min 6, max 234 >= 292? no -> as above; T = 240:
     * max 234 >= 232 -> max 232, min 8, step (232-8)/3 = 74 */
    ekv_pyramid_caps(240, 128, 8, 4, 20.0, caps);
    CHECK(caps[0] == 232 + 8 && caps[1] == 158 + 8 && caps[2] == 84 + 8 && caps[3] == 10 + 8);

    /* kvpress */
    ekv_pyramid_caps_kvpress(1000, 0.5, 64, 4, 20.0, caps);
    static const int32_t k4[4] = {936, 645, 355, 64};
    int32_t ks = 0;
    for (int l = 0; l < 4; l++) {
        CHECK_MSG(caps[l] == k4[l], "kvpress layer %d: %d", l, (int)caps[l]);
        ks += caps[l];
    }
    CHECK(ks == 2000);
    ekv_pyramid_caps_kvpress(1000, 0.8, 64, 4, 20.0, caps);
    for (int l = 0; l < 4; l++) CHECK(caps[l] == 200);
}


/* The policy on a 1000-token prompt, 4 layers: layer capacities follow the
 * schedule with C = ceil(0.128 * 1000) = 128, w = 8. */
static void test_pyramid_policy(void) {
    struct ekv_kv_params p = params_for("pyramidkv", 0.128);
    p.obs_window = 8;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(4, 2, 2, 1, &p, &kv));
    if (!kv) return;
    CHECK(kv->params.beta == 20.0);
    const int32_t T = 1000;
    struct ekv_kv_step step = prompt_step(0, T, T, NULL, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    CHECK(kv->win_start == 992);
    for (int il = 0; il < 4; il++) {
        append_entries(kv, il, 0, T, NULL);
        for (int32_t hk = 0; hk < 2; hk++) /* fake window votes */
            for (int32_t j = 0; j < T; j++) kv->layers[il].heads[hk].winsum[j] = rnd();
        CHECK_OK(kv->ops->layer(kv, il, &step));
        static const int32_t f4[4] = {234, 158, 82, 6};
        CHECK(kv->layers[il].budget == f4[il] + 8);
        for (int32_t hk = 0; hk < 2; hk++) {
            const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            CHECK_MSG(h->len == f4[il] + 8, "layer %d head %d len %d", il, (int)hk, (int)h->len);
            bool asc = true, win = true;
            for (int32_t j = 1; j < h->len; j++) asc &= h->pos[j] > h->pos[j - 1];
            for (int32_t j = 0; j < 8; j++) win &= h->pos[h->len - 8 + j] == 992 + j;
            CHECK(asc && win);
            CHECK(h->n_evicted + h->len == T);
        }
    }
    CHECK_OK(ekv_kv_end(kv, &step));
    ekv_kv_free(kv);
}

/* ------------------------------------------------------------------ */
/* VL-Cache                                                           */
/* ------------------------------------------------------------------ */

static void test_vlcache_alloc(void) {
    double beta[4];
    int32_t k[4];
    const double g1[4] = {.30, .90, .95, .85};
    ekv_vlcache_alloc(g1, 4, 0.1, 1000, beta, k);
    static const double b1[4] = {.28, .04, .02, .06};
    static const int32_t k1[4] = {280, 40, 20, 60};
    for (int l = 0; l < 4; l++) {
        CHECK_NEAR(beta[l], b1[l], 1e-12);
        CHECK_MSG(k[l] == k1[l], "layer %d: k %d", l, (int)k[l]);
    }
    ekv_vlcache_alloc(g1, 4, 0.5, 1000, beta, k);
    static const double b2[4] = {1, .2, .1, .3};
    double s = 0;
    for (int l = 0; l < 4; l++) {
        CHECK_NEAR(beta[l], b2[l], 1e-12);
        s += beta[l];
    }
    CHECK_NEAR(s, 1.6, 1e-12);
    const double g3[4] = {.3, .9, .95, .999};
    ekv_vlcache_alloc(g3, 4, 0.02, 1000, beta, k);
    CHECK_NEAR(beta[0], .7 / .851 * .08, 1e-12);
    CHECK_NEAR(beta[0], .0658, 5e-5);
    CHECK(beta[1] == .01 && beta[2] == .01 && beta[3] == .01);
    CHECK_NEAR(beta[0] + beta[1] + beta[2] + beta[3], .0958, 5e-5);
    CHECK(k[1] == 10 && k[0] == 65);
}

static void test_vlcache_sparsity(void) {
    /* prompt of 5: image at index 2, post-vision rows at positions 3 and 4 */
    struct ekv_kv_params p = params_for("vlcache", 1.0);
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 2, 1, 1, &p, &kv));
    if (!kv) return;
    CHECK(kv->params.sparsity_p == 0.01);
    const uint8_t tags[5] = {EKV_TAG_TEXT, EKV_TAG_TEXT, EKV_TAG_IMAGE, EKV_TAG_TEXT, EKV_TAG_TEXT};
    struct ekv_kv_step step = prompt_step(0, 5, 5, tags, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    CHECK(kv->win_start == 3);
    CHECK(kv->stats == (EKV_STAT_SPARSITY | EKV_STAT_WINSUM));
    append_entries(kv, 0, 0, 5, tags);
    static const float r0[1] = {1.0f}, r1[2] = {.6f, .4f}, r2[3] = {.5f, .2f, .3f};
    static const float r3[4] = {.70f, .005f, .29f, .005f}, r4[5] = {.5f, .004f, .3f, .19f, .006f};
    feed_row(kv, 0, 0, r0, 1);
    feed_row(kv, 0, 1, r1, 2);
    feed_row(kv, 0, 2, r2, 3);
    CHECK(kv->layers[0].sparse_total == 0.0);
    feed_row(kv, 0, 3, r3, 4);
    feed_row(kv, 0, 4, r4, 5);
    /* 2 query heads with the same rows: 6 of 18 */
    CHECK(kv->layers[0].sparse_zero == 6.0 && kv->layers[0].sparse_total == 18.0);
    CHECK_NEAR(kv->layers[0].sparse_zero / kv->layers[0].sparse_total, 1.0 / 3.0, 1e-12);
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    CHECK_NEAR(h->winsum[0], 1.2, 1e-6);
    CHECK_NEAR(h->winsum[4], .006, 1e-6);
    CHECK_OK(kv->ops->layer ? kv->ops->layer(kv, 0, &step) : EKV_OK);
    CHECK_OK(ekv_kv_end(kv, &step));
    CHECK(h->len == 5); /* budget 1: nothing */
    ekv_kv_free(kv);

    /* window placement: no image -> prompt start; image last -> tau = 1 */
    p = params_for("vlcache", 0.5);
    kv = NULL;
    CHECK_OK(ekv_kv_new(1, 1, 1, 1, &p, &kv));
    if (!kv) return;
    const uint8_t text[5] = {0};
    struct ekv_kv_step s2 = prompt_step(0, 5, 5, text, true);
    CHECK_OK(ekv_kv_begin(kv, &s2));
    CHECK(kv->win_start == 0);
    const uint8_t last[5] = {0, EKV_TAG_IMAGE, 0, 0, EKV_TAG_IMAGE};
    s2 = prompt_step(0, 5, 5, last, true);
    CHECK_OK(ekv_kv_begin(kv, &s2));
    CHECK(kv->win_start == 4);
    ekv_kv_free(kv);
}

static void test_vlcache_policy(void) {
    /* no image: psi = colsum of A; budget .5 -> k = 4, recent 25% -> r = 1:
     * key 7 + top 3 of keys 0..6 by colsum = {0, 2, 4} */
    struct ekv_kv_params p = params_for("vlcache", 0.5);
    p.recent_ratio = 0.25;
    struct ekv_kv *kv = run_matrix(p, 1);
    if (kv) {
        static const int32_t want[] = {0, 2, 4, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], want, 4));
        CHECK(kv->layers[0].budget == 4);
        ekv_kv_free(kv);
    }
    /* default recent 10%: r = 0 -> top 4 by colsum {0, 2, 3, 4} */
    kv = run_matrix(params_for("vlcache", 0.5), 1);
    if (kv) {
        static const int32_t want[] = {0, 2, 3, 4};
        CHECK(positions_are(&kv->layers[0].heads[0], want, 4));
        ekv_kv_free(kv);
    }
    /* 4 layers with sparsities [.30,.90,.95,.85], alpha .1, m = 1000:
     * k = [280, 40, 20, 60], the last floor(0.1 k) entries kept */
    p = params_for("vlcache", 0.1);
    kv = NULL;
    CHECK_OK(ekv_kv_new(4, 1, 1, 1, &p, &kv));
    if (!kv) return;
    const int32_t m = 1000;
    struct ekv_kv_step step = prompt_step(0, m, m, NULL, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    static const double g[4] = {.30, .90, .95, .85};
    static const int32_t kk[4] = {280, 40, 20, 60};
    for (int il = 0; il < 4; il++) {
        append_entries(kv, il, 0, m, NULL);
        struct ekv_kv_head *h = &kv->layers[il].heads[0];
        for (int32_t j = 0; j < m; j++) h->winsum[j] = (j % 2 == 0) ? 1.0 + j : 0.0; /* favour late even positions */
        kv->layers[il].sparse_zero = g[il] * 100.0;
        kv->layers[il].sparse_total = 100.0;
    }
    CHECK_OK(ekv_kv_end(kv, &step));
    for (int il = 0; il < 4; il++) {
        const struct ekv_kv_head *h = &kv->layers[il].heads[0];
        CHECK_MSG(h->len == kk[il], "layer %d len %d", il, (int)h->len);
        CHECK(kv->layers[il].budget == kk[il]);
        const int32_t r = kk[il] / 10;
        bool ok = true;
        for (int32_t j = 0; j < r; j++) ok &= h->pos[h->len - r + j] == m - r + j;
        /* the others: the largest even positions below m - r */
        const int32_t top = ((m - r - 1) / 2) * 2;
        for (int32_t j = 0; j < kk[il] - r; j++) ok &= h->pos[j] == top - 2 * (kk[il] - r - 1 - j);
        CHECK_MSG(ok, "layer %d selection", il);
    }
    ekv_kv_free(kv);
}

/* ------------------------------------------------------------------ */
/* Elastic Cache                                                      */
/* ------------------------------------------------------------------ */

/* Entry j of a head_dim-2 head as {k0, k1, v0, v1}, read through the access API. */
static void kv_row2(const struct ekv_kv *kv, const struct ekv_kv_head *h, int j, float out[4]) {
    out[0] = out[1] = out[2] = out[3] = NAN;
    if (kv->head_dim == 2) (void)ekv_kv_head_get(kv, h, j, out, out + 2);
}

static bool kv_is(const struct ekv_kv *kv, const struct ekv_kv_head *h, const double *val, int n) {
    if (h->len != n) return false;
    bool ok = true;
    for (int j = 0; j < n; j++) {
        float r[4];
        kv_row2(kv, h, j, r);
        ok &= fabs(r[0] - val[j]) < 1e-5 && fabs(r[1] - 2 * val[j]) < 1e-5;
        ok &= fabs(r[2] + val[j]) < 1e-5 && fabs(r[3] - (100 + val[j])) < 1e-4;
    }
    return ok;
}

static void test_elastic_vectors(void) {
    /* paper-faithful: [kv0, mean(1,2,3) = 2, mean(4,5,6) = 5, kv7] */
    struct ekv_kv_params p = params_for("elastic", 0.5);
    struct ekv_kv *kv = run_matrix(p, 2);
    if (kv) {
        const struct ekv_kv_head *h = &kv->layers[0].heads[0];
        CHECK(kv->params.sinks == 1 && kv->params.distance == -25);
        static const int32_t pos[] = {0, 2, 4, 7};
        static const double val[] = {0, 2, 5, 7};
        CHECK(positions_are(h, pos, 4));
        CHECK(kv_is(kv, h, val, 4));
        CHECK(h->weight[0] == 1 && h->weight[1] == 3 && h->weight[2] == 3 && h->weight[3] == 1);
        CHECK(h->n_merged == 4 && h->n_evicted == 0);
        CHECK(weight_sum(h) + (double)h->n_evicted == (double)kv->n_seen);
        CHECK(ekv_elastic_fixed_point(kv, 0) == 1); /* 4 - 25 clamped to [1, 2] */
        ekv_kv_free(kv);
    }
    /* reference: [kv0, (1+1+2+3+4+5)/6 = 2.667, kv7] */
    p.compat_ref = true;
    kv = run_matrix(p, 2);
    if (kv) {
        const struct ekv_kv_head *h = &kv->layers[0].heads[0];
        static const int32_t pos[] = {0, 1, 7};
        static const double val[] = {0, 16.0 / 6.0, 7};
        CHECK(positions_are(h, pos, 3));
        CHECK(kv_is(kv, h, val, 3));
        float r1[4];
        kv_row2(kv, h, 1, r1);
        CHECK_NEAR(r1[0], 2.667, 5e-4);
        /* honest accounting: kv2..kv5 merged, kv6 dropped */
        CHECK(h->n_merged == 4 && h->n_evicted == 1);
        CHECK(weight_sum(h) + (double)h->n_evicted == 8.0);
        CHECK(ekv_elastic_fixed_point(kv, 0) == 8 - 4 - 25);
        ekv_kv_free(kv);
    }
    /* f == 1 at prefill (budget .8: f = trunc(8 - 6.4) = 1): no merge, one
     * entry eliminated at P = clamp(8 - 25) = 1; the reference deletes index 0 */
    p = params_for("elastic", 0.8);
    kv = run_matrix(p, 2);
    if (kv) {
        static const int32_t pos[] = {0, 2, 3, 4, 5, 6, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], pos, 7));
        CHECK(kv->layers[0].heads[0].n_merged == 0);
        ekv_kv_free(kv);
    }
    p.compat_ref = true;
    kv = run_matrix(p, 2);
    if (kv) {
        static const int32_t pos[] = {1, 2, 3, 4, 5, 6, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], pos, 7));
        ekv_kv_free(kv);
    }
    /* max_tokens 4 with budget 1 forces f = 4: the paper-faithful result above */
    p = params_for("elastic", 1.0);
    p.max_tokens = 4;
    kv = run_matrix(p, 2);
    if (kv) {
        static const int32_t pos[] = {0, 2, 4, 7};
        static const double val[] = {0, 2, 5, 7};
        CHECK(positions_are(&kv->layers[0].heads[0], pos, 4));
        CHECK(kv_is(kv, &kv->layers[0].heads[0], val, 4));
        ekv_kv_free(kv);
    }
    /* f <= 0 (budget 1): nothing */
    kv = run_matrix(params_for("elastic", 1.0), 2);
    if (kv) {
        CHECK(kv->layers[0].heads[0].len == 8);
        ekv_kv_free(kv);
    }
}

/* Anchors are shared by the heads of a layer and chosen on the all-head
 * mean: head 0 alone would pick {1,4}, head 1 {3,5}; the mean picks {1,3}. */
static void test_elastic_shared_anchors(void) {
    struct ekv_kv_params p = params_for("elastic", 0.5);
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 4, 2, 2, &p, &kv));
    if (!kv) return;
    struct ekv_kv_step step = prompt_step(0, 8, 8, NULL, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    CHECK(kv->stats == EKV_STAT_COLSUM);
    append_entries(kv, 0, 0, 8, NULL);
    static const double c0[8] = {5, .9, .1, .1, .8, .1, .1, 1};
    static const double c1[8] = {5, .1, .1, .9, .1, .7, .1, 1};
    for (int j = 0; j < 8; j++) {
        kv->layers[0].heads[0].colsum[j] = c0[j];
        kv->layers[0].heads[1].colsum[j] = c1[j];
    }
    CHECK_OK(kv->ops->layer(kv, 0, &step));
    static const int32_t pos[] = {0, 1, 3, 7};
    static const double val[] = {0, 1.5, 4.5, 7}; /* 2 ties between 1 and 3 -> left */
    for (int hk = 0; hk < 2; hk++) {
        CHECK(positions_are(&kv->layers[0].heads[hk], pos, 4));
        CHECK(kv_is(kv, &kv->layers[0].heads[hk], val, 4));
    }
    /* decode: statistics off, frozen scores */
    struct ekv_kv_step d = {.is_prompt = false, .pos0 = 8, .n_new = 1};
    CHECK_OK(ekv_kv_begin(kv, &d));
    CHECK(kv->stats == 0 && kv->layers[0].heads[0].colsum == NULL);
    ekv_kv_free(kv);
}

/* Fixed point: T = 600, r = 0.2 (budget .8): merge to 480 entries with P = 455
 * (25 entries from P on); then one eviction at index P every 5 decode steps
 * (paper) or 479 entries and every 5 steps from step 10 (reference). */
static void elastic_long(bool compat) {
    struct ekv_kv_params p = params_for("elastic", 0.8);
    p.compat_ref = compat;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, 1, 1, 2, &p, &kv));
    if (!kv) return;
    const int32_t T = 600;
    struct ekv_kv_step step = prompt_step(0, T, T, NULL, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    append_entries(kv, 0, 0, T, NULL);
    struct ekv_kv_head *h = &kv->layers[0].heads[0];
    for (int32_t j = 0; j < T; j++) h->colsum[j] = rnd();
    CHECK_OK(kv->ops->layer(kv, 0, &step));
    CHECK_OK(ekv_kv_end(kv, &step));
    const int32_t P = ekv_elastic_fixed_point(kv, 0);
    CHECK(P == 455);
    CHECK(h->len == (compat ? 479 : 480));
    if (!compat) {
        CHECK(h->len - P == 25);
        CHECK(h->n_merged == 120 && h->n_evicted == 0);
    }
    CHECK(weight_sum(h) + (double)h->n_evicted == 600.0);
    bool asc = true;
    for (int32_t j = 1; j < h->len; j++) asc &= h->pos[j] > h->pos[j - 1];
    CHECK(asc && h->pos[0] == 0 && h->pos[h->len - 1] == T - 1);

    int bad = 0;
    for (int32_t k = 1; k <= 100; k++) {
        struct ekv_kv_step d = {.is_prompt = false, .pos0 = T + k - 1, .n_new = 1};
        CHECK_OK(ekv_kv_begin(kv, &d));
        append_entries(kv, 0, T + k - 1, 1, NULL);
        const int32_t len0 = h->len;
        const int32_t at_p = h->pos[P], after_p = h->pos[P + 1];
        CHECK_OK(kv->ops->layer(kv, 0, &d));
        const bool expect = compat ? (k >= 10 && k % 5 == 0) : (k % 5 == 0);
        if (expect) {
            if (h->len != len0 - 1 || h->pos[P] != after_p) bad++;
            for (int32_t j = 0; j < h->len; j++)
                if (h->pos[j] == at_p) bad++;
        } else if (h->len != len0) {
            bad++;
        }
        if (weight_sum(h) + (double)h->n_evicted != (double)kv->n_seen) bad++;
        if (h->pos[h->len - 1] != T + k - 1) bad++;
    }
    CHECK_MSG(bad == 0, "%s: %d mismatches over 100 decode steps", compat ? "reference" : "paper", bad);
    /* the cache tracks 0.8 n (paper) */
    if (!compat) CHECK(h->len == 480 + 100 - 20);
    /* RoPE position of the next token: the true one (paper), the compressed
     * length (reference mode) */
    struct ekv_kv_step next = {.is_prompt = false, .pos0 = T + 100, .n_new = 1};
    CHECK(ekv_kv_rope_pos(kv, &next) == (compat ? h->len : T + 100));
    ekv_kv_free(kv);
}

/* Edge cases of the reference's unclamped P with Python slicing:
 * after the reference merge above ([0, 1, 7], P = 4 + distance) four decode
 * steps give f = trunc(k/2 - 1) = 1 at k = 4 with 7 entries
 * [0,1,7,8,9,10,11]: P = -2 deletes index 5 (position 10); P = -21
 * (len < -P) and P = -1 (the reference would duplicate) delete nothing. */
static void elastic_compat_edge(int32_t distance, const int32_t *want, int n_want) {
    struct ekv_kv_params p = params_for("elastic", 0.5);
    p.compat_ref = true;
    p.distance = distance;
    struct ekv_kv *kv = run_matrix(p, 2);
    if (!kv) return;
    CHECK(ekv_elastic_fixed_point(kv, 0) == 4 + distance);
    for (int32_t k = 1; k <= 4; k++) {
        struct ekv_kv_step d = {.is_prompt = false, .pos0 = 7 + k, .n_new = 1};
        CHECK_OK(ekv_kv_begin(kv, &d));
        append_entries(kv, 0, 7 + k, 1, NULL);
        CHECK_OK(kv->ops->layer(kv, 0, &d));
    }
    CHECK_MSG(positions_are(&kv->layers[0].heads[0], want, n_want), "distance %d", (int)distance);
    ekv_kv_free(kv);
}

static void test_elastic_long(void) {
    static const int32_t del5[] = {0, 1, 7, 8, 9, 11}, none[] = {0, 1, 7, 8, 9, 10, 11};
    elastic_compat_edge(-6, del5, 6);
    elastic_compat_edge(-25, none, 7);
    elastic_compat_edge(-5, none, 7);
    elastic_long(false);
    elastic_long(true);
}

/* ------------------------------------------------------------------ */
/* Every policy through ekv_kv_layer_forward on random data             */
/* ------------------------------------------------------------------ */

static void run_random(const char *policy, int32_t chunk) {
    const int32_t L = 3, H = 4, G = 2, d = 8, m = 97, n_dec = 23;
    struct ekv_kv_params p = params_for(policy, 0.3);
    p.obs_window = 8;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(L, H, G, d, &p, &kv));
    if (!kv) return;
    uint8_t *tags = calloc((size_t)m, 1);
    for (int32_t i = 10; i < 60; i++) tags[i] = EKV_TAG_IMAGE;
    const int32_t maxn = m;
    float *q = malloc((size_t)maxn * H * d * sizeof *q), *k = malloc((size_t)maxn * G * d * sizeof *k);
    float *v = malloc((size_t)maxn * G * d * sizeof *v), *out = malloc((size_t)maxn * H * d * sizeof *out);
    int bad = 0;
    for (int32_t pos = 0; pos < m + n_dec;) {
        const bool prompt = pos < m;
        const int32_t n = prompt ? (chunk > 0 ? EKV_MIN(chunk, m - pos) : m) : 1;
        struct ekv_kv_step s = prompt ? prompt_step(pos, n, m, tags, pos + n == m)
                                      : (struct ekv_kv_step){.is_prompt = false, .pos0 = pos, .n_new = 1};
        for (size_t i = 0; i < (size_t)n * H * d; i++) q[i] = (float)(rnd() * 4 - 2);
        for (size_t i = 0; i < (size_t)n * G * d; i++) k[i] = (float)(rnd() * 4 - 2);
        for (size_t i = 0; i < (size_t)n * G * d; i++) v[i] = (float)(rnd() * 2 - 1);
        CHECK_OK(ekv_kv_begin(kv, &s));
        for (int il = 0; il < L; il++) CHECK_OK(ekv_kv_layer_forward(kv, NULL, il, &s, q, k, v, out));
        CHECK_OK(ekv_kv_end(kv, &s));
        pos += n;
        for (int il = 0; il < L; il++)
            for (int hk = 0; hk < G; hk++) {
                const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                for (int32_t j = 1; j < h->len; j++) bad += h->pos[j] <= h->pos[j - 1];
                if (strcmp(policy, "vlcache")) bad += h->pos[h->len - 1] != pos - 1; /* newest kept */
                bad += fabs(weight_sum(h) + (double)h->n_evicted - (double)pos) > 1e-3;
                const int32_t target = (int32_t)ceil(0.3 * pos - 1e-9);
                if (!strcmp(policy, "roco") || !strcmp(policy, "elastic")) {
                    /* exact budget after every forward (elastic: N = ceil(b n)) */
                    if (strcmp(policy, "elastic") || !prompt || pos == m) bad += h->len != target;
                } else if (pos == m) {
                    if (!strcmp(policy, "snapkv")) bad += h->len != target;
                    /* T = 97, C = 30, w = 8: min 1, max 43, step 21 */
                    static const int32_t pcap[3] = {43 + 8, 22 + 8, 1 + 8};
                    if (!strcmp(policy, "pyramidkv")) bad += h->len != pcap[il];
                }
            }
        if (pos >= m && (!strcmp(policy, "snapkv") || !strcmp(policy, "pyramidkv") || !strcmp(policy, "vlcache"))) {
            /* no decode eviction: grows by one per step */
            static int32_t len_at_m[3];
            for (int il = 0; il < L; il++) {
                if (pos == m) len_at_m[il] = kv->layers[il].heads[0].len;
                else bad += kv->layers[il].heads[0].len != len_at_m[il] + (pos - m);
            }
        }
    }
    CHECK_MSG(bad == 0, "%s chunk %d: %d invariant failures", policy, (int)chunk, bad);
    free(tags); free(q); free(k); free(v); free(out);
    ekv_kv_free(kv);
}

static void test_random_all(void) {
    static const char *pol[] = {"roco", "snapkv", "pyramidkv", "vlcache", "elastic"};
    for (size_t i = 0; i < EKV_ARRAY_LEN(pol); i++) {
        run_random(pol[i], 0);
        run_random(pol[i], 16);
    }
}

/* ---- +adakv (src/kv/adakv.c) ---- */

/* One layer of H KV heads (one query head each), 10 prompt entries, window 2, no pooling,
 * budget 0.5 (C = 5: 2 window + 3 candidates per head), candidate scores s[h][0..8). */
static struct ekv_kv *ada_run(const char *spec, int H, const double s[][8]) {
    struct ekv_kv_params p = params_for(spec, 0.5);
    p.obs_window = 2;
    p.pool = 1;
    struct ekv_kv *kv = NULL;
    CHECK_OK(ekv_kv_new(1, H, H, 1, &p, &kv));
    if (!kv) return NULL;
    struct ekv_kv_step step = prompt_step(0, 10, 10, NULL, true);
    CHECK_OK(ekv_kv_begin(kv, &step));
    append_entries(kv, 0, 0, 10, NULL);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < 10; j++) kv->layers[0].heads[h].winsum[j] = j < 8 ? s[h][j] : 1.0;
    CHECK_OK(kv->ops->layer(kv, 0, &step));
    CHECK_OK(ekv_kv_end(kv, &step));
    return kv;
}

static void test_adakv_vectors(void) {
    static const double s[2][8] = {{.9, .8, .7, .6, .5, .4, .3, .2}, {.05, .04, .03, .02, .01, 0, 0, 0}};
    /* ada_floor 0.2: floor(0.6) = 0 own candidates; the 6 best of the layer are head 0's */
    struct ekv_kv *kv = ada_run("snapkv+adakv", 2, s);
    if (kv) {
        const int32_t w0[8] = {0, 1, 2, 3, 4, 5, 8, 9}, w1[2] = {8, 9};
        CHECK(positions_are(&kv->layers[0].heads[0], w0, 8));
        CHECK(positions_are(&kv->layers[0].heads[1], w1, 2));
    }
    ekv_kv_free(kv);
    /* ada_floor 0.5: floor(1.5) = 1 each; the other 4 go to head 0 */
    kv = ada_run("snapkv+adakv:ada_floor=0.5", 2, s);
    if (kv) {
        const int32_t w0[7] = {0, 1, 2, 3, 4, 8, 9}, w1[3] = {0, 8, 9};
        CHECK(positions_are(&kv->layers[0].heads[0], w0, 7));
        CHECK(positions_are(&kv->layers[0].heads[1], w1, 3));
    }
    ekv_kv_free(kv);
    /* ada_floor 1 and plain snapkv: 3 candidates per head */
    for (int v = 0; v < 2; v++) {
        kv = ada_run(v ? "snapkv" : "snapkv+adakv:ada_floor=1", 2, s);
        if (!kv) continue;
        const int32_t w[5] = {0, 1, 2, 8, 9};
        CHECK(positions_are(&kv->layers[0].heads[0], w, 5));
        CHECK(positions_are(&kv->layers[0].heads[1], w, 5));
        ekv_kv_free(kv);
    }
}

/* Random layers: the caps keep the layer's total, each head's floor, and the kept sets are the
 * joint ranking's (brute force: candidates sorted by score, then head, then index). */
static void test_adakv_random(void) {
    enum { H = 4, N = 40, W = 3 };
    int bad = 0;
    for (int it = 0; it < 200; it++) {
        const double fl = it % 5 == 0 ? 0.0 : it % 5 == 1 ? 1.0 : rnd();
        char spec[64];
        snprintf(spec, sizeof spec, "snapkv+adakv:ada_floor=%.17g", fl);
        const double budget = 0.1 + 0.8 * rnd();
        struct ekv_kv_params p = params_for(spec, budget);
        p.obs_window = W;
        p.pool = 1;
        struct ekv_kv *kv = NULL;
        CHECK_OK(ekv_kv_new(1, H, H, 1, &p, &kv));
        if (!kv) return;
        struct ekv_kv_step step = prompt_step(0, N, N, NULL, true);
        CHECK_OK(ekv_kv_begin(kv, &step));
        append_entries(kv, 0, 0, N, NULL);
        double sc[H][N];
        for (int h = 0; h < H; h++)
            for (int j = 0; j < N; j++) kv->layers[0].heads[h].winsum[j] = sc[h][j] = floor(rnd() * 20) / 20; /* ties */
        const int32_t C = ekv_kv_target(kv, 0);
        CHECK_OK(kv->ops->layer(kv, 0, &step));
        /* brute force */
        int keep[H][N] = {{0}}, fcount[H] = {0}, total = 0, room = C > W ? C - W : 0;
        for (int h = 0; h < H; h++) {
            for (int j = N - W; j < N; j++) keep[h][j] = 1;
            const int f = (int)floor(fl * room + 1e-9);
            for (int k = 0; k < f; k++) { /* head h's best unkept candidate */
                int b = -1;
                for (int j = 0; j < N - W; j++)
                    if (!keep[h][j] && (b < 0 || sc[h][j] > sc[h][b])) b = j;
                keep[h][b] = 1;
            }
            fcount[h] = f;
            total += room - f;
        }
        for (int k = 0; k < total; k++) {
            int bh = -1, bj = -1;
            for (int h = 0; h < H; h++)
                for (int j = 0; j < N - W; j++)
                    if (!keep[h][j] && (bh < 0 || sc[h][j] > sc[bh][bj])) bh = h, bj = j;
            keep[bh][bj] = 1;
        }
        int sum = 0;
        for (int h = 0; h < H; h++) {
            const struct ekv_kv_head *hd = &kv->layers[0].heads[h];
            sum += hd->len;
            int n = 0;
            for (int j = 0; j < N; j++) n += keep[h][j];
            bool same = n == hd->len && hd->len >= W + fcount[h];
            for (int i = 0, j = 0; same && j < N; j++)
                if (keep[h][j]) same = hd->pos[i++] == j;
            bad += !same;
        }
        bad += sum != H * C;
        ekv_kv_free(kv);
    }
    CHECK_MSG(bad == 0, "+adakv: %d heads or layers differ from the joint ranking of 200 random layers", bad);
}

int main(void) {
    test_adakv_vectors();
    test_adakv_random();
    test_roco();
    test_snapkv();
    test_pyramid_schedule();
    test_pyramid_policy();
    test_vlcache_alloc();
    test_vlcache_sparsity();
    test_vlcache_policy();
    test_elastic_vectors();
    test_elastic_shared_anchors();
    test_elastic_long();
    test_random_all();
    return test_finish("test_policies_adv");
}
