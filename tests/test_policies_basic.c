/*
 * test_policies_basic.c — the simple policies against hand-worked test
 * vectors (the 8-token attention matrix A fed row by row through ekv_attn_accumulate into
 * a one-layer, one-head cache whose entry t has k = v = t), the shared
 * selection helpers (top-k tie rule, pooling), and invariants that every
 * registered policy must keep on random data driven through
 * ekv_kv_begin / ekv_kv_layer_forward / ekv_kv_end.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"
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

/* A one-layer, one-head cache with the 8 entries of A, statistics fed
 * from A, and the policy's layer() run once. Returns NULL on failure. */
static struct ekv_kv *run_matrix(struct ekv_kv_params p) {
    struct ekv_kv *kv = NULL;
    enum ekv_status s = ekv_kv_new(1, 1, 1, 1, &p, &kv);
    CHECK_OK(s);
    if (s != EKV_OK) return NULL;
    uint8_t tags[8] = {0};
    struct ekv_kv_step step = {.is_prompt = true, .last_chunk = true, .pos0 = 0, .n_new = 8,
                               .prompt_pos0 = 0, .prompt_len = 8, .prompt_tags = tags, .tags = tags};
    CHECK_OK(ekv_kv_begin(kv, &step));
    CHECK_OK(ekv_kv_reserve(kv, 0, 8));
    struct ekv_kv_head *h = &kv->layers[0].heads[0];
    for (int t = 0; t < 8; t++) {
        float x = (float)t;
        ekv_kv_head_append(kv, h, &x, &x, t, EKV_TAG_TEXT, NULL);
    }
    struct ekv_attn_stats st = {.flags = kv->stats, .colsum = h->colsum, .count = h->count, .sumsq = h->sumsq,
                                .lastrow = h->lastrow, .winsum = h->winsum, .bincount = h->bincount};
    for (int i = 0; i < 8; i++) ekv_attn_accumulate(A[i], 1, i + 1, &st);
    if (kv->ops->layer) CHECK_OK(kv->ops->layer(kv, 0, &step));
    CHECK_OK(ekv_kv_end(kv, &step));
    return kv;
}

static bool keeps(const struct ekv_kv *kv, const int32_t *want, int n) {
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    if (h->len != n) return false;
    for (int j = 0; j < n; j++) {
        float k = NAN, v = NAN;
        if (kv->head_dim != 1 || ekv_kv_head_get(kv, h, j, &k, &v) != EKV_OK) return false;
        if (h->pos[j] != want[j] || k != (float)want[j] || v != (float)want[j]) return false;
    }
    return true;
}

static void print_keep(const char *what, const struct ekv_kv *kv) {
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    fprintf(stderr, "  %s keeps {", what);
    for (int j = 0; j < h->len; j++) fprintf(stderr, "%s%d", j ? "," : "", (int)h->pos[j]);
    fprintf(stderr, "}\n");
}

static struct ekv_kv_params params(const char *policy, int max_tokens) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = policy;
    p.max_tokens = max_tokens;
    return p;
}

static void test_full(void) {
    struct ekv_kv *kv = run_matrix(params("full", 4));
    if (!kv) return;
    const int32_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK(keeps(kv, all, 8));
    CHECK(kv->stats == 0);
    CHECK(kv->layers[0].heads[0].colsum == NULL);
    ekv_kv_free(kv);
}

static void test_local(void) {
    struct ekv_kv_params p = params("local", 4);
    p.sinks = 2;
    struct ekv_kv *kv = run_matrix(p);
    if (!kv) return;
    const int32_t want[4] = {0, 1, 6, 7}; /* local, sinks 2 */
    CHECK(keeps(kv, want, 4));
    print_keep("local(sinks 2)", kv);
    CHECK(kv->layers[0].heads[0].n_evicted == 4);
    ekv_kv_free(kv);
    /* default 4 sinks with a target of 4: [CHOICE] sinks shrink to 3 so
     * the newest token stays */
    kv = run_matrix(params("local", 4));
    if (!kv) return;
    CHECK(kv->params.sinks == 4);
    const int32_t want2[4] = {0, 1, 2, 7};
    CHECK(keeps(kv, want2, 4));
    ekv_kv_free(kv);
}

