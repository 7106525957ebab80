/*
 * test_merge.c — "+merge" over the eviction policies (src/kv/merge.c).
 *
 * On real weights (the bundled stories260K, 300-token prompt then 60 fixed
 * tokens), for every eviction policy P and both merge_to rules, at budget
 * 0.2: P+merge holds exactly as many entries as P in every (layer, KV
 * head) after the prompt and after every step (the selection and so the
 * budget are P's), keeps exactly P's positions after the prompt (the first
 * compression sees the same statistics), merges something, and with
 * merge_to=pos loses no token (weights add up to the tokens seen at every step); at budget 1.0
 * P+merge gives the full cache's logits bit for bit, and with a token cap
 * above the run's length (nothing to drop) P's own logits bit for bit,
 * while at 0.2 its logits differ from P's. On a cache of its own (no
 * model; local at budget 0.5 on 11 entries, f32): the dropped entries join
 * the kept entry nearer in position (ties to the earlier one) with the
 * weighted mean of the values (1e-6); merge_to=key joins the kept key of
 * highest cosine similarity (computed here in double) and merge_sim=1
 * drops what is not identical; merge_key=rotate merges keys that are one
 * vector roped at each position into that vector roped at the survivor's
 * position (1e-5); merge_stats=0 leaves the survivors' statistics the base
 * policy's, 1 adds the members'; merge_at=prompt merges at the prompt and
 * evicts at decode steps. Specs: modifiers and merge_* options are validated, and
 * merge_bias sets the attention's log(weight) flag. And "+adakv" (head-wise
 * budgets) over snapkv, pyramidkv, h2o, scissorhands, vlcache and roco on the same run: test_adakv.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "kv/kv.h"
#include "testutil.h"

#define N_PROMPT 300
#define N_GEN 60
#define MAXE 1024

static struct ekv_model *g_m;
static struct ekv_context *g_ctx;
static struct ekv_model_info g_mi;
static int32_t *g_toks;

static struct ekv_kv_params params(const char *policy, double budget) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = policy;
    p.budget = budget;
    return p;
}

/* What a run leaves per step: entry counts per (layer, head), positions
 * after the prompt, and weight sums. */
struct trace {
    int32_t len[N_GEN + 1][16][16];
    int32_t pos0[16][16][MAXE];
    double wsum[N_GEN + 1][16][16];
    int64_t seen[N_GEN + 1];
    bool overflow;
};

static void record(struct ekv_seq *seq, int step, struct trace *tr) {
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(seq, &st);
    tr->seen[step] = st.n_seen;
    int32_t pos[MAXE];
    float w[MAXE];
    for (int32_t l = 0; l < g_mi.n_layer && l < 16; l++)
        for (int32_t h = 0; h < g_mi.n_head_kv && h < 16; h++) {
            const int32_t len = ekv_seq_kv_layer_len(seq, l, h);
            tr->len[step][l][h] = len;
            if (len > MAXE) {
                tr->overflow = true;
                continue;
            }
            ekv_seq_kv_entries(seq, l, h, pos, w, NULL);
            double sum = 0;
            for (int32_t j = 0; j < len; j++) sum += w[j];
            tr->wsum[step][l][h] = sum;
            if (step == 0) memcpy(tr->pos0[l][h], pos, (size_t)len * sizeof *pos);
        }
}

static void record_step(struct ekv_seq *seq, int step, void *ud) { record(seq, step, ud); }

/* Prompt then N_GEN fixed tokens; logits of every step into lg
 * [(N_GEN + 1)][n_vocab] when not NULL; the trace when tr is not NULL. */
static enum ekv_status run(const struct ekv_kv_params *kv, float *lg, struct trace *tr) {
    return tu_run_forced(g_ctx, g_mi.n_vocab, kv, g_toks, N_PROMPT, N_GEN, lg, tr ? record_step : NULL, tr);
}

