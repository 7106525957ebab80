/*
 * cmd_bench.c — `ekv bench`: a llama-bench-style grid of speed measurements.
 * For every combination of thread count, KV policy, budget, prompt length
 * (-p), generated tokens (-n), context already in the cache (--depth) and
 * batch size (-b), it fills the cache, times the prompt and the decode steps
 * (several sequences decode together through ekv_decode_batch), and reports
 * prompt and decode tokens/s, time to first token, KV bytes against the full
 * cache, peak RSS and the prompt-time overhead of a policy's statistics over
 * the full cache of the same shape. Repetitions (-r) give min and median.
 * Output: a Markdown table on stdout, optionally JSON (--json FILE).
 *
 * Token ids are pseudo-random (fixed seed): speed does not depend on text,
 * and synthetic models (ekv mkmodel) have no meaningful vocabulary.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *const CMD = "bench";

#define MAX_LIST 32

static void help(void) {
    printf("usage: ekv bench [options]\n\n"
           "Measures prompt processing and decode speed over a grid of settings.\n"
           "List options take comma-separated values; every combination is run.\n\n"
           "  -m, --model FILE      GGUF or llama2.c model (default: bundled models/stories260K.gguf)\n"
           "  -p, --n-prompt LIST   prompt tokens timed per sequence (default 512)\n"
           "  -n, --n-gen LIST      decode steps timed (default 128)\n"
           "  -d, --depth LIST      tokens put in the cache before the timed prompt, untimed (default 0)\n"
           "  -b, --batch LIST      sequences decoded together in one forward (default 1)\n"
           "  -t, --threads LIST    worker threads (default: online cores, at most 8)\n"
           "  -r, --repetitions N   repetitions of every grid point (default 3)\n"
           "  -c, --ctx-size N      context size (default: the model's trained context)\n"
           "      --kv-policy LIST  KV policies (default full)\n"
           "      --kv-budget LIST  KV budgets (default 1)\n"
           "      --kv-*            any other KV flag (below) applies to every grid point\n"
           "      --json FILE       also write all results as JSON ('-' = stdout, no table)\n"
           "      --no-warmup       skip the warm-up step that pages the weights in\n"
           "  -h, --help            this help\n\n"
           "Per grid point and repetition: for each of the b sequences, depth tokens are\n"
           "evaluated as a prompt (untimed), then p tokens as a prompt (timed: prompt tok/s =\n"
           "b*p / time; time to first token = time of one sequence's prompt and its first\n"
           "sampled token), then n decode steps of all b sequences together (timed: decode\n"
           "tok/s = b*n / time). 'stats ovh' is the prompt-time overhead against the full\n"
           "policy of the same p/depth/b/threads when the grid has it. Peak RSS is the\n"
           "process's high-water mark after the grid point. 'CPU share' is the process's\n"
           "CPU time over the timed phases / (wall time x threads): well below 100%%\n"
           "means other programs took the cores (rates are then not the machine's).\n\n");
    cli_print_kv_help(stdout);
}

struct list {
    long v[MAX_LIST];
    int n;
};

static bool parse_int_list(const char *opt, const char *s, long lo, long hi, struct list *out) {
    if (!s || !*s) return cli_usage_error(CMD, "%s needs a value", opt), false;
    out->n = 0;
    char buf[1024];
    if (strlen(s) >= sizeof buf) return cli_usage_error(CMD, "%s: list too long", opt), false;
    strcpy(buf, s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (out->n == MAX_LIST) return cli_usage_error(CMD, "%s: more than %d values", opt, MAX_LIST), false;
        if (!cli_int(CMD, opt, tok, lo, hi, &out->v[out->n])) return false;
        out->n++;
    }
    if (out->n == 0) return cli_usage_error(CMD, "%s needs a value", opt), false;
    return true;
}

struct row {
    int threads;
    const char *policy;
    double budget;
    long p, n, depth, b;
    int reps;
    double *t_prompt; /* [reps] seconds for all b prompts */
    double *t_ttft;   /* [reps] seconds to the first token of sequence 0 */
    double *t_decode; /* [reps] seconds for n batched decode steps */
    double *cpu;      /* [reps] process CPU seconds / (wall seconds * threads) over the timed phases */
    uint64_t kv_bytes, kv_bytes_full, kv_alloc;
    uint64_t peak_rss;
    double ovh; /* median prompt-time overhead vs. full, NaN if none */
    bool failed;
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double med(const double *v, int n) {
    double t[256];
    int m = n < 256 ? n : 256;
    memcpy(t, v, (size_t)m * sizeof *t);
    qsort(t, (size_t)m, sizeof *t, cmp_double);
    return m % 2 ? t[m / 2] : 0.5 * (t[m / 2 - 1] + t[m / 2]);
}

