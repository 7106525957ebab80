/*
 * gpupolicy.h — what test_gpu_policy.c's parts share (gpupolicy.c): the
 * device under test, the token streams, the test models, KV parameters,
 * and one policy run on the GPU beside the CPU (run_case_n), which most
 * parts are made of.
 */
#ifndef EKV_GPUPOLICY_H
#define EKV_GPUPOLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "kv/kv.h"

/* The test's token stream: a story of the bundled eval set, then more of
 * the same text as needed (make_tokens). */
#define N_PROMPT 64
#define N_STEPS 40
/* KIVI's group and residual in these tests: small, so that a 64-token
 * prompt quantises (the default residual of 128 would keep it in fp16) */
#define KIVI_G 16
#define KIVI_R 16

extern char g_dev[32]; /* the device under test (main) */
extern int32_t g_toks[N_PROMPT + N_STEPS + 1];
/* model_b: a random-weight model of TinyLlama's layout at small width
 * (head_dim 64, so that q8_0 and q4_0 rows fit), made once by main for the
 * parts that use it, and its token stream */
extern int32_t g_toks_b[N_PROMPT + N_STEPS + 1];
extern struct ekv_model *g_mb;
/* An image for M-RoPE models (test_mrope): when set, a prompt is text
 * toks[0, 8), these g_img_w x g_img_h rows, then text toks[8, n). */
extern const float *g_img;
extern int32_t g_img_w, g_img_h;

/* `ekv mkmodel ARGS` into /tmp/ekv-test-gpu-policy-TAG-PID.gguf (path), loaded. */
struct ekv_model *mk_model(const char *args, const char *tag, char *path, size_t cap);
/* model_b made into path; fills g_toks_b. */
struct ekv_model *model_b(char *path, size_t cap);
/* Fills g_toks from m's tokenizer; false when the text is too short. */
bool make_tokens(const struct ekv_model *m);
/* A policy at a budget with type t for K and V (KIVI_G, KIVI_R). */
struct ekv_kv_params kv_params(const char *policy, double budget, enum ekv_kv_type t);
/* Reads a prompt of n tokens (and g_img when set), last row's logits. */
enum ekv_status prompt_in(struct ekv_seq *s, const int32_t *toks, int32_t n, float *logits);
/* Relative difference of two arrays (max |a - b| / max |b|). */
double rel_diff_d(const double *a, const double *b, int32_t n);
/* Kept positions and weights of every head equal (count of heads that differ). */
int heads_differ(const struct ekv_kv *a, const struct ekv_kv *b);
/* The rows the device holds against the CPU cache's, max |gpu - cpu| / max |cpu| over each head. */
double rows_diff(struct ekv_kv *a, struct ekv_kv *b);
double log_softmax_at(const float *x, int32_t n, int32_t t);
/* One policy x budget x type, GPU beside CPU (and, at budget 1.0, beside
 * the GPU's full cache), a prompt of n_prompt tokens of toks then N_STEPS
 * teacher-forced steps; run_case: n_prompt = N_PROMPT. */
void run_case_n(const struct ekv_model *m, struct ekv_context *cg, struct ekv_context *cc, const int32_t *toks,
                int32_t n_prompt, const char *pol, double budget, enum ekv_kv_type t);
void run_case(const struct ekv_model *m, struct ekv_context *cg, struct ekv_context *cc, const int32_t *toks,
              const char *pol, double budget, enum ekv_kv_type t);

#endif
