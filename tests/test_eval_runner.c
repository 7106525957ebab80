/*
 * test_eval_runner.c — the evaluation protocols (src/eval/runner.c) on the
 * real stories260K weights and the shipped TinyStories set:
 * - at budget 1.0 every policy matches the full cache exactly: perplexity
 *   bit-equal, KL exactly 0, top-1 agreement 1, ROUGE-L F = 2/(2+1e-8)
 *   (pltrdy) or exactly 1 (sentence), hit rate and Jaccard 1;
 * - at budget 0.2 every compressing policy moves the distributions (KL > 0
 *   on some item) and keeps about a fifth of the cache;
 * - the teacher-forced perplexity equals an independent computation (one
 *   batched forward over prompt + answer, scoring the a-1 answer tokens);
 * - text streaming: windows, scored-token counts, and the full-cache value
 *   against one batched forward per window;
 * - the grid (full once) and the table writer; errors for unsupported input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ekv_eval.h"
#include "testutil.h"

static struct ekv_model *g_model;
static struct ekv_context *g_ctx;
static int32_t g_vocab;

static const double PLTRDY_SAME = 2.0 / (2.0 + 1e-8);

/* Full-cache NLL of tokens[from..to) given everything before, with one
 * batched prompt forward (logits_all) — independent of the runner's loop. */
static double batched_nll(const int32_t *tokens, int32_t n, int32_t from, int32_t to, size_t *count) {
    struct ekv_seq *seq = NULL;
    float *lg = malloc((size_t)n * (size_t)g_vocab * sizeof(float));
    double sum = 0;
    *count = 0;
    if (!lg || ekv_seq_new(g_ctx, NULL, &seq) != EKV_OK) {
        free(lg);
        return NAN;
    }
    struct ekv_segment sg = {.tokens = tokens, .n = n, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &sg, .n_segs = 1, .is_prompt = true, .logits_all = true};
    if (ekv_seq_eval(seq, &in, lg) == EKV_OK) {
        for (int32_t j = from; j < to; j++) {
            double nll;
            if (ekv_nll_from_logits(lg + (size_t)(j - 1) * (size_t)g_vocab, (size_t)g_vocab, tokens[j], &nll) != EKV_OK)
                return NAN;
            sum += nll;
            (*count)++;
        }
    } else {
        sum = NAN;
    }
    ekv_seq_free(seq);
    free(lg);
    return sum;
}

/* dst += src (what running the unit into dst would add, up to summation order) */
static void merge_cell(struct ekv_eval_cell *d, const struct ekv_eval_cell *s) {
    ekv_ppl_merge(&d->ppl, &s->ppl);
    ekv_kl_merge(&d->kl, &s->kl);
    struct ekv_mean_acc *dm[] = {&d->rouge_f, &d->rouge_p, &d->rouge_r, &d->hit_rate, &d->jaccard, &d->kv_frac};
    const struct ekv_mean_acc *sm[] = {&s->rouge_f, &s->rouge_p, &s->rouge_r, &s->hit_rate, &s->jaccard, &s->kv_frac};
    for (int i = 0; i < 6; i++) {
        dm[i]->sum += sm[i]->sum;
        dm[i]->n += sm[i]->n;
    }
}