static void test_h2o(void) {
    struct ekv_kv *kv = run_matrix(params("h2o", 1000));
    if (!kv) return;
    /* no eviction with a cap above the length: check colsum of A */
    const double colsum[8] = {3.70, .59, 1.40, .61, .90, .41, .29, .10};
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    CHECK(h->len == 8);
    for (int j = 0; j < 8 && h->colsum; j++) {
        CHECK_NEAR(h->colsum[j], colsum[j], 1e-6);
        CHECK(h->count[j] == 8 - j);
    }
    ekv_kv_free(kv);

    kv = run_matrix(params("h2o", 4)); /* C = 4, w = C/2 = 2 */
    if (!kv) return;
    const int32_t want[4] = {0, 2, 6, 7}; /* h2o */
    CHECK(keeps(kv, want, 4));
    print_keep("h2o(C 4)", kv);
    h = &kv->layers[0].heads[0];
    /* scores travel with their entries */
    const double kept[4] = {3.70, 1.40, .29, .10};
    for (int j = 0; j < 4 && h->colsum; j++) CHECK_NEAR(h->colsum[j], kept[j], 1e-6);
    ekv_kv_free(kv);

    struct ekv_kv_params p = params("h2o", 4);
    p.window = 1; /* top 3 of keys 0..6 by colsum, plus key 7 */
    kv = run_matrix(p);
    if (!kv) return;
    const int32_t want1[4] = {0, 2, 4, 7};
    CHECK(keeps(kv, want1, 4));
    ekv_kv_free(kv);
}

static void test_scissorhands(void) {
    struct ekv_kv *kv = run_matrix(params("scissorhands", 1000));
    if (!kv) return;
    const float counts[8] = {8, 0, 5, 1, 3, 1, 1, 0}; /* scissorhands */
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    for (int j = 0; j < 8 && h->bincount; j++) CHECK_MSG(h->bincount[j] == counts[j], "key %d: %g", j, h->bincount[j]);
    CHECK(h->bincount != NULL && h->colsum == NULL);
    ekv_kv_free(kv);

    kv = run_matrix(params("scissorhands", 4));
    if (!kv) return;
    const int32_t want[4] = {0, 2, 6, 7};
    CHECK(keeps(kv, want, 4));
    print_keep("scissorhands(C 4)", kv);
    ekv_kv_free(kv);
}

static void test_tova(void) {
    struct ekv_kv *kv = run_matrix(params("tova", 4));
    if (!kv) return;
    const int32_t want[4] = {0, 2, 4, 5}; /* pure TOVA */
    CHECK(keeps(kv, want, 4));
    print_keep("tova(C 4)", kv);
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    const float last[4] = {.20f, .15f, .25f, .11f};
    for (int j = 0; j < 4 && h->lastrow; j++) CHECK_NEAR(h->lastrow[j], last[j], 1e-7);
    ekv_kv_free(kv);
}

static void test_random(void) {
    int32_t first[4] = {0};
    int n_same = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        struct ekv_kv_params p = params("random", 4);
        p.seed = seed;
        struct ekv_kv *a = run_matrix(p);
        struct ekv_kv *b = run_matrix(p);
        if (!a || !b) {
            ekv_kv_free(a);
            ekv_kv_free(b);
            return;
        }
        const struct ekv_kv_head *ha = &a->layers[0].heads[0], *hb = &b->layers[0].heads[0];
        CHECK(ha->len == 4 && hb->len == 4);
        bool same = true;
        for (int j = 0; j < 4; j++) {
            CHECK(ha->pos[j] == hb->pos[j]); /* fixed seed: fixed output */
            if (j) CHECK(ha->pos[j] > ha->pos[j - 1]);
            float kj = NAN;
            CHECK_OK(ekv_kv_head_get(a, ha, j, &kj, NULL));
            CHECK(kj == (float)ha->pos[j]);
            if (seed == 1) first[j] = ha->pos[j];
            same = same && ha->pos[j] == first[j];
        }
        n_same += same;
        ekv_kv_free(a);
        ekv_kv_free(b);
    }
    CHECK_MSG(n_same < 8, "8 seeds gave the same subset"); /* P = 70^-7 for a correct sampler */
}

