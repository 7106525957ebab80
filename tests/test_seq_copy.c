/*
 * test_seq_copy.c — ekv_seq_copy on the CPU: a copy goes on exactly as its
 * original, for every policy and storage type. A sequence reads a prompt,
 * is copied, and the original, the copy (its original freed first) and a
 * third sequence that was never copied decode the same tokens: logits,
 * cache lengths, bytes and tokens seen equal bit for bit. Also: what a copy
 * refuses (a prompt half read in pieces). The GPU's copies are checked in
 * test_gpu_policy.c ("copy").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "testutil.h"

enum { N_PROMPT = 48, N_MORE = 12, N_STEPS = 20 };

static int32_t g_toks[N_PROMPT + N_MORE + N_STEPS];
static bool g_compat_ref; /* Elastic's reference mode (--kv-compat ref) for the next cases */

static struct ekv_kv_params params(const char *policy, double budget, enum ekv_kv_type tk, enum ekv_kv_type tv) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = policy;
    p.budget = budget;
    p.type_k = tk;
    p.type_v = tv;
    p.seed = 7;
    p.compat_ref = g_compat_ref;
    return p;
}

/* Original A, its copy B and an uncopied C through the same tokens (with
 * `more`, a second prompt part first, then decoding). */
static void copy_case(const struct ekv_model *m, struct ekv_context *c, const char *policy, double budget,
                      enum ekv_kv_type tk, enum ekv_kv_type tv, bool more) {
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    const size_t V = (size_t)mi.n_vocab;
    struct ekv_kv_params kp = params(policy, budget, tk, tv);
    struct ekv_seq *a = NULL, *b = NULL, *cc = NULL;
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb), *lc = malloc(V * sizeof *lc);
    CHECK(la && lb && lc);
    CHECK_OK(ekv_seq_new(c, &kp, &a));
    CHECK_OK(ekv_seq_new(c, &kp, &cc));
    if (!a || !cc || !la || !lb || !lc) goto done;
    CHECK_OK(ekv_seq_prefill(a, g_toks, N_PROMPT, NULL));
    CHECK_OK(ekv_seq_prefill(cc, g_toks, N_PROMPT, NULL));
    CHECK_OK(ekv_seq_copy(a, &b));
    if (!b) goto done;
    CHECK(tu_same_kv_shape(m, a, b));
    int bad = 0, bad_c = 0;
    if (more) { /* a second prompt part after the copy (the policies that act on prompts see it) */
        CHECK_OK(ekv_seq_prefill(a, g_toks + N_PROMPT, N_MORE, la));
        CHECK_OK(ekv_seq_prefill(b, g_toks + N_PROMPT, N_MORE, lb));
        CHECK_OK(ekv_seq_prefill(cc, g_toks + N_PROMPT, N_MORE, lc));
        bad += memcmp(la, lb, V * sizeof *la) != 0;
        bad_c += memcmp(la, lc, V * sizeof *la) != 0;
    }
    for (int i = 0; i < N_STEPS / 2; i++) {
        const int32_t t = g_toks[N_PROMPT + N_MORE + i];
        CHECK_OK(ekv_seq_decode(a, t, la));
        CHECK_OK(ekv_seq_decode(b, t, lb));
        CHECK_OK(ekv_seq_decode(cc, t, lc));
        bad += memcmp(la, lb, V * sizeof *la) != 0;
        bad_c += memcmp(la, lc, V * sizeof *la) != 0;
    }
    CHECK(tu_same_kv_shape(m, a, b) && tu_same_kv_shape(m, a, cc));
    /* the copy owns all it holds: it goes on after its original is freed */
    struct ekv_seq *b2 = NULL;
    CHECK_OK(ekv_seq_copy(b, &b2));
    ekv_seq_free(a);
    a = NULL;
    for (int i = N_STEPS / 2; i < N_STEPS && b2; i++) {
        const int32_t t = g_toks[N_PROMPT + N_MORE + i];
        CHECK_OK(ekv_seq_decode(b2, t, lb));
        CHECK_OK(ekv_seq_decode(cc, t, lc));
        bad += memcmp(lb, lc, V * sizeof *lb) != 0;
    }
    ekv_seq_free(b2);
    CHECK_MSG(bad == 0, "%s budget %.2f %s/%s: the copy's logits differ from the original's at %d steps", policy,
              budget, ekv_kv_type_name(tk), ekv_kv_type_name(tv), bad);
    CHECK_MSG(bad_c == 0, "%s budget %.2f %s/%s: copying changed the original (%d steps differ)", policy, budget,
              ekv_kv_type_name(tk), ekv_kv_type_name(tv), bad_c);
done:
    ekv_seq_free(a);
    ekv_seq_free(b);
    ekv_seq_free(cc);
    free(la), free(lb), free(lc);
}

