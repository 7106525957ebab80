/*
 * test_shared_prefill.c — ekv_seq_eval_shared: one prompt read once for
 * many caches leaves each exactly as reading it alone would. For every
 * policy (options, +merge and +adakv included) at budgets 0.2, 0.5 and 1.0,
 * in one shared forward per storage type, against the same sequence that
 * read the prompt by itself: the prompt's logits, the saved cache
 * (ekv_seq_save_mem: every entry's K/V bits, positions, weights,
 * statistics and the policy's state) and the logits of the decode steps
 * after it, all bit for bit. Prompts with an image-tagged span (VL-Cache's
 * windows) and a sliding-window model (rows that see part of the cache)
 * included. Also what it refuses, and that a refusal leaves the sequences
 * usable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "testutil.h"

enum { N_PROMPT = 48, N_IMG = 12, N_STEPS = 10 };

static int32_t g_toks[N_PROMPT + N_STEPS];

static const char *g_pols[] = {"full",        "random",       "local",
                               "h2o",         "scissorhands", "tova",
                               "roco",        "snapkv",       "pyramidkv",
                               "vlcache",     "elastic",      "elastic-v2",
                               "elastic-v2:bias=1:key=rotate", "snapkv+merge", "h2o+merge:merge_to=pos",
                               "snapkv+adakv", "vlcache+adakv", "h2o+adakv+merge"};
static const double g_budgets[] = {0.2, 0.5, 1.0};
#define N_POL (sizeof g_pols / sizeof g_pols[0])
#define N_BUD (sizeof g_budgets / sizeof g_budgets[0])
#define N_SEQ (N_POL * N_BUD)

static struct ekv_kv_params params(size_t i, enum ekv_kv_type tk, enum ekv_kv_type tv) {
    struct ekv_kv_params p = ekv_kv_default_params();
    p.policy = g_pols[i / N_BUD];
    p.budget = g_budgets[i % N_BUD];
    p.type_k = tk;
    p.type_v = tv;
    p.seed = 3;
    p.recompress = 4; /* the prompt-only policies re-select during the steps too */
    return p;
}

/* The prompt: tokens, or tokens around n_img image-tagged embedding rows. */
struct prompt {
    struct ekv_segment seg[3];
    struct ekv_input in;
    float *embd;
};

static void make_prompt(struct prompt *p, int64_t n_embd, int n_img) {
    memset(p, 0, sizeof *p);
    if (n_img == 0) {
        p->seg[0] = (struct ekv_segment){.tokens = g_toks, .n = N_PROMPT, .tag = EKV_TAG_TEXT};
        p->in = (struct ekv_input){.segs = p->seg, .n_segs = 1, .is_prompt = true};
        return;
    }
    p->embd = malloc((size_t)n_img * (size_t)n_embd * sizeof(float));
    CHECK(p->embd != NULL);
    if (!p->embd) return;
    for (size_t i = 0; i < (size_t)n_img * (size_t)n_embd; i++) p->embd[i] = (float)((i * 7919u) % 101) / 50.0f - 1.0f;
    const int32_t a = 6, b = N_PROMPT - a - n_img;
    p->seg[0] = (struct ekv_segment){.tokens = g_toks, .n = a, .tag = EKV_TAG_TEXT};
    p->seg[1] = (struct ekv_segment){.embd = p->embd, .n = n_img, .tag = EKV_TAG_IMAGE};
    p->seg[2] = (struct ekv_segment){.tokens = g_toks + a, .n = b, .tag = EKV_TAG_TEXT};
    p->in = (struct ekv_input){.segs = p->seg, .n_segs = 3, .is_prompt = true};
}

/* Saved bytes of a and b are equal (NULL-safe). */
static bool same_saved(const struct ekv_seq *a, const struct ekv_seq *b) {
    void *da = NULL, *db = NULL;
    size_t na = 0, nb = 0;
    const bool ok = ekv_seq_save_mem(a, NULL, 0, &da, &na) == EKV_OK && ekv_seq_save_mem(b, NULL, 0, &db, &nb) == EKV_OK &&
                    na == nb && memcmp(da, db, na) == 0;
    free(da);
    free(db);
    return ok;
}