static double vmin(const double *v, int n) {
    double x = v[0];
    for (int i = 1; i < n; i++) x = v[i] < x ? v[i] : x;
    return x;
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* User + system CPU seconds of the whole process. */
static double cpu_seconds(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* One repetition of one grid point. */
static enum ekv_status run_once(const struct ekv_model *model, struct ekv_context *ctx,
                                const struct ekv_kv_params *kvp, struct row *r, int rep, uint64_t *seed) {
    struct ekv_model_info mi;
    ekv_model_get_info(model, &mi);
    const int32_t V = mi.n_vocab;
    const long b = r->b;
    enum ekv_status s = EKV_OK;
    struct ekv_seq **seqs = calloc((size_t)b, sizeof *seqs);
    int32_t *toks = malloc(((size_t)(r->p > r->depth ? r->p : r->depth) + 1) * sizeof *toks);
    int32_t *next = malloc((size_t)b * sizeof *next);
    float *logits = malloc((size_t)b * (size_t)V * sizeof *logits);
    if (!seqs || !toks || !next || !logits) {
        s = EKV_ERR_NOMEM;
        goto done;
    }
    for (long i = 0; i < b && s == EKV_OK; i++) s = ekv_seq_new(ctx, kvp, &seqs[i]);
    if (s != EKV_OK) goto done;

    double t_prompt = 0.0, ttft = 0.0, cpu_timed = 0.0;
    for (long i = 0; i < b && s == EKV_OK; i++) {
        if (r->depth > 0) {
            for (long j = 0; j < r->depth; j++) toks[j] = (int32_t)(rng_next(seed) % (uint64_t)V);
            s = ekv_seq_prefill(seqs[i], toks, (int32_t)r->depth, logits + (size_t)i * V);
            if (s != EKV_OK) break;
            next[i] = argmax(logits + (size_t)i * V, V);
        }
        if (r->p > 0) {
            for (long j = 0; j < r->p; j++) toks[j] = (int32_t)(rng_next(seed) % (uint64_t)V);
            double t0 = cli_now(), c0 = cpu_seconds();
            s = ekv_seq_prefill(seqs[i], toks, (int32_t)r->p, logits + (size_t)i * V);
            if (s != EKV_OK) break;
            next[i] = argmax(logits + (size_t)i * V, V);
            double dt = cli_now() - t0;
            cpu_timed += cpu_seconds() - c0;
            t_prompt += dt;
            if (i == 0) ttft = dt;
        } else if (r->depth == 0) {
            next[i] = (int32_t)(rng_next(seed) % (uint64_t)V);
        }
    }
    if (s != EKV_OK) goto done;

    double t0 = cli_now(), c0 = cpu_seconds();
    for (long step = 0; step < r->n && s == EKV_OK; step++) {
        s = ekv_decode_batch(ctx, seqs, next, (int32_t)b, logits);
        for (long i = 0; i < b && s == EKV_OK; i++) next[i] = argmax(logits + (size_t)i * V, V);
    }
    double t_dec = cli_now() - t0;
    cpu_timed += cpu_seconds() - c0;
    if (s != EKV_OK) goto done;
    r->cpu[rep] = t_prompt + t_dec > 0 ? cpu_timed / ((t_prompt + t_dec) * r->threads) : 0.0;

    r->t_prompt[rep] = t_prompt;
    r->t_ttft[rep] = ttft;
    r->t_decode[rep] = t_dec;
    r->kv_bytes = r->kv_bytes_full = r->kv_alloc = 0;
    for (long i = 0; i < b; i++) {
        struct ekv_kv_stats st;
        ekv_seq_kv_stats(seqs[i], &st);
        r->kv_bytes += st.bytes;
        r->kv_bytes_full += st.bytes_full;
        r->kv_alloc += st.peak_bytes_alloc;
    }
done:
    if (seqs)
        for (long i = 0; i < b; i++) ekv_seq_free(seqs[i]);
    free(seqs);
    free(toks);
    free(next);
    free(logits);
    if (s == EKV_ERR_NOMEM && !*ekv_last_error()) return EKV_ERR_NOMEM;
    return s;
}

static double tps(double tokens, double sec) { return sec > 0 ? tokens / sec : 0.0; }

static void fmt_rate(char *buf, size_t n, double tokens, const double *t, int reps, bool have) {
    if (!have || tokens <= 0) {
        snprintf(buf, n, "-");
        return;
    }
    double m = tps(tokens, med(t, reps)), best = tps(tokens, vmin(t, reps));
    if (reps > 1)
        snprintf(buf, n, "%.2f (%.2f)", m, best);
    else
        snprintf(buf, n, "%.2f", m);
}

static void print_table(FILE *out, const struct row *rows, int nrows, const char *model_path) {
    fprintf(out, "model: %s; rates are median (best) over repetitions\n\n", model_path);
    fprintf(out, "| t | policy | budget | p | n | depth | b | prompt tok/s | TTFT ms | decode tok/s | KV MiB | KV/full "
                 "| peak RSS MiB | stats ovh | CPU share |\n");
    fprintf(out, "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];
        if (r->failed) {
            fprintf(out, "| %d | %s | %g | %ld | %ld | %ld | %ld | failed ||||||||\n", r->threads, r->policy, r->budget,
                    r->p, r->n, r->depth, r->b);
            continue;
        }
        char pr[64], dr[64], ttft[32], ovh[32];
        fmt_rate(pr, sizeof pr, (double)(r->p * r->b), r->t_prompt, r->reps, r->p > 0);
        fmt_rate(dr, sizeof dr, (double)(r->n * r->b), r->t_decode, r->reps, r->n > 0);
        if (r->p > 0)
            snprintf(ttft, sizeof ttft, "%.1f", 1e3 * med(r->t_ttft, r->reps));
        else
            snprintf(ttft, sizeof ttft, "-");
        if (r->ovh == r->ovh)
            snprintf(ovh, sizeof ovh, "%+.1f%%", 100.0 * r->ovh);
        else
            snprintf(ovh, sizeof ovh, "-");
        fprintf(out, "| %d | %s | %g | %ld | %ld | %ld | %ld | %s | %s | %s | %.1f | %.3f | %.0f | %s | %.0f%% |\n", r->threads,
                r->policy, r->budget, r->p, r->n, r->depth, r->b, pr, ttft, dr, (double)r->kv_bytes / 1048576.0,
                r->kv_bytes_full ? (double)r->kv_bytes / (double)r->kv_bytes_full : 0.0,
                (double)r->peak_rss / 1048576.0, ovh, 100.0 * med(r->cpu, r->reps));
    }
}

static cJSON *num_array(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static bool write_json(const char *path, const struct row *rows, int nrows, const char *model_path) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model_path);
    cJSON_AddStringToObject(root, "version", ekv_version());
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "threads", r->threads);
        cJSON_AddStringToObject(o, "policy", r->policy);
        cJSON_AddNumberToObject(o, "budget", r->budget);
        cJSON_AddNumberToObject(o, "n_prompt", (double)r->p);
        cJSON_AddNumberToObject(o, "n_gen", (double)r->n);
        cJSON_AddNumberToObject(o, "depth", (double)r->depth);
        cJSON_AddNumberToObject(o, "batch", (double)r->b);
        cJSON_AddNumberToObject(o, "repetitions", r->reps);
        cJSON_AddBoolToObject(o, "failed", r->failed);
        if (!r->failed) {
            cJSON_AddItemToObject(o, "prompt_s", num_array(r->t_prompt, r->reps));
            cJSON_AddItemToObject(o, "ttft_s", num_array(r->t_ttft, r->reps));
            cJSON_AddItemToObject(o, "decode_s", num_array(r->t_decode, r->reps));
            cJSON_AddItemToObject(o, "cpu_share", num_array(r->cpu, r->reps));
            double pt = (double)(r->p * r->b), dt = (double)(r->n * r->b);
            cJSON_AddNumberToObject(o, "prompt_tps_median", r->p ? tps(pt, med(r->t_prompt, r->reps)) : 0);
            cJSON_AddNumberToObject(o, "prompt_tps_best", r->p ? tps(pt, vmin(r->t_prompt, r->reps)) : 0);
            cJSON_AddNumberToObject(o, "ttft_s_median", med(r->t_ttft, r->reps));
            cJSON_AddNumberToObject(o, "decode_tps_median", r->n ? tps(dt, med(r->t_decode, r->reps)) : 0);
            cJSON_AddNumberToObject(o, "decode_tps_best", r->n ? tps(dt, vmin(r->t_decode, r->reps)) : 0);
            cJSON_AddNumberToObject(o, "kv_bytes", (double)r->kv_bytes);
            cJSON_AddNumberToObject(o, "kv_bytes_full", (double)r->kv_bytes_full);
            cJSON_AddNumberToObject(o, "kv_peak_alloc_bytes", (double)r->kv_alloc);
            cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)r->peak_rss);
            if (r->ovh == r->ovh) cJSON_AddNumberToObject(o, "stats_overhead", r->ovh);
        }
        cJSON_AddItemToArray(arr, o);
    }
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    if (!txt) return false;
    bool ok = true;
    if (!strcmp(path, "-")) {
        printf("%s\n", txt);
    } else {
        FILE *f = fopen(path, "w");
        if (!f || fprintf(f, "%s\n", txt) < 0) ok = false;
        if (f && fclose(f) != 0) ok = false;
        if (!ok) cli_usage_error(CMD, "cannot write %s", path);
    }
    cJSON_free(txt);
    return ok;
}