/* types: 0 = the float types (any head_dim), 1 = the quantised ones (head_dim 64) */
static void test_policies(const struct ekv_model *m, struct ekv_context *c, int types_set) {
    static const char *pols[] = {"full",   "random", "local",      "h2o",  "scissorhands", "tova",
                                 "roco",   "snapkv", "pyramidkv",  "vlcache", "elastic",   "elastic-v2",
                                 "elastic-v2:bias=1:key=rotate", "elastic-v2:decode=fixed"};
    const enum ekv_kv_type types[2][3][2] = {
        {{EKV_KV_F32, EKV_KV_F32}, {EKV_KV_F16, EKV_KV_F32}, {EKV_KV_F16, EKV_KV_F16}},
        {{EKV_KV_Q8_0, EKV_KV_Q4_0}, {EKV_KV_KIVI4, EKV_KV_Q8_0}, {EKV_KV_KIVI2, EKV_KV_KIVI2}}};
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++)
        for (size_t ti = 0; ti < 3; ti++)
            copy_case(m, c, pols[pi], pi == 0 ? 1.0 : 0.3, types[types_set][ti][0], types[types_set][ti][1],
                      ti == 1);
    if (types_set) return;
    g_compat_ref = true;
    copy_case(m, c, "elastic", 0.3, EKV_KV_F32, EKV_KV_F32, false);
    copy_case(m, c, "elastic", 0.5, EKV_KV_F16, EKV_KV_F16, true);
    g_compat_ref = false;
    /* block-wise prompt reading and a cap on entries */
    struct ekv_kv_params kp = params("h2o", 0.4, EKV_KV_F16, EKV_KV_F16);
    kp.chunk = 16;
    kp.max_tokens = 20;
    struct ekv_seq *a = NULL, *b = NULL;
    CHECK_OK(ekv_seq_new(c, &kp, &a));
    if (a) CHECK_OK(ekv_seq_prefill(a, g_toks, N_PROMPT, NULL));
    if (a) CHECK_OK(ekv_seq_copy(a, &b));
    if (a && b) {
        CHECK(tu_same_kv_shape(m, a, b) && ekv_seq_kv_layer_len(b, 0, 0) <= 20);
        CHECK_OK(ekv_seq_decode(a, 5, NULL));
        CHECK_OK(ekv_seq_decode(b, 5, NULL));
        CHECK(tu_same_kv_shape(m, a, b));
    }
    ekv_seq_free(a), ekv_seq_free(b);
}

static void test_refused(const struct ekv_model *m, struct ekv_context *c) {
    (void)m;
    struct ekv_seq *s = NULL, *out = (struct ekv_seq *)&s;
    CHECK(ekv_seq_copy(NULL, &out) == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_seq_new(c, NULL, &s));
    CHECK(ekv_seq_copy(s, NULL) == EKV_ERR_INVALID_ARG);
    /* a prompt half read in pieces cannot be copied; once read, it can */
    struct ekv_segment seg = {.tokens = g_toks, .n = N_PROMPT, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &seg, .n_segs = 1, .is_prompt = true};
    struct ekv_prefill *p = NULL;
    if (s) CHECK_OK(ekv_prefill_new(s, &in, 8, &p));
    bool done = false;
    if (p) CHECK_OK(ekv_prefill_step(p, 1, NULL, &done));
    CHECK(!done);
    out = (struct ekv_seq *)&s;
    CHECK(s && ekv_seq_copy(s, &out) == EKV_ERR_INVALID_ARG && out == NULL && strstr(ekv_last_error(), "in pieces"));
    while (p && !done) CHECK_OK(ekv_prefill_step(p, 1000, NULL, &done));
    ekv_prefill_free(p);
    CHECK_OK(ekv_seq_copy(s, &out));
    CHECK(out && ekv_seq_n_seen(out) == N_PROMPT);
    ekv_seq_free(out);
    ekv_seq_free(s);
    ekv_seq_free(NULL);
}

/* One model's cases: its tokens, a CPU context. */
static void on_model(const char *path, int types_set) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m) return;
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    for (int32_t i = 0; i < N_PROMPT + N_MORE + N_STEPS; i++) g_toks[i] = 1 + (i * 37 + 11) % (mi.n_vocab - 1);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_ctx = 256;
    cp.device = "cpu";
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    if (c) test_policies(m, c, types_set);
    if (c && types_set == 0) test_refused(m, c);
    ekv_context_free(c);
    ekv_model_free(m);
}

int main(void) {
    on_model(tu_src("models/stories260K.gguf"), 0);
    /* the quantised types need head_dim 64: TinyLlama's layout at small width */
    char path[96], cmd[512];
    snprintf(path, sizeof path, "/tmp/ekv-test-seq-copy-%ld.gguf", (long)getpid());
    snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset tiny-llama3 --type f32 -o '%s' > /dev/null 2>&1", tu_bin(), path);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    on_model(path, 1);
    remove(path);
    return test_finish("test_seq_copy");
}