static const char *const g_bases[] = {"local", "h2o", "scissorhands", "tova", "roco",
                                      "snapkv", "pyramidkv", "vlcache", "random"};

static void test_invariants(void) {
    struct trace *base = calloc(1, sizeof *base), *mg = calloc(1, sizeof *mg);
    if (!base || !mg) {
        CHECK(0);
        free(base), free(mg);
        return;
    }
    for (size_t i = 0; i < sizeof g_bases / sizeof *g_bases; i++)
        for (int to = 0; to < 2; to++) {
            char spec[64];
            snprintf(spec, sizeof spec, "%s+merge%s", g_bases[i], to ? "" : ":merge_to=pos");
            struct ekv_kv_params pb = params(g_bases[i], 0.2), pm = params(spec, 0.2);
            memset(base, 0, sizeof *base), memset(mg, 0, sizeof *mg);
            CHECK_OK(run(&pb, NULL, base));
            CHECK_OK(run(&pm, NULL, mg));
            int bad_len = 0, bad_pos = 0, bad_w = 0, merged = 0;
            for (int t = 0; t <= N_GEN; t++)
                for (int32_t l = 0; l < g_mi.n_layer; l++)
                    for (int32_t h = 0; h < g_mi.n_head_kv; h++) {
                        const int32_t len = mg->len[t][l][h];
                        bad_len += len != base->len[t][l][h];
                        const double w = mg->wsum[t][l][h], n = (double)mg->seen[t];
                        if (to == 0) bad_w += fabs(w - n) > 1e-3; /* pos: every token joins someone */
                        else bad_w += w > n + 1e-3 || w < len - 1e-3; /* key: some may be dropped */
                        merged += w > len + 0.5;
                        if (t == 0 && len == base->len[0][l][h] && len <= MAXE)
                            bad_pos += memcmp(mg->pos0[l][h], base->pos0[l][h], (size_t)len * sizeof(int32_t)) != 0;
                    }
            CHECK_MSG(!mg->overflow && !bad_len && !bad_pos && !bad_w && merged > 0,
                      "%s at 0.2: lengths %d, prompt positions %d, weights %d differ; %d (step, layer, head) merged",
                      spec, bad_len, bad_pos, bad_w, merged);
        }
    free(base);
    free(mg);
}

/* merge_at=prompt: the prompt's evictions merge (no token lost), decode
 * steps evict (tokens are lost by the end). */
static void test_merge_at_prompt(void) {
    struct trace *tr = calloc(1, sizeof *tr);
    if (!tr) {
        CHECK(0);
        return;
    }
    struct ekv_kv_params p = params("h2o+merge:merge_to=pos:merge_at=prompt", 0.2);
    CHECK_OK(run(&p, NULL, tr));
    int bad0 = 0, lost = 0;
    for (int32_t l = 0; l < g_mi.n_layer; l++)
        for (int32_t h = 0; h < g_mi.n_head_kv; h++) {
            bad0 += fabs(tr->wsum[0][l][h] - (double)tr->seen[0]) > 1e-3;
            lost += tr->wsum[N_GEN][l][h] < (double)tr->seen[N_GEN] - 0.5;
        }
    CHECK_MSG(bad0 == 0 && lost == g_mi.n_layer * g_mi.n_head_kv, "merge_at=prompt: %d heads lost tokens at the "
              "prompt, %d lost some by the end", bad0, lost);
    free(tr);
}

