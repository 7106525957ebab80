/*
 * test_elastic_v2.c — POLICIES-style invariants of elastic-v2 (src/kv/
 * elastic_v2.c) on real weights (the bundled stories260K): the budget holds
 * after the prompt and after every decode step, per layer and KV head; the
 * protected entries (the first `sinks` tokens and the recent window of
 * floor(recent * N) entries) are kept unmerged; budget 1.0 gives the full
 * cache's logits bit for bit (default f16 storage and f32); with every
 * option at its paper value ("elastic-v2:paper=1") the policy is Elastic
 * Cache's paper mode, bit for bit; merge=0 evicts (every weight 1) and
 * merge=1 merges (weights add up to the tokens seen); the policy spec's
 * options are validated.
 *
 * bias=1 and key=rotate: both keep the invariants above (budget, sinks,
 * recent window, weights) and give the full cache's logits at budget 1.0
 * bit for bit; the defaults written out are the default bit for bit, and paper=1 after bias=1
 * is elastic again (the attention flag follows the options); both change
 * the logits at budget 0.2. On caches of their own (no model): key=rotate
 * merges keys that are one pre-RoPE vector roped at each position into
 * that vector roped at the anchor's position (1e-5, pairs and NeoX halves;
 * key=mean does not), and is refused on a cache without RoPE; bias=1 makes
 * a decode step's attention output, through ekv_kv_layer_forward and
 * through the batched ekv_kv_layer_forward_batch, equal
 * softmax(q . k_j / sqrt(d) + log w_j) v_j computed in double from the
 * cached entries (1e-5), and bias=0 the same without the log w_j term.
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

static struct ekv_model *g_m;
static struct ekv_context *g_ctx;
static struct ekv_model_info g_mi;
static int32_t *g_toks;

/* Prompt then N_GEN fixed tokens (the prompt's continuation, so every
 * policy sees the same inputs); logits of every step into lg
 * [(N_GEN + 1)][n_vocab] when not NULL; calls check(seq, step) after the
 * prompt (step 0) and each decode step. */
static enum ekv_status run(const struct ekv_kv_params *kv, float *lg, tu_step_fn check, void *ud) {
    return tu_run_forced(g_ctx, g_mi.n_vocab, kv, g_toks, N_PROMPT, N_GEN, lg, check, ud);
}

struct inv {
    double budget;
    int sinks;
    double recent;
    bool conserve;
    int bad_budget, bad_sink, bad_recent, bad_weight;
};

/* After each step: every (layer, head) holds <= ceil(budget * n) entries;
 * after the prompt, position 0 .. sinks-1 are kept with weight 1 and the
 * last floor(recent * N) entries are the last prompt positions, weight 1;
 * weights add up to the tokens seen (merging never loses a token). */
static void check_inv(struct ekv_seq *seq, int step, void *ud) {
    struct inv *c = ud;
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(seq, &st);
    const int64_t n = st.n_seen;
    const int32_t N = (int32_t)ceil(c->budget * (double)n - 1e-9);
    int32_t pos[1024];
    float w[1024];
    for (int32_t l = 0; l < g_mi.n_layer; l++)
        for (int32_t h = 0; h < g_mi.n_head_kv; h++) {
            int32_t len = ekv_seq_kv_layer_len(seq, l, h);
            if (len > N || len > 1024) {
                c->bad_budget++;
                continue;
            }
            ekv_seq_kv_entries(seq, l, h, pos, w, NULL);
            double sum = 0;
            for (int32_t j = 0; j < len; j++) sum += w[j];
            if (c->conserve && fabs(sum - (double)n) > 1e-3) c->bad_weight++;
            if (step != 0) continue;
            for (int j = 0; j < c->sinks; j++)
                if (pos[j] != j || w[j] != 1.0f) c->bad_sink++;
            int32_t W = (int32_t)floor(c->recent * N);
            if (W < 1) W = 1;
            for (int32_t j = 0; j < W; j++)
                if (pos[len - 1 - j] != N_PROMPT - 1 - j || w[len - 1 - j] != 1.0f) c->bad_recent++;
        }
}