static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_budget_one_and_point_two(void) {
    struct ekv_data_opts o = ekv_data_default_opts();
    o.limit = 3;
    struct ekv_dataset ds;
    CHECK_OK(ekv_dataset_load(tu_src("data/tinystories_eval.jsonl"), &o, &ds));
    CHECK(ds.n_items == 3);
    struct ekv_eval_cfg cfg = ekv_eval_default_cfg();
    cfg.metrics = EKV_METRIC_PPL | EKV_METRIC_ROUGE | EKV_METRIC_KL | EKV_METRIC_HITRATE;
    cfg.n_predict = 32;
    struct ekv_eval_runner r;
    CHECK_OK(ekv_eval_runner_init(&r, g_ctx, &ds, &cfg));
    CHECK(r.n_units == 3 && r.n_skipped == 0);

    const int np = ekv_kv_policy_count();
    CHECK(np == 12);
    struct ekv_eval_cell full_all, pol_all[16], low_all[16];
    ekv_eval_cell_init(&full_all);
    for (int p = 0; p < np && p < 16; p++) {
        ekv_eval_cell_init(&pol_all[p]);
        ekv_eval_cell_init(&low_all[p]);
    }
    bool kl_pos[16] = {false};
    size_t expect_tokens = 0;
    for (size_t u = 0; u < r.n_units; u++) {
        CHECK_OK(ekv_eval_unit_prepare(&r, u));
        /* the teacher-forced and greedy references wait for a group (cfg.share > 1) or the first cell */
        CHECK(r.ref_pending && r.ref_text == NULL && r.ref_logits != NULL && r.ref_attn != NULL);
        const struct ekv_eval_unit *un = &r.units[u];
        int32_t a = un->n_tokens - un->n_prompt;
        expect_tokens += (size_t)(a - 1);
        /* the protocol against one batched forward: same tokens, same values up to rounding */
        size_t cnt = 0;
        double ref_sum = batched_nll(un->tokens, un->n_tokens - 1, un->n_prompt, un->n_tokens - 1, &cnt);
        struct ekv_eval_cell full;
        ekv_eval_cell_init(&full);
        CHECK_OK(ekv_eval_unit_run(&r, NULL, &full));
        CHECK(!r.ref_pending && r.ref_text != NULL);
        CHECK_MSG(full.ppl.n_tokens == (size_t)(a - 1) && cnt == full.ppl.n_tokens, "unit %zu: %zu scored, a = %d",
                  u, full.ppl.n_tokens, a);
        CHECK_MSG(fabs(full.ppl.nll_sum - ref_sum) <= 1e-4 * ref_sum, "unit %zu: NLL %.9g vs batched %.9g", u,
                  full.ppl.nll_sum, ref_sum);
        CHECK(full.kl.kl_sum == 0.0 && full.kl.top1_agree == full.kl.n_positions);
        CHECK(full.rouge_f.n == 1 && same_double(full.rouge_f.sum, PLTRDY_SAME));
        CHECK(full.hit_rate.n == 20 && full.hit_rate.sum == 20.0 && full.jaccard.sum == 20.0);
        merge_cell(&full_all, &full);
        for (int p = 0; p < np && p < 16; p++) {
            struct ekv_kv_params kv = ekv_kv_default_params();
            kv.policy = ekv_kv_policy_name(p);
            kv.budget = 1.0;
            struct ekv_eval_cell c;
            ekv_eval_cell_init(&c);
            CHECK_OK(ekv_eval_unit_run(&r, &kv, &c));
            merge_cell(&pol_all[p], &c);
            CHECK_MSG(same_double(c.ppl.nll_sum, full.ppl.nll_sum) && c.ppl.n_tokens == full.ppl.n_tokens,
                      "%s at 1.0, unit %zu: NLL %.17g vs full %.17g", kv.policy, u, c.ppl.nll_sum, full.ppl.nll_sum);
            CHECK_MSG(c.kl.kl_sum == 0.0 && c.kl.top1_agree == c.kl.n_positions, "%s at 1.0, unit %zu: KL %g",
                      kv.policy, u, c.kl.kl_sum);
            CHECK_MSG(c.rouge_f.n == 1 && same_double(c.rouge_f.sum, PLTRDY_SAME) && c.rouge_p.sum == 1.0 &&
                      c.rouge_r.sum == 1.0, "%s at 1.0, unit %zu: ROUGE-L F %.17g", kv.policy, u, c.rouge_f.sum);
            CHECK_MSG(c.hit_rate.sum == (double)c.hit_rate.n && c.jaccard.sum == (double)c.jaccard.n,
                      "%s at 1.0: hit rate %g of %zu", kv.policy, c.hit_rate.sum, c.hit_rate.n);
            CHECK_MSG(c.kv_frac.n == 1 && c.kv_frac.sum == 1.0, "%s at 1.0: kept %g", kv.policy, c.kv_frac.sum);
            if (!strcmp(kv.policy, "full")) continue;
            kv.budget = 0.2;
            struct ekv_eval_cell lo;
            ekv_eval_cell_init(&lo);
            CHECK_OK(ekv_eval_unit_run(&r, &kv, &lo));
            merge_cell(&low_all[p], &lo);
            if (lo.kl.kl_sum > 0) kl_pos[p] = true;
            /* at the end of the answer: decode-time policies hold ~20%; SnapKV,
             * PyramidKV and VL-Cache compress the prompt only, so the answer's
             * tokens stay and the fraction is higher */
            bool prompt_only = !strcmp(kv.policy, "snapkv") || !strcmp(kv.policy, "pyramidkv") ||
                               !strcmp(kv.policy, "vlcache");
            CHECK_MSG(lo.kv_frac.sum > 0.1 && lo.kv_frac.sum < (prompt_only ? 0.8 : 0.35), "%s at 0.2 keeps %g",
                      kv.policy, lo.kv_frac.sum);
            CHECK_MSG(lo.hit_rate.sum < (double)lo.hit_rate.n, "%s at 0.2: every kept set is ideal?", kv.policy);
        }
    }
    /* pooled over the 3 items */
    double vf, vp;
    CHECK_OK(ekv_ppl_value(&full_all.ppl, &vf));
    CHECK(full_all.ppl.n_tokens == expect_tokens);
    CHECK(vf > 1.5 && vf < 20); /* a trained model on in-domain text */
    for (int p = 0; p < np && p < 16; p++) {
        CHECK_OK(ekv_ppl_value(&pol_all[p].ppl, &vp));
        CHECK_MSG(same_double(vp, vf), "%s at 1.0: pooled PPL %.17g vs %.17g", ekv_kv_policy_name(p), vp, vf);
        double kl, top1;
        CHECK_OK(ekv_kl_result(&pol_all[p].kl, &kl, &top1));
        CHECK(kl == 0.0 && top1 == 1.0);
        if (strcmp(ekv_kv_policy_name(p), "full") != 0) {
            CHECK_MSG(kl_pos[p], "%s at 0.2: KL is 0 on every item", ekv_kv_policy_name(p));
            double lp;
            CHECK_OK(ekv_ppl_value(&low_all[p].ppl, &lp));
            CHECK_MSG(!same_double(lp, vf), "%s at 0.2: PPL unchanged", ekv_kv_policy_name(p));
        }
    }

    /* the table writer: full, h2o and elastic rows with every metric column */
    struct ekv_report rep;
    ekv_report_init(&rep);
    CHECK_OK(ekv_eval_cell_report(&full_all, cfg.metrics, "full", 1.0, &rep));
    for (int p = 0; p < np && p < 16; p++)
        if (!strcmp(ekv_kv_policy_name(p), "h2o") || !strcmp(ekv_kv_policy_name(p), "elastic"))
            CHECK_OK(ekv_eval_cell_report(&low_all[p], cfg.metrics, ekv_kv_policy_name(p), 0.2, &rep));
    CHECK(rep.n_rows == 3 * 9);
    char *md = NULL;
    CHECK_OK(ekv_report_markdown(&rep, &md));
    CHECK(md && strstr(md, "| policy | budget | ppl | rouge_l_f | rouge_l_p | rouge_l_r | kl | top1 | hit_rate | "
                           "jaccard | kv_frac |"));
    CHECK(md && strstr(md, "| full | 1 | ") && strstr(md, "| h2o | 0.2 | ") && strstr(md, "| elastic | 0.2 | "));
    free(md);
    ekv_report_free(&rep);
    ekv_eval_runner_free(&r);

    /* sentence ROUGE-L: identical answers give exactly 1 */
    cfg.metrics = EKV_METRIC_ROUGE;
    cfg.rouge = EKV_ROUGE_SENTENCE;
    CHECK_OK(ekv_eval_runner_init(&r, g_ctx, &ds, &cfg));
    for (size_t u = 0; u < 1 && u < r.n_units; u++) {
        CHECK_OK(ekv_eval_unit_prepare(&r, u));
        CHECK(r.ref_logits == NULL && r.ref_attn == NULL && r.ref_pending);
        for (int p = 0; p < np; p++) {
            struct ekv_kv_params kv = ekv_kv_default_params();
            kv.policy = ekv_kv_policy_name(p);
            kv.budget = 1.0;
            struct ekv_eval_cell c;
            ekv_eval_cell_init(&c);
            CHECK_OK(ekv_eval_unit_run(&r, &kv, &c));
            CHECK_MSG(c.rouge_f.n == 1 && c.rouge_f.sum == 1.0 && c.ppl.n_tokens == 0 && c.kl.n_positions == 0,
                      "%s sentence ROUGE %.17g", kv.policy, c.rouge_f.sum);
        }
        CHECK(!r.ref_pending && r.ref_text != NULL);
    }
    ekv_eval_runner_free(&r);
    ekv_dataset_free(&ds);
}

