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
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
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
typedef void (*check_fn)(struct ekv_seq *seq, int step, void *ud);
static enum ekv_status run(const struct ekv_kv_params *kv, float *lg, check_fn check, void *ud) {
    struct ekv_seq *seq = NULL;
    const size_t V = (size_t)g_mi.n_vocab;
    float *tmp = malloc(V * sizeof *tmp);
    enum ekv_status s = tmp ? ekv_seq_new(g_ctx, kv, &seq) : EKV_ERR_NOMEM;
    if (s == EKV_OK) s = ekv_seq_prefill(seq, g_toks, N_PROMPT, lg ? lg : tmp);
    if (s == EKV_OK && check) check(seq, 0, ud);
    for (int t = 1; s == EKV_OK && t <= N_GEN; t++) {
        s = ekv_seq_decode(seq, g_toks[N_PROMPT + t - 1], lg ? lg + (size_t)t * V : tmp);
        if (s == EKV_OK && check) check(seq, t, ud);
    }
    ekv_seq_free(seq);
    free(tmp);
    return s;
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
                                        "elastic-v2:heads=head:value=attn", "elastic-v2:key=anchor:decode=fixed"};
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
    for (int t = 0; t < 2; t++) {
        struct ekv_kv_params pf = params("full", 1.0), pv = params("elastic-v2", 1.0);
        if (t) pf.type_k = pf.type_v = pv.type_k = pv.type_v = EKV_KV_F32;
        CHECK_OK(run(&pf, a, NULL, NULL));
        CHECK_OK(run(&pv, b, NULL, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) == 0, "elastic-v2 at budget 1 differs from full (%s)",
                  t ? "f32" : "f16");
    }
    /* paper options == elastic, bit for bit, at two budgets */
    for (int k = 0; k < 2; k++) {
        const double bud = k ? 0.5 : 0.2;
        struct ekv_kv_params pe = params("elastic", bud), pv = params("elastic-v2:paper=1", bud);
        CHECK_OK(run(&pe, a, NULL, NULL));
        CHECK_OK(run(&pv, b, NULL, NULL));
        CHECK_MSG(memcmp(a, b, cells * sizeof *a) == 0, "elastic-v2:paper=1 differs from elastic at %g", bud);
    }
    /* the defaults are not the paper's: the logits differ at 0.2 */
    struct ekv_kv_params pv = params("elastic-v2", 0.2);
    CHECK_OK(run(&pv, b, NULL, NULL));
    CHECK(memcmp(a, b, cells * sizeof *a) != 0);
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
                                           "elastic-v2:recent", "elastic-v2:key=rotate", "h2o:recent=0.5",
                                           "elastic-v2:merge=maybe"};
    for (size_t i = 0; i < sizeof badspecs / sizeof *badspecs; i++) {
        struct ekv_kv_params q = params(badspecs[i], 0.2);
        struct ekv_seq *seq = NULL;
        enum ekv_status s = ekv_seq_new(g_ctx, &q, &seq);
        CHECK_MSG(s == EKV_ERR_INVALID_ARG && !seq, "%s: %s", badspecs[i], ekv_status_str(s));
        ekv_seq_free(seq);
    }
}

int main(void) {
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &g_m));
    if (!g_m) return test_finish("test_elastic_v2");
    ekv_model_get_info(g_m, &g_mi);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    CHECK_OK(ekv_context_new(g_m, &cp, &g_ctx));
    size_t len = 0, nt = 0;
    char *text = tu_read_file(tu_src("data/tinystories_eval.jsonl"), &len);
    g_toks = text ? malloc((len + 16) * sizeof *g_toks) : NULL;
    if (!g_ctx || !g_toks) return test_finish("test_elastic_v2");
    CHECK_OK(ekv_tokenize(g_m, text, len, true, false, g_toks, len + 16, &nt));
    CHECK(nt >= N_PROMPT + N_GEN);
    test_invariants();
    test_budget_one_and_paper();
    test_merge_control_and_options();
    ekv_context_free(g_ctx);
    ekv_model_free(g_m);
    free(g_toks);
    free(text);
    return test_finish("test_elastic_v2");
}