static void count_merged(struct ekv_seq *seq, int step, void *ud) {
    int *merged = ud;
    if (step != N_GEN) return;
    int32_t pos[1024];
    float w[1024];
    for (int32_t l = 0; l < g_mi.n_layer; l++)
        for (int32_t h = 0; h < g_mi.n_head_kv; h++) {
            int32_t len = ekv_seq_kv_layer_len(seq, l, h);
            ekv_seq_kv_entries(seq, l, h, pos, w, NULL);
            for (int32_t j = 0; j < len && len <= 1024; j++) *merged += w[j] > 1.0f;
        }
}

static struct ekv_kv_params params(const char *policy, double budget) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = policy;
    p.budget = budget;
    return p;
}

static void test_invariants(void) {
    static const char *const specs[] = {"elastic-v2", "elastic-v2:recent=0.25", "elastic-v2:score=window",
                                        "elastic-v2:heads=head:value=attn", "elastic-v2:key=anchor:decode=fixed",
                                        "elastic-v2:bias=1", "elastic-v2:key=rotate",
                                        "elastic-v2:key=rotate:bias=1:heads=head:decode=fixed"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        for (int b = 0; b < 2; b++) {
            struct inv c = {.budget = b ? 0.5 : 0.2, .sinks = 1,
                            .recent = strstr(specs[i], "recent=0.25") ? 0.25 : 0.5};
            /* decode=fixed deletes entries at decode (Elastic's rule): weights do not add up */
            c.conserve = strstr(specs[i], "decode=fixed") == NULL;
            struct ekv_kv_params p = params(specs[i], c.budget);
            CHECK_OK(run(&p, NULL, check_inv, &c));
            CHECK_MSG(!c.bad_budget && !c.bad_sink && !c.bad_recent && !c.bad_weight,
                      "%s at %g: budget %d, sink %d, recent %d, weight %d", specs[i], c.budget, c.bad_budget,
                      c.bad_sink, c.bad_recent, c.bad_weight);
        }
}

static void test_budget_one_and_paper(void) {
    const size_t V = (size_t)g_mi.n_vocab, cells = (size_t)(N_GEN + 1) * V;
    float *a = malloc(cells * sizeof *a), *b = malloc(cells * sizeof *b);
    if (!a || !b) {
        CHECK(0);
        free(a);
        free(b);
        return;
    }
    /* budget 1.0 == full, bit for bit, in the default f16 storage and in f32 */
    static const char *const one[] = {"elastic-v2", "elastic-v2:bias=1:key=rotate"};
    for (int t = 0; t < 4; t++) {
        struct ekv_kv_params pf = params("full", 1.0), pv = params(one[t / 2], 1.0);
        if (t & 1) pf.type_k = pf.type_v = pv.type_k = pv.type_v = EKV_KV_F32;
        CHECK_OK(run(&pf, a, NULL, NULL));
        CHECK_OK(run(&pv, b, NULL, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) == 0, "%s at budget 1 differs from full (%s)", one[t / 2],
                  t & 1 ? "f32" : "f16");
    }
    /* paper options == elastic, bit for bit, at two budgets (also when
     * paper=1 follows bias=1: the attention flag follows the options) */
    for (int k = 0; k < 3; k++) {
        const double bud = k == 1 ? 0.5 : 0.2;
        const char *spec = k == 2 ? "elastic-v2:bias=1:paper=1" : "elastic-v2:paper=1";
        struct ekv_kv_params pe = params("elastic", bud), pv = params(spec, bud);
        CHECK_OK(run(&pe, a, NULL, NULL));
        CHECK_OK(run(&pv, b, NULL, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) == 0, "%s differs from elastic at %g", spec, bud);
    }
    /* the defaults are not the paper's: the logits differ at 0.2 */
    struct ekv_kv_params pv = params("elastic-v2", 0.2);
    CHECK_OK(run(&pv, b, NULL, NULL));
    CHECK(memcmp(a, b, cells * sizeof *a) != 0);
    /* the defaults written out are the defaults bit for bit; bias=0 and
     * key=rotate change the logits */
    static const char *const same[] = {"elastic-v2:score=window:recent=0.75:decode=window:bias=1",
                                       "elastic-v2:key=mean:bias=on:score=window:recent=0.75:value=mean"};
    for (int i = 0; i < 2; i++) {
        pv = params(same[i], 0.2);
        CHECK_OK(run(&pv, a, NULL, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) == 0, "%s differs from elastic-v2", same[i]);
    }
    static const char *const differ[] = {"elastic-v2:bias=0", "elastic-v2:key=rotate"};
    for (int i = 0; i < 2; i++) {
        pv = params(differ[i], 0.2);
        CHECK_OK(run(&pv, a, NULL, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) != 0, "%s gives elastic-v2's logits", differ[i]);
    }
    free(a);
    free(b);
}

static void test_merge_control_and_options(void) {
    int merged = 0, evicted = 0;
    struct ekv_kv_params p = params("elastic-v2", 0.2);
    CHECK_OK(run(&p, NULL, count_merged, &merged));
    p = params("elastic-v2:merge=0", 0.2);
    CHECK_OK(run(&p, NULL, count_merged, &evicted));
    CHECK_MSG(merged > 0 && evicted == 0, "merged entries: merge=1 %d, merge=0 %d", merged, evicted);
    static const char *const badspecs[] = {"elastic-v2:score=max", "elastic-v2:recent=1.5", "elastic-v2:bogus=1",
                                           "elastic-v2:recent", "elastic-v2:key=spin", "h2o:recent=0.5",
                                           "elastic-v2:merge=maybe", "elastic-v2:bias=2", "elastic-v2:bias=",
                                           "elastic-v2:bias=log"};
    for (size_t i = 0; i < sizeof badspecs / sizeof *badspecs; i++) {
        struct ekv_kv_params q = params(badspecs[i], 0.2);
        struct ekv_seq *seq = NULL;
        enum ekv_status s = ekv_seq_new(g_ctx, &q, &seq);
        CHECK_MSG(s == EKV_ERR_INVALID_ARG && !seq, "%s: %s", badspecs[i], ekv_status_str(s));
        ekv_seq_free(seq);
    }
}

/* ---- caches of their own (no model) ---- */

enum { SD = 16, ST = 12, SR = 2 }; /* head size, prompt length, query heads (one KV head) */

static uint64_t g_rng = 0xE1A5;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* A one-layer cache (f32, budget 0.5) with `spec`, the model's RoPE when
 * rope_dim > 0, after a prompt of ST tokens whose keys are x roped at their
 * positions (x: [SD]); queries and values random. NULL on failure. */
static struct ekv_kv *synthetic(const char *spec, int rope_dim, bool neox, const float *x, enum ekv_status *st) {
    struct ekv_kv_params p = params(spec, 0.5);
    p.type_k = p.type_v = EKV_KV_F32;
    struct ekv_kv *kv = NULL;
    *st = ekv_kv_new(1, SR, 1, SD, &p, &kv);
    if (*st != EKV_OK) return NULL;
    if (rope_dim > 0)
        kv->rope = (struct ekv_rope_params){.dim = rope_dim, .neox = neox, .freq_base = 10000.0, .freq_scale = 1.0,
                                            .attn_factor = 1.0};
    static float q[ST * SR * SD], k[ST * SD], v[ST * SD], out[ST * SR * SD];
    for (int i = 0; i < ST * SR * SD; i++) q[i] = 2.0f * frand();
    for (int i = 0; i < ST; i++) {
        memcpy(k + i * SD, x, SD * sizeof *k);
        ekv_rope(k + i * SD, 1, SD, SD, i, 10000.0f, neox);
        for (int c = 0; c < SD; c++) v[i * SD + c] = frand();
    }
    *st = tu_kv_prompt(kv, ST, q, k, v, out);
    if (*st != EKV_OK) {
        ekv_kv_free(kv);
        return NULL;
    }
    return kv;
}

static void test_rotate_frame(void) {
    float x[SD], key[SD], want[SD];
    for (int c = 0; c < SD; c++) x[c] = frand();
    for (int neox = 0; neox < 2; neox++)
        for (int rot = 0; rot < 2; rot++) {
            enum ekv_status st;
            struct ekv_kv *kv = synthetic(rot ? "elastic-v2:key=rotate" : "elastic-v2", SD, neox, x, &st);
            CHECK_OK(st);
            if (!kv) continue;
            const struct ekv_kv_head *h = &kv->layers[0].heads[0];
            double worst = 0;
            int merged = 0;
            CHECK(h->len == ST / 2);
            for (int32_t j = 0; j < h->len; j++) {
                if (h->weight[j] <= 1.0f) continue;
                merged++;
                CHECK_OK(ekv_kv_head_get(kv, h, j, key, NULL));
                memcpy(want, x, sizeof want);
                ekv_rope(want, 1, SD, SD, h->pos[j], 10000.0f, neox);
                for (int c = 0; c < SD; c++) worst = fmax(worst, fabs((double)key[c] - want[c]));
            }
            CHECK_MSG(merged > 0, "no merged entry (neox %d)", neox);
            if (rot)
                CHECK_MSG(worst < 1e-5, "key=rotate: merged key is %g from x roped at the anchor (neox %d)", worst,
                          neox);
            else
                CHECK_MSG(worst > 1e-2, "key=mean: merged key only %g from the anchor's (neox %d)", worst, neox);
            ekv_kv_free(kv);
        }
    /* no RoPE in the cache: key=rotate is refused when it has to merge */
    enum ekv_status st;
    struct ekv_kv *kv = synthetic("elastic-v2:key=rotate", 0, false, x, &st);
    CHECK_MSG(!kv && st == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "key=rotate"), "%s: %s",
              ekv_status_str(st), ekv_last_error());
    /* the options parse and set the attention flag as the last one says */
    static const struct { const char *spec; bool bias; } flags[] = {
        {"elastic-v2", true}, {"elastic-v2:bias=off", false}, {"elastic-v2:bias=1:bias=0", false},
        {"elastic-v2:bias=true:paper=1", false}, {"elastic-v2:paper=1:bias=1", true}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        struct ekv_kv_params p = params(flags[i].spec, 0.5);
        struct ekv_kv *c = NULL;
        CHECK_OK(ekv_kv_new(1, SR, 1, SD, &p, &c));
        CHECK_MSG(c && c->logit_bias == flags[i].bias, "%s: logit_bias %d", flags[i].spec, c ? c->logit_bias : -1);
        ekv_kv_free(c);
    }
}