/* The grid runner on 2 items: full once, cells in order, values as above. */
static void test_grid(void) {
    char *pols[] = {"full", "local", "elastic"};
    const double buds[] = {0.5, 1.0};
    struct ekv_eval_grid_cell *cells = NULL;
    size_t n = 0;
    CHECK_OK(ekv_eval_grid(pols, 3, buds, 2, &cells, &n));
    CHECK(n == 5 && cells && !strcmp(cells[0].policy, "full") && cells[0].budget == 1.0 &&
          !strcmp(cells[1].policy, "local") && cells[1].budget == 0.5 && !strcmp(cells[4].policy, "elastic") &&
          cells[4].budget == 1.0);
    char *badp[] = {"full", "nonsense"};
    struct ekv_eval_grid_cell *bad = NULL;
    size_t nb = 0;
    CHECK(ekv_eval_grid(badp, 2, buds, 2, &bad, &nb) == EKV_ERR_INVALID_ARG && bad == NULL);
    CHECK(strstr(ekv_last_error(), "nonsense") != NULL);

    struct ekv_data_opts o = ekv_data_default_opts();
    o.offset = 5;
    o.limit = 2;
    struct ekv_dataset ds;
    CHECK_OK(ekv_dataset_load(tu_src("data/tinystories_eval.jsonl"), &o, &ds));
    struct ekv_eval_cfg cfg = ekv_eval_default_cfg();
    cfg.n_predict = 32;
    struct ekv_eval_runner r;
    CHECK_OK(ekv_eval_runner_init(&r, g_ctx, &ds, &cfg));
    struct ekv_eval_cell out[5];
    struct ekv_kv_params base = ekv_kv_default_params();
    if (n == 5) CHECK_OK(ekv_eval_run_grid(&r, &base, cells, n, out, NULL, NULL));
    double f, e1, l5, k;
    CHECK_OK(ekv_ppl_value(&out[0].ppl, &f));
    CHECK_OK(ekv_ppl_value(&out[4].ppl, &e1));
    CHECK_OK(ekv_ppl_value(&out[1].ppl, &l5));
    CHECK(same_double(f, e1) && !same_double(f, l5));
    CHECK_OK(ekv_kl_result(&out[1].kl, &k, &f));
    CHECK(k > 0 && f < 1.0);
    CHECK(out[0].rouge_f.n == 2 && out[0].hit_rate.n == 0);
    ekv_eval_runner_free(&r);
    ekv_dataset_free(&ds);
    free(cells);
}