static void test_helpers(void) {
    /* SnapKV: window sums over keys 0..5 */
    const double s[6] = {.45, .07, .25, .13, .55, .16};
    double pooled[6];
    int32_t idx[6];
    ekv_pool1d(s, 6, 3, EKV_POOL_AVG, pooled);
    const double avg[6] = {.52 / 3, .77 / 3, .45 / 3, .93 / 3, .84 / 3, .71 / 3};
    for (int j = 0; j < 6; j++) CHECK_NEAR(pooled[j], avg[j], 1e-12);
    CHECK(ekv_topk(pooled, 6, 2, NULL, idx) == 2);
    CHECK(idx[0] == 3 && idx[1] == 4);
    ekv_pool1d(s, 6, 3, EKV_POOL_MAX, pooled);
    const double mx[6] = {.45, .45, .25, .55, .55, .55};
    for (int j = 0; j < 6; j++) CHECK(pooled[j] == mx[j]);
    CHECK(ekv_topk(pooled, 6, 2, NULL, idx) == 2); /* three-way tie: lowest indices */
    CHECK(idx[0] == 3 && idx[1] == 4);
    CHECK(ekv_topk(s, 6, 2, NULL, idx) == 2); /* no pooling */
    CHECK(idx[0] == 0 && idx[1] == 4);
    ekv_pool1d(s, 6, 1, EKV_POOL_AVG, pooled);
    for (int j = 0; j < 6; j++) CHECK(pooled[j] == s[j]);
    ekv_pool1d(s, 6, 5, EKV_POOL_AVG, pooled);
    CHECK_NEAR(pooled[0], (.45 + .07 + .25) / 5, 1e-12);
    CHECK_NEAR(pooled[2], (.45 + .07 + .25 + .13 + .55) / 5, 1e-12);

    /* ties, mask, NaN, k > candidates; output ascending */
    const double t[7] = {1, 3, 3, NAN, 3, 0, 2};
    CHECK(ekv_topk(t, 7, 2, NULL, idx) == 2);
    CHECK(idx[0] == 1 && idx[1] == 2);
    const uint8_t mask[7] = {1, 0, 1, 1, 1, 1, 0};
    CHECK(ekv_topk(t, 7, 3, mask, idx) == 3);
    CHECK(idx[0] == 0 && idx[1] == 2 && idx[2] == 4);
    CHECK(ekv_topk(t, 7, 10, mask, idx) == 5);
    CHECK(idx[0] == 0 && idx[1] == 2 && idx[2] == 3 && idx[3] == 4 && idx[4] == 5);
    CHECK(ekv_topk(t, 7, 6, NULL, idx) == 6); /* NaN ranks last: 3 is out */
    CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2 && idx[3] == 4 && idx[4] == 5 && idx[5] == 6);
    CHECK(ekv_topk(t, 7, 0, NULL, idx) == 0);

    /* a larger top-k against a sort-based reference */
    enum { N = 500 };
    double sc[N];
    int32_t got[N];
    uint32_t x = 12345;
    for (int j = 0; j < N; j++) {
        x = x * 1664525u + 1013904223u;
        sc[j] = (double)((x >> 16) % 50); /* many ties */
    }
    const int32_t k = 137;
    CHECK(ekv_topk(sc, N, k, NULL, got) == k);
    /* reference: the k-th best by (score desc, index asc) */
    int32_t n_ok = 0;
    for (int j = 0; j < N; j++) {
        int better = 0;
        for (int i = 0; i < N; i++) better += sc[i] > sc[j] || (sc[i] == sc[j] && i < j);
        bool in_ref = better < k, in_got = false;
        for (int t2 = 0; t2 < k; t2++) in_got = in_got || got[t2] == j;
        n_ok += in_ref == in_got;
    }
    CHECK(n_ok == N);
    bool asc = true;
    for (int t2 = 1; t2 < k; t2++) asc = asc && got[t2] > got[t2 - 1];
    CHECK(asc);

    /* both ways ekv_topk selects (a heap of the k kept; when all but at most
     * 64 candidates are kept, a heap of the dropped): every k around the
     * switch and far from it, with ties, NaN and masks, against the rank rule */
    uint8_t mk[N];
    int bad = 0, cases = 0;
    for (int trial = 0; trial < 60; trial++) {
        const int n = 1 + trial * 8; /* 1 .. 473 */
        for (int j = 0; j < n; j++) {
            x = x * 1664525u + 1013904223u;
            sc[j] = (x >> 16) % 97 == 0 ? NAN : (double)((x >> 16) % 23);
            mk[j] = (x >> 8) % 5 != 0;
        }
        const uint8_t *msk = trial % 2 ? mk : NULL;
        int c = 0;
        for (int j = 0; j < n; j++) c += !msk || msk[j];
        const int ks[] = {1, n / 3, c - 70, c - 65, c - 64, c - 63, c - 1, c, c + 3};
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int kk = ks[ki];
            if (kk <= 0) continue;
            const int32_t m = ekv_topk(sc, n, kk, msk, got);
            int want = kk < c ? kk : c;
            bad += m != want;
            for (int t2 = 1; t2 < m; t2++) bad += got[t2] <= got[t2 - 1];
            for (int t2 = 0; t2 < m; t2++) { /* each listed candidate ranks among the first kk */
                const int j = got[t2];
                if (msk && !msk[j]) {
                    bad++;
                    continue;
                }
                const double sj = isnan(sc[j]) ? -INFINITY : sc[j];
                int better = 0;
                for (int i = 0; i < n; i++) {
                    if (msk && !msk[i]) continue;
                    const double si = isnan(sc[i]) ? -INFINITY : sc[i];
                    better += si > sj || (si == sj && i < j);
                }
                bad += better >= kk;
            }
            cases++;
        }
    }
    CHECK_MSG(bad == 0, "ekv_topk against the rank rule: %d mismatches in %d cases", bad, cases);
}