static void test_bit_identity(void) {
    const size_t V = (size_t)g_mi.n_vocab, cells = (size_t)(N_GEN + 1) * V;
    float *a = malloc(cells * sizeof *a), *b = malloc(cells * sizeof *b);
    if (!a || !b) {
        CHECK(0);
        free(a), free(b);
        return;
    }
    static const char *const some[] = {"h2o", "snapkv", "local", "tova"};
    for (size_t i = 0; i < sizeof some / sizeof *some; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s+merge:merge_key=rotate", some[i]);
        /* budget 1.0: the full cache */
        struct ekv_kv_params pf = params("full", 1.0), pm = params(spec, 1.0);
        CHECK_OK(run(&pf, a, NULL));
        CHECK_OK(run(&pm, b, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) == 0, "%s at budget 1 differs from full", spec);
        /* nothing to drop (budget 1 and a token cap above the run's
         * length): the base policy, bit for bit */
        struct ekv_kv_params pb = params(some[i], 1.0), pn = params(spec, 1.0);
        pb.max_tokens = pn.max_tokens = N_PROMPT + N_GEN + 1;
        CHECK_OK(run(&pb, a, NULL));
        CHECK_OK(run(&pn, b, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) == 0, "%s with nothing to drop differs from %s", spec, some[i]);
        /* at 0.2 merging changes the answer */
        pb = params(some[i], 0.2), pn = params(spec, 0.2);
        CHECK_OK(run(&pb, a, NULL));
        CHECK_OK(run(&pn, b, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) != 0, "%s gives %s's logits at 0.2", spec, some[i]);
    }
    free(a);
    free(b);
}

/* ---- a cache of its own ---- */

enum { SD = 16, ST = 11, SR = 2 };

static uint64_t g_rng = 0x3E76E;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* One-layer f32 cache with `spec` at budget 0.5 (local keeps positions
 * 0-3 and 9-10 of 11) after a prompt with keys k and values v [ST][SD];
 * the model's RoPE in the cache when rope is set. NULL on failure. */
static struct ekv_kv *synthetic(const char *spec, bool rope, const float *k, const float *v, enum ekv_status *st) {
    struct ekv_kv_params p = params(spec, 0.5);
    p.type_k = p.type_v = EKV_KV_F32;
    struct ekv_kv *kv = NULL;
    *st = ekv_kv_new(1, SR, 1, SD, &p, &kv);
    if (*st != EKV_OK) return NULL;
    if (rope)
        kv->rope = (struct ekv_rope_params){.dim = SD, .neox = false, .freq_base = 10000.0, .freq_scale = 1.0,
                                            .attn_factor = 1.0};
    static float q[ST * SR * SD], out[ST * SR * SD];
    for (int i = 0; i < ST * SR * SD; i++) q[i] = frand();
    *st = tu_kv_prompt(kv, ST, q, k, v, out);
    if (*st != EKV_OK) {
        ekv_kv_free(kv);
        return NULL;
    }
    return kv;
}

static void test_pos_rule(void) {
    float k[ST * SD], v[ST * SD], got[SD];
    for (int i = 0; i < ST * SD; i++) k[i] = frand(), v[i] = frand();
    enum ekv_status st;
    struct ekv_kv *kv = synthetic("local+merge:merge_to=pos", false, k, v, &st);
    CHECK_OK(st);
    if (!kv) return;
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    /* kept 0 1 2 3 9 10; 4 5 -> 3 (nearer), 6 -> 3 (3 against 3: the
     * earlier), 7 8 -> 9 */
    static const int32_t want_pos[] = {0, 1, 2, 3, 9, 10};
    static const float want_w[] = {1, 1, 1, 4, 3, 1};
    static const int32_t group[2][4] = {{3, 4, 5, 6}, {7, 8, 9, -1}};
    CHECK(h->len == 6);
    for (int32_t j = 0; j < h->len && j < 6; j++)
        CHECK_MSG(h->pos[j] == want_pos[j] && h->weight[j] == want_w[j], "entry %d: position %d weight %g", (int)j,
                  (int)h->pos[j], (double)h->weight[j]);
    for (int g = 0; g < 2; g++) {
        CHECK_OK(ekv_kv_head_get(kv, h, g ? 4 : 3, NULL, got));
        double worst = 0;
        for (int c = 0; c < SD; c++) {
            double m = 0;
            const int n = g ? 3 : 4;
            for (int i = 0; i < n; i++) m += v[group[g][i] * SD + c] / n;
            worst = fmax(worst, fabs(m - got[c]));
        }
        CHECK_MSG(worst < 1e-6, "group %d: value mean off by %g", g, worst);
    }
    CHECK(h->n_merged == 5 && h->n_evicted == 0 && kv->logit_bias);
    ekv_kv_free(kv);
}

