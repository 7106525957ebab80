/*
 * testutil.h — a tiny assertion harness for ekv's C tests. Each failed
 * check prints file:line and the expression; test_finish() prints
 * "N passed, N failed" and returns the exit status.
 */
#ifndef EKV_TESTUTIL_H
#define EKV_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

extern int tu_pass, tu_fail;

#define CHECK(cond) do { if (cond) tu_pass++; else { tu_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { if (cond) tu_pass++; else { tu_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_OK(expr) do { enum ekv_status s_ = (expr); if (s_ == EKV_OK) tu_pass++; else { tu_fail++; \
    fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr, \
            ekv_status_str(s_), ekv_last_error()); } } while (0)
#define CHECK_NEAR(a, b, tol) CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), \
    "%s = %.9g, %s = %.9g, tol %.3g", #a, (double)(a), #b, (double)(b), (double)(tol))

/* Path helpers: repository file and ../shared file (static buffer per call slot). */
const char *tu_src(const char *rel);
const char *tu_shared(const char *rel);
/* The build folder (for the ekv binary). */
const char *tu_bin(void);
/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL on failure. */
char *tu_read_file(const char *path, size_t *len);
int test_finish(const char *name);
/* Whether two sequences of model m hold the same entries per (layer, KV
 * head), K/V bytes, evicted and merged counts and tokens seen. */
struct ekv_model;
struct ekv_seq;
bool tu_same_kv_shape(const struct ekv_model *m, const struct ekv_seq *a, const struct ekv_seq *b);

#endif