/* Every policy x budget of one storage type: shared prompt vs alone. */
static void shared_case(const struct ekv_model *m, struct ekv_context *c, enum ekv_kv_type tk, enum ekv_kv_type tv,
                        int n_img) {
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    const size_t V = (size_t)mi.n_vocab;
    struct prompt pr;
    make_prompt(&pr, mi.n_embd, n_img);
    struct ekv_seq *sh[N_SEQ] = {NULL};
    float *ls = malloc(V * sizeof *ls), *la = malloc(V * sizeof *la), *ls2 = malloc(V * sizeof *ls2);
    CHECK(ls && la && ls2);
    bool made = ls && la && ls2 && (n_img == 0 || pr.embd);
    for (size_t i = 0; i < N_SEQ && made; i++) {
        struct ekv_kv_params kp = params(i, tk, tv);
        CHECK_OK(ekv_seq_new(c, &kp, &sh[i]));
        made = sh[i] != NULL;
    }
    if (made) CHECK_OK(ekv_seq_eval_shared(sh, (int32_t)N_SEQ, &pr.in, ls));
    for (size_t i = 0; i < N_SEQ && made; i++) {
        struct ekv_kv_params kp = params(i, tk, tv);
        struct ekv_seq *alone = NULL;
        CHECK_OK(ekv_seq_new(c, &kp, &alone));
        if (!alone) continue;
        CHECK_OK(ekv_seq_eval(alone, &pr.in, la));
        int bad_steps = 0;
        const bool prompt_same = memcmp(ls, la, V * sizeof *la) == 0;
        const bool cache_same = tu_same_kv_shape(m, sh[i], alone) && same_saved(sh[i], alone);
        for (int k = 0; k < N_STEPS; k++) {
            CHECK_OK(ekv_seq_decode(sh[i], g_toks[N_PROMPT + k], ls2));
            CHECK_OK(ekv_seq_decode(alone, g_toks[N_PROMPT + k], la));
            bad_steps += memcmp(ls2, la, V * sizeof *la) != 0;
        }
        const bool end_same = tu_same_kv_shape(m, sh[i], alone) && same_saved(sh[i], alone);
        CHECK_MSG(prompt_same && cache_same && bad_steps == 0 && end_same,
                  "%s budget %.1f %s/%s%s: shared prompt differs from reading it alone (logits %s, cache after the "
                  "prompt %s, %d of %d steps' logits differ, cache at the end %s)",
                  g_pols[i / N_BUD], g_budgets[i % N_BUD], ekv_kv_type_name(tk), ekv_kv_type_name(tv),
                  n_img ? " with an image span" : "", prompt_same ? "same" : "differ", cache_same ? "same" : "differs",
                  bad_steps, N_STEPS, end_same ? "same" : "differs");
        ekv_seq_free(alone);
    }
    for (size_t i = 0; i < N_SEQ; i++) ekv_seq_free(sh[i]);
    free(ls), free(la), free(ls2);
    free(pr.embd);
}