static double cosine(const float *a, const float *b) {
    double d = 0, na = 0, nb = 0;
    for (int c = 0; c < SD; c++) d += (double)a[c] * b[c], na += (double)a[c] * a[c], nb += (double)b[c] * b[c];
    return d / sqrt(na * nb);
}

static void test_key_rule(void) {
    float k[ST * SD], v[ST * SD];
    for (int i = 0; i < ST * SD; i++) k[i] = frand(), v[i] = frand();
    static const int32_t kept[] = {0, 1, 2, 3, 9, 10};
    float want_w[6] = {1, 1, 1, 1, 1, 1};
    for (int j = 4; j < 9; j++) { /* the kept key most similar to k_j (first on ties) */
        int best = 0;
        for (int i = 1; i < 6; i++)
            if (cosine(k + j * SD, k + kept[i] * SD) > cosine(k + j * SD, k + kept[best] * SD)) best = i;
        want_w[best] += 1;
    }
    enum ekv_status st;
    struct ekv_kv *kv = synthetic("local+merge:merge_to=key:merge_sim=-1", false, k, v, &st);
    CHECK_OK(st);
    if (kv) {
        const struct ekv_kv_head *h = &kv->layers[0].heads[0];
        CHECK(h->len == 6);
        for (int32_t j = 0; j < h->len && j < 6; j++)
            CHECK_MSG(h->pos[j] == kept[j] && h->weight[j] == want_w[j], "entry %d: position %d weight %g (want %g)",
                      (int)j, (int)h->pos[j], (double)h->weight[j], (double)want_w[j]);
        ekv_kv_free(kv);
    }
    /* merge_sim=1: random keys are never that close, all dropped */
    kv = synthetic("local+merge:merge_to=key:merge_sim=1:merge_bias=0", false, k, v, &st);
    CHECK_OK(st);
    if (kv) {
        const struct ekv_kv_head *h = &kv->layers[0].heads[0];
        CHECK(h->len == 6 && h->n_evicted == 5 && h->n_merged == 0 && !kv->logit_bias);
        ekv_kv_free(kv);
    }
}

static void test_rotate(void) {
    float x[SD], k[ST * SD], v[ST * SD], key[SD], want[SD];
    for (int c = 0; c < SD; c++) x[c] = frand();
    for (int i = 0; i < ST; i++) {
        memcpy(k + i * SD, x, sizeof x);
        ekv_rope(k + i * SD, 1, SD, SD, i, 10000.0f, false);
        for (int c = 0; c < SD; c++) v[i * SD + c] = frand();
    }
    for (int rot = 0; rot < 2; rot++) {
        enum ekv_status st;
        struct ekv_kv *kv = synthetic(rot ? "local+merge:merge_to=pos:merge_key=rotate" : "local+merge:merge_to=pos", true, k, v, &st);
        CHECK_OK(st);
        if (!kv) continue;
        const struct ekv_kv_head *h = &kv->layers[0].heads[0];
        double worst = 0;
        for (int32_t j = 0; j < h->len; j++) {
            if (h->weight[j] <= 1.0f) continue;
            CHECK_OK(ekv_kv_head_get(kv, h, j, key, NULL));
            memcpy(want, x, sizeof want);
            ekv_rope(want, 1, SD, SD, h->pos[j], 10000.0f, false);
            for (int c = 0; c < SD; c++) worst = fmax(worst, fabs((double)key[c] - want[c]));
        }
        if (rot) CHECK_MSG(worst < 1e-5, "merge_key=rotate: merged key %g from x roped at the survivor", worst);
        else CHECK_MSG(worst > 1e-2, "merge_key=mean: merged key only %g from the survivor's", worst);
        ekv_kv_free(kv);
    }
    enum ekv_status st; /* no RoPE in the cache: refused when it has to merge */
    struct ekv_kv *kv = synthetic("local+merge:merge_to=pos:merge_key=rotate", false, k, v, &st);
    CHECK_MSG(!kv && st == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "rotate"), "%s: %s", ekv_status_str(st),
              ekv_last_error());
}