/* Text streaming: windows of n_ctx, stride chunks, full-cache value against one
 * batched forward per window; budget 1 bit-equal; rouge refused. */
static void test_text_stream(void) {
    struct ekv_context *c128 = NULL;
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    cp.n_ctx = 128;
    CHECK_OK(ekv_context_new(g_model, &cp, &c128));
    struct ekv_data_opts o = ekv_data_default_opts();
    o.format = EKV_DATA_TEXT;
    o.doc_sep = "<|endoftext|>";
    o.limit = 2;
    struct ekv_dataset ds;
    CHECK_OK(ekv_dataset_load(tu_shared("data/perplexity/tinystories_sample.txt"), &o, &ds));
    struct ekv_eval_cfg cfg = ekv_eval_default_cfg();
    cfg.stride = 32;
    struct ekv_eval_runner r;
    CHECK(ekv_eval_runner_init(&r, c128, &ds, &cfg) == EKV_ERR_INVALID_ARG); /* rouge needs JSONL */
    ekv_eval_runner_free(&r);
    cfg.metrics = EKV_METRIC_PPL | EKV_METRIC_KL;
    CHECK_OK(ekv_eval_runner_init(&r, c128, &ds, &cfg));
    /* every window but possibly the last of a document holds 128 tokens */
    size_t total_tokens = 0;
    for (size_t d = 0; d < ds.n_items; d++) {
        int32_t *t = malloc(8192 * sizeof *t);
        size_t nt = 0;
        CHECK_OK(ekv_tokenize(g_model, ds.items[d].text, strlen(ds.items[d].text), true, false, t, 8192, &nt));
        total_tokens += nt;
        free(t);
    }
    size_t covered = 0;
    for (size_t u = 0; u < r.n_units; u++) {
        covered += (size_t)r.units[u].n_tokens;
        CHECK(r.units[u].stream && r.units[u].n_prompt == 32 && r.units[u].n_tokens <= 128);
    }
    size_t skipped_tokens = 0;
    for (size_t i = 0; i < r.n_skipped; i++) {
        size_t k = 0;
        const char *p = strstr(r.skipped[i], "window");
        if (p && sscanf(strchr(p, ':') + 1, " %zu", &k) == 1) skipped_tokens += k;
    }
    CHECK_MSG(covered + skipped_tokens == total_tokens, "%zu + %zu tokens of %zu", covered, skipped_tokens,
              total_tokens);
    CHECK(r.n_units >= 4);
    for (size_t u = 0; u < r.n_units; u++) {
        CHECK_OK(ekv_eval_unit_prepare(&r, u));
        const struct ekv_eval_unit *un = &r.units[u];
        struct ekv_eval_cell full, pol, lo;
        ekv_eval_cell_init(&full);
        ekv_eval_cell_init(&pol);
        ekv_eval_cell_init(&lo);
        CHECK_OK(ekv_eval_unit_run(&r, NULL, &full));
        size_t cnt = 0;
        double ref = batched_nll(un->tokens, un->n_tokens, 32, un->n_tokens, &cnt);
        CHECK(full.ppl.n_tokens == (size_t)(un->n_tokens - 32) && cnt == full.ppl.n_tokens);
        CHECK_MSG(fabs(full.ppl.nll_sum - ref) <= 1e-4 * ref, "window %zu: %.9g vs %.9g", u, full.ppl.nll_sum, ref);
        struct ekv_kv_params kv = ekv_kv_default_params();
        kv.policy = "local";
        kv.budget = 1.0;
        CHECK_OK(ekv_eval_unit_run(&r, &kv, &pol));
        CHECK(same_double(pol.ppl.nll_sum, full.ppl.nll_sum) && pol.kl.kl_sum == 0.0);
        kv.budget = 0.3;
        CHECK_OK(ekv_eval_unit_run(&r, &kv, &lo));
        CHECK(lo.ppl.n_tokens == full.ppl.n_tokens);
        if (un->n_tokens > 64) CHECK_MSG(lo.kl.kl_sum > 0 && lo.kv_frac.sum < 0.45, "window %zu", u);
    }
    ekv_eval_runner_free(&r);
    ekv_dataset_free(&ds);
    ekv_context_free(c128);
}

