/*
 * common.c — option parsing and small utilities shared by the ekv
 * sub-commands (see cli.h).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
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

bool cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        cli_usage_error(cmd, "%s expects an integer in [%ld, %ld], got '%s'", opt, lo, hi, v ? v : "(nothing)");
        return false;
    }
    *out = x;
    return true;
}

bool cli_double(const char *cmd, const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        cli_usage_error(cmd, "%s expects a number in [%g, %g], got '%s'", opt, lo, hi, v ? v : "(nothing)");
        return false;
    }
    *out = x;
    return true;
}

int cli_parse_kv_opt(const char *cmd, int argc, char **argv, int *i, struct ekv_kv_params *p) {
    const char *a = argv[*i];
    if (strncmp(a, "--kv-", 5) != 0) return 0;
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long x;
    double d;
    if (!strcmp(a, "--kv-policy")) {
        if (!v) return cli_usage_error(cmd, "--kv-policy needs a name"), -1;
        p->policy = v;
    } else if (!strcmp(a, "--kv-budget")) {
        if (!cli_double(cmd, a, v, 1e-6, 1.0, &d)) return -1;
        p->budget = d;
    } else if (!strcmp(a, "--kv-tokens")) {
        if (!cli_int(cmd, a, v, 1, 1L << 30, &x)) return -1;
        p->max_tokens = (int32_t)x;
    } else if (!strcmp(a, "--kv-sinks")) {
        if (!cli_int(cmd, a, v, 0, 1L << 30, &x)) return -1;
        p->sinks = (int32_t)x;
    } else if (!strcmp(a, "--kv-window")) {
        if (!cli_int(cmd, a, v, 0, 1L << 30, &x)) return -1;
        p->window = (int32_t)x;
    } else if (!strcmp(a, "--kv-obs-window")) {
        if (!cli_int(cmd, a, v, 1, 1L << 30, &x)) return -1;
        p->obs_window = (int32_t)x;
    } else if (!strcmp(a, "--kv-pool")) {
        if (!cli_int(cmd, a, v, 1, 1001, &x)) return -1;
        if (x % 2 == 0) return cli_usage_error(cmd, "--kv-pool must be odd, got %ld", x), -1;
        p->pool = (int32_t)x;
    } else if (!strcmp(a, "--kv-pool-type")) {
        if (v && !strcmp(v, "avg")) p->pool_kind = EKV_POOL_AVG;
        else if (v && !strcmp(v, "max")) p->pool_kind = EKV_POOL_MAX;
        else return cli_usage_error(cmd, "--kv-pool-type expects avg or max"), -1;
    } else if (!strcmp(a, "--kv-distance")) {
        if (!cli_int(cmd, a, v, -(1L << 30), 1L << 30, &x)) return -1;
        p->distance = (int32_t)x;
    } else if (!strcmp(a, "--kv-chunk")) {
        if (!cli_int(cmd, a, v, 0, 1L << 30, &x)) return -1;
        p->chunk = (int32_t)x;
    } else if (!strcmp(a, "--kv-beta")) {
        if (!cli_double(cmd, a, v, 1.0, 1e6, &d)) return -1;
        p->beta = d;
    } else if (!strcmp(a, "--kv-sparsity-p")) {
        if (!cli_double(cmd, a, v, 0.0, 1.0, &d)) return -1;
        p->sparsity_p = d;
    } else if (!strcmp(a, "--kv-recent-ratio")) {
        if (!cli_double(cmd, a, v, 0.0, 1.0, &d)) return -1;
        p->recent_ratio = d;
    } else if (!strcmp(a, "--kv-seed")) {
        if (!cli_int(cmd, a, v, 0, __LONG_MAX__, &x)) return -1;
        p->seed = (uint64_t)x;
    } else if (!strcmp(a, "--kv-compat")) {
        if (v && !strcmp(v, "ref")) p->compat_ref = true;
        else if (v && !strcmp(v, "paper")) p->compat_ref = false;
        else return cli_usage_error(cmd, "--kv-compat expects 'paper' or 'ref'"), -1;
    } else {
        return 0;
    }
    (*i)++;
    return 1;
}

void cli_print_kv_help(FILE *out) {
    fprintf(out,
            "KV-cache policy (POLICIES.md gives exact semantics; -1/omitted = the policy's default):\n"
            "  --kv-policy NAME      one of:");
    for (int i = 0; i < ekv_kv_policy_count(); i++) fprintf(out, " %s", ekv_kv_policy_name(i));
    fprintf(out,
            " (default full)\n"
            "  --kv-budget F         fraction of tokens seen that is kept, (0,1] (default 1)\n"
            "  --kv-tokens N         cap on entries per layer and KV head\n"
            "  --kv-sinks N          protected first tokens (local 4, roco 4, elastic 1)\n"
            "  --kv-window N         protected recent tokens (h2o/scissorhands: half the budget)\n"
            "  --kv-obs-window N     observation window of queries (snapkv/pyramidkv: 32)\n"
            "  --kv-pool N           pooling kernel, odd (snapkv/pyramidkv: 7)\n"
            "  --kv-pool-type T      avg or max (default max)\n"
            "  --kv-distance N       Elastic Cache fixed-point distance (default -25)\n"
            "  --kv-chunk N          block-wise prefill: compress after every N prompt tokens\n"
            "  --kv-beta F           PyramidKV beta (default 20)\n"
            "  --kv-sparsity-p F     VL-Cache threshold p (default 0.01)\n"
            "  --kv-recent-ratio F   recent share of the budget (vlcache 0.1)\n"
            "  --kv-seed N           seed of the random policy\n"
            "  --kv-compat paper|ref reproduce the authors' reference code (elastic)\n");
    fprintf(out, "policies:\n");
    for (int i = 0; i < ekv_kv_policy_count(); i++)
        fprintf(out, "  %-13s %s\n", ekv_kv_policy_name(i), ekv_kv_policy_summary(i));
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