static void test_refused(struct ekv_context *c) {
    struct prompt pr;
    make_prompt(&pr, 0, 0);
    struct ekv_kv_params kp = ekv_kv_default_params();
    struct ekv_seq *s[3] = {NULL};
    for (int i = 0; i < 3; i++) CHECK_OK(ekv_seq_new(c, &kp, &s[i]));
    if (!s[0] || !s[1] || !s[2]) goto done;
    CHECK(ekv_seq_eval_shared(NULL, 2, &pr.in, NULL) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_seq_eval_shared(s, 0, &pr.in, NULL) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_seq_eval_shared(s, 2, NULL, NULL) == EKV_ERR_INVALID_ARG);
    struct ekv_seq *dup[2] = {s[0], s[0]};
    CHECK(ekv_seq_eval_shared(dup, 2, &pr.in, NULL) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "twice"));
    struct ekv_input dec = pr.in;
    dec.is_prompt = false;
    CHECK(ekv_seq_eval_shared(s, 2, &dec, NULL) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "prompt"));
    /* another storage type */
    struct ekv_kv_params k32 = kp;
    k32.type_k = EKV_KV_F32;
    struct ekv_seq *t = NULL;
    CHECK_OK(ekv_seq_new(c, &k32, &t));
    struct ekv_seq *mix[2] = {s[0], t};
    CHECK(t && ekv_seq_eval_shared(mix, 2, &pr.in, NULL) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "types"));
    ekv_seq_free(t);
    /* block-wise prefill compresses inside the prompt */
    struct ekv_kv_params kc = kp;
    kc.policy = "h2o";
    kc.budget = 0.5;
    kc.chunk = 16;
    t = NULL;
    CHECK_OK(ekv_seq_new(c, &kc, &t));
    struct ekv_seq *ch[2] = {s[0], t};
    CHECK(t && ekv_seq_eval_shared(ch, 2, &pr.in, NULL) == EKV_ERR_UNSUPPORTED && strstr(ekv_last_error(), "kv-chunk"));
    ekv_seq_free(t);
    /* a sequence that has read something */
    CHECK_OK(ekv_seq_prefill(s[2], g_toks, 4, NULL));
    struct ekv_seq *old[2] = {s[0], s[2]};
    CHECK(ekv_seq_eval_shared(old, 2, &pr.in, NULL) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "read"));
    /* a context-size overflow is refused before anything is read */
    struct ekv_segment big = {.tokens = g_toks, .n = 100000, .tag = EKV_TAG_TEXT};
    struct ekv_input bin = {.segs = &big, .n_segs = 1, .is_prompt = true};
    CHECK(ekv_seq_eval_shared(s, 2, &bin, NULL) == EKV_ERR_CONTEXT_FULL);
    /* refusals left s[0], s[1] untouched: they share a prompt now */
    CHECK_OK(ekv_seq_eval_shared(s, 2, &pr.in, NULL));
    CHECK(ekv_seq_n_seen(s[0]) == N_PROMPT && ekv_seq_n_seen(s[1]) == N_PROMPT);
    CHECK_OK(ekv_seq_decode(s[1], 3, NULL));
done:
    for (int i = 0; i < 3; i++) ekv_seq_free(s[i]);
}

static void on_model(const char *path, int types_set, bool images, bool refused) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m) return;
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    for (int32_t i = 0; i < N_PROMPT + N_STEPS; i++) g_toks[i] = 1 + (i * 37 + 11) % (mi.n_vocab - 1);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_ctx = 128;
    cp.device = "cpu";
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    const enum ekv_kv_type types[2][2][2] = {{{EKV_KV_F16, EKV_KV_F16}, {EKV_KV_F32, EKV_KV_F16}},
                                             {{EKV_KV_Q8_0, EKV_KV_Q4_0}, {EKV_KV_KIVI4, EKV_KV_KIVI2}}};
    for (int ti = 0; c && ti < 2; ti++) shared_case(m, c, types[types_set][ti][0], types[types_set][ti][1], 0);
    if (c && images) shared_case(m, c, EKV_KV_F16, EKV_KV_F16, N_IMG);
    if (c && refused) test_refused(c);
    ekv_context_free(c);
    ekv_model_free(m);
}

int main(void) {
    on_model(tu_src("models/stories260K.gguf"), 0, true, true);
    /* quantised types need head_dim 64 (tiny-llama3); rows that see part of
     * the cache need a sliding window (tiny-mistral, window 32) */
    const char *presets[2] = {"tiny-llama3", "tiny-mistral"};
    for (int i = 0; i < 2; i++) {
        char path[96], cmd[512];
        snprintf(path, sizeof path, "/tmp/ekv-test-shared-%s-%ld.gguf", presets[i], (long)getpid());
        snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset %s --type f32 -o '%s' > /dev/null 2>&1", tu_bin(),
                 presets[i], path);
        CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
        on_model(path, i == 0 ? 1 : 0, i == 1, false);
        remove(path);
    }
    return test_finish("test_shared_prefill");
}