/* Images and missing answers are refused with a message; long prompts skipped. */
static void test_bad_items(void) {
    char path[] = "/tmp/ekv_eval_runner_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    fputs("{\"id\":\"img\",\"instruction\":\"Look.\",\"answer\":\"A cat.\",\"image\":\"cat.png\"}\n", f);
    fclose(f);
    struct ekv_data_opts o = ekv_data_default_opts();
    o.format = EKV_DATA_JSONL;
    struct ekv_dataset ds;
    CHECK_OK(ekv_dataset_load(path, &o, &ds));
    struct ekv_eval_cfg cfg = ekv_eval_default_cfg();
    struct ekv_eval_runner r;
    CHECK(ekv_eval_runner_init(&r, g_ctx, &ds, &cfg) == EKV_ERR_UNSUPPORTED);
    CHECK(strstr(ekv_last_error(), "--mmproj") && strstr(ekv_last_error(), "img"));
    ekv_eval_runner_free(&r);
    ekv_dataset_free(&ds);

    f = fopen(path, "w");
    fputs("{\"id\":\"noans\",\"instruction\":\"Once upon a time\"}\n", f);
    fclose(f);
    CHECK_OK(ekv_dataset_load(path, &o, &ds));
    CHECK(ekv_eval_runner_init(&r, g_ctx, &ds, &cfg) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "noans") && strstr(ekv_last_error(), "no answer"));
    ekv_eval_runner_free(&r);
    cfg.metrics = EKV_METRIC_ROUGE; /* rouge alone needs no answer */
    CHECK_OK(ekv_eval_runner_init(&r, g_ctx, &ds, &cfg));
    CHECK(r.n_units == 1 && r.units[0].n_tokens == r.units[0].n_prompt);
    ekv_eval_runner_free(&r);
    ekv_dataset_free(&ds);

    /* a prompt longer than the context is skipped, with its reason */
    f = fopen(path, "w");
    fputs("{\"id\":\"long\",\"instruction\":\"", f);
    for (int i = 0; i < 700; i++) fputs("Tim ran. ", f);
    fputs("\",\"answer\":\"He was tired.\"}\n{\"id\":\"ok\",\"instruction\":\"Tim ran.\",\"answer\":\"He was tired.\"}\n", f);
    fclose(f);
    CHECK_OK(ekv_dataset_load(path, &o, &ds));
    cfg = ekv_eval_default_cfg();
    CHECK_OK(ekv_eval_runner_init(&r, g_ctx, &ds, &cfg));
    CHECK(r.n_units == 1 && r.n_skipped == 1 && strstr(r.skipped[0], "long") && strstr(r.skipped[0], "context"));
    ekv_eval_runner_free(&r);
    ekv_dataset_free(&ds);
    remove(path);
}