/* Walks the registry: every entry is complete, findable by its unique
 * name, listed by the public calls, and builds a cache with its defaults;
 * the policies docs/policies.md specifies are all there. */
static void test_registry(void) {
    const int n = ekv_policy_count();
    CHECK(n >= 1 && ekv_kv_policy_count() == n);
    for (int i = 0; i < n; i++) {
        const struct ekv_policy_ops *o = ekv_policy_at(i);
        CHECK_MSG(o && o->name && o->name[0] && strlen(o->name) < 32, "registry entry %d has no usable name", i);
        if (!o || !o->name) continue;
        CHECK_MSG(o->summary && o->summary[0], "%s has no summary", o->name);
        CHECK_MSG(ekv_policy_find(o->name) == o, "%s is not found by its name", o->name);
        for (int j = 0; j < i; j++) CHECK_MSG(strcmp(ekv_policy_at(j)->name, o->name) != 0, "%s registered twice", o->name);
        CHECK(ekv_kv_policy_name(i) && strcmp(ekv_kv_policy_name(i), o->name) == 0);
        CHECK(ekv_kv_policy_summary(i) && strcmp(ekv_kv_policy_summary(i), o->summary) == 0);
        struct ekv_kv_params p = ekv_kv_default_params();
        p.policy = o->name;
        p.budget = 0.5;
        struct ekv_kv *kv = NULL;
        CHECK_MSG(ekv_kv_new(2, 4, 2, 8, &p, &kv) == EKV_OK, "%s with defaults: %s", o->name, ekv_last_error());
        if (kv) CHECK_MSG(kv->stats == o->stats, "%s: stats before the first forward", o->name);
        ekv_kv_free(kv);
        /* only policies with a reference mode accept --kv-compat ref */
        p.compat_ref = true;
        kv = NULL;
        enum ekv_status s = ekv_kv_new(2, 4, 2, 8, &p, &kv);
        CHECK_MSG((s == EKV_OK) == o->has_compat_ref, "%s: compat_ref %s", o->name, s == EKV_OK ? "accepted" : "refused");
        if (s != EKV_OK) CHECK(strstr(ekv_last_error(), "elastic only") != NULL);
        ekv_kv_free(kv);
    }
    const char *spec[] = {"full", "random", "local", "h2o", "scissorhands", "tova",
                          "roco", "snapkv", "pyramidkv", "vlcache", "elastic"};
    for (size_t i = 0; i < EKV_ARRAY_LEN(spec); i++) CHECK_MSG(ekv_policy_find(spec[i]) != NULL, "%s missing", spec[i]);
    CHECK(ekv_policy_find("nope") == NULL);
    CHECK(ekv_policy_find(NULL) == NULL);
    CHECK(ekv_policy_at(-1) == NULL && ekv_policy_at(ekv_policy_count()) == NULL);
    CHECK(ekv_kv_policy_name(99) == NULL);
    struct ekv_kv_params p = ekv_kv_default_params();
    CHECK(strcmp(p.policy, "full") == 0 && p.budget == 1.0 && p.max_tokens == 0);
    CHECK(p.sinks == -1 && p.window == -1 && p.obs_window == -1 && p.pool == -1 && p.chunk == -1);
    CHECK(p.pool_kind == EKV_POOL_MAX);
    CHECK(isnan(p.beta) && isnan(p.sparsity_p) && isnan(p.recent_ratio) && p.seed == 0 && !p.compat_ref);
}