/* merge_stats: with 1 the survivors' column sums take their members'
 * (the kept entries' sums add up to every query's attention, ST queries);
 * with 0 they are the base policy's own. merge_at=prompt merges at the
 * prompt like all. */
static void test_stats_and_at(void) {
    float k[ST * SD], v[ST * SD];
    for (int i = 0; i < ST * SD; i++) k[i] = frand(), v[i] = frand();
    static const char *const specs[] = {"h2o", "h2o+merge:merge_to=pos", "h2o+merge:merge_to=pos:merge_stats=0",
                                        "h2o+merge:merge_to=pos:merge_at=prompt"};
    struct ekv_kv *kv[4];
    for (int i = 0; i < 4; i++) {
        enum ekv_status st;
        g_rng = 0x51A7; /* the same queries for every cache */
        kv[i] = synthetic(specs[i], false, k, v, &st);
        CHECK_OK(st);
    }
    if (kv[0] && kv[1] && kv[2] && kv[3]) {
        const struct ekv_kv_head *h[4];
        for (int i = 0; i < 4; i++) h[i] = &kv[i]->layers[0].heads[0];
        double sum1 = 0;
        bool own = h[2]->len == h[0]->len, same_at = h[3]->len == h[1]->len;
        for (int32_t j = 0; j < h[1]->len; j++) sum1 += h[1]->colsum[j];
        for (int32_t j = 0; own && j < h[0]->len; j++) own = h[2]->colsum[j] == h[0]->colsum[j] && h[2]->weight[j] > 0;
        for (int32_t j = 0; same_at && j < h[1]->len; j++)
            same_at = h[3]->colsum[j] == h[1]->colsum[j] && h[3]->weight[j] == h[1]->weight[j];
        CHECK_MSG(fabs(sum1 - ST) < 1e-4, "merge_stats=1: kept column sums add up to %g, not %d", sum1, ST);
        CHECK_MSG(own, "merge_stats=0: the survivors' column sums are not the base policy's");
        CHECK_MSG(same_at, "merge_at=prompt differs from merge_at=all at the prompt");
        CHECK(h[1]->n_merged == ST - h[1]->len && h[0]->n_evicted == ST - h[0]->len);
    }
    for (int i = 0; i < 4; i++) ekv_kv_free(kv[i]);
}

