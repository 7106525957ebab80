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

static const struct cli_help k_help = {
    "usage: ekv bench [options]",
    "Measures prompt processing and decode speed over a grid of settings.\n"
    "List options take comma-separated values; every combination is run.",
    "Per grid point and repetition: the b sequences start with depth tokens in their\n"
    "cache (untimed: one sequence reads depth random tokens once per policy, storage\n"
    "type, budget and depth, and every sequence is a copy of it), then each reads\n"
    "p tokens as a prompt (timed: prompt tok/s =\n"
    "b*p / time; time to first token = time of one sequence's prompt and its first\n"
    "sampled token), then n decode steps of all b sequences together (timed: decode\n"
    "tok/s = b*n / time). 'stats ovh' is the prompt-time overhead against the full\n"
    "policy of the same p/depth/b/threads when the grid has it. Peak RSS is the\n"
    "process's high-water mark after the grid point. 'CPU share' is the process's\n"
    "CPU time over the timed phases / (wall time x threads): well below 100%\n"
    "means other programs took the cores (rates are then not the machine's).\n"
    "Output: a Markdown table on stdout, and JSON with --json.",
};

struct row {
    int threads;
    const char *policy;
    char kv_type[32];   /* "f16", "q8_0/kivi4" */
    enum ekv_kv_type tk, tv;
    double budget;
    long p, n, depth, b;
    int reps;
    double *t_prompt; /* [reps] seconds for all b prompts */
    double *t_ttft;   /* [reps] seconds to the first token of sequence 0 */
    double *t_decode; /* [reps] seconds for n batched decode steps */
    double *cpu;      /* [reps] process CPU seconds / (wall seconds * threads) over the timed phases */
    uint64_t kv_bytes, kv_bytes_full, kv_bytes_f32, kv_alloc; /* K/V bytes in the types, full cache, full f32 */
    uint64_t kv_alloc_now; /* bytes the caches have allocated at the end (host and device) */
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

/* The context already in the cache (--depth): one sequence reads `depth`
 * random tokens once per (threads, policy, storage type, budget, depth);
 * every sequence of every batch size and repetition of that point starts as
 * a copy of it (ekv_seq_copy), so a deep grid reads each depth once, not
 * b x reps times. */
struct depth_fill {
    struct ekv_seq *seq; /* NULL until read */
    int32_t next;        /* its greedy next token */
    int key[5];          /* threads, policy, type, budget, depth indices */
};

/* The depth sequence for r (read now unless df already holds it). */
static enum ekv_status depth_seq(struct ekv_context *ctx, const struct ekv_kv_params *kvp, const struct row *r,
                                 struct depth_fill *df, int32_t V, int32_t *toks, float *logits, uint64_t *seed) {
    if (df->seq) return EKV_OK;
    const double t0 = cli_now();
    enum ekv_status s = ekv_seq_new(ctx, kvp, &df->seq);
    for (long j = 0; j < r->depth && s == EKV_OK; j++) toks[j] = (int32_t)(rng_next(seed) % (uint64_t)V);
    if (s == EKV_OK) s = ekv_seq_prefill(df->seq, toks, (int32_t)r->depth, logits);
    if (s == EKV_OK) df->next = argmax(logits, V);
    if (s == EKV_OK) fprintf(stderr, " [depth read in %.2f s]", cli_now() - t0);
    if (s != EKV_OK) {
        ekv_seq_free(df->seq);
        df->seq = NULL;
    }
    return s;
}

/* One repetition of one grid point. */
static enum ekv_status run_once(const struct ekv_model *model, struct ekv_context *ctx,
                                const struct ekv_kv_params *kvp, struct row *r, int rep, uint64_t *seed,
                                struct depth_fill *df) {
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
    if (r->depth > 0) s = depth_seq(ctx, kvp, r, df, V, toks, logits, seed);
    for (long i = 0; i < b && s == EKV_OK; i++) {
        s = r->depth > 0 ? ekv_seq_copy(df->seq, &seqs[i]) : ekv_seq_new(ctx, kvp, &seqs[i]);
        next[i] = r->depth > 0 ? df->next : 0;
    }
    if (s != EKV_OK) goto done;

