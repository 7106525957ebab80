/*
 * cmd_eval.c — `ekv eval`: quality of KV-cache policies against their
 * budget, with the papers' protocols (docs/policies.md "Evaluation protocols"): perplexity, ROUGE-L
 * and KL against the full cache, cache hit rate; a policies x budgets grid;
 * results as CSV, JSON, Markdown and gnuplot PNGs. The protocols themselves
 * live in src/eval/runner.c; this file parses flags, loops over units and
 * cells with a progress line, and writes the reports.
 */
#include <errno.h>
#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "ekv_eval.h"

static const char *const CMD = "eval";

static const struct cli_help k_help = {
    "usage: ekv eval [options]",
    "Measures the quality of KV-cache policies against their budget on an evaluation set,\n"
    "over a grid of policies x budgets, with the protocols of docs/policies.md\n"
    "(\"Evaluation protocols\").",
    "metrics (--metric):\n"
    "  ppl     jsonl: prompt (BOS, then system + \"\\n\" + instruction, or the --chat-template template;\n"
    "          an item with images (\"image\" or \"images\"): the model's own template, else llava-1.5,\n"
    "          each image at its <image> marker) prefilled and\n"
    "          compressed; answer (no BOS, no EOS) teacher-forced token by token with the decode-time\n"
    "          policy active; a-1 tokens scored per item (the first from the prefill logits, before\n"
    "          compression); PPL = exp(mean NLL) pooled over all tokens of all items. An item's\n"
    "          \"score_from\": k feeds its first k answer tokens (a cue) without scoring them.\n"
    "          text: each window streamed in prompt chunks of --stride tokens, the policy\n"
    "          compressing after each; every token after the first chunk is scored (EasyKV style).\n"
    "  rouge   greedy answer (-n tokens at most, stop at end of text) under the policy vs the\n"
    "          full cache's greedy answer: ROUGE-L F1, P and R, macro mean over items. The policy\n"
    "          acts after every forward, so the first token comes from the uncompressed prefill\n"
    "          logits.\n"
    "  kl      mean KL(full || policy) of next-token distributions over the teacher-forced\n"
    "          positions of ppl, and top-1 agreement.\n"
    "  acc     exact match on the teacher-forced answer: an item scores 1 when every scored answer\n"
    "          token (all but the last) is the argmax, i.e. the greedy answer equals the reference\n"
    "          (retrieval sets: the last answer token, e.g. '(', only fixes the token boundary).\n"
    "  hitrate after the prompt, per layer and KV head: kept positions vs the top-k (k = kept) of\n"
    "          the full cache's attention of the first answer token's query (VL-Cache hit rate,\n"
    "          RoCo Jaccard).\n"
    "Every run also reports kv_frac, the cache entries kept / full cache, kv_bytes, the K/V\n"
    "bytes of the cache in its storage types (mean over items, at the end of each), and\n"
    "kv_bytes_frac, those bytes / a full f32 cache's. --kv-type LIST adds storage types as a\n"
    "grid axis; with kv_bytes_frac the plots include pareto_<metric>.png (quality against\n"
    "bytes, one point per policy x type x budget).\n\n"
    "Context (-c): the default is the context the model file declares. stories260K was trained\n"
    "on 512 positions (its llama2.c checkpoint says so) but its GGUF declares 2048: pass -c 512\n"
    "with it. Positions beyond the trained context were never seen in training, so scores there\n"
    "are meaningless. JSONL items that do not fit are skipped (listed); text documents are cut\n"
    "into windows of N tokens, each a fresh sequence (only the first starts with BOS).\n\n"
    "The other --kv-* flags apply to every policy of the grid. Progress with ETA goes to stderr.\n"
    "Exit status: 0 success, 1 bad usage or failure, 2 results written but plotting failed.",
};

/* the shipped evaluation set, found like the bundled model */
static const char *default_data(void) {
    static char buf[4096];
    return cli_find_file("data/tinystories_eval.jsonl", buf, sizeof buf);
}

