/*
 * report.c — what `ekv eval` hands to people and scripts: the result grid
 * (policy x storage type x budget x metric) as CSV, JSON and a Markdown
 * table, one gnuplot PNG per metric (metric against budget, one line per
 * policy and type) and, when K/V bytes were measured, the Pareto view
 * (pareto_<metric>.png: quality against bytes, a point per cell); a metric
 * with an interval (metric_lo, metric_hi: --compare-to) gets error bars
 * instead of plots of its ends. Plus the small parsers for the
 * comma-separated grid options and the progress line formatter. Nothing
 * here prints; gnuplot's own output goes to a log file.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ekv_eval.h"
#include "eval_util.h"

extern char **environ;

/* ------------------------------------------------------------------------ */
/* Growing string                                                             */
/* ------------------------------------------------------------------------ */

struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int k = vsnprintf(b->s ? b->s + b->n : NULL, room, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = b->cap ? b->cap : 256;
        while (nc - b->n <= (size_t)k) {
            if (nc > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            nc *= 2;
        }
        char *p = realloc(b->s, nc);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = nc;
    }
}

/* Finite values as %.9g, the rest as nan / inf / -inf (printf's spelling
 * of NaN varies). */
static void sb_num(struct sbuf *b, double v, const char *fmt) {
    if (isnan(v)) sb_printf(b, "nan");
    else if (isinf(v)) sb_printf(b, v > 0 ? "inf" : "-inf");
    else sb_printf(b, fmt, v);
}

static enum ekv_status write_file(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return ekv_error_set(EKV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t w = fwrite(s, 1, n, f);
    int e = fclose(f);
    if (w != n || e != 0) return ekv_error_set(EKV_ERR_IO, "%s: write failed", path);
    return EKV_OK;
}

/* ------------------------------------------------------------------------ */
/* Grid options and progress                                                  */
/* ------------------------------------------------------------------------ */

enum ekv_status ekv_split_list(const char *list, char ***items, size_t *n) {
    *items = NULL;
    *n = 0;
    if (!list || !*list) return ekv_error_set(EKV_ERR_INVALID_ARG, "list: empty");
    size_t len = strlen(list), cnt = 1;
    for (const char *p = list; *p; p++) cnt += *p == ',';
    size_t bytes;
    if (!ev_mul_ok(cnt, sizeof(char *), &bytes) || !ev_add_ok(bytes, len + 1, &bytes))
        return ekv_error_set(EKV_ERR_OVERFLOW, "list: %zu elements", cnt);
    char **arr = malloc(bytes);
    if (!arr) return ekv_error_set(EKV_ERR_NOMEM, "list: no memory");
    char *str = (char *)(arr + cnt);
    memcpy(str, list, len + 1);
    size_t k = 0;
    for (char *p = str;;) {
        char *c = strchr(p, ',');
        if (c) *c = '\0';
        while (*p == ' ' || *p == '\t') p++;
        char *e = p + strlen(p);
        while (e > p && (e[-1] == ' ' || e[-1] == '\t')) *--e = '\0';
        enum ekv_status st = EKV_OK;
        if (!*p) st = ekv_error_set(EKV_ERR_INVALID_ARG, "list '%s': empty element %zu", list, k + 1);
        for (size_t i = 0; i < k && st == EKV_OK; i++)
            if (strcmp(arr[i], p) == 0)
                st = ekv_error_set(EKV_ERR_INVALID_ARG, "list '%s': '%s' given twice", list, p);
        if (st != EKV_OK) {
            free(arr); /* p points into arr: the message is written first */
            return st;
        }
        arr[k++] = p;
        if (!c) break;
        p = c + 1;
    }
    *items = arr;
    *n = k;
    return EKV_OK;
}

enum ekv_status ekv_metrics_parse(const char *list, unsigned *bits) {
    char **it;
    size_t n;
    enum ekv_status st = ekv_split_list(list, &it, &n);
    if (st != EKV_OK) return ekv_error_prefix(st, "--metric");
    unsigned b = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(it[i], "ppl") == 0) b |= EKV_METRIC_PPL;
        else if (strcmp(it[i], "rouge") == 0) b |= EKV_METRIC_ROUGE;
        else if (strcmp(it[i], "kl") == 0) b |= EKV_METRIC_KL;
        else if (strcmp(it[i], "hitrate") == 0) b |= EKV_METRIC_HITRATE;
        else if (strcmp(it[i], "acc") == 0) b |= EKV_METRIC_ACC;
        else {
            st = ekv_error_set(EKV_ERR_INVALID_ARG, "--metric: unknown metric '%s' (ppl, rouge, kl, hitrate, acc)",
                         it[i]);
            break;
        }
    }
    free(it);
    if (st == EKV_OK) *bits = b;
    return st;
}