static int bench_main(int argc, char **argv) {
    const char *model_path = NULL, *json_path = NULL;
    struct list P = {{512}, 1}, N = {{128}, 1}, Dp = {{0}, 1}, B = {{1}, 1}, T = {{0}, 1};
    long reps = 3, n_ctx = 0;
    bool warmup = true;
    const char *policies[MAX_LIST] = {"full"};
    int n_pol = 1;
    double budgets[MAX_LIST] = {1.0};
    int n_bud = 1;
    char pol_buf[1024];
    struct ekv_context_params cp = ekv_context_default_params();
    T.v[0] = cp.n_threads;
    struct ekv_kv_params kvp = ekv_kv_default_params();

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!v) return cli_usage_error(CMD, "%s needs a file", a);
            model_path = v;
            i++;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            if (!parse_int_list(a, v, 0, 1L << 24, &P)) return 1;
            i++;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            if (!parse_int_list(a, v, 0, 1L << 24, &N)) return 1;
            i++;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--depth")) {
            if (!parse_int_list(a, v, 0, 1L << 24, &Dp)) return 1;
            i++;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) {
            if (!parse_int_list(a, v, 1, 1024, &B)) return 1;
            i++;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!parse_int_list(a, v, 1, 256, &T)) return 1;
            i++;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            if (!cli_int(CMD, a, v, 1, 256, &reps)) return 1;
            i++;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!cli_int(CMD, a, v, 1, 1L << 24, &n_ctx)) return 1;
            i++;
        } else if (!strcmp(a, "--json")) {
            if (!v) return cli_usage_error(CMD, "--json needs a file");
            json_path = v;
            i++;
        } else if (!strcmp(a, "--no-warmup")) {
            warmup = false;
        } else if (!strcmp(a, "--kv-policy")) {
            if (!v || !*v || strlen(v) >= sizeof pol_buf) return cli_usage_error(CMD, "--kv-policy needs names");
            strcpy(pol_buf, v);
            n_pol = 0;
            for (char *save = NULL, *tok = strtok_r(pol_buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (n_pol == MAX_LIST) return cli_usage_error(CMD, "--kv-policy: more than %d values", MAX_LIST);
                policies[n_pol++] = tok;
            }
            if (n_pol == 0) return cli_usage_error(CMD, "--kv-policy needs names");
            i++;
        } else if (!strcmp(a, "--kv-budget")) {
            if (!v || !*v || strlen(v) >= 1024) return cli_usage_error(CMD, "--kv-budget needs values");
            char buf[1024];
            strcpy(buf, v);
            n_bud = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (n_bud == MAX_LIST) return cli_usage_error(CMD, "--kv-budget: more than %d values", MAX_LIST);
                if (!cli_double(CMD, a, tok, 1e-6, 1.0, &budgets[n_bud])) return 1;
                n_bud++;
            }
            if (n_bud == 0) return cli_usage_error(CMD, "--kv-budget needs values");
            i++;
        } else {
            int k = cli_parse_kv_opt(CMD, argc, argv, &i, &kvp);
            if (k < 0) return 1;
            if (k == 0) return cli_usage_error(CMD, "unknown option '%s' (see --help)", a);
        }
    }
    if (!model_path) model_path = cli_default_model();
    for (int i = 0; i < n_pol; i++) {
        bool known = false;
        for (int j = 0; j < ekv_kv_policy_count(); j++) known |= !strcmp(policies[i], ekv_kv_policy_name(j));
        if (!known) return cli_usage_error(CMD, "unknown KV policy '%s'", policies[i]);
    }

    struct ekv_model *model = NULL;
    struct ekv_model_params mp = ekv_model_default_params();
    enum ekv_status s = ekv_model_load(model_path, &mp, &model);
    if (s != EKV_OK) return cli_fail(CMD, s);
    struct ekv_model_info mi;
    ekv_model_get_info(model, &mi);

    long need = 0;
    for (int a = 0; a < P.n; a++)
        for (int c = 0; c < N.n; c++)
            for (int d = 0; d < Dp.n; d++)
                if (P.v[a] + N.v[c] + Dp.v[d] > need) need = P.v[a] + N.v[c] + Dp.v[d];
    if (n_ctx == 0) n_ctx = need > mi.n_ctx_train ? need : mi.n_ctx_train;

    size_t max_rows = (size_t)T.n * n_pol * n_bud * P.n * N.n * Dp.n * B.n;
    struct row *rows = calloc(max_rows, sizeof *rows);
    double *times = calloc(max_rows * 4 * (size_t)reps, sizeof *times);
    if (!rows || !times) {
        free(rows);
        free(times);
        ekv_model_free(model);
        return cli_fail(CMD, EKV_ERR_NOMEM);
    }
    int nrows = 0, rc = 0;
    uint64_t seed = 0x5EED;
    for (int ti = 0; ti < T.n && rc == 0; ti++) {
        struct ekv_context_params ctxp = {.n_threads = (int32_t)T.v[ti], .n_ctx = (int32_t)n_ctx};
        struct ekv_context *ctx = NULL;
        if ((s = ekv_context_new(model, &ctxp, &ctx)) != EKV_OK) {
            rc = cli_fail(CMD, s);
            break;
        }
        if (warmup) { /* touch every weight once (mmap page-in), untimed */
            struct ekv_seq *w = NULL;
            float *lg = malloc((size_t)mi.n_vocab * sizeof *lg);
            if (lg && ekv_seq_new(ctx, NULL, &w) == EKV_OK) (void)ekv_seq_decode(w, 0, lg);
            ekv_seq_free(w);
            free(lg);
        }
        for (int pi = 0; pi < n_pol; pi++)
            for (int bi = 0; bi < n_bud; bi++)
                for (int a = 0; a < P.n; a++)
                    for (int c = 0; c < N.n; c++)
                        for (int d = 0; d < Dp.n; d++)
                            for (int e = 0; e < B.n; e++) {
                                const bool full = !strcmp(policies[pi], "full");
                                if (full && bi > 0) continue; /* the full cache has no budget */
                                struct row *r = &rows[nrows];
                                r->threads = (int)T.v[ti];
                                r->policy = policies[pi];
                                r->budget = full ? 1.0 : budgets[bi];
                                r->p = P.v[a];
                                r->n = N.v[c];
                                r->depth = Dp.v[d];
                                r->b = B.v[e];
                                r->reps = (int)reps;
                                r->t_prompt = times + (size_t)nrows * 4 * (size_t)reps;
                                r->t_ttft = r->t_prompt + reps;
                                r->t_decode = r->t_ttft + reps;
                                r->cpu = r->t_decode + reps;
                                r->ovh = 0.0 / 0.0;
                                struct ekv_kv_params k = kvp;
                                k.policy = r->policy;
                                k.budget = r->budget;
                                fprintf(stderr, "ekv bench: t=%d %s budget=%g p=%ld n=%ld depth=%ld b=%ld ...",
                                        r->threads, r->policy, r->budget, r->p, r->n, r->depth, r->b);
                                for (int rep = 0; rep < reps && !r->failed; rep++) {
                                    s = run_once(model, ctx, &k, r, rep, &seed);
                                    if (s != EKV_OK) {
                                        fprintf(stderr, " failed: %s: %s", ekv_status_str(s), ekv_last_error());
                                        r->failed = true;
                                        rc = 1;
                                    }
                                }
                                r->peak_rss = cli_peak_rss();
                                if (!r->failed)
                                    fprintf(stderr, " prompt %.2f tok/s, decode %.2f tok/s\n",
                                            r->p ? tps((double)(r->p * r->b), med(r->t_prompt, r->reps)) : 0.0,
                                            r->n ? tps((double)(r->n * r->b), med(r->t_decode, r->reps)) : 0.0);
                                else
                                    fprintf(stderr, "\n");
                                nrows++;
                            }
        ekv_context_free(ctx);
    }

    /* statistics overhead: prompt time against the full cache of the same shape */
    for (int i = 0; i < nrows; i++) {
        struct row *r = &rows[i];
        if (r->failed || r->p == 0 || !strcmp(r->policy, "full")) continue;
        for (int j = 0; j < nrows; j++) {
            const struct row *f = &rows[j];
            if (f->failed || strcmp(f->policy, "full") || f->threads != r->threads || f->p != r->p ||
                f->depth != r->depth || f->b != r->b)
                continue;
            r->ovh = med(r->t_prompt, r->reps) / med(f->t_prompt, f->reps) - 1.0;
            break;
        }
    }

    if (!json_path || strcmp(json_path, "-")) print_table(stdout, rows, nrows, model_path);
    if (json_path && !write_json(json_path, rows, nrows, model_path)) rc = 1;
    free(rows);
    free(times);
    ekv_model_free(model);
    return rc;
}

const struct ekv_cmd ekv_cmd_bench = {"bench", "speed grid: prompt/decode tok/s, TTFT, KV bytes, RSS", bench_main};