/* One prompt per cell (the greedy answer continues a copy of the
 * teacher-forced run's sequence) gives the same cell as reading the prompt
 * twice (cfg.no_fork), bit for bit: every policy at 0.2, a +merge spec and
 * KIVI storage, with ppl, kl, acc, rouge and hit rate. */
static void test_fork_same(void) {
    struct ekv_data_opts o = ekv_data_default_opts();
    o.limit = 2;
    struct ekv_dataset ds;
    CHECK_OK(ekv_dataset_load(tu_src("data/tinystories_eval.jsonl"), &o, &ds));
    struct ekv_eval_cfg cfg[2] = {ekv_eval_default_cfg(), ekv_eval_default_cfg()};
    struct ekv_eval_runner r[2];
    for (int f = 0; f < 2; f++) {
        cfg[f].metrics = EKV_METRIC_PPL | EKV_METRIC_ROUGE | EKV_METRIC_KL | EKV_METRIC_ACC | EKV_METRIC_HITRATE;
        cfg[f].n_predict = 24;
        cfg[f].no_fork = f == 1;
        CHECK_OK(ekv_eval_runner_init(&r[f], g_ctx, &ds, &cfg[f]));
    }
    const int np = ekv_kv_policy_count();
    int differ = 0, cells = 0, rouge_lt1 = 0;
    for (size_t u = 0; u < r[0].n_units; u++) {
        for (int f = 0; f < 2; f++) CHECK_OK(ekv_eval_unit_prepare(&r[f], u));
        for (int p = 0; p < np + 2; p++) {
            struct ekv_kv_params kv = ekv_kv_default_params();
            kv.policy = p < np ? ekv_kv_policy_name(p) : p == np ? "h2o+merge" : "snapkv";
            kv.budget = 0.2;
            if (p == np + 1) {
                kv.type_k = EKV_KV_KIVI4, kv.type_v = EKV_KV_KIVI2, kv.kv_group = 8;
            }
            struct ekv_eval_cell c[2];
            for (int f = 0; f < 2; f++) {
                ekv_eval_cell_init(&c[f]);
                CHECK_OK(ekv_eval_unit_run(&r[f], &kv, &c[f]));
            }
            const bool same = same_double(c[0].ppl.nll_sum, c[1].ppl.nll_sum) &&
                              same_double(c[0].kl.kl_sum, c[1].kl.kl_sum) && c[0].rouge_f.n == 1 &&
                              c[1].rouge_f.n == 1 && same_double(c[0].rouge_f.sum, c[1].rouge_f.sum) &&
                              same_double(c[0].rouge_r.sum, c[1].rouge_r.sum) &&
                              same_double(c[0].acc.sum, c[1].acc.sum) &&
                              same_double(c[0].hit_rate.sum, c[1].hit_rate.sum) &&
                              same_double(c[0].kv_frac.sum, c[1].kv_frac.sum);
            CHECK_MSG(same, "%s at 0.2, unit %zu: one prompt gives NLL %.17g ROUGE-L %.17g, two give %.17g %.17g",
                      kv.policy, u, c[0].ppl.nll_sum, c[0].rouge_f.sum, c[1].ppl.nll_sum, c[1].rouge_f.sum);
            differ += !same;
            cells++;
            rouge_lt1 += c[0].rouge_f.sum < PLTRDY_SAME;
        }
    }
    CHECK_MSG(cells == 2 * (np + 2) && differ == 0 && rouge_lt1 > 0, "%d of %d cells differ; %d answers changed",
              differ, cells, rouge_lt1);
    for (int f = 0; f < 2; f++) ekv_eval_runner_free(&r[f]);
    ekv_dataset_free(&ds);
}