enum ekv_status ekv_budgets_parse(const char *list, double **budgets, size_t *n) {
    char **it;
    size_t k;
    *budgets = NULL;
    *n = 0;
    enum ekv_status st = ekv_split_list(list, &it, &k);
    if (st != EKV_OK) return ekv_error_prefix(st, "--kv-budget");
    double *b = malloc(k * sizeof *b);
    if (!b) {
        free(it);
        return ekv_error_set(EKV_ERR_NOMEM, "--kv-budget: no memory");
    }
    for (size_t i = 0; i < k && st == EKV_OK; i++) {
        char *end;
        errno = 0;
        double v = strtod(it[i], &end);
        if (end == it[i] || *end || errno == ERANGE || !isfinite(v) || !(v > 0.0) || v > 1.0)
            st = ekv_error_set(EKV_ERR_INVALID_ARG, "--kv-budget: '%s' is not a kept fraction in (0, 1]",
                         it[i]);
        for (size_t j = 0; j < i && st == EKV_OK; j++)
            if (b[j] == v) st = ekv_error_set(EKV_ERR_INVALID_ARG, "--kv-budget: %g given twice", v);
        b[i] = v;
    }
    free(it);
    if (st != EKV_OK) {
        free(b);
        return st;
    }
    *budgets = b;
    *n = k;
    return EKV_OK;
}

static void fmt_hms(char *buf, size_t cap, double s) {
    if (!(s >= 0.0) || s > 359999999.0) {
        snprintf(buf, cap, "--:--:--");
        return;
    }
    unsigned long t = (unsigned long)(s + 0.5);
    snprintf(buf, cap, "%lu:%02lu:%02lu", t / 3600, (t / 60) % 60, t % 60);
}

void ekv_eval_format_progress(char *buf, size_t cap, size_t done, size_t total,
                              double elapsed_s) {
    if (!buf || cap == 0) return;
    char el[32], eta[32];
    fmt_hms(el, sizeof el, elapsed_s);
    if (done == 0 || done > total) snprintf(eta, sizeof eta, "--:--:--");
    else fmt_hms(eta, sizeof eta, elapsed_s / (double)done * (double)(total - done));
    double pct = total ? 100.0 * (double)done / (double)total : 0.0;
    int w = 1;
    for (size_t t = total; t >= 10; t /= 10) w++;
    snprintf(buf, cap, "[%*zu/%zu %5.1f%%] %s elapsed, ETA %s", w, done, total, pct, el, eta);
}

/* ------------------------------------------------------------------------ */
/* Result table                                                               */
/* ------------------------------------------------------------------------ */

void ekv_report_init(struct ekv_report *rep) { memset(rep, 0, sizeof *rep); }

void ekv_report_free(struct ekv_report *rep) {
    if (!rep) return;
    for (size_t i = 0; i < rep->n_rows; i++) {
        free(rep->rows[i].policy);
        free(rep->rows[i].metric);
        free(rep->rows[i].kv_type);
    }
    free(rep->rows);
    free(rep->title);
    free(rep->meta_json);
    memset(rep, 0, sizeof *rep);
}

/* Names go into CSV cells, Markdown cells, gnuplot strings and (metrics)
 * file names, so they are kept to a safe alphabet. */
static bool policy_name_ok(const char *s) {
    if (!s || !*s || strlen(s) > 128) return false;
    for (; *s; s++)
        if (*s <= 0x20 || *s >= 0x7f || *s == ',' || *s == '|' || *s == '"' || *s == '\\' ||
            *s == '\'')
            return false;
    return true;
}