static void test_specs(void) {
    static const char *const bad[] = {"h2o+merge+merge", "h2o+mrge", "h2o+", "h2o:merge_to=key",
                                      "h2o+merge:merge_to=near", "h2o+merge:merge_sim=2", "h2o+merge:merge_sim=x",
                                      "h2o+merge:merge_key=spin", "h2o+merge:merge_bias=2", "h2o+merge:merge_size=3",
                                      "h2o+merge:window=3", "nosuch+merge", "h2o+merge:merge_at=decode",
                                      "h2o+merge:merge_stats=yes", "tova+adakv", "local+adakv", "snapkv+adakv+adakv",
                                      "snapkv:ada_floor=0.2", "snapkv+adakv:ada_floor=2", "snapkv+adakv:ada_floor=-0.1",
                                      "snapkv+adakv:ada_floor=x", "snapkv+adakv:ada_ceiling=1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct ekv_kv_params p = params(bad[i], 0.5);
        struct ekv_kv *kv = NULL;
        enum ekv_status s = ekv_kv_new(1, SR, 1, SD, &p, &kv);
        CHECK_MSG(s == EKV_ERR_INVALID_ARG && !kv, "%s: %s", bad[i], ekv_status_str(s));
        ekv_kv_free(kv);
    }
    { /* +adakv on a policy without head-wise ranking names the registry's head-wise policies */
        struct ekv_kv_params p = params("tova+adakv", 0.5);
        struct ekv_kv *kv = NULL;
        (void)ekv_kv_new(1, SR, 1, SD, &p, &kv);
        const char *msg = ekv_last_error();
        int named = 0;
        for (int i = 0; i < ekv_policy_count(); i++) {
            const char *w = ekv_policy_at(i)->name;
            const char *at = strstr(msg, w);
            const bool in = at && (at[strlen(w)] == ',' || at[strlen(w)] == ')') && (at[-1] == '(' || at[-1] == ' ');
            CHECK_MSG(in == ekv_policy_at(i)->headwise, "+adakv refusal '%s' and policy %s (headwise %d)", msg,
                      w, ekv_policy_at(i)->headwise);
            named += in;
        }
        CHECK_MSG(named == 6, "+adakv refusal names %d policies: %s", named, msg);
    }
    static const struct { const char *spec; bool on, bias; } good[] = {
        {"h2o", false, false}, {"h2o+merge", true, true}, {"h2o+merge:merge_bias=0", true, false},
        {"elastic-v2:bias=0+merge", false, false}, {"elastic-v2+merge:bias=0", true, true},
        {"elastic-v2+merge:merge_bias=0:bias=0", true, false}, {"snapkv+merge:merge_to=key:merge_sim=0.5", true, true}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        struct ekv_kv_params p = params(good[i].spec, 0.5);
        struct ekv_kv *kv = NULL;
        enum ekv_status s = ekv_kv_new(1, SR, 1, SD, &p, &kv);
        if (i == 3) { /* a modifier after the options is an option value, refused by the policy */
            CHECK_MSG(s == EKV_ERR_INVALID_ARG, "%s: %s", good[i].spec, ekv_status_str(s));
        } else {
            CHECK_OK(s);
            CHECK_MSG(kv && kv->merge.on == good[i].on && kv->logit_bias == good[i].bias, "%s: merge %d bias %d",
                      good[i].spec, kv ? kv->merge.on : -1, kv ? kv->logit_bias : -1);
        }
        ekv_kv_free(kv);
    }
}

/* +adakv (src/kv/adakv.c) on real weights, at 0.2 for snapkv, pyramidkv, h2o, scissorhands, vlcache (no
 * image: its window is the whole prompt) and roco, alone and with
 * +merge, in three storage types: every layer holds as many entries as the base policy's after
 * the prompt and after every step (the budget is shared, not grown), the heads' split differs
 * from the base's somewhere, +merge:merge_to=pos loses no token; at budget 1.0 the full cache's
 * logits bit for bit. */