/* Every field of two cells' accumulators is equal bit for bit. */
static bool same_cell(const struct ekv_eval_cell *a, const struct ekv_eval_cell *b) {
    const struct ekv_mean_acc *ma[] = {&a->rouge_f, &a->rouge_p, &a->rouge_r, &a->hit_rate, &a->jaccard,
                                       &a->acc,     &a->kv_frac, &a->kv_bytes, &a->kv_bytes_frac};
    const struct ekv_mean_acc *mb[] = {&b->rouge_f, &b->rouge_p, &b->rouge_r, &b->hit_rate, &b->jaccard,
                                       &b->acc,     &b->kv_frac, &b->kv_bytes, &b->kv_bytes_frac};
    bool same = same_double(a->ppl.nll_sum, b->ppl.nll_sum) && a->ppl.n_tokens == b->ppl.n_tokens &&
                same_double(a->kl.kl_sum, b->kl.kl_sum) && a->kl.n_positions == b->kl.n_positions &&
                a->kl.top1_agree == b->kl.top1_agree;
    for (size_t i = 0; i < sizeof ma / sizeof ma[0]; i++) same = same && same_double(ma[i]->sum, mb[i]->sum) && ma[i]->n == mb[i]->n;
    return same;
}

/* Cells run together (ekv_eval_unit_run_group: one shared prompt, batched
 * decode steps) give each cell exactly what it gets alone, for several
 * metric sets: every policy at 0.2 and 0.5, +merge and +adakv specs, and
 * cells that cannot join (KIVI storage, --kv-chunk) and run alone. */