/* ---- invariants over every registered policy ---- */

static uint64_t g_rng = 0x1234567;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

enum { NL = 2, NH = 4, NKV = 2, HD = 8, PROMPT = 64, DECODE = 40 };

static bool prefill_only(const char *name) {
    return !strcmp(name, "snapkv") || !strcmp(name, "pyramidkv") || !strcmp(name, "vlcache");
}

/* first positions a policy always keeps (0: none asserted) */
static int protected_sinks(const char *name) {
    if (!strcmp(name, "local")) return 4;
    if (!strcmp(name, "elastic")) return 1;
    return 0;
}

/* One forward of n_new positions with random q/k/v through every layer. */
static enum ekv_status forward(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    const size_t nq = (size_t)step->n_new * NH * HD, nk = (size_t)step->n_new * NKV * HD;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    float *out = malloc(nq * sizeof *out);
    enum ekv_status s = (q && k && v && out) ? ekv_kv_begin(kv, step) : EKV_ERR_NOMEM;
    for (int il = 0; il < NL && s == EKV_OK; il++) {
        for (size_t i = 0; i < nq; i++) q[i] = 2.0f * frand();
        for (size_t i = 0; i < nk; i++) k[i] = 2.0f * frand();
        for (size_t i = 0; i < nk; i++) v[i] = frand();
        s = ekv_kv_layer_forward(kv, NULL, il, step, q, k, v, out);
        for (size_t i = 0; i < nq && s == EKV_OK; i++)
            if (!isfinite(out[i])) s = EKV_ERR_INTERNAL;
    }
    if (s == EKV_OK) s = ekv_kv_end(kv, step);
    free(q);
    free(k);
    free(v);
    free(out);
    return s;
}

/* Runs prompt + decode; checks the invariants after every forward. Writes
 * the final kept positions of every (layer, head) to sig when not NULL. */