static void test_adakv(void) {
    static const char *const bases[] = {"snapkv", "pyramidkv", "h2o", "scissorhands", "vlcache", "roco"};
    static const enum ekv_kv_type types[3][2] = {{EKV_KV_F16, EKV_KV_F16}, {EKV_KV_F32, EKV_KV_F16},
                                                 {EKV_KV_KIVI4, EKV_KV_KIVI2}};
    struct trace *base = calloc(1, sizeof *base), *ad = calloc(1, sizeof *ad);
    float *lf = malloc((size_t)(N_GEN + 1) * (size_t)g_mi.n_vocab * sizeof *lf);
    float *la = malloc((size_t)(N_GEN + 1) * (size_t)g_mi.n_vocab * sizeof *la);
    if (!base || !ad || !lf || !la) {
        CHECK(0);
        free(base), free(ad), free(lf), free(la);
        return;
    }
    for (int b = 0; b < 6; b++)
        for (int mg = 0; mg < 2; mg++)
            for (int t = 0; t < 3; t++) {
                char spec[64];
                snprintf(spec, sizeof spec, "%s+adakv%s", bases[b], mg ? "+merge:merge_to=pos" : "");
                struct ekv_kv_params pb = params(bases[b], 0.2), pa = params(spec, 0.2);
                pb.type_k = pa.type_k = types[t][0];
                pb.type_v = pa.type_v = types[t][1];
                if (t == 2) pb.kv_group = pa.kv_group = 8; /* stories260K's head_dim */
                memset(base, 0, sizeof *base), memset(ad, 0, sizeof *ad);
                CHECK_OK(run(&pb, NULL, base));
                CHECK_OK(run(&pa, NULL, ad));
                int bad_sum = 0, differ = 0, bad_w = 0;
                for (int st = 0; st <= N_GEN; st++)
                    for (int32_t l = 0; l < g_mi.n_layer; l++) {
                        int32_t sb = 0, sa = 0;
                        for (int32_t h = 0; h < g_mi.n_head_kv; h++) {
                            sb += base->len[st][l][h];
                            sa += ad->len[st][l][h];
                            differ += ad->len[st][l][h] != base->len[st][l][h];
                            if (mg) bad_w += fabs(ad->wsum[st][l][h] - (double)ad->seen[st]) > 1e-3;
                        }
                        bad_sum += sa != sb;
                    }
                CHECK_MSG(!ad->overflow && !bad_sum && differ > 0 && !bad_w,
                          "%s %s/%s at 0.2: %d (step, layer) totals differ from %s's, %d head lengths moved, "
                          "%d weight sums off", spec, ekv_kv_type_name(types[t][0]), ekv_kv_type_name(types[t][1]),
                          bad_sum, bases[b], differ, bad_w);
            }
    /* ada_floor=1: every head keeps its own share, so the heads stay equal: the base policy bit for bit */
    for (int b = 0; b < 6; b++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s+adakv:ada_floor=1", bases[b]);
        struct ekv_kv_params pb = params(bases[b], 0.2), pa = params(spec, 0.2);
        CHECK_OK(run(&pb, lf, NULL));
        CHECK_OK(run(&pa, la, NULL));
        CHECK_MSG(!memcmp(lf, la, (size_t)(N_GEN + 1) * (size_t)g_mi.n_vocab * sizeof *lf),
                  "%s at 0.2: logits differ from %s's", spec, bases[b]);
    }
    struct ekv_kv_params pf = params("full", 1.0), pa = params("snapkv+adakv", 1.0);
    CHECK_OK(run(&pf, lf, NULL));
    CHECK_OK(run(&pa, la, NULL));
    CHECK_MSG(!memcmp(lf, la, (size_t)(N_GEN + 1) * (size_t)g_mi.n_vocab * sizeof *lf),
              "snapkv+adakv at budget 1.0: logits differ from the full cache's");
    free(base), free(ad), free(lf), free(la);
}

int main(void) {
    test_pos_rule();
    test_key_rule();
    test_rotate();
    test_specs();
    test_stats_and_at();
    size_t nt = 0;
    const bool loaded = tu_load_stories(&g_m, &g_ctx, &g_toks, &nt);
    if (g_m) ekv_model_get_info(g_m, &g_mi);
    CHECK(g_mi.n_layer <= 16 && g_mi.n_head_kv <= 16);
    if (!loaded) {
        ekv_context_free(g_ctx);
        ekv_model_free(g_m);
        free(g_toks);
        return test_finish("test_merge");
    }
    CHECK(nt >= N_PROMPT + N_GEN);
    test_invariants();
    test_merge_at_prompt();
    test_bit_identity();
    test_adakv();
    ekv_context_free(g_ctx);
    ekv_model_free(g_m);
    free(g_toks);
    return test_finish("test_merge");
}
