/*
 * testutil.h — a tiny assertion harness for ekv's C tests. Each failed
 * check prints file:line and the expression; test_finish() prints
 * "N passed, N failed" and returns the exit status.
 */
#ifndef EKV_TESTUTIL_H
#define EKV_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ekv.h"

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
/* Runs `ekv mkmodel ARGS` from the build directory (output discarded);
 * system()'s status. */
int tu_mkmodel(const char *args);
/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL on failure. */
char *tu_read_file(const char *path, size_t *len);
int test_finish(const char *name);
/* Whether two sequences of model m hold the same entries per (layer, KV
 * head), K/V bytes, evicted and merged counts and tokens seen. */
struct ekv_model;
struct ekv_seq;
bool tu_same_kv_shape(const struct ekv_model *m, const struct ekv_seq *a, const struct ekv_seq *b);
/* A teacher-forced run on a new sequence of ctx with the KV params kv:
 * the prompt toks[0, n_prompt), then n_gen decode steps fed toks[n_prompt
 * + t - 1]. Logits of the prompt and every step into lg [(n_gen + 1)][n_vocab]
 * when lg is not NULL; step(seq, t, ud) after the prompt (t = 0) and each
 * step t when not NULL. The first failing status. */
/* One prompt of T tokens through layer 0 of a cache (ekv_kv_begin,
 * ekv_kv_layer_forward, ekv_kv_end; no model): queries q [T][n_head][d],
 * keys k and values v [T][d] of its one KV head, output into out. */
struct ekv_kv;
enum ekv_status tu_kv_prompt(struct ekv_kv *kv, int T, const float *q, const float *k, const float *v, float *out);
/* The bundled stories260K (*m), a context of 512 positions on 2 threads
 * (*ctx) and data/tinystories_eval.jsonl tokenized (*toks, *n_toks: at
 * least 64 tokens of room past the text); each checked. Returns false when
 * a step failed; the caller frees what was made (NULL otherwise). */
bool tu_load_stories(struct ekv_model **m, struct ekv_context **ctx, int32_t **toks, size_t *n_toks);
typedef void (*tu_step_fn)(struct ekv_seq *seq, int t, void *ud);
enum ekv_status tu_run_forced(struct ekv_context *ctx, int32_t n_vocab, const struct ekv_kv_params *kv,
                              const int32_t *toks, int n_prompt, int n_gen, float *lg, tu_step_fn step, void *ud);

#endif