/* mkdir -p */
static bool make_dirs(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return false;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return false;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return false;
    struct stat st;
    return stat(buf, &st) == 0 && S_ISDIR(st.st_mode);
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

struct progress {
    bool tty;
    double t0;
    size_t n_cells;
    const struct ekv_eval_runner *r;
};

static void show_progress(struct progress *pg, size_t done, size_t total, size_t unit) {
    char line[160];
    ekv_eval_format_progress(line, sizeof line, done, total, cli_now() - pg->t0);
    const struct ekv_eval_item *it = &pg->r->ds->items[pg->r->units[unit].item];
    char what[96];
    if (it->id) snprintf(what, sizeof what, "%.80s", it->id);
    else snprintf(what, sizeof what, "line %zu", it->line);
    if (pg->tty) fprintf(stderr, "\r\033[Kekv eval: %s unit %s, %zu cells", line, what, pg->n_cells);
    else fprintf(stderr, "ekv eval: %s unit %s, %zu cells\n", line, what, pg->n_cells);
    if (pg->tty && done == total) fputc('\n', stderr);
    fflush(stderr);
}

static const char *basename_of(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}


/* Everything one evaluation holds. */
struct eval {
    struct cli_params p;
    struct ekv_eval_cfg cfg;
    struct ekv_data_opts dopts;
    struct ekv_eval_grid_cell *cells;
    size_t n_cells;            /* policy x budget cells of one storage type */
    struct kv_type_axis {
        char label[32];        /* "f16", "q8_0/kivi4" */
        enum ekv_kv_type k, v;
    } *types;                  /* [n_types] the storage-type axis */
    size_t n_types;
    const char *model_path, *data_path;
    struct ekv_model *model;
    struct ekv_context *ctx;
    int32_t n_threads;
    struct ekv_dataset ds;
    struct ekv_eval_runner run;
    struct ekv_vision *vision;
    char *data_dir;
    struct ekv_eval_cell *acc; /* [n_types][n_cells] */
    struct ekv_eval_cell *unit_acc; /* [n_units][n_types][n_cells]: each unit's own, for --per-item / --compare-to */
    double *cell_s;            /* [n_types][n_cells] seconds per cell */
    double total_s, ref_s;
    struct ekv_report rep;
    char *md, *p_csv, *p_json, *p_md;
    cJSON *meta;
};

/* Flags, then metrics, formats and the grid: everything checked before loading anything. */
static int eval_parse(struct eval *e, int argc, char **argv) {
    struct cli_params *p = &e->p;
    cli_params_init(p, CLI_EVAL);
    int rc = cli_parse(CMD, argc, argv, p, &k_help);
    if (rc) return rc;
    e->cfg = ekv_eval_default_cfg();
    e->cfg.n_predict = (int32_t)p->n_predict;
    e->cfg.stride = (int32_t)p->stride;
    e->cfg.share = (int32_t)p->share;
    e->cfg.chat_template = p->chat_template;
    e->dopts = ekv_data_default_opts();
    e->dopts.offset = (size_t)p->offset;
    e->dopts.limit = (size_t)p->limit;
    e->dopts.doc_sep = p->doc_sep;
    if (ekv_metrics_parse(p->metrics, &e->cfg.metrics) != EKV_OK)
        return cli_usage_error(CMD, "--metric: %s", ekv_last_error());
    if (ekv_rouge_kind_parse(p->rouge, &e->cfg.rouge) != EKV_OK)
        return cli_usage_error(CMD, "--rouge: %s", ekv_last_error());
    if (ekv_data_format_parse(p->format, &e->dopts.format) != EKV_OK)
        return cli_usage_error(CMD, "--format: %s", ekv_last_error());
    if (ekv_eval_grid((char *const *)p->kv_policies.s, (size_t)p->kv_policies.n, p->kv_budgets.d,
                      (size_t)p->kv_budgets.n, &e->cells, &e->n_cells) != EKV_OK)
        return cli_usage_error(CMD, "--kv-policy: %s", ekv_last_error());
    /* storage types: the --kv-type list, else the one of -ctk/-ctv (default f16) */
    e->n_types = p->kv_types.n > 0 ? (size_t)p->kv_types.n : 1;
    e->types = calloc(e->n_types, sizeof *e->types);
    if (!e->types) return cli_fail(CMD, EKV_ERR_NOMEM);
    for (size_t t = 0; t < e->n_types; t++) {
        struct kv_type_axis *a = &e->types[t];
        a->k = p->kv.type_k == EKV_KV_DEFAULT ? ekv_kv_type_default() : p->kv.type_k;
        a->v = p->kv.type_v == EKV_KV_DEFAULT ? ekv_kv_type_default() : p->kv.type_v;
        char err[192];
        if (p->kv_types.n > 0 && !cli_parse_kv_types(p->kv_types.s[t], &a->k, &a->v, err, sizeof err))
            return cli_usage_error(CMD, "--kv-type: %s", err);
        if (a->k == a->v) snprintf(a->label, sizeof a->label, "%s", ekv_kv_type_name(a->k));
        else snprintf(a->label, sizeof a->label, "%s/%s", ekv_kv_type_name(a->k), ekv_kv_type_name(a->v));
    }
    if (p->compare_to) {
        bool found = !strcmp(p->compare_to, "base");
        for (size_t c = 0; c < e->n_cells; c++) found |= !strcmp(e->cells[c].policy, p->compare_to);
        if (!found) return cli_usage_error(CMD, "--compare-to: '%s' is not one of the --kv-policy list", p->compare_to);
        if (!(e->cfg.metrics & EKV_METRIC_PPL)) return cli_usage_error(CMD, "--compare-to needs --metric ppl");
    }
    e->model_path = p->model ? p->model : cli_default_model();
    e->data_path = p->data ? p->data : default_data();
    return 0;
}

/* Output directory, model, context, data set, vision tower, runner. */
static bool eval_setup(struct eval *e) {
    struct cli_params *p = &e->p;
    enum ekv_status s;
    if (!make_dirs(p->out_dir)) {
        fprintf(stderr, "ekv eval: error: cannot create output directory '%s': %s\n", p->out_dir, strerror(errno));
        return false;
    }
    p->model = e->model_path;
    if (!cli_load_model(CMD, p, &e->model, &e->ctx)) return false;
    struct ekv_model_info mi;
    ekv_model_get_info(e->model, &mi);
    if (p->n_ctx > mi.n_ctx_train)
        fprintf(stderr, "ekv eval: warning: -c %ld exceeds the trained context %d; scores there are meaningless\n",
                p->n_ctx, mi.n_ctx_train);
    e->n_threads = p->threads > 0 ? (int32_t)p->threads : ekv_context_default_params().n_threads;
    if ((s = ekv_dataset_load(e->data_path, &e->dopts, &e->ds)) != EKV_OK) return cli_fail(CMD, s), false;
    if (e->ds.n_items == 0) {
        fprintf(stderr, "ekv eval: error: '%s' has no item in the selection (offset %ld, limit %ld)\n", e->data_path,
                p->offset, p->limit);
        return false;
    }
    if (p->mmproj) {
        if ((s = ekv_vision_load(p->mmproj, &e->vision)) != EKV_OK) return cli_fail(CMD, s), false;
        e->cfg.vision = e->vision;
        const char *image_dir = p->image_dir;
        if (!image_dir) { /* the data file's folder */
            e->data_dir = strdup(e->data_path);
            if (!e->data_dir) return cli_fail(CMD, EKV_ERR_NOMEM), false;
            char *slash = strrchr(e->data_dir, '/');
            if (slash) *slash = 0;
            else strcpy(e->data_dir, ".");
            image_dir = e->data_dir;
        }
        e->cfg.image_dir = image_dir;
    }
    if ((s = ekv_eval_runner_init(&e->run, e->ctx, &e->ds, &e->cfg)) != EKV_OK) return cli_fail(CMD, s), false;
    for (size_t i = 0; i < e->run.n_skipped; i++) fprintf(stderr, "ekv eval: skipped: %s\n", e->run.skipped[i]);
    if (e->run.n_units == 0) {
        fprintf(stderr, "ekv eval: error: no item of '%s' can be evaluated\n", e->data_path);
        return false;
    }
    fprintf(stderr, "ekv eval: %s on %s: %zu items (%zu units, %zu skipped) x %zu cells, context %d, threads %d\n",
            basename_of(e->model_path), basename_of(e->data_path), e->ds.n_items, e->run.n_units, e->run.n_skipped,
            e->n_cells * e->n_types, e->run.n_ctx, e->n_threads);
    if ((s = ekv_eval_grid_check(&e->run, &e->p.kv, e->cells, e->n_cells)) != EKV_OK) return cli_fail(CMD, s), false;
    const size_t nct = e->n_cells * e->n_types;
    if (e->run.n_units > SIZE_MAX / nct) return cli_fail(CMD, EKV_ERR_OVERFLOW), false;
    const size_t nu = nct * e->run.n_units;
    e->acc = calloc(nct, sizeof *e->acc);
    e->cell_s = calloc(nct, sizeof *e->cell_s);
    e->unit_acc = calloc(nu, sizeof *e->unit_acc);
    if (!e->acc || !e->cell_s || !e->unit_acc) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    for (size_t c = 0; c < nct; c++) ekv_eval_cell_init(&e->acc[c]);
    for (size_t c = 0; c < nu; c++) ekv_eval_cell_init(&e->unit_acc[c]);
    return true;
}

/* The parameters of cell ct (policy x budget, then storage type). */
static struct ekv_kv_params cell_params(const struct eval *e, size_t ct) {
    const size_t c = ct % e->n_cells, ty = ct / e->n_cells;
    struct ekv_kv_params kv = e->p.kv;
    kv.policy = e->cells[c].policy;
    kv.budget = e->cells[c].budget;
    kv.type_k = e->types[ty].k;
    kv.type_v = e->types[ty].v;
    return kv;
}

/* Units outer (each reference built once), cells inner in groups of
 * --share that run together (ekv_eval_unit_run_group: one prompt, batched
 * decode steps), a progress line per unit. A cell's time is its group's
 * divided by the cells in it (with --share 1, its own). */
static bool eval_run(struct eval *e) {
    struct progress pg = {.tty = isatty(2), .t0 = cli_now(), .n_cells = e->n_cells * e->n_types, .r = &e->run};
    const size_t nct = e->n_cells * e->n_types, group = e->cfg.share > 1 ? (size_t)e->cfg.share : 1;
    struct ekv_kv_params *kv = calloc(group, sizeof *kv);
    if (!kv) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    enum ekv_status s = EKV_OK;
    for (size_t u = 0; u < e->run.n_units && s == EKV_OK; u++) {
        double t = cli_now();
        if ((s = ekv_eval_unit_prepare(&e->run, u)) != EKV_OK) break;
        e->ref_s += cli_now() - t;
        for (size_t c0 = 0; c0 < nct && s == EKV_OK;) { /* groups inside one storage type */
            const size_t type_end = (c0 / e->n_cells + 1) * e->n_cells;
            const size_t n = type_end - c0 < group ? type_end - c0 : group;
            for (size_t i = 0; i < n; i++) kv[i] = cell_params(e, c0 + i);
            t = cli_now();
            struct ekv_eval_cell *one = &e->unit_acc[u * nct + c0];
            if ((s = ekv_eval_unit_run_group(&e->run, kv, n, one)) != EKV_OK) {
                const size_t c1 = c0 + n - 1;
                fprintf(stderr, "ekv eval: error in the cells %s at budget %g .. %s at budget %g (%s), unit %zu:\n",
                        e->cells[c0 % e->n_cells].policy, e->cells[c0 % e->n_cells].budget,
                        e->cells[c1 % e->n_cells].policy, e->cells[c1 % e->n_cells].budget,
                        e->types[c0 / e->n_cells].label, u);
                break;
            }
            const double dt = cli_now() - t;
            for (size_t i = 0; i < n; i++) { /* a group's time, split evenly over its cells */
                e->cell_s[c0 + i] += dt / (double)n;
                ekv_eval_cell_merge(&e->acc[c0 + i], &one[i]);
            }
            c0 += n;
        }
        if (s == EKV_OK) show_progress(&pg, u + 1, e->run.n_units, u);
    }
    free(kv);
    if (s != EKV_OK) return cli_fail(CMD, s), false;
    e->total_s = cli_now() - pg.t0;
    return true;
}

/* The run's settings and timings, stored with the results. */
static cJSON *eval_meta(const struct eval *e) {
    const struct cli_params *p = &e->p;
    cJSON *meta = cJSON_CreateObject();
    if (!meta) return NULL;
    cJSON_AddStringToObject(meta, "model", e->model_path);
    cJSON_AddStringToObject(meta, "data", e->data_path);
    cJSON_AddStringToObject(meta, "format", e->ds.format == EKV_DATA_TEXT ? "text" : "jsonl");
    cJSON_AddStringToObject(meta, "metrics", p->metrics);
    cJSON_AddStringToObject(meta, "rouge", ekv_rouge_kind_name(e->cfg.rouge));
    if (p->mmproj) cJSON_AddStringToObject(meta, "mmproj", p->mmproj);
    if (p->chat_template) cJSON_AddStringToObject(meta, "chat_template", p->chat_template);
    cJSON_AddNumberToObject(meta, "n_predict", e->cfg.n_predict);
    cJSON_AddNumberToObject(meta, "stride", e->cfg.stride);
    cJSON_AddNumberToObject(meta, "n_ctx", e->run.n_ctx);
    cJSON_AddNumberToObject(meta, "threads", e->n_threads);
    cJSON_AddNumberToObject(meta, "kv_seed", (double)p->kv.seed);
    cJSON_AddNumberToObject(meta, "items", (double)e->ds.n_items);
    cJSON_AddNumberToObject(meta, "units", (double)e->run.n_units);
    cJSON *sk = cJSON_AddArrayToObject(meta, "skipped");
    for (size_t i = 0; sk && i < e->run.n_skipped; i++) cJSON_AddItemToArray(sk, cJSON_CreateString(e->run.skipped[i]));
    cJSON *tm = cJSON_AddObjectToObject(meta, "timings");
    if (tm) {
        cJSON_AddNumberToObject(tm, "total_seconds", e->total_s);
        cJSON_AddNumberToObject(tm, "reference_seconds", e->ref_s);
        cJSON_AddNumberToObject(tm, "share", e->cfg.share);
        cJSON *ca = cJSON_AddArrayToObject(tm, "cells");
        for (size_t ct = 0; ca && ct < e->n_cells * e->n_types; ct++) {
            const size_t c = ct % e->n_cells;
            cJSON *o = cJSON_CreateObject();
            if (!o) break;
            cJSON_AddStringToObject(o, "policy", e->cells[c].policy);
            cJSON_AddStringToObject(o, "kv_type", e->types[ct / e->n_cells].label);
            cJSON_AddNumberToObject(o, "budget", e->cells[c].budget);
            cJSON_AddNumberToObject(o, "seconds", e->cell_s[ct]);
            cJSON_AddItemToArray(ca, o);
        }
    }
    return meta;
}

/* The baseline of cell c for --compare-to: the compared policy's cell at
 * c's budget, else its only cell; with "base", the cell of the policy
 * before "+merge" in c's spec at c's budget ("snapkv+merge" -> "snapkv");
 * n_cells when there is none. */
static size_t baseline_of(const struct eval *e, size_t c) {
    const bool base = !strcmp(e->p.compare_to, "base");
    const char *plus = strchr(e->cells[c].policy, '+');
    if (base && !plus) return e->n_cells;
    size_t only = e->n_cells, count = 0;
    for (size_t b = 0; b < e->n_cells; b++) {
        const char *pb = e->cells[b].policy;
        if (base ? strlen(pb) != (size_t)(plus - e->cells[c].policy) || strncmp(pb, e->cells[c].policy, strlen(pb))
                 : strcmp(pb, e->p.compare_to) != 0)
            continue;
        if (base && e->cells[b].budget != e->cells[c].budget) continue;
        if (e->cells[b].budget == e->cells[c].budget) return b;
        only = b, count++;
    }
    return count == 1 ? only : e->n_cells;
}

/* Adds the rows NAME, NAME_lo and NAME_hi (n = units measured). */
static enum ekv_status add_interval(struct eval *e, size_t c, size_t ty, const char *name, double v, double lo,
                                   double hi, size_t n) {
    const char *pol = e->cells[c].policy, *ty_l = e->types[ty].label;
    const double bud = e->cells[c].budget;
    char key[64];
    enum ekv_status s = ekv_report_add_kv(&e->rep, pol, ty_l, bud, name, v, n);
    snprintf(key, sizeof key, "%s_lo", name);
    if (s == EKV_OK) s = ekv_report_add_kv(&e->rep, pol, ty_l, bud, key, lo, n);
    snprintf(key, sizeof key, "%s_hi", name);
    if (s == EKV_OK) s = ekv_report_add_kv(&e->rep, pol, ty_l, bud, key, hi, n);
    return s;
}

/* The per-unit mean of accuracy (rouge == false) or ROUGE-L F of cell x,
 * or false when the unit has none. */
static bool unit_score(const struct ekv_eval_cell *x, bool rouge, double *v) {
    const struct ekv_mean_acc *m = rouge ? &x->rouge_f : &x->acc;
    if (m->n == 0) return false;
    *v = ekv_mean_value(m);
    return true;
}

/* --compare-to: for every cell whose baseline exists, per storage type,
 * ppl_ratio (with _lo and _hi: paired bootstrap 95 % interval over units)
 * and, for the metrics measured, acc_diff and rouge_l_f_diff (the mean
 * difference to the baseline over the units both have, with its interval;
 * the same 2,000 resamples and seed). */
static enum ekv_status compare_rows(struct eval *e) {
    const size_t nu = e->run.n_units, nct = e->n_cells * e->n_types;
    double *a = malloc(nu * sizeof *a), *b = malloc(nu * sizeof *b);
    size_t *tok = malloc(nu * sizeof *tok);
    enum ekv_status s = a && b && tok ? EKV_OK : EKV_ERR_NOMEM;
    for (size_t ty = 0; ty < e->n_types && s == EKV_OK; ty++)
        for (size_t c = 0; c < e->n_cells && s == EKV_OK; c++) {
            const size_t base = baseline_of(e, c);
            if (base == e->n_cells) continue;
            const struct ekv_eval_cell *xs = &e->unit_acc[ty * e->n_cells + c];
            const struct ekv_eval_cell *ys = &e->unit_acc[ty * e->n_cells + base];
            for (size_t u = 0; u < nu; u++) {
                const struct ekv_eval_cell *x = xs + u * nct, *y = ys + u * nct;
                a[u] = x->ppl.nll_sum, b[u] = y->ppl.nll_sum, tok[u] = x->ppl.n_tokens;
                if (x->ppl.n_tokens != y->ppl.n_tokens) tok[u] = 0, a[u] = b[u] = 0; /* not paired: left out */
            }
            double r, lo, hi;
            if (ekv_bootstrap_ppl_ratio(a, b, tok, nu, 2000, 0x5EEDB007u, &r, &lo, &hi) == EKV_OK)
                s = add_interval(e, c, ty, "ppl_ratio", r, lo, hi, nu);
            for (int rouge = 0; rouge < 2 && s == EKV_OK; rouge++) {
                size_t n = 0;
                for (size_t u = 0; u < nu; u++)
                    if (unit_score(xs + u * nct, rouge, &a[n]) && unit_score(ys + u * nct, rouge, &b[n])) n++;
                if (n && ekv_bootstrap_mean_diff(a, b, n, 2000, 0x5EEDB007u, &r, &lo, &hi) == EKV_OK)
                    s = add_interval(e, c, ty, rouge ? "rouge_l_f_diff" : "acc_diff", r, lo, hi, n);
            }
        }
    free(a), free(b), free(tok);
    return s;
}

/* The metrics --per-type repeats per item type: the quality ones. */
static bool per_type_metric(const char *m) {
    static const char *const k[] = {"ppl", "acc", "rouge_l_f", "kl", "top1", "hit_rate"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!strcmp(m, k[i])) return true;
    return false;
}

/* A type as the tail of a metric name: at most 40 characters, those
 * outside [A-Za-z0-9_.-] as '_'. */
static void type_tag(const char *t, char *out, size_t cap) {
    size_t n = 0;
    for (; t[n] && n + 1 < cap && n < 40; n++) {
        const char c = t[n];
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                        c == '-' || c == '.';
        out[n] = ok ? c : '_';
    }
    out[n] = '\0';
}

#define EVAL_MAX_TYPES 64

/* --per-type: every cell's quality metrics again over the units whose
 * item has type T, as rows "<metric>.<T>", types in first-seen order (at
 * most EVAL_MAX_TYPES; units without a type are in none). */
static enum ekv_status type_rows(struct eval *e) {
    const size_t nu = e->run.n_units, nct = e->n_cells * e->n_types;
    const char *types[EVAL_MAX_TYPES];
    char tags[EVAL_MAX_TYPES][48];
    size_t nt = 0;
    size_t *tix = malloc((nu ? nu : 1) * sizeof *tix); /* [nu] each unit's type, nt for none */
    if (!tix) return ekv_error_set(EKV_ERR_NOMEM, "--per-type: no memory");
    enum ekv_status s = EKV_OK;
    for (size_t u = 0; u < nu && s == EKV_OK; u++) {
        const char *t = e->ds.items[e->run.units[u].item].type;
        size_t k = 0;
        while (t && k < nt && strcmp(types[k], t)) k++;
        tix[u] = t ? k : EVAL_MAX_TYPES;
        if (!t || k < nt) continue;
        if (nt == EVAL_MAX_TYPES) {
            s = ekv_error_set(EKV_ERR_INVALID_ARG, "--per-type: more than %d item types", EVAL_MAX_TYPES);
            break;
        }
        type_tag(t, tags[nt], sizeof tags[nt]);
        for (size_t j = 0; j < nt && s == EKV_OK; j++)
            if (!strcmp(tags[j], tags[nt]))
                s = ekv_error_set(EKV_ERR_INVALID_ARG, "--per-type: item types '%s' and '%s' give the same name '%s'",
                                  types[j], t, tags[nt]);
        types[nt++] = t;
    }
    for (size_t k = 0; k < nt && s == EKV_OK; k++)
        for (size_t ct = 0; ct < nct && s == EKV_OK; ct++) {
            struct ekv_eval_cell agg;
            ekv_eval_cell_init(&agg);
            for (size_t u = 0; u < nu; u++)
                if (tix[u] == k) ekv_eval_cell_merge(&agg, &e->unit_acc[u * nct + ct]);
            const size_t c = ct % e->n_cells;
            const char *pol = e->cells[c].policy, *ty_l = e->types[ct / e->n_cells].label;
            struct ekv_report tmp;
            ekv_report_init(&tmp);
            s = ekv_eval_cell_report_kv(&agg, e->cfg.metrics, pol, ty_l, e->cells[c].budget, &tmp);
            for (size_t i = 0; i < tmp.n_rows && s == EKV_OK; i++) {
                if (!per_type_metric(tmp.rows[i].metric)) continue;
                char name[80];
                snprintf(name, sizeof name, "%s.%.40s", tmp.rows[i].metric, tags[k]); /* a tag is at most 40 */
                s = ekv_report_add_kv(&e->rep, pol, ty_l, e->cells[c].budget, name, tmp.rows[i].value, tmp.rows[i].n);
            }
            ekv_report_free(&tmp);
        }
    free(tix);
    return s;
}

/* --per-item FILE: one JSON object per unit and cell (the measurements
 * that unit has), written to FILE.tmp and renamed (no partial file). */
static bool write_per_item(const struct eval *e) {
    const size_t nct = e->n_cells * e->n_types;
    char *tmp = malloc(strlen(e->p.per_item) + 5);
    if (!tmp) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    sprintf(tmp, "%s.tmp", e->p.per_item);
    FILE *f = fopen(tmp, "w");
    bool ok = f != NULL;
    for (size_t u = 0; ok && u < e->run.n_units; u++)
        for (size_t ct = 0; ok && ct < nct; ct++) {
            const struct ekv_eval_cell *x = &e->unit_acc[u * nct + ct];
            const struct ekv_eval_item *it = &e->ds.items[e->run.units[u].item];
            cJSON *o = cJSON_CreateObject();
            if (!o) {
                ok = false;
                break;
            }
            cJSON_AddNumberToObject(o, "unit", (double)u);
            if (it->id) cJSON_AddStringToObject(o, "id", it->id);
            else cJSON_AddNumberToObject(o, "item", (double)e->run.units[u].item);
            if (it->type) cJSON_AddStringToObject(o, "type", it->type);
            cJSON_AddStringToObject(o, "policy", e->cells[ct % e->n_cells].policy);
            cJSON_AddStringToObject(o, "kv_type", e->types[ct / e->n_cells].label);
            cJSON_AddNumberToObject(o, "budget", e->cells[ct % e->n_cells].budget);
            if (x->ppl.n_tokens > 0) {
                cJSON_AddNumberToObject(o, "tokens", (double)x->ppl.n_tokens);
                cJSON_AddNumberToObject(o, "nll", x->ppl.nll_sum);
                cJSON_AddNumberToObject(o, "ppl", exp(x->ppl.nll_sum / (double)x->ppl.n_tokens));
            }
            if (x->kl.n_positions > 0) {
                cJSON_AddNumberToObject(o, "kl", x->kl.kl_sum / (double)x->kl.n_positions);
                cJSON_AddNumberToObject(o, "top1", (double)x->kl.top1_agree / (double)x->kl.n_positions);
            }
            if (x->rouge_f.n > 0) cJSON_AddNumberToObject(o, "rouge_l_f", ekv_mean_value(&x->rouge_f));
            if (x->acc.n > 0) cJSON_AddNumberToObject(o, "acc", ekv_mean_value(&x->acc));
            if (x->hit_rate.n > 0) cJSON_AddNumberToObject(o, "hit_rate", ekv_mean_value(&x->hit_rate));
            if (x->kv_frac.n > 0) cJSON_AddNumberToObject(o, "kv_frac", ekv_mean_value(&x->kv_frac));
            char *line = cJSON_PrintUnformatted(o);
            ok = line && fprintf(f, "%s\n", line) > 0;
            cJSON_free(line);
            cJSON_Delete(o);
        }
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, e->p.per_item) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "ekv eval: error: cannot write '%s': %s\n", e->p.per_item, strerror(errno));
        if (f) remove(tmp);
    }
    free(tmp);
    return ok;
}