/* softmax(q . k_j / sqrt(d) + (bias ? log w_j : 0)) v_j in double over the
 * head's entries, for the SR query heads q [SR][SD] into o [SR][SD]. */
static void expected_out(const struct ekv_kv *kv, const float *q, bool bias, double *o) {
    const struct ekv_kv_head *h = &kv->layers[0].heads[0];
    const int32_t n = h->len;
    float *K = malloc((size_t)n * SD * sizeof *K), *V = malloc((size_t)n * SD * sizeof *V);
    double *s = malloc((size_t)n * sizeof *s);
    CHECK_OK(ekv_kv_head_gather(kv, h, NULL, n, K, V));
    for (int r = 0; r < SR; r++) {
        double mx = -INFINITY, sum = 0;
        for (int32_t j = 0; j < n; j++) {
            double d = 0;
            for (int c = 0; c < SD; c++) d += (double)q[r * SD + c] * K[j * SD + c];
            s[j] = d / sqrt((double)SD) + (bias ? log((double)h->weight[j]) : 0.0);
            mx = fmax(mx, s[j]);
        }
        for (int32_t j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
        for (int c = 0; c < SD; c++) {
            double acc = 0;
            for (int32_t j = 0; j < n; j++) acc += s[j] / sum * V[j * SD + c];
            o[r * SD + c] = acc;
        }
    }
    free(K), free(V), free(s);
}

static void test_bias_attention(void) {
    float x[SD];
    for (int c = 0; c < SD; c++) x[c] = frand();
    for (int batched = 0; batched < 2; batched++) {
        enum ekv_status st;
        struct ekv_kv *kv[2] = {synthetic("elastic-v2:bias=1", 0, false, x, &st), NULL};
        CHECK_OK(st);
        kv[1] = synthetic("elastic-v2:bias=0", 0, false, x, &st);
        CHECK_OK(st);
        if (!kv[0] || !kv[1]) {
            ekv_kv_free(kv[0]), ekv_kv_free(kv[1]);
            continue;
        }
        float q[2][SR * SD], k[2][SD], v[2][SD], out[2][SR * SD];
        for (int i = 0; i < 2; i++) {
            for (int c = 0; c < SR * SD; c++) q[i][c] = 2.0f * frand();
            for (int c = 0; c < SD; c++) k[i][c] = frand(), v[i][c] = frand();
        }
        const struct ekv_kv_step step = {.is_prompt = false, .pos0 = ST, .n_new = 1};
        struct ekv_kv_part parts[2];
        for (int i = 0; i < 2; i++) {
            CHECK_OK(ekv_kv_begin(kv[i], &step));
            parts[i] = (struct ekv_kv_part){.kv = kv[i], .step = &step, .q = q[i], .k = k[i], .v = v[i], .out = out[i]};
        }
        if (batched) {
            CHECK_OK(ekv_kv_layer_forward_batch(NULL, 0, parts, 2));
        } else {
            for (int i = 0; i < 2; i++) CHECK_OK(ekv_kv_layer_forward(kv[i], NULL, 0, &step, q[i], k[i], v[i], out[i]));
        }
        for (int i = 0; i < 2; i++) {
            CHECK(kv[i]->layers[0].heads[0].len == ST / 2 + 1); /* 13 seen, target 7: nothing merged at this step */
            double with[SR * SD], without[SR * SD], e_with = 0, e_without = 0;
            expected_out(kv[i], q[i], true, with);
            expected_out(kv[i], q[i], false, without);
            for (int c = 0; c < SR * SD; c++) {
                e_with = fmax(e_with, fabs(out[i][c] - with[c]));
                e_without = fmax(e_without, fabs(out[i][c] - without[c]));
            }
            /* bias=1 (i = 0) matches the biased attention and not the plain one; bias=0 the reverse */
            const double e_match = i == 0 ? e_with : e_without, e_other = i == 0 ? e_without : e_with;
            CHECK_MSG(e_match < 1e-5 && e_other > 1e-4, "bias=%d (%s): error %g against its rule, %g against the other",
                      1 - i, batched ? "batched" : "single", e_match, e_other);
            CHECK_OK(ekv_kv_end(kv[i], &step));
            ekv_kv_free(kv[i]);
        }
    }
}

int main(void) {
    size_t nt = 0;
    const bool loaded = tu_load_stories(&g_m, &g_ctx, &g_toks, &nt);
    if (g_m) ekv_model_get_info(g_m, &g_mi);
    if (!loaded) {
        ekv_context_free(g_ctx);
        ekv_model_free(g_m);
        free(g_toks);
        return test_finish("test_elastic_v2");
    }
    CHECK(nt >= N_PROMPT + N_GEN);
    test_invariants();
    test_budget_one_and_paper();
    test_merge_control_and_options();
    test_rotate_frame();
    test_bias_attention();
    ekv_context_free(g_ctx);
    ekv_model_free(g_m);
    free(g_toks);
    return test_finish("test_elastic_v2");
}