    double t_prompt = 0.0, ttft = 0.0, cpu_timed = 0.0;
    for (long i = 0; i < b && s == EKV_OK; i++) {
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

    ekv_context_device_profile_reset(ctx); /* EKV_VK_PROFILE: the decode steps only */
    double t0 = cli_now(), c0 = cpu_seconds();
    for (long step = 0; step < r->n && s == EKV_OK; step++) {
        s = ekv_decode_batch(ctx, seqs, next, (int32_t)b, logits);
        for (long i = 0; i < b && s == EKV_OK; i++) next[i] = argmax(logits + (size_t)i * V, V);
    }
    double t_dec = cli_now() - t0;
    cpu_timed += cpu_seconds() - c0;
    if (s != EKV_OK) goto done;
    char prof[4096];
    if (rep == r->reps - 1 && r->n > 0 && ekv_seq_on_device(seqs[0]) &&
        ekv_context_device_profile(ctx, prof, sizeof prof) == EKV_OK)
        fprintf(stderr, "\nekv bench: device time by shader (EKV_VK_PROFILE), the last repetition's %ld decode steps:\n%s",
                r->n, prof);
    r->cpu[rep] = t_prompt + t_dec > 0 ? cpu_timed / ((t_prompt + t_dec) * r->threads) : 0.0;

    r->t_prompt[rep] = t_prompt;
    r->t_ttft[rep] = ttft;
    r->t_decode[rep] = t_dec;
    r->kv_bytes = r->kv_bytes_full = r->kv_bytes_f32 = r->kv_alloc = r->kv_alloc_now = 0;
    for (long i = 0; i < b; i++) {
        struct ekv_kv_stats st;
        ekv_seq_kv_stats(seqs[i], &st);
        r->kv_bytes += st.bytes;
        r->kv_bytes_full += st.bytes_full;
        r->kv_bytes_f32 += st.bytes_full_f32;
        r->kv_alloc += st.peak_bytes_alloc;
        r->kv_alloc_now += st.bytes_alloc;
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
    fprintf(out, "| t | policy | kv | budget | p | n | depth | b | prompt tok/s | TTFT ms | decode tok/s | KV MiB | "
                 "KV/full | peak RSS MiB | stats ovh | CPU share |\n");
    fprintf(out, "|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];
        if (r->failed) {
            fprintf(out, "| %d | %s | %s | %g | %ld | %ld | %ld | %ld | failed ||||||||\n", r->threads, r->policy,
                    r->kv_type, r->budget, r->p, r->n, r->depth, r->b);
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
        fprintf(out, "| %d | %s | %s | %g | %ld | %ld | %ld | %ld | %s | %s | %s | %.1f | %.3f | %.0f | %s | %.0f%% |\n",
                r->threads, r->policy, r->kv_type, r->budget, r->p, r->n, r->depth, r->b, pr, ttft, dr,
                (double)r->kv_bytes / 1048576.0,
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
    cJSON_AddStringToObject(root, "cpu_kernels", ekv_cpu_kernels());
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "threads", r->threads);
        cJSON_AddStringToObject(o, "policy", r->policy);
        cJSON_AddStringToObject(o, "kv_type", r->kv_type);
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
            cJSON_AddNumberToObject(o, "kv_bytes_full_f32", (double)r->kv_bytes_f32);
            cJSON_AddNumberToObject(o, "kv_peak_alloc_bytes", (double)r->kv_alloc);
            cJSON_AddNumberToObject(o, "kv_alloc_bytes", (double)r->kv_alloc_now);
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

/* Everything one bench holds. */
struct bench {
    struct cli_params p;
    const char *model_path;
    struct ekv_model *model;
    long n_ctx;
    struct row *rows;
    int nrows;
    size_t max_rows;
    double *times; /* [max_rows][4][reps] */
    uint64_t seed;
};

static int bench_parse(struct bench *b, int argc, char **argv) {
    cli_params_init(&b->p, CLI_BENCH);
    int rc = cli_parse(CMD, argc, argv, &b->p, &k_help);
    if (rc) return rc;
    b->model_path = b->p.model ? b->p.model : cli_default_model();
    return 0;
}

/* Model, context size (the grid's longest point or the trained context), rows. */
static bool bench_setup(struct bench *b) {
    const struct cli_params *p = &b->p;
    if (!cli_load_model(CMD, p, &b->model, NULL)) return false;
    struct ekv_model_info mi;
    ekv_model_get_info(b->model, &mi);
    long need = 0;
    for (int a = 0; a < p->n_prompt.n; a++)
        for (int c = 0; c < p->n_gen.n; c++)
            for (int d = 0; d < p->depth.n; d++)
                if (p->n_prompt.i[a] + p->n_gen.i[c] + p->depth.i[d] > need)
                    need = p->n_prompt.i[a] + p->n_gen.i[c] + p->depth.i[d];
    b->n_ctx = p->n_ctx;
    if (b->n_ctx == 0) b->n_ctx = need > mi.n_ctx_train ? need : mi.n_ctx_train;
    b->max_rows = (size_t)p->threads_list.n * p->kv_policies.n * (p->kv_types.n > 0 ? p->kv_types.n : 1) *
                  p->kv_budgets.n * p->n_prompt.n * p->n_gen.n * p->depth.n * p->batch.n;
    b->rows = calloc(b->max_rows, sizeof *b->rows);
    b->times = calloc(b->max_rows * 4 * (size_t)p->reps, sizeof *b->times);
    if (!b->rows || !b->times) return cli_fail(CMD, EKV_ERR_NOMEM), false;
    b->seed = 0x5EED;
    return true;
}

/* Untimed, once per context: when the grid reads prompts, one prompt of the
 * longest -p (as llama-bench warms up with its prompt), then one decode
 * step. The decode step pages every weight in; the context's first prompt
 * of a given length grows and first touches its row buffers and per-thread
 * attention scratch, which on the 2-core AMD Zen 5 host made the first
 * 512-token repetition 30 % slower than the next ones (docs/performance.md). */
static void bench_warmup(struct ekv_context *ctx, int32_t n_vocab, long max_p) {
    struct ekv_seq *w = NULL;
    float *lg = malloc((size_t)n_vocab * sizeof *lg);
    int32_t *toks = max_p > 0 ? malloc((size_t)max_p * sizeof *toks) : NULL;
    if (lg && (max_p == 0 || toks) && ekv_seq_new(ctx, NULL, &w) == EKV_OK) {
        uint64_t seed = 0x3A3A;
        for (long j = 0; j < max_p; j++) toks[j] = (int32_t)(rng_next(&seed) % (uint64_t)n_vocab);
        if (max_p == 0 || ekv_seq_prefill(w, toks, (int32_t)max_p, lg) == EKV_OK) (void)ekv_seq_decode(w, 0, lg);
    }
    ekv_seq_free(w);
    free(toks);
    free(lg);
}

/* All repetitions of one grid point (row r already describes it). */
static bool bench_point(struct bench *b, struct ekv_context *ctx, struct row *r, struct depth_fill *df) {
    const size_t reps = (size_t)b->p.reps;
    r->reps = (int)reps;
    r->t_prompt = b->times + (size_t)(r - b->rows) * 4 * reps;
    r->t_ttft = r->t_prompt + reps;
    r->t_decode = r->t_ttft + reps;
    r->cpu = r->t_decode + reps;
    r->ovh = 0.0 / 0.0;
    struct ekv_kv_params k = b->p.kv;
    k.policy = r->policy;
    k.budget = r->budget;
    k.type_k = r->tk;
    k.type_v = r->tv;
    fprintf(stderr, "ekv bench: t=%d %s kv=%s budget=%g p=%ld n=%ld depth=%ld b=%ld ...", r->threads, r->policy,
            r->kv_type, r->budget, r->p, r->n, r->depth, r->b);
    for (int rep = 0; rep < r->reps && !r->failed; rep++) {
        enum ekv_status s = run_once(b->model, ctx, &k, r, rep, &b->seed, df);
        if (s != EKV_OK) {
            fprintf(stderr, " failed: %s: %s", ekv_status_str(s), ekv_last_error());
            r->failed = true;
        }
    }
    r->peak_rss = cli_peak_rss();
    if (!r->failed)
        fprintf(stderr, " prompt %.2f tok/s, decode %.2f tok/s\n",
                r->p ? tps((double)(r->p * r->b), med(r->t_prompt, r->reps)) : 0.0,
                r->n ? tps((double)(r->n * r->b), med(r->t_decode, r->reps)) : 0.0);
    else
        fprintf(stderr, "\n");
    return !r->failed;
}

/* Threads outer (one context each), then policy, storage type, budget, p, n, depth, batch. */
static int bench_grid(struct bench *b) {
    const struct cli_params *p = &b->p;
    struct ekv_model_info mi;
    ekv_model_get_info(b->model, &mi);
    struct cli_list one_type = {.n = 1}; /* no --kv-type list: the types of -ctk/-ctv (default f16) */
    const struct cli_list *types = p->kv_types.n > 0 ? &p->kv_types : &one_type;
    const struct cli_list *ax[7] = {&p->kv_policies, types, &p->kv_budgets, &p->n_prompt, &p->n_gen, &p->depth,
                                    &p->batch};
    size_t per_ctx = 1;
    for (int a = 0; a < 7; a++) per_ctx *= (size_t)ax[a]->n;
    int rc = 0;
    for (int ti = 0; ti < p->threads_list.n && rc == 0; ti++) {
        struct ekv_context_params cp = {.n_threads = (int32_t)p->threads_list.i[ti], .n_ctx = (int32_t)b->n_ctx,
                                        .device = p->device};
        struct ekv_context *ctx = NULL;
        enum ekv_status s = ekv_context_new(b->model, &cp, &ctx);
        if (s != EKV_OK) return cli_fail(CMD, s);
        if (p->warmup) {
            long max_p = 0;
            for (int i = 0; i < p->n_prompt.n; i++)
                if ((long)p->n_prompt.i[i] > max_p) max_p = (long)p->n_prompt.i[i];
            bench_warmup(ctx, mi.n_vocab, max_p < b->n_ctx ? max_p : b->n_ctx);
        }
        struct depth_fill df = {0};
        for (size_t g = 0; g < per_ctx; g++) {
            int idx[7];
            size_t rest = g;
            for (int a = 6; a >= 0; a--) {
                idx[a] = (int)(rest % (size_t)ax[a]->n);
                rest /= (size_t)ax[a]->n;
            }
            const int key[5] = {ti, idx[0], idx[1], idx[2], idx[5]};
            if (memcmp(key, df.key, sizeof key)) { /* another depth sequence */
                ekv_seq_free(df.seq);
                df.seq = NULL;
                memcpy(df.key, key, sizeof key);
            }
            const bool full = !strcmp(p->kv_policies.s[idx[0]], "full");
            if (full && idx[2] > 0) continue; /* the full cache has no budget */
            struct row *r = &b->rows[b->nrows++];
            r->threads = (int)p->threads_list.i[ti];
            r->policy = p->kv_policies.s[idx[0]];
            r->tk = p->kv.type_k == EKV_KV_DEFAULT ? ekv_kv_type_default() : p->kv.type_k;
            r->tv = p->kv.type_v == EKV_KV_DEFAULT ? ekv_kv_type_default() : p->kv.type_v;
            char err[192];
            if (p->kv_types.n > 0 && !cli_parse_kv_types(p->kv_types.s[idx[1]], &r->tk, &r->tv, err, sizeof err))
                return cli_usage_error(CMD, "--kv-type: %s", err);
            if (r->tk == r->tv) snprintf(r->kv_type, sizeof r->kv_type, "%s", ekv_kv_type_name(r->tk));
            else snprintf(r->kv_type, sizeof r->kv_type, "%s/%s", ekv_kv_type_name(r->tk), ekv_kv_type_name(r->tv));
            r->budget = full ? 1.0 : p->kv_budgets.d[idx[2]];
            r->p = p->n_prompt.i[idx[3]];
            r->n = p->n_gen.i[idx[4]];
            r->depth = p->depth.i[idx[5]];
            r->b = p->batch.i[idx[6]];
            if (!bench_point(b, ctx, r, &df)) rc = 1;
        }
        ekv_seq_free(df.seq);
        ekv_context_free(ctx);
    }
    return rc;
}

/* Statistics overhead: prompt time against the full cache of the same shape. */
static void bench_overhead(struct bench *b) {
    for (int i = 0; i < b->nrows; i++) {
        struct row *r = &b->rows[i];
        if (r->failed || r->p == 0 || !strcmp(r->policy, "full")) continue;
        for (int j = 0; j < b->nrows; j++) {
            const struct row *f = &b->rows[j];
            if (f->failed || strcmp(f->policy, "full") || strcmp(f->kv_type, r->kv_type) || f->threads != r->threads ||
                f->p != r->p || f->depth != r->depth || f->b != r->b)
                continue;
            r->ovh = med(r->t_prompt, r->reps) / med(f->t_prompt, f->reps) - 1.0;
            break;
        }
    }
}

static int bench_report(struct bench *b) {
    const char *json_path = b->p.json_path;
    bench_overhead(b);
    if (!json_path || strcmp(json_path, "-")) print_table(stdout, b->rows, b->nrows, b->model_path);
    if (json_path && !write_json(json_path, b->rows, b->nrows, b->model_path)) return 1;
    return 0;
}

static int bench_main(int argc, char **argv) {
    struct bench b;
    memset(&b, 0, sizeof b);
    int rc = bench_parse(&b, argc, argv);
    if (rc == 2) rc = 0; /* --help */
    else if (rc == 0 && !bench_setup(&b)) rc = 1;
    else if (rc == 0) {
        rc = bench_grid(&b);
        if (bench_report(&b)) rc = 1;
    }
    free(b.rows);
    free(b.times);
    ekv_model_free(b.model);
    cli_params_free(&b.p);
    return rc;
}

const struct ekv_cmd ekv_cmd_bench = {"bench", "speed grid: prompt/decode tok/s, TTFT, KV bytes, RSS", bench_main};