static void test_group_same(void) {
    struct ekv_data_opts o = ekv_data_default_opts();
    o.limit = 2;
    struct ekv_dataset ds;
    CHECK_OK(ekv_dataset_load(tu_src("data/tinystories_eval.jsonl"), &o, &ds));
    const unsigned sets[4] = {EKV_METRIC_PPL | EKV_METRIC_ROUGE | EKV_METRIC_KL | EKV_METRIC_ACC | EKV_METRIC_HITRATE,
                              EKV_METRIC_ROUGE, EKV_METRIC_PPL | EKV_METRIC_KL, EKV_METRIC_HITRATE};
    const int np = ekv_kv_policy_count();
    enum { MAXC = 64 };
    struct ekv_kv_params kv[MAXC];
    size_t n = 0;
    /* lossy cells first, so that the group's first members differ from the reference */
    const char *extra[4] = {"h2o+merge", "snapkv+adakv", "snapkv", "h2o"};
    for (int i = 0; i < 4 && n < MAXC; i++) {
        kv[n] = ekv_kv_default_params();
        kv[n].policy = extra[i];
        kv[n].budget = 0.3;
        if (i == 2) kv[n].type_k = EKV_KV_KIVI4, kv[n].type_v = EKV_KV_KIVI2, kv[n].kv_group = 8; /* runs alone */
        if (i == 3) kv[n].chunk = 16;                                                        /* runs alone */
        n++;
    }
    for (int p = 0; p < np && n + 2 <= MAXC; p++)
        for (int b = 0; b < 2; b++) {
            kv[n] = ekv_kv_default_params();
            kv[n].policy = ekv_kv_policy_name(p);
            kv[n++].budget = b ? 0.5 : 0.2;
        }
    for (int si = 0; si < 4; si++) {
        /* r[0]: every cell alone (share 1: the reference built by prepare);
         * r[1]: groups of 11 (the reference runs in the first group) */
        struct ekv_eval_cfg cfg[2] = {ekv_eval_default_cfg(), ekv_eval_default_cfg()};
        struct ekv_eval_runner r[2];
        for (int f = 0; f < 2; f++) {
            cfg[f].metrics = sets[si];
            cfg[f].n_predict = 24;
            cfg[f].share = f == 0 ? 1 : 11;
            CHECK_OK(ekv_eval_runner_init(&r[f], g_ctx, &ds, &cfg[f]));
        }
        struct ekv_eval_cell alone[MAXC], grouped[MAXC];
        int differ = 0;
        const size_t n_units = si == 0 ? r[0].n_units : 1; /* the other metric sets on one unit (ASan time) */
        for (size_t u = 0; u < n_units; u++) {
            for (int f = 0; f < 2; f++) CHECK_OK(ekv_eval_unit_prepare(&r[f], u));
            const bool waits = (sets[si] & (EKV_METRIC_KL | EKV_METRIC_ROUGE)) != 0;
            CHECK_MSG(!r[0].ref_pending && r[1].ref_pending == waits, "metrics 0x%x: reference pending %d %d", sets[si],
                      r[0].ref_pending, r[1].ref_pending);
            for (size_t i = 0; i < n; i++) {
                ekv_eval_cell_init(&alone[i]);
                ekv_eval_cell_init(&grouped[i]);
                CHECK_OK(ekv_eval_unit_run(&r[0], &kv[i], &alone[i]));
            }
            for (size_t c0 = 0; c0 < n; c0 += 11) /* groups of 11 */
                CHECK_OK(ekv_eval_unit_run_group(&r[1], kv + c0, n - c0 < 11 ? n - c0 : 11, grouped + c0));
            CHECK(!r[1].ref_pending);
            for (size_t i = 0; i < n; i++) {
                const bool same = same_cell(&alone[i], &grouped[i]);
                CHECK_MSG(same, "metrics 0x%x, %s at %.1f, unit %zu: in a group NLL %.17g ROUGE-L %.17g hit %.17g, "
                          "alone %.17g %.17g %.17g", sets[si], kv[i].policy, kv[i].budget, u, grouped[i].ppl.nll_sum,
                          grouped[i].rouge_f.sum, grouped[i].hit_rate.sum, alone[i].ppl.nll_sum, alone[i].rouge_f.sum,
                          alone[i].hit_rate.sum);
                differ += !same;
            }
            /* a unit run alone after grouping, and grouping after a cell ran alone, still agree */
            struct ekv_eval_cell one;
            ekv_eval_cell_init(&one);
            CHECK_OK(ekv_eval_unit_run(&r[1], &kv[0], &one));
            CHECK(same_cell(&one, &alone[0]));
        }
        /* every cell but the two that cannot join ran in a group */
        CHECK_MSG(r[1].n_grouped == n_units * (n - 2) && r[0].n_grouped == 0,
                  "metrics 0x%x: %zu cells ran in groups, expected %zu", sets[si], r[1].n_grouped, n_units * (n - 2));
        CHECK(differ == 0);
        for (int f = 0; f < 2; f++) ekv_eval_runner_free(&r[f]);
    }
    ekv_dataset_free(&ds);
}

int main(void) {
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &g_model));
    if (!g_model) return test_finish("test_eval_runner");
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    cp.n_ctx = 512; /* stories260K's trained context */
    CHECK_OK(ekv_context_new(g_model, &cp, &g_ctx));
    struct ekv_model_info mi;
    ekv_model_get_info(g_model, &mi);
    g_vocab = mi.n_vocab;
    if (g_ctx) {
        test_budget_one_and_point_two();
        test_grid();
        test_text_stream();
        test_bad_items();
        test_fork_same();
        test_group_same();
    }
    ekv_context_free(g_ctx);
    ekv_model_free(g_model);
    return test_finish("test_eval_runner");
}