/* CSV, JSON and Markdown files, the table (or JSON) on stdout, plots.
 * Returns the exit status: 0, 1 on failure, 2 when only plotting failed. */
static int eval_report(struct eval *e) {
    const struct cli_params *p = &e->p;
    enum ekv_status s;
    /* policy, then storage type, then budget: one series' rows stay together */
    for (size_t c0 = 0, c1; c0 < e->n_cells; c0 = c1) {
        for (c1 = c0 + 1; c1 < e->n_cells && !strcmp(e->cells[c1].policy, e->cells[c0].policy);) c1++;
        for (size_t ty = 0; ty < e->n_types; ty++)
            for (size_t c = c0; c < c1; c++)
                if ((s = ekv_eval_cell_report_kv(&e->acc[ty * e->n_cells + c], e->cfg.metrics, e->cells[c].policy,
                                                 e->types[ty].label, e->cells[c].budget, &e->rep)) != EKV_OK)
                    return cli_fail(CMD, s);
    }
    if (p->compare_to && (s = compare_rows(e)) != EKV_OK) return cli_fail(CMD, s);
    if (p->per_type && (s = type_rows(e)) != EKV_OK) return cli_fail(CMD, s);
    if (p->per_item && !write_per_item(e)) return 1;
    char title[512];
    snprintf(title, sizeof title, "%s on %s (%zu items, %zu units)", basename_of(e->model_path),
             basename_of(e->data_path), e->ds.n_items, e->run.n_units);
    if (!(e->meta = eval_meta(e))) return cli_fail(CMD, EKV_ERR_NOMEM);
    char *meta_txt = cJSON_PrintUnformatted(e->meta);
    s = meta_txt ? ekv_report_set_meta(&e->rep, meta_txt) : EKV_ERR_NOMEM;
    cJSON_free(meta_txt);
    if (s == EKV_OK) s = ekv_report_set_title(&e->rep, title);
    if (s != EKV_OK) return cli_fail(CMD, s);
    e->p_csv = join(p->out_dir, "results.csv");
    e->p_json = join(p->out_dir, "results.json");
    e->p_md = join(p->out_dir, "results.md");
    if (!e->p_csv || !e->p_json || !e->p_md) return cli_fail(CMD, EKV_ERR_NOMEM);
    if ((s = ekv_report_write_csv(&e->rep, e->p_csv)) != EKV_OK ||
        (s = ekv_report_write_json(&e->rep, e->p_json)) != EKV_OK ||
        (s = ekv_report_write_markdown(&e->rep, e->p_md)) != EKV_OK || (s = ekv_report_markdown(&e->rep, &e->md)) != EKV_OK)
        return cli_fail(CMD, s);
    if (p->json) {
        char *txt = cli_read_file(CMD, e->p_json, NULL);
        if (!txt) return 1;
        fputs(txt, stdout);
        free(txt);
    } else {
        fputs(e->md, stdout);
    }
    fflush(stdout);
    int rc = 0;
    if (p->plot && (s = ekv_report_plot(&e->rep, p->out_dir, NULL)) != EKV_OK) {
        fprintf(stderr, "ekv eval: warning: plots not made: %s: %s\n", ekv_status_str(s), ekv_last_error());
        rc = 2;
    }
    fprintf(stderr, "ekv eval: wrote %s, %s, %s%s in %.1f s\n", e->p_csv, e->p_json, e->p_md,
            p->plot && rc == 0 ? " and one PNG per metric" : "", e->total_s);
    return rc;
}

static void eval_free(struct eval *e) {
    cJSON_Delete(e->meta);
    free(e->md);
    free(e->p_csv);
    free(e->p_json);
    free(e->p_md);
    ekv_report_free(&e->rep);
    free(e->acc);
    free(e->unit_acc);
    free(e->cell_s);
    ekv_eval_runner_free(&e->run); /* also after a failed init, which leaves partial state */
    ekv_dataset_free(&e->ds);
    ekv_vision_free(e->vision);
    free(e->data_dir);
    ekv_context_free(e->ctx);
    ekv_model_free(e->model);
    free(e->cells);
    free(e->types);
    cli_params_free(&e->p);
}

static int cmd_eval_main(int argc, char **argv) {
    struct eval e;
    memset(&e, 0, sizeof e);
    ekv_report_init(&e.rep);
    int rc = eval_parse(&e, argc, argv);
    if (rc == 2) rc = 0; /* --help */
    else if (rc == 0) rc = eval_setup(&e) && eval_run(&e) ? eval_report(&e) : 1;
    eval_free(&e);
    return rc;
}

const struct ekv_cmd ekv_cmd_eval = {"eval", "quality of KV-cache policies against their budget (ppl, ROUGE-L, KL, hit rate)",
                                     cmd_eval_main};
