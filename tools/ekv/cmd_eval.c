/*
 * cmd_eval.c — `ekv eval`: quality of KV-cache policies against their
 * budget, with the papers' protocols (POLICIES.md §13): perplexity, ROUGE-L
 * and KL against the full cache, cache hit rate; a policies x budgets grid;
 * results as CSV, JSON, Markdown and gnuplot PNGs. The protocols themselves
 * live in src/eval/runner.c; this file parses flags, loops over units and
 * cells with a progress line, and writes the reports.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "eval/eval.h"

static const char *const CMD = "eval";

static void help(void) {
    printf("usage: ekv eval [options]\n\n"
           "Measures the quality of KV-cache policies against their budget on an evaluation set,\n"
           "over a grid of policies x budgets, with the protocols of POLICIES.md section 13.\n\n"
           "  -m, --model FILE      GGUF or llama2.c model (default: bundled models/stories260K.gguf)\n"
           "      --tokenizer FILE  tokenizer .bin for llama2.c checkpoints\n"
           "  -f, --data FILE       evaluation set (default: the bundled data/tinystories_eval.jsonl)\n"
           "      --format F        jsonl | text | auto (default auto: .jsonl/.json => jsonl, else text)\n"
           "      --doc-sep S       text: split the file into documents at S (default: one document)\n"
           "      --metric LIST     comma list of ppl,rouge,kl,hitrate (default ppl,rouge,kl)\n"
           "                          ppl     jsonl: prompt (system + instruction, BOS, no template) prefilled\n"
           "                                  and compressed; answer (no BOS, no EOS) teacher-forced token by\n"
           "                                  token with the decode-time policy active; a-1 tokens scored per\n"
           "                                  item (the first from the prefill logits, before compression);\n"
           "                                  PPL = exp(mean NLL) pooled over all tokens of all items.\n"
           "                                  text: each window streamed in prompt chunks of --stride tokens,\n"
           "                                  the policy compressing after each; every token after the first\n"
           "                                  chunk is scored (EasyKV style).\n"
           "                          rouge   greedy answer (-n tokens at most, stop at end of text) under the\n"
           "                                  policy vs the full cache's greedy answer: ROUGE-L F1, P and R,\n"
           "                                  macro mean over items. The policy acts after every forward, so\n"
           "                                  the first token comes from the uncompressed prefill logits.\n"
           "                          kl      mean KL(full || policy) of next-token distributions over the\n"
           "                                  teacher-forced positions of ppl, and top-1 agreement.\n"
           "                          hitrate after the prompt, per layer and KV head: kept positions vs the\n"
           "                                  top-k (k = kept) of the full cache's attention of the first\n"
           "                                  answer token's query (VL-Cache hit rate, RoCo Jaccard).\n"
           "                        every run also reports kv_frac, the cache entries kept / full cache.\n"
           "      --rouge KIND      pltrdy (rouge 1.0.1, the ElasticCache protocol; default) | sentence\n"
           "      --kv-policy LIST  comma list of policies (default full,local,h2o,elastic)\n"
           "      --kv-budget LIST  comma list of kept fractions in (0,1] (default 0.2,0.5,1);\n"
           "                        policies x budgets run as a grid, 'full' once at budget 1\n"
           "      --limit N         evaluate at most N items (0 = all; default 0)\n"
           "      --offset N        skip the first N items\n"
           "  -n, --n-predict N     rouge: max new tokens per answer (default 128)\n"
           "      --stride N        text ppl: tokens per streamed chunk (default 96)\n"
           "  -c, --ctx N           positions per sequence (default: the context the model file declares).\n"
           "                        stories260K was trained on 512 positions (its llama2.c checkpoint says\n"
           "                        so) but its GGUF declares 2048: pass -c 512 with it. Positions beyond\n"
           "                        the trained context were never seen in training, so scores there are\n"
           "                        meaningless. JSONL items that do\n"
           "                        not fit are skipped (listed); text documents are cut into windows of\n"
           "                        N tokens, each a fresh sequence (only the first starts with BOS).\n"
           "  -o, --out DIR         output directory (default eval-out): results.csv (deterministic),\n"
           "                        results.json (with timings), results.md, <metric>.png\n"
           "      --no-plot         do not run gnuplot\n"
           "      --json            print the JSON results on stdout instead of the Markdown table\n"
           "  -t, --threads N       worker threads (results do not depend on it)\n"
           "  -s, --seed N          seed of the random policy (same as --kv-seed)\n"
           "      --mmproj FILE     vision tower (llama.cpp-style mmproj GGUF) for items with an \"image\"\n"
           "      --image-dir DIR   relative image paths resolve against DIR (default: the data file's folder)\n"
           "      --chat-template T none, llava-1.5 or chatml (default: plain system + \"\\n\" + instruction;\n"
           "                        llava-1.5 for items with an image)\n"
           "  -h, --help            this help\n\n"
           "Progress with ETA goes to stderr. Exit status: 0 success, 1 bad usage or failure,\n"
           "2 results written but plotting failed.\n\n"
           "Other --kv-* flags apply to every policy of the grid:\n");
    cli_print_kv_help(stdout);
}

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

static int cmd_eval_main(int argc, char **argv) {
    const char *model_path = NULL, *tok_path = NULL, *data_path = NULL, *doc_sep = NULL;
    const char *metric_list = "ppl,rouge,kl", *rouge_kind = "pltrdy", *format = "auto";
    const char *policy_list = "full,local,h2o,elastic", *budget_list = "0.2,0.5,1", *out_dir = "eval-out";
    long limit = 0, offset = 0, n_predict = 128, stride = 96, n_ctx = 0, threads = -1, seed = -1;
    const char *mmproj = NULL, *image_dir = NULL, *chat_tmpl = NULL;
    bool json = false, plot = true;
    struct ekv_kv_params kvp = ekv_kv_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--kv-policy") || !strcmp(a, "--kv-budget")) {
            if (!v) return cli_usage_error(CMD, "%s needs a comma-separated list", a);
            if (!strcmp(a, "--kv-policy")) policy_list = v;
            else budget_list = v;
            i++;
            continue;
        }
        int kv = cli_parse_kv_opt(CMD, argc, argv, &i, &kvp);
        if (kv < 0) return 1;
        if (kv > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { help(); return 0; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--no-plot")) plot = false;
        else if (!v) return cli_usage_error(CMD, "unknown option or missing value: %s", a);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { model_path = v; i++; }
        else if (!strcmp(a, "--tokenizer")) { tok_path = v; i++; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--data")) { data_path = v; i++; }
        else if (!strcmp(a, "--format")) { format = v; i++; }
        else if (!strcmp(a, "--doc-sep")) { doc_sep = v; i++; }
        else if (!strcmp(a, "--metric")) { metric_list = v; i++; }
        else if (!strcmp(a, "--rouge")) { rouge_kind = v; i++; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) { out_dir = v; i++; }
        else if (!strcmp(a, "--mmproj")) { mmproj = v; i++; }
        else if (!strcmp(a, "--image-dir")) { image_dir = v; i++; }
        else if (!strcmp(a, "--chat-template")) { chat_tmpl = v; i++; }
        else if (!strcmp(a, "--limit")) { if (!cli_int(CMD, a, v, 0, LONG_MAX, &limit)) return 1; i++; }
        else if (!strcmp(a, "--offset")) { if (!cli_int(CMD, a, v, 0, LONG_MAX, &offset)) return 1; i++; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { if (!cli_int(CMD, a, v, 1, 1L << 20, &n_predict)) return 1; i++; }
        else if (!strcmp(a, "--stride")) { if (!cli_int(CMD, a, v, 1, 1L << 24, &stride)) return 1; i++; }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) { if (!cli_int(CMD, a, v, 0, 1L << 24, &n_ctx)) return 1; i++; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!cli_int(CMD, a, v, 1, 256, &threads)) return 1; i++; }
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) { if (!cli_int(CMD, a, v, 0, LONG_MAX, &seed)) return 1; i++; }
        else return cli_usage_error(CMD, "unknown option: %s", a);
    }
    if (seed >= 0) kvp.seed = (uint64_t)seed;

    /* grid, metrics, formats: check everything before loading anything */
    struct ekv_eval_cfg cfg = ekv_eval_default_cfg();
    cfg.n_predict = (int32_t)n_predict;
    cfg.stride = (int32_t)stride;
    struct ekv_data_opts dopts = ekv_data_default_opts();
    dopts.offset = (size_t)offset;
    dopts.limit = (size_t)limit;
    dopts.doc_sep = doc_sep;
    enum ekv_status s;
    if (ekv_metrics_parse(metric_list, &cfg.metrics) != EKV_OK)
        return cli_usage_error(CMD, "--metric: %s", ekv_last_error());
    if (ekv_rouge_kind_parse(rouge_kind, &cfg.rouge) != EKV_OK)
        return cli_usage_error(CMD, "--rouge: %s", ekv_last_error());
    if (ekv_data_format_parse(format, &dopts.format) != EKV_OK)
        return cli_usage_error(CMD, "--format: %s", ekv_last_error());
    if (chat_tmpl) {
        bool known = false;
        for (int k = 0; k < ekv_chat_template_count(); k++) known |= !strcmp(chat_tmpl, ekv_chat_template_name(k));
        if (!known) return cli_usage_error(CMD, "--chat-template: unknown template '%s'", chat_tmpl);
    }
    cfg.chat_template = chat_tmpl;
    char **policies = NULL;
    size_t n_pol = 0, n_bud = 0, n_cells = 0;
    double *budgets = NULL;
    struct ekv_eval_grid_cell *cells = NULL;
    if (ekv_split_list(policy_list, &policies, &n_pol) != EKV_OK)
        return cli_usage_error(CMD, "--kv-policy: %s", ekv_last_error());
    if (ekv_budgets_parse(budget_list, &budgets, &n_bud) != EKV_OK) {
        free(policies);
        return cli_usage_error(CMD, "--kv-budget: %s", ekv_last_error());
    }
    if (ekv_eval_grid(policies, n_pol, budgets, n_bud, &cells, &n_cells) != EKV_OK) {
        free(policies);
        free(budgets);
        return cli_usage_error(CMD, "--kv-policy: %s", ekv_last_error());
    }

    int rc = 1;
    struct ekv_model *model = NULL;
    struct ekv_context *ctx = NULL;
    struct ekv_dataset ds = {0};
    struct ekv_eval_runner run;
    memset(&run, 0, sizeof run);
    struct ekv_vision *vision = NULL;
    char *data_dir = NULL;
    struct ekv_eval_cell *acc = NULL;
    double *cell_s = NULL;
    struct ekv_report rep;
    ekv_report_init(&rep);
    char *md = NULL, *p_csv = NULL, *p_json = NULL, *p_md = NULL;
    cJSON *meta = NULL;

    if (!model_path) model_path = cli_default_model();
    if (!data_path) data_path = default_data();
    if (!make_dirs(out_dir)) {
        fprintf(stderr, "ekv eval: error: cannot create output directory '%s': %s\n", out_dir, strerror(errno));
        goto done;
    }
    struct ekv_model_params mp = ekv_model_default_params();
    mp.tokenizer_path = tok_path;
    if ((s = ekv_model_load(model_path, &mp, &model)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    struct ekv_model_info mi;
    ekv_model_get_info(model, &mi);
    if (n_ctx > mi.n_ctx_train)
        fprintf(stderr, "ekv eval: warning: --ctx %ld exceeds the trained context %d; scores there are meaningless\n",
                n_ctx, mi.n_ctx_train);
    struct ekv_context_params cp = ekv_context_default_params();
    if (threads > 0) cp.n_threads = (int32_t)threads;
    cp.n_ctx = (int32_t)n_ctx;
    if ((s = ekv_context_new(model, &cp, &ctx)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    if ((s = ekv_dataset_load(data_path, &dopts, &ds)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    if (ds.n_items == 0) {
        fprintf(stderr, "ekv eval: error: '%s' has no item in the selection (offset %ld, limit %ld)\n", data_path,
                offset, limit);
        goto done;
    }
    if (mmproj) {
        if ((s = ekv_vision_load(mmproj, &vision)) != EKV_OK) { cli_fail(CMD, s); goto done; }
        cfg.vision = vision;
        if (!image_dir) { /* the data file's folder */
            data_dir = strdup(data_path);
            if (!data_dir) goto done;
            char *slash = strrchr(data_dir, '/');
            if (slash) *slash = 0;
            else strcpy(data_dir, ".");
            image_dir = data_dir;
        }
        cfg.image_dir = image_dir;
    }
    if ((s = ekv_eval_runner_init(&run, ctx, &ds, &cfg)) != EKV_OK) { cli_fail(CMD, s); goto done; }
    for (size_t i = 0; i < run.n_skipped; i++) fprintf(stderr, "ekv eval: skipped: %s\n", run.skipped[i]);
    if (run.n_units == 0) {
        fprintf(stderr, "ekv eval: error: no item of '%s' can be evaluated\n", data_path);
        goto done;
    }
    fprintf(stderr, "ekv eval: %s on %s: %zu items (%zu units, %zu skipped) x %zu cells, context %d, threads %d\n",
            basename_of(model_path), basename_of(data_path), ds.n_items, run.n_units, run.n_skipped, n_cells,
            run.n_ctx, cp.n_threads);

    acc = calloc(n_cells, sizeof *acc);
    cell_s = calloc(n_cells, sizeof *cell_s);
    if (!acc || !cell_s) { fprintf(stderr, "ekv eval: error: out of memory\n"); goto done; }
    for (size_t c = 0; c < n_cells; c++) ekv_eval_cell_init(&acc[c]);
    struct progress pg = {.tty = isatty(2), .t0 = cli_now(), .n_cells = n_cells, .r = &run};
    double ref_s = 0;
    for (size_t u = 0; u < run.n_units; u++) {
        double t = cli_now();
        if ((s = ekv_eval_unit_prepare(&run, u)) != EKV_OK) { cli_fail(CMD, s); goto done; }
        ref_s += cli_now() - t;
        for (size_t c = 0; c < n_cells; c++) {
            struct ekv_kv_params kv = kvp;
            kv.policy = cells[c].policy;
            kv.budget = cells[c].budget;
            t = cli_now();
            if ((s = ekv_eval_unit_run(&run, &kv, &acc[c])) != EKV_OK) {
                fprintf(stderr, "ekv eval: error in %s at budget %g, unit %zu:\n", cells[c].policy, cells[c].budget, u);
                cli_fail(CMD, s);
                goto done;
            }
            cell_s[c] += cli_now() - t;
        }
        show_progress(&pg, u + 1, run.n_units, u);
    }
    double total_s = cli_now() - pg.t0;

    /* reports */
    for (size_t c = 0; c < n_cells; c++)
        if ((s = ekv_eval_cell_report(&acc[c], cfg.metrics, cells[c].policy, cells[c].budget, &rep)) != EKV_OK) {
            cli_fail(CMD, s);
            goto done;
        }
    char title[512];
    snprintf(title, sizeof title, "%s on %s (%zu items, %zu units)", basename_of(model_path),
             basename_of(data_path), ds.n_items, run.n_units);
    meta = cJSON_CreateObject();
    if (!meta) goto done;
    cJSON_AddStringToObject(meta, "model", model_path);
    cJSON_AddStringToObject(meta, "data", data_path);
    cJSON_AddStringToObject(meta, "format", ds.format == EKV_DATA_TEXT ? "text" : "jsonl");
    cJSON_AddStringToObject(meta, "metrics", metric_list);
    cJSON_AddStringToObject(meta, "rouge", ekv_rouge_kind_name(cfg.rouge));
    if (mmproj) cJSON_AddStringToObject(meta, "mmproj", mmproj);
    if (chat_tmpl) cJSON_AddStringToObject(meta, "chat_template", chat_tmpl);
    cJSON_AddNumberToObject(meta, "n_predict", cfg.n_predict);
    cJSON_AddNumberToObject(meta, "stride", cfg.stride);
    cJSON_AddNumberToObject(meta, "n_ctx", run.n_ctx);
    cJSON_AddNumberToObject(meta, "threads", cp.n_threads);
    cJSON_AddNumberToObject(meta, "kv_seed", (double)kvp.seed);
    cJSON_AddNumberToObject(meta, "items", (double)ds.n_items);
    cJSON_AddNumberToObject(meta, "units", (double)run.n_units);
    cJSON *sk = cJSON_AddArrayToObject(meta, "skipped");
    for (size_t i = 0; sk && i < run.n_skipped; i++) cJSON_AddItemToArray(sk, cJSON_CreateString(run.skipped[i]));
    cJSON *tm = cJSON_AddObjectToObject(meta, "timings");
    if (tm) {
        cJSON_AddNumberToObject(tm, "total_seconds", total_s);
        cJSON_AddNumberToObject(tm, "reference_seconds", ref_s);
        cJSON *ca = cJSON_AddArrayToObject(tm, "cells");
        for (size_t c = 0; ca && c < n_cells; c++) {
            cJSON *o = cJSON_CreateObject();
            if (!o) break;
            cJSON_AddStringToObject(o, "policy", cells[c].policy);
            cJSON_AddNumberToObject(o, "budget", cells[c].budget);
            cJSON_AddNumberToObject(o, "seconds", cell_s[c]);
            cJSON_AddItemToArray(ca, o);
        }
    }
    char *meta_txt = cJSON_PrintUnformatted(meta);
    s = meta_txt ? ekv_report_set_meta(&rep, meta_txt) : EKV_ERR_NOMEM;
    cJSON_free(meta_txt);
    if (s == EKV_OK) s = ekv_report_set_title(&rep, title);
    if (s != EKV_OK) { cli_fail(CMD, s); goto done; }

    p_csv = join(out_dir, "results.csv");
    p_json = join(out_dir, "results.json");
    p_md = join(out_dir, "results.md");
    if (!p_csv || !p_json || !p_md) goto done;
    if ((s = ekv_report_write_csv(&rep, p_csv)) != EKV_OK || (s = ekv_report_write_json(&rep, p_json)) != EKV_OK ||
        (s = ekv_report_write_markdown(&rep, p_md)) != EKV_OK || (s = ekv_report_markdown(&rep, &md)) != EKV_OK) {
        cli_fail(CMD, s);
        goto done;
    }
    if (json) {
        char *txt = cli_read_file(CMD, p_json, NULL);
        if (!txt) goto done;
        fputs(txt, stdout);
        free(txt);
    } else {
        fputs(md, stdout);
    }
    fflush(stdout);
    rc = 0;
    if (plot) {
        if ((s = ekv_report_plot(&rep, out_dir, NULL)) != EKV_OK) {
            fprintf(stderr, "ekv eval: warning: plots not made: %s: %s\n", ekv_status_str(s), ekv_last_error());
            rc = 2;
        }
    }
    fprintf(stderr, "ekv eval: wrote %s, %s, %s%s in %.1f s\n", p_csv, p_json, p_md,
            plot && rc == 0 ? " and one PNG per metric" : "", total_s);
done:
    cJSON_Delete(meta);
    free(md);
    free(p_csv);
    free(p_json);
    free(p_md);
    ekv_report_free(&rep);
    free(acc);
    free(cell_s);
    ekv_eval_runner_free(&run); /* also after a failed init, which leaves partial state */
    ekv_dataset_free(&ds);
    ekv_vision_free(vision);
    free(data_dir);
    ekv_context_free(ctx);
    ekv_model_free(model);
    free(cells);
    free(policies);
    free(budgets);
    return rc;
}

const struct ekv_cmd ekv_cmd_eval = {"eval", "quality of KV-cache policies against their budget (ppl, ROUGE-L, KL, hit rate)",
                                     cmd_eval_main};