static void drive(const char *name, double budget, uint64_t seed, int32_t *sig, int sig_cap) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = name;
    p.budget = budget;
    p.seed = seed;
    struct ekv_kv *kv = NULL;
    enum ekv_status s = ekv_kv_new(NL, NH, NKV, HD, &p, &kv);
    CHECK_MSG(s == EKV_OK, "%s budget %g: %s", name, budget, ekv_last_error());
    if (s != EKV_OK) return;
    uint8_t ptags[PROMPT];
    for (int i = 0; i < PROMPT; i++) ptags[i] = (i >= 10 && i < 42) ? EKV_TAG_IMAGE : EKV_TAG_TEXT;
    int32_t prev_len[NL][NKV] = {{0}};
    int fails = tu_fail;
    for (int stepi = 0; stepi <= DECODE && tu_fail == fails; stepi++) {
        struct ekv_kv_step st;
        memset(&st, 0, sizeof st);
        if (stepi == 0) {
            st = (struct ekv_kv_step){.is_prompt = true, .last_chunk = true, .pos0 = 0, .n_new = PROMPT,
                                      .prompt_pos0 = 0, .prompt_len = PROMPT, .prompt_tags = ptags,
                                      .tags = ptags};
        } else {
            st = (struct ekv_kv_step){.pos0 = PROMPT + stepi - 1, .n_new = 1};
        }
        s = forward(kv, &st);
        CHECK_MSG(s == EKV_OK, "%s budget %g step %d: %s", name, budget, stepi, ekv_last_error());
        if (s != EKV_OK) break;
        CHECK(kv->n_seen == st.pos0 + st.n_new);
        for (int il = 0; il < NL; il++) {
            const int32_t target = ekv_kv_target(kv, il);
            for (int hk = 0; hk < NKV; hk++) {
                const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                if (!strcmp(name, "full")) /* never evicts, whatever the budget */
                    CHECK_MSG(h->len == kv->n_seen, "full: len %d of %lld seen", (int)h->len, (long long)kv->n_seen);
                else if (prefill_only(name) && stepi > 0 && kv->n_seen % kv->params.recompress != 0)
                    /* between re-selection points (--kv-recompress, default 32) the cache grows by one */
                    CHECK_MSG(h->len == prev_len[il][hk] + 1, "%s budget %g step %d layer %d head %d: len %d after %d",
                              name, budget, stepi, il, hk, (int)h->len, (int)prev_len[il][hk]);
                else if (prefill_only(name) && stepi > 0) /* at one: back to the layer's target (VL-Cache's k_l) */
                    CHECK_MSG(h->len <= target && h->len <= prev_len[il][hk] + 1,
                              "%s budget %g step %d layer %d head %d: len %d after %d, target %d", name, budget, stepi,
                              il, hk, (int)h->len, (int)prev_len[il][hk], (int)target);
                else
                    CHECK_MSG(h->len <= target, "%s budget %g step %d layer %d head %d: len %d > target %d", name,
                              budget, stepi, il, hk, (int)h->len, (int)target);
                CHECK_MSG(h->len >= 1 && h->len <= h->cap, "%s: len %d cap %d", name, (int)h->len, (int)h->cap);
                prev_len[il][hk] = h->len;
                double wsum = 0.0;
                bool inc = true;
                for (int j = 0; j < h->len; j++) {
                    wsum += h->weight[j];
                    if (j) inc = inc && h->pos[j] > h->pos[j - 1];
                }
                CHECK_MSG(inc, "%s budget %g step %d: positions not increasing", name, budget, stepi);
                CHECK_MSG(h->pos[h->len - 1] < kv->n_seen && h->pos[0] >= 0, "%s: position out of range", name);
                CHECK_MSG(fabs(wsum + (double)h->n_evicted - (double)kv->n_seen) < 1e-6,
                          "%s budget %g step %d layer %d head %d: weights %g + evicted %lld != seen %lld", name,
                          budget, stepi, il, hk, wsum, (long long)h->n_evicted, (long long)kv->n_seen);
                const int ns = protected_sinks(name);
                if (ns > 0 && target > ns) {
                    bool ok = h->len >= ns;
                    for (int j = 0; j < ns && ok; j++) ok = h->pos[j] == j;
                    CHECK_MSG(ok, "%s budget %g step %d layer %d head %d: sinks lost", name, budget, stepi, il, hk);
                }
                if (budget == 1.0) {
                    CHECK_MSG(h->len == kv->n_seen && h->n_evicted == 0 && h->n_merged == 0,
                              "%s budget 1.0 step %d: len %d of %lld seen", name, stepi, (int)h->len,
                              (long long)kv->n_seen);
                }
            }
        }
        CHECK(kv->bytes_alloc <= kv->peak_bytes_alloc);
    }
    if (sig) {
        int n = 0;
        for (int il = 0; il < NL; il++)
            for (int hk = 0; hk < NKV; hk++) {
                const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                for (int j = 0; j < h->len && n < sig_cap; j++) sig[n++] = h->pos[j];
                if (n < sig_cap) sig[n++] = -1;
            }
        while (n < sig_cap) sig[n++] = -2;
    }
    ekv_kv_free(kv);
}

static void test_invariants(void) {
    const double budgets[3] = {0.2, 0.5, 1.0};
    for (int i = 0; i < ekv_policy_count(); i++) {
        const struct ekv_policy_ops *o = ekv_policy_at(i);
        if (o->summary && !strncmp(o->summary, "stub:", 5)) {
            fprintf(stderr, "  (policy %s is a stub on this branch: invariants skipped)\n", o->name);
            continue;
        }
        for (int b = 0; b < 3; b++) drive(o->name, budgets[b], 7, NULL, 0);
    }
    /* random: a fixed seed reproduces the kept positions; another seed differs */
    enum { SIG = NL * NKV * (PROMPT + DECODE + 1) };
    static int32_t s1[SIG], s2[SIG], s3[SIG];
    g_rng = 99;
    drive("random", 0.2, 42, s1, SIG);
    g_rng = 99;
    drive("random", 0.2, 42, s2, SIG);
    g_rng = 99;
    drive("random", 0.2, 43, s3, SIG);
    CHECK(memcmp(s1, s2, sizeof s1) == 0);
    CHECK(memcmp(s1, s3, sizeof s1) != 0);
}

int main(void) {
    test_registry();
    test_helpers();
    test_full();
    test_local();
    test_h2o();
    test_scissorhands();
    test_tova();
    test_random();
    test_invariants();
    return test_finish("test_policies_basic");
}