static bool metric_name_ok(const char *s) {
    if (!s || !*s || strlen(s) > 64) return false;
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* NULL-safe equality of two optional labels. */
static bool same_label(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

/* Rows of one series (a line in a plot): the same policy and storage type. */
static bool same_series(const struct ekv_result_row *a, const struct ekv_result_row *b) {
    return strcmp(a->policy, b->policy) == 0 && same_label(a->kv_type, b->kv_type);
}

/* "policy" or "policy type" into buf. */
static const char *series_label(const struct ekv_result_row *r, char *buf, size_t n) {
    if (!r->kv_type) return r->policy;
    snprintf(buf, n, "%s %s", r->policy, r->kv_type);
    return buf;
}

enum ekv_status ekv_report_add(struct ekv_report *rep, const char *policy, double budget,
                               const char *metric, double value, size_t n) {
    return ekv_report_add_kv(rep, policy, NULL, budget, metric, value, n);
}

enum ekv_status ekv_report_add_kv(struct ekv_report *rep, const char *policy, const char *kv_type, double budget,
                                  const char *metric, double value, size_t n) {
    if (kv_type && !policy_name_ok(kv_type))
        return ekv_error_set(EKV_ERR_INVALID_ARG, "report: storage type '%s' is empty, too long or has "
                       "spaces, quotes, ',' or '|'", kv_type);
    if (!policy_name_ok(policy))
        return ekv_error_set(EKV_ERR_INVALID_ARG, "report: policy name '%s' is empty, too long or has "
                       "spaces, quotes, ',' or '|'", policy ? policy : "(null)");
    if (!metric_name_ok(metric))
        return ekv_error_set(EKV_ERR_INVALID_ARG, "report: metric name '%s' must be 1-64 of [A-Za-z0-9_.-]",
                       metric ? metric : "(null)");
    if (!isfinite(budget) || budget < 0.0)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "report: budget %g is not a non-negative number", budget);
    for (size_t i = 0; i < rep->n_rows; i++) {
        const struct ekv_result_row *r = &rep->rows[i];
        if (r->budget == budget && strcmp(r->policy, policy) == 0 && same_label(r->kv_type, kv_type) &&
            strcmp(r->metric, metric) == 0)
            return ekv_error_set(EKV_ERR_INVALID_ARG, "report: %s%s%s at budget %g already has a %s value", policy,
                           kv_type ? " " : "", kv_type ? kv_type : "", budget, metric);
    }
    if (rep->n_rows == rep->cap) {
        size_t nc = rep->cap ? rep->cap * 2 : 16, bytes;
        if (!ev_mul_ok(nc, sizeof *rep->rows, &bytes))
            return ekv_error_set(EKV_ERR_OVERFLOW, "report: %zu rows", nc);
        struct ekv_result_row *p = realloc(rep->rows, bytes);
        if (!p) return ekv_error_set(EKV_ERR_NOMEM, "report: no memory for %zu rows", nc);
        rep->rows = p;
        rep->cap = nc;
    }
    struct ekv_result_row *r = &rep->rows[rep->n_rows];
    r->policy = strdup(policy);
    r->metric = strdup(metric);
    r->kv_type = kv_type ? strdup(kv_type) : NULL;
    if (!r->policy || !r->metric || (kv_type && !r->kv_type)) {
        free(r->policy);
        free(r->metric);
        free(r->kv_type);
        return ekv_error_set(EKV_ERR_NOMEM, "report: no memory for a row");
    }
    r->budget = budget;
    r->value = value;
    r->n = n;
    rep->n_rows++;
    return EKV_OK;
}

enum ekv_status ekv_report_set_title(struct ekv_report *rep, const char *title) {
    char *t = title ? strdup(title) : NULL;
    if (title && !t) return ekv_error_set(EKV_ERR_NOMEM, "report: no memory for the title");
    free(rep->title);
    rep->title = t;
    return EKV_OK;
}

enum ekv_status ekv_report_set_meta(struct ekv_report *rep, const char *meta_json) {
    if (!meta_json) {
        free(rep->meta_json);
        rep->meta_json = NULL;
        return EKV_OK;
    }
    cJSON *j = cJSON_Parse(meta_json);
    bool ok = j && cJSON_IsObject(j);
    cJSON_Delete(j);
    if (!ok) return ekv_error_set(EKV_ERR_INVALID_ARG, "report: meta is not a JSON object");
    char *m = strdup(meta_json);
    if (!m) return ekv_error_set(EKV_ERR_NOMEM, "report: no memory for meta");
    free(rep->meta_json);
    rep->meta_json = m;
    return EKV_OK;
}

enum ekv_status ekv_report_write_csv(const struct ekv_report *rep, const char *path) {
    struct sbuf b = {0};
    sb_printf(&b, "policy,kv_type,budget,metric,value,n\n");
    for (size_t i = 0; i < rep->n_rows; i++) {
        const struct ekv_result_row *r = &rep->rows[i];
        sb_printf(&b, "%s,%s,", r->policy, r->kv_type ? r->kv_type : "");
        sb_num(&b, r->budget, "%.9g");
        sb_printf(&b, ",%s,", r->metric);
        sb_num(&b, r->value, "%.9g");
        sb_printf(&b, ",%zu\n", r->n);
    }
    enum ekv_status st = b.oom ? ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for the CSV", path)
                               : write_file(path, b.s, b.n);
    free(b.s);
    return st;
}

enum ekv_status ekv_report_write_json(const struct ekv_report *rep, const char *path) {
    cJSON *root = cJSON_CreateObject();
    enum ekv_status st = EKV_OK;
    bool ok = root != NULL;
    if (ok && rep->title) ok = cJSON_AddStringToObject(root, "title", rep->title) != NULL;
    if (ok && rep->meta_json) {
        cJSON *m = cJSON_Parse(rep->meta_json);
        ok = m != NULL && cJSON_AddItemToObject(root, "meta", m);
        if (!ok) cJSON_Delete(m);
    }
    cJSON *arr = ok ? cJSON_AddArrayToObject(root, "results") : NULL;
    ok = ok && arr;
    for (size_t i = 0; ok && i < rep->n_rows; i++) {
        const struct ekv_result_row *r = &rep->rows[i];
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(arr, o);
        if (!ok) {
            cJSON_Delete(o);
            break;
        }
        ok = cJSON_AddStringToObject(o, "policy", r->policy) &&
             (!r->kv_type || cJSON_AddStringToObject(o, "kv_type", r->kv_type)) &&
             cJSON_AddNumberToObject(o, "budget", r->budget) &&
             cJSON_AddStringToObject(o, "metric", r->metric) &&
             (isfinite(r->value) ? cJSON_AddNumberToObject(o, "value", r->value) != NULL
                                 : cJSON_AddNullToObject(o, "value") != NULL) &&
             cJSON_AddNumberToObject(o, "n", (double)r->n);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    if (!text) {
        st = ekv_error_set(EKV_ERR_NOMEM, "%s: no memory for the JSON", path);
    } else {
        size_t n = strlen(text);
        text[n] = '\n'; /* replace the NUL: the buffer is only written, never read as a string */
        st = write_file(path, text, n + 1);
    }
    cJSON_free(text);
    cJSON_Delete(root);
    return st;
}

/* Distinct (policy, budget) keys and metrics, in first-seen order, as row
 * indices of their first occurrence. */
struct pivot {
    size_t *keys, n_keys;
    size_t *metrics, n_metrics;
};

static enum ekv_status make_pivot(const struct ekv_report *rep, struct pivot *pv) {
    memset(pv, 0, sizeof *pv);
    size_t n = rep->n_rows ? rep->n_rows : 1;
    pv->keys = malloc(n * sizeof *pv->keys);
    pv->metrics = malloc(n * sizeof *pv->metrics);
    if (!pv->keys || !pv->metrics) {
        free(pv->keys);
        free(pv->metrics);
        return ekv_error_set(EKV_ERR_NOMEM, "report: no memory for the table");
    }
    for (size_t i = 0; i < rep->n_rows; i++) {
        const struct ekv_result_row *r = &rep->rows[i];
        bool seen = false;
        for (size_t k = 0; k < pv->n_keys && !seen; k++) {
            const struct ekv_result_row *q = &rep->rows[pv->keys[k]];
            seen = q->budget == r->budget && same_series(q, r);
        }
        if (!seen) pv->keys[pv->n_keys++] = i;
        seen = false;
        for (size_t k = 0; k < pv->n_metrics && !seen; k++)
            seen = strcmp(rep->rows[pv->metrics[k]].metric, r->metric) == 0;
        if (!seen) pv->metrics[pv->n_metrics++] = i;
    }
    return EKV_OK;
}

/* The value of `metric` in the grid cell of `key` (same policy, type, budget). */
static const struct ekv_result_row *find_row(const struct ekv_report *rep, const struct ekv_result_row *key,
                                             const char *metric) {
    for (size_t i = 0; i < rep->n_rows; i++) {
        const struct ekv_result_row *r = &rep->rows[i];
        if (r->budget == key->budget && same_series(r, key) && strcmp(r->metric, metric) == 0) return r;
    }
    return NULL;
}

static bool any_kv_type(const struct ekv_report *rep) {
    for (size_t i = 0; i < rep->n_rows; i++)
        if (rep->rows[i].kv_type) return true;
    return false;
}

enum ekv_status ekv_report_markdown(const struct ekv_report *rep, char **out) {
    *out = NULL;
    struct pivot pv;
    enum ekv_status st = make_pivot(rep, &pv);
    if (st != EKV_OK) return st;
    struct sbuf b = {0};
    if (rep->title) {
        sb_printf(&b, "**");
        for (const char *p = rep->title; *p; p++) /* keep the title on one line */
            sb_printf(&b, "%c", (*p == '\n' || *p == '\r') ? ' ' : *p);
        sb_printf(&b, "**\n\n");
    }
    const bool types = any_kv_type(rep);
    sb_printf(&b, types ? "| policy | kv_type | budget |" : "| policy | budget |");
    for (size_t m = 0; m < pv.n_metrics; m++) sb_printf(&b, " %s |", rep->rows[pv.metrics[m]].metric);
    sb_printf(&b, types ? "\n|---|---|---:|" : "\n|---|---:|");
    for (size_t m = 0; m < pv.n_metrics; m++) sb_printf(&b, "---:|");
    sb_printf(&b, "\n");
    for (size_t k = 0; k < pv.n_keys; k++) {
        const struct ekv_result_row *key = &rep->rows[pv.keys[k]];
        sb_printf(&b, "| %s | ", key->policy);
        if (types) sb_printf(&b, "%s | ", key->kv_type ? key->kv_type : "-");
        sb_num(&b, key->budget, "%.4g");
        sb_printf(&b, " |");
        for (size_t m = 0; m < pv.n_metrics; m++) {
            const struct ekv_result_row *r = find_row(rep, key, rep->rows[pv.metrics[m]].metric);
            sb_printf(&b, " ");
            if (r) sb_num(&b, r->value, "%.5g");
            else sb_printf(&b, "-");
            sb_printf(&b, " |");
        }
        sb_printf(&b, "\n");
    }
    free(pv.keys);
    free(pv.metrics);
    if (b.oom || !b.s) {
        free(b.s);
        return ekv_error_set(EKV_ERR_NOMEM, "report: no memory for the Markdown table");
    }
    *out = b.s;
    return EKV_OK;
}

enum ekv_status ekv_report_write_markdown(const struct ekv_report *rep, const char *path) {
    char *md;
    enum ekv_status st = ekv_report_markdown(rep, &md);
    if (st != EKV_OK) return st;
    st = write_file(path, md, strlen(md));
    free(md);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Plots                                                                      */
/* ------------------------------------------------------------------------ */

/* Appends s as a gnuplot double-quoted string body (\ and " escaped,
 * control characters dropped). */
static void sb_gp_str(struct sbuf *b, const char *s) {
    for (; *s; s++) {
        if ((unsigned char)*s < 0x20) continue;
        if (*s == '"' || *s == '\\') sb_printf(b, "\\");
        sb_printf(b, "%c", *s);
    }
}

static int cmp_row_budget(const void *pa, const void *pb) {
    const struct ekv_result_row *a = *(const struct ekv_result_row *const *)pa;
    const struct ekv_result_row *b = *(const struct ekv_result_row *const *)pb;
    return (a->budget > b->budget) - (a->budget < b->budget);
}

/* The gnuplot script for one metric; output "<metric>.png" next to it. */
/* Twelve distinguishable colours and point shapes, so that a line's colour
 * and marker together name its policy even when a grid has many policies
 * (gnuplot's default cycle repeats after eight). */
static const char *const k_colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                       "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8"};
static const int k_points[] = {7, 5, 9, 11, 13, 4, 6, 8, 10, 12, 14, 1, 2, 3};

/* The series (policy, storage type) that have rows of this metric, in
 * first-seen order: one representative row each into pol; returns how many. */
static size_t series_of(const struct ekv_report *rep, const char *metric, const struct ekv_result_row **pol) {
    size_t np = 0;
    for (size_t i = 0; i < rep->n_rows; i++) {
        if (strcmp(rep->rows[i].metric, metric) != 0) continue;
        bool seen = false;
        for (size_t k = 0; k < np && !seen; k++) seen = same_series(pol[k], &rep->rows[i]);
        if (!seen) pol[np++] = &rep->rows[i];
    }
    return np;
}

/* The value of metric "<base><suffix>" in r's series at r's budget. */
static bool companion(const struct ekv_report *rep, const struct ekv_result_row *r, const char *base,
                      const char *suffix, double *v) {
    const size_t nb = strlen(base), ns = strlen(suffix);
    for (size_t i = 0; i < rep->n_rows; i++) {
        const struct ekv_result_row *c = &rep->rows[i];
        if (c->budget == r->budget && strlen(c->metric) == nb + ns && !strncmp(c->metric, base, nb) &&
            !strcmp(c->metric + nb, suffix) && same_series(c, r) && isfinite(c->value)) {
            *v = c->value;
            return true;
        }
    }
    return false;
}

/* Whether metric is the "_lo" or "_hi" end of another metric's interval
 * (drawn as that metric's error bars, not a plot of its own). */
static bool interval_end(const struct ekv_report *rep, const char *metric) {
    const size_t n = strlen(metric);
    if (n < 4 || (strcmp(metric + n - 3, "_lo") && strcmp(metric + n - 3, "_hi"))) return false;
    for (size_t i = 0; i < rep->n_rows; i++)
        if (strlen(rep->rows[i].metric) == n - 3 && !strncmp(rep->rows[i].metric, metric, n - 3)) return true;
    return false;
}

static enum ekv_status plot_script(const struct ekv_report *rep, const char *metric,
                                   const struct ekv_plot_opts *o, struct sbuf *b) {
    /* series (policy, storage type) with this metric, first-seen order */
    const struct ekv_result_row **pts = malloc(rep->n_rows * sizeof *pts);
    const struct ekv_result_row **pol = malloc(rep->n_rows * sizeof *pol);
    if (!pts || !pol) {
        free(pts);
        free(pol);
        return ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
    }
    const size_t np = series_of(rep, metric, pol);
    int w = o && o->width > 0 ? o->width : 800, h = o && o->height > 0 ? o->height : 500;
    sb_printf(b, "# ekv eval: %s against KV budget, one line per policy.\n", metric);
    sb_printf(b, "# Written by ekv; run it with: cd <this directory> && gnuplot %s.gp\n", metric);
    sb_printf(b, "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) {\n"
                 "    set terminal pngcairo size %d,%d noenhanced\n"
                 "} else {\n"
                 "    set terminal png size %d,%d noenhanced\n"
                 "}\n", w, h, w, h);
    sb_printf(b, "set output \"%s.png\"\n", metric);
    sb_printf(b, "set title \"");
    if (rep->title) {
        sb_gp_str(b, rep->title);
        sb_printf(b, ": ");
    }
    sb_printf(b, "%s\"\n", metric);
    sb_printf(b, "set xlabel \"KV budget (fraction of tokens kept)\"\n");
    sb_printf(b, "set ylabel \"%s\"\nset grid\nset key outside right top\n", metric);
    double bmax = 0.0;
    for (size_t i = 0; i < rep->n_rows; i++)
        if (strcmp(rep->rows[i].metric, metric) == 0 && rep->rows[i].budget > bmax)
            bmax = rep->rows[i].budget;
    /* x from 0 to just past the largest budget, so that the reference lines
     * of single-budget policies span the plot */
    sb_printf(b, "set xrange [0:%.9g]\n", bmax > 0.0 ? bmax * 1.05 : 1.05);
    sb_printf(b, "set offsets 0, 0, graph 0.05, graph 0.05\n");
    /* A policy measured at a single budget (the full cache, typically) is
     * drawn as a dashed horizontal reference line across the plot. */
    double *single = malloc((np ? np : 1) * sizeof *single);
    bool *bars = malloc((np ? np : 1) * sizeof *bars);
    if (!single || !bars) {
        free(single);
        free(bars);
        free(pts);
        free(pol);
        return ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
    }
    for (size_t k = 0; k < np; k++) {
        size_t n = 0;
        for (size_t i = 0; i < rep->n_rows; i++) {
            const struct ekv_result_row *r = &rep->rows[i];
            if (strcmp(r->metric, metric) == 0 && same_series(r, pol[k]) && isfinite(r->value)) pts[n++] = r;
        }
        qsort(pts, n, sizeof *pts, cmp_row_budget);
        single[k] = n == 1 ? pts[0]->value : NAN;
        /* an interval (metric_lo, metric_hi at every point) becomes error bars */
        bars[k] = n > 0;
        for (size_t i = 0; i < n && bars[k]; i++) {
            double lo, hi;
            bars[k] = companion(rep, pts[i], metric, "_lo", &lo) && companion(rep, pts[i], metric, "_hi", &hi);
        }
        sb_printf(b, "$d%zu << EOD\n", k);
        for (size_t i = 0; i < n; i++) {
            double lo = 0, hi = 0;
            sb_printf(b, "%.9g %.9g", pts[i]->budget, pts[i]->value);
            if (bars[k] && companion(rep, pts[i], metric, "_lo", &lo) && companion(rep, pts[i], metric, "_hi", &hi))
                sb_printf(b, " %.9g %.9g", lo, hi);
            sb_printf(b, "\n");
        }
        sb_printf(b, "EOD\n");
    }
    sb_printf(b, "plot ");
    for (size_t k = 0; k < np; k++) {
        char lab[160];
        const char *title = series_label(pol[k], lab, sizeof lab);
        sb_printf(b, "%s", k ? ", \\\n     " : "");
        if (isfinite(single[k]))
            sb_printf(b, "%.9g with lines dt 2 lw 2 title \"%s\"", single[k], title);
        else
            sb_printf(b, "$d%zu using %s lw 2 lc rgb \"%s\" pt %d title \"%s\"", k,
                      bars[k] ? "1:2:3:4 with yerrorlines" : "1:2 with linespoints",
                      k_colors[k % EV_ARRAY_LEN(k_colors)], k_points[k % EV_ARRAY_LEN(k_points)], title);
    }
    sb_printf(b, "\n");
    free(single);
    free(bars);
    free(pts);
    free(pol);
    return b->oom ? ekv_error_set(EKV_ERR_NOMEM, "plot: no memory for the script") : EKV_OK;
}

/* The x axis of the Pareto view: K/V bytes at the end of each unit as a
 * fraction of a full f32 cache (ekv_eval_cell_report's kv_bytes_frac). */
#define EKV_PARETO_X "kv_bytes_frac"

/* Quality metrics drawn against KV bytes, and whether lower is better. */
static const struct {
    const char *metric;
    bool lower;
} k_pareto[] = {{"ppl", true}, {"kl", true}, {"rouge_l_f", false}};

/* The gnuplot script of "pareto_<metric>": metric against K/V bytes, one
 * point per grid cell (policy x type x budget), the budgets of a series
 * joined; output "pareto_<metric>.png". */
static enum ekv_status pareto_script(const struct ekv_report *rep, const char *metric, bool lower,
                                     const struct ekv_plot_opts *o, struct sbuf *b) {
    const struct ekv_result_row **pol = malloc(rep->n_rows * sizeof *pol);
    const struct ekv_result_row **pts = malloc(rep->n_rows * sizeof *pts);
    if (!pol || !pts) {
        free(pol);
        free(pts);
        return ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
    }
    const size_t np = series_of(rep, metric, pol);
    int w = o && o->width > 0 ? o->width : 900, h = o && o->height > 0 ? o->height : 560;
    sb_printf(b, "# ekv eval: %s against the KV cache's bytes (Pareto view), one point per policy x type x budget.\n",
              metric);
    sb_printf(b, "# Written by ekv; run it with: cd <this directory> && gnuplot pareto_%s.gp\n", metric);
    sb_printf(b, "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) {\n"
                 "    set terminal pngcairo size %d,%d noenhanced\n"
                 "} else {\n"
                 "    set terminal png size %d,%d noenhanced\n"
                 "}\n", w, h, w, h);
    sb_printf(b, "set output \"pareto_%s.png\"\nset title \"", metric);
    if (rep->title) {
        sb_gp_str(b, rep->title);
        sb_printf(b, ": ");
    }
    sb_printf(b, "%s against KV bytes (%s is better)\"\n", metric, lower ? "lower" : "higher");
    sb_printf(b, "set xlabel \"K/V bytes at the end of each item, fraction of a full f32 cache (log scale)\"\n");
    sb_printf(b, "set ylabel \"%s\"\nset logscale x 2\nset grid\nset key outside right top\n", metric);
    sb_printf(b, "set offsets graph 0.02, graph 0.02, graph 0.05, graph 0.05\n");
    size_t drawn = 0;
    for (size_t k = 0; k < np; k++) {
        size_t n = 0;
        for (size_t i = 0; i < rep->n_rows; i++) {
            const struct ekv_result_row *r = &rep->rows[i];
            if (strcmp(r->metric, metric) == 0 && same_series(r, pol[k]) && isfinite(r->value)) pts[n++] = r;
        }
        qsort(pts, n, sizeof *pts, cmp_row_budget);
        sb_printf(b, "$d%zu << EOD\n", k);
        for (size_t i = 0; i < n; i++) {
            const struct ekv_result_row *x = find_row(rep, pts[i], EKV_PARETO_X);
            if (x && isfinite(x->value) && x->value > 0) {
                sb_printf(b, "%.9g %.9g\n", x->value, pts[i]->value);
                drawn++;
            }
        }
        sb_printf(b, "EOD\n");
    }
    sb_printf(b, "plot ");
    for (size_t k = 0; k < np; k++) {
        char lab[160];
        sb_printf(b, "%s$d%zu using 1:2 with linespoints lw 2 lc rgb \"%s\" pt %d ps 1.3 title \"%s\"",
                  k ? ", \\\n     " : "", k, k_colors[k % EV_ARRAY_LEN(k_colors)],
                  k_points[(k / EV_ARRAY_LEN(k_colors)) % EV_ARRAY_LEN(k_points)], series_label(pol[k], lab, sizeof lab));
    }
    sb_printf(b, "\n");
    free(pol);
    free(pts);
    if (b->oom) return ekv_error_set(EKV_ERR_NOMEM, "plot: no memory for the script");
    return drawn ? EKV_OK : EKV_ERR_NOT_FOUND;
}

static char *path_join(const char *dir, const char *name, const char *ext) {
    struct sbuf b = {0};
    sb_printf(&b, "%s/%s%s", dir, name, ext);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* Runs `gnuplot -e "cd '<dir>'" <metric>.gp` with stdout and stderr to
 * log_fd. */
static enum ekv_status run_gnuplot(const char *prog, const char *dir, const char *metric,
                                   int log_fd, const char *log_path) {
    struct sbuf cd = {0}, script = {0};
    sb_printf(&cd, "cd '");
    for (const char *p = dir; *p; p++) {
        if (*p == '\'') sb_printf(&cd, "''");
        else sb_printf(&cd, "%c", *p);
    }
    sb_printf(&cd, "'");
    sb_printf(&script, "%s.gp", metric);
    enum ekv_status st = EKV_OK;
    if (cd.oom || script.oom) {
        st = ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
        goto done;
    }
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) {
        st = ekv_error_set(EKV_ERR_NOMEM, "plot: cannot prepare to run %s", prog);
        goto done;
    }
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
    char *argv[] = {(char *)prog, "-e", cd.s, script.s, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, prog, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc == ENOENT) {
        st = ekv_error_set(EKV_ERR_NOT_FOUND, "plot: '%s' not found in PATH; install gnuplot-nox "
                     "(scripts/setup.sh) or run the .gp scripts in %s later", prog, dir);
        goto done;
    }
    if (rc != 0) {
        st = ekv_error_set(EKV_ERR_IO, "plot: cannot run '%s': %s", prog, strerror(rc));
        goto done;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            st = ekv_error_set(EKV_ERR_IO, "plot: waiting for '%s': %s", prog, strerror(errno));
            goto done;
        }
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        st = ekv_error_set(EKV_ERR_NOT_FOUND, "plot: '%s' not found; install gnuplot-nox "
                     "(scripts/setup.sh) or run the .gp scripts in %s later", prog, dir);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        st = ekv_error_set(EKV_ERR_IO, "plot: '%s' failed on %s/%s.gp (see %s)", prog, dir, metric, log_path);
    }
done:
    free(cd.s);
    free(script.s);
    return st;
}

enum ekv_status ekv_report_plot(const struct ekv_report *rep, const char *dir,
                                const struct ekv_plot_opts *opts) {
    if (!rep || !dir || !*dir) return ekv_error_set(EKV_ERR_INVALID_ARG, "plot: no output directory");
    if (strchr(dir, '\n') || strchr(dir, '\r'))
        return ekv_error_set(EKV_ERR_INVALID_ARG, "plot: directory name has a line break");
    const char *prog = opts && opts->gnuplot ? opts->gnuplot : "gnuplot";
    struct pivot pv;
    enum ekv_status st = make_pivot(rep, &pv);
    if (st != EKV_OK) return st;
    /* 1. scripts */
    for (size_t m = 0; m < pv.n_metrics && st == EKV_OK; m++) {
        const char *metric = rep->rows[pv.metrics[m]].metric;
        if (interval_end(rep, metric)) continue;
        struct sbuf b = {0};
        st = plot_script(rep, metric, opts, &b);
        char *path = st == EKV_OK ? path_join(dir, metric, ".gp") : NULL;
        if (st == EKV_OK && !path) st = ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
        if (st == EKV_OK) st = write_file(path, b.s, b.n);
        free(path);
        free(b.s);
    }
    /* 1b. the Pareto view: quality against KV bytes, when the grid measured them */
    const char *pareto[EV_ARRAY_LEN(k_pareto)];
    size_t n_pareto = 0;
    bool have_x = false;
    for (size_t m = 0; m < pv.n_metrics; m++) have_x |= strcmp(rep->rows[pv.metrics[m]].metric, EKV_PARETO_X) == 0;
    for (size_t q = 0; have_x && q < EV_ARRAY_LEN(k_pareto) && st == EKV_OK; q++) {
        struct sbuf b = {0};
        char name[80];
        snprintf(name, sizeof name, "pareto_%s", k_pareto[q].metric);
        enum ekv_status ps = pareto_script(rep, k_pareto[q].metric, k_pareto[q].lower, opts, &b);
        if (ps == EKV_OK) {
            char *path = path_join(dir, name, ".gp");
            st = path ? write_file(path, b.s, b.n) : ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
            free(path);
            if (st == EKV_OK) pareto[n_pareto++] = k_pareto[q].metric;
        } else if (ps != EKV_ERR_NOT_FOUND) {
            st = ps;
        }
        free(b.s);
    }
    /* 2. gnuplot */
    char *log_path = path_join(dir, "gnuplot", ".log");
    if (st == EKV_OK && !log_path) st = ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
    int log_fd = -1;
    if (st == EKV_OK) {
        log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (log_fd < 0) st = ekv_error_set(EKV_ERR_IO, "%s: cannot create: %s", log_path, strerror(errno));
    }
    for (size_t m = 0; m < pv.n_metrics + n_pareto && st == EKV_OK; m++) {
        char pname[80];
        if (m >= pv.n_metrics) snprintf(pname, sizeof pname, "pareto_%s", pareto[m - pv.n_metrics]);
        const char *metric = m < pv.n_metrics ? rep->rows[pv.metrics[m]].metric : pname;
        if (m < pv.n_metrics && interval_end(rep, metric)) continue;
        char *png = path_join(dir, metric, ".png");
        struct stat sb;
        if (!png) st = ekv_error_set(EKV_ERR_NOMEM, "plot: no memory");
        else if (unlink(png) != 0 && errno != ENOENT)
            st = ekv_error_set(EKV_ERR_IO, "%s: cannot replace: %s", png, strerror(errno));
        if (st == EKV_OK) st = run_gnuplot(prog, dir, metric, log_fd, log_path);
        if (st != EKV_OK) {
            free(png);
            break;
        }
        if (stat(png, &sb) != 0 || sb.st_size == 0)
            st = ekv_error_set(EKV_ERR_IO, "plot: gnuplot made no %s (see %s)", png, log_path);
        free(png);
    }
    if (log_fd >= 0) close(log_fd);
    free(log_path);
    free(pv.keys);
    free(pv.metrics);
    return st;
}
