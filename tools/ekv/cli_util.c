/*
 * cli_util.c — the small utilities the ekv sub-commands share (cli.h):
 * printing a failed call's status and message, usage errors, finding the
 * shipped model and files, loading the model the options name, the -l
 * logit biases, clocks,
 * resident memory, reading a whole file. The option layer is common.c.
 */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

int cli_fail(const char *cmd, enum ekv_status s) {
    const char *d = ekv_last_error();
    fprintf(stderr, "ekv %s: error: %s%s%s\n", cmd, ekv_status_str(s), d[0] ? ": " : "", d);
    return 1;
}

bool cli_logit_bias_parse(const char *v, long *tok, double *bias) {
    char *end = NULL;
    errno = 0;
    const long t = strtol(v, &end, 10);
    if (end == v || !isdigit((unsigned char)v[0]) || errno || t > INT32_MAX || (*end != '+' && *end != '-'))
        return false;
    const double sign = *end == '-' ? -1.0 : 1.0;
    const char *num = end + 1;
    double b;
    if (!strcmp(num, "inf")) {
        if (sign > 0) return false;
        b = INFINITY;
    } else {
        if (!isdigit((unsigned char)num[0]) && !(num[0] == '.' && isdigit((unsigned char)num[1]))) return false;
        errno = 0;
        b = strtod(num, &end);
        if (*end || errno || !(b <= FLT_MAX)) return false;
    }
    *tok = t;
    *bias = sign * b;
    return true;
}

bool cli_logit_bias_check(const char *cmd, const struct cli_list *l, int32_t n_vocab) {
    for (int i = 0; i < l->n; i++)
        if (l->i[i] >= n_vocab) {
            fprintf(stderr, "ekv %s: error: --logit-bias: token %ld is not in the model's vocabulary [0, %d)\n", cmd,
                    l->i[i], (int)n_vocab);
            return false;
        }
    return true;
}

enum ekv_status cli_logit_bias_set(const struct cli_list *l, struct ekv_sampler *smp) {
    int32_t tok[CLI_LIST_MAX];
    float val[CLI_LIST_MAX];
    for (int i = 0; i < l->n; i++) tok[i] = (int32_t)l->i[i], val[i] = (float)l->d[i];
    return l->n ? ekv_sampler_set_logit_bias(smp, tok, val, l->n) : EKV_OK;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "ekv %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see 'ekv %s --help')\n", cmd);
    return 1;
}

const char *cli_find_file(const char *rel, char *buf, size_t n) {
    if (access(rel, R_OK) == 0) return rel;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            if ((size_t)snprintf(buf, n, "%s/../%s", exe, rel) < n && access(buf, R_OK) == 0) return buf;
            if ((size_t)snprintf(buf, n, "%s/%s", exe, rel) < n && access(buf, R_OK) == 0) return buf;
        }
    }
#ifdef EKV_SOURCE_DIR
    if ((size_t)snprintf(buf, n, "%s/%s", EKV_SOURCE_DIR, rel) < n && access(buf, R_OK) == 0) return buf;
#endif
    return rel;
}

const char *cli_default_model(void) {
    static char buf[4096];
    return cli_find_file("models/stories260K.gguf", buf, sizeof buf);
}

bool cli_load_model(const char *cmd, const struct cli_params *p, struct ekv_model **model,
                    struct ekv_context **ctx) {
    *model = NULL;
    if (ctx) *ctx = NULL;
    struct ekv_model_params mp = ekv_model_default_params();
    mp.tokenizer_path = p->tokenizer;
    mp.no_repack = p->no_repack;
    enum ekv_status s = ekv_model_load(p->model ? p->model : cli_default_model(), &mp, model);
    if (s != EKV_OK) return cli_fail(cmd, s), false;
    if (!ctx) return true;
    struct ekv_context_params cp = ekv_context_default_params();
    if (p->threads > 0) cp.n_threads = (int32_t)p->threads;
    cp.n_ctx = (int32_t)p->n_ctx;
    cp.device = p->device;
    if ((s = ekv_context_new(*model, &cp, ctx)) != EKV_OK) {
        cli_fail(cmd, s);
        ekv_model_free(*model);
        *model = NULL;
        return false;
    }
    return true;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t cli_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (uint64_t)ru.ru_maxrss * 1024u;
}

uint64_t cli_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, res = 0;
    int got = fscanf(f, "%llu %llu", &size, &res);
    fclose(f);
    return got == 2 ? (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

char *cli_read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ekv %s: error: cannot open '%s': %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        fprintf(stderr, "ekv %s: error: cannot read '%s'\n", cmd, path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
