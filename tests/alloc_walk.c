/*
 * alloc_walk.c — the wrapped allocator and the walk (alloc_walk.h): a
 * counter of allocations since the scenario started and the one that
 * fails, both atomic (the server's scenario allocates on several threads).
 */
#include <execinfo.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc_walk.h"
#include "core/util.h"
#include "testutil.h"

/* ---- the wrapped allocator ---- */

static atomic_long g_count;   /* allocations since the scenario started */
static atomic_long g_fail_at; /* the one that fails (0: none) */

static bool g_trace; /* $EKV_ALLOC_FAIL_TRACE: the failing allocation's call stack on stderr */

/* The failing allocation's call stack, kept for a run whose results differ
 * (printed then: the failure that changed an answer, found in one run). */
static void *g_fail_pcs[32];
static atomic_int g_fail_depth;

long aw_failing(void) { return atomic_load(&g_fail_at); }

static int fail_now(void) {
    const long at = atomic_load(&g_fail_at);
    if (at <= 0) {
        atomic_fetch_add(&g_count, 1);
        return 0;
    }
    if (atomic_fetch_add(&g_count, 1) + 1 != at) return 0;
    const int n = backtrace(g_fail_pcs, 32); /* exactly one allocation per run gets here */
    atomic_store(&g_fail_depth, n);
    if (g_trace) {
        fprintf(stderr, "  allocation %ld fails here:\n", at);
        backtrace_symbols_fd(g_fail_pcs, n, 2);
    }
    return 1;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) { return fail_now() ? NULL : __real_calloc(n, m); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { return fail_now() ? NULL : __real_aligned_alloc(a, n); }
char *__wrap_strdup(const char *s) {
    if (fail_now()) return NULL;
    const size_t n = strlen(s) + 1;
    char *d = __real_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- the walk ---- */

long aw_sites, aw_clean, aw_absorbed;
char aw_msg[AW_MSG_MAX];
bool aw_defect;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void aw_walk(const char *name, aw_scenario fn, void *arg) {
    const double t0 = now_s();
    double want = 0, got = 0;
    atomic_store(&g_fail_at, 0);
    atomic_store(&g_count, 0);
    aw_defect = false;
    void *warm[2];
    backtrace(warm, 2); /* its first call loads libgcc: not inside a failing run */
    const enum ekv_status s0 = fn(arg, &want);
    const long total = atomic_load(&g_count);
    CHECK_MSG(s0 == EKV_OK && !aw_defect, "%s without failures: %s", name, aw_msg[0] ? aw_msg : ekv_last_error());
    long clean = 0, absorbed = 0, silent = 0, wrong = 0, defects = 0;
    const bool progress = getenv("EKV_ALLOC_FAIL_GPU") || getenv("EKV_ALLOC_FAIL_PROGRESS"); /* long walks */
    if (progress) fprintf(stderr, "%s: %ld allocations, one run %.2f s\n", name, total, now_s() - t0);
    /* resume a long walk at an allocation, or look at a few (EKV_ALLOC_FAIL_TO, _TRACE) */
    const char *from = progress ? getenv("EKV_ALLOC_FAIL_FROM") : NULL, *to = progress ? getenv("EKV_ALLOC_FAIL_TO") : NULL;
    g_trace = progress && getenv("EKV_ALLOC_FAIL_TRACE");
    const bool msgs = progress && getenv("EKV_ALLOC_FAIL_MSGS"); /* each clean error's message */
    /* every k-th allocation only (the ThreadSanitizer build, ~10x slower, walks a sample) */
    const char *every = getenv("EKV_ALLOC_FAIL_STRIDE");
    const long stride = every && atol(every) > 1 ? atol(every) : 1;
    long runs = 0;
    for (long n = from ? atol(from) : 1; n <= (to && atol(to) < total ? atol(to) : total); n += stride) {
        runs++;
        if (progress && n % 100 == 0) fprintf(stderr, "%s: %ld of %ld, %.0f s\n", name, n, total, now_s() - t0);
        atomic_store(&g_count, 0);
        atomic_store(&g_fail_at, n);
        atomic_store(&g_fail_depth, 0);
        got = 0;
        ekv_err_clear();
        aw_msg[0] = 0;
        aw_defect = false;
        const enum ekv_status s = fn(arg, &got);
        atomic_store(&g_fail_at, 0);
        if (aw_defect) { /* the scenario said what (stderr) */
            defects++;
            fprintf(stderr, "  %s: allocation %ld failed: the scenario's checks failed (above)\n", name, n);
        } else if (s == EKV_OK) {
            absorbed++;
            if (got != want && !(isnan(got) && isnan(want))) {
                wrong++;
                if (wrong <= 3) {
                    fprintf(stderr, "  %s: allocation %ld failed, the scenario succeeded with other results; "
                                    "the allocation that failed:\n", name, n);
                    const int d = atomic_load(&g_fail_depth);
                    if (d > 0) backtrace_symbols_fd(g_fail_pcs, d, 2);
                    else fprintf(stderr, "  (none reached: the run allocated less than without failures)\n");
                }
            }
        } else if (!aw_msg[0] && !ekv_last_error()[0]) {
            silent++;
            if (silent <= 3) fprintf(stderr, "  %s: allocation %ld failed: status %d without a message\n", name, n, (int)s);
        } else {
            clean++;
            if (msgs) fprintf(stderr, "  allocation %ld: %s\n", n, aw_msg[0] ? aw_msg : ekv_last_error());
        }
    }
    CHECK_MSG(silent == 0 && wrong == 0 && defects == 0,
              "%s: %ld of %ld failures without a message, %ld absorbed with other results, %ld failed checks", name,
              silent, total, wrong, defects);
    if (stride > 1)
        printf("%-34s %5ld allocations, every %ld-th failed (%ld runs): %5ld clean errors, %4ld absorbed (%.1f s)\n", name,
               total, stride, runs, clean, absorbed, now_s() - t0);
    else
        printf("%-34s %5ld allocations, each failed in turn: %5ld clean errors, %4ld absorbed (%.1f s)\n", name, total, clean,
               absorbed, now_s() - t0);
    aw_sites += runs;
    aw_clean += clean;
    aw_absorbed += absorbed;
}
