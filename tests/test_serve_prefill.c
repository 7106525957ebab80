/*
 * test_serve_prefill.c — the engine calls `ekv serve` stands on:
 *
 * - ekv_prefill_* (a prompt read in bounded pieces, layer by layer) gives
 *   the cache and the logits of one ekv_seq_eval of the prompt, bit for bit,
 *   for every policy, with budgets below 1, with block-wise compression
 *   (kv chunk), whatever the piece size and however the units are grouped
 *   into steps, and the decode steps after it agree too;
 * - while it reads, the cache never holds more than ekv_kv_project's
 *   bytes_peak, and after prompt + generation no more than bytes_final
 *   (PyramidKV: its documented per-layer rounding);
 * - ekv_kv_project's numbers, computed by hand for a few policies;
 * - misuse: a sequence reading a prompt takes no other input, an abandoned
 *   prompt leaves the sequence refusing everything, freeing the sequence
 *   first is harmless.
 *
 * On the bundled stories260K model (real weights, 5 layers, 4 KV heads).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "testutil.h"

static struct ekv_model *g_model;
static struct ekv_context *g_ctx;
static struct ekv_model_info g_mi;

static uint64_t rng(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void make_tokens(int32_t *t, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) t[i] = 1 + (int32_t)(rng(&seed) % (uint64_t)(g_mi.n_vocab - 1));
}

/* Same entries (positions, merge weights, tags) in every layer and head. */
static bool same_cache(const struct ekv_seq *a, const struct ekv_seq *b) {
    int32_t pa[4096], pb[4096];
    float wa[4096], wb[4096];
    for (int l = 0; l < g_mi.n_layer; l++)
        for (int h = 0; h < g_mi.n_head_kv; h++) {
            int32_t na = ekv_seq_kv_layer_len(a, l, h), nb = ekv_seq_kv_layer_len(b, l, h);
            if (na != nb || na > 4096) return false;
            ekv_seq_kv_entries(a, l, h, pa, wa, NULL);
            ekv_seq_kv_entries(b, l, h, pb, wb, NULL);
            if (memcmp(pa, pb, (size_t)na * sizeof *pa) || memcmp(wa, wb, (size_t)na * sizeof *wa)) return false;
        }
    return true;
}

/* One policy: whole-prompt prefill vs pieces of `rows` rows stepped `units`
 * at a time; then `gen` decode steps of both. */
static void compare(const char *policy, double budget, int32_t chunk, int n, int rows, int units, int gen) {
    struct ekv_kv_params kv = ekv_kv_default_params();
    kv.policy = policy;
    kv.budget = budget;
    kv.chunk = chunk;
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    float *la = malloc((size_t)g_mi.n_vocab * sizeof *la), *lb = malloc((size_t)g_mi.n_vocab * sizeof *lb);
    struct ekv_seq *a = NULL, *b = NULL;
    struct ekv_prefill *pf = NULL;
    make_tokens(tok, n, (uint64_t)n * 31 + (uint64_t)rows);
    CHECK_OK(ekv_seq_new(g_ctx, &kv, &a));
    CHECK_OK(ekv_seq_new(g_ctx, &kv, &b));
    CHECK_OK(ekv_seq_prefill(a, tok, n, la));
    struct ekv_segment seg = {.tokens = tok, .n = n, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &seg, .n_segs = 1, .is_prompt = true};
    CHECK_OK(ekv_prefill_new(b, &in, rows, &pf));
    struct ekv_kv_projection pr;
    CHECK_OK(ekv_kv_project(g_model, &kv, n, gen, &pr));
    bool done = false, peak_ok = true;
    int steps = 0;
    int64_t left = ekv_prefill_units_left(pf);
    while (!done && steps < 100000) {
        CHECK_OK(ekv_prefill_step(pf, units, lb, &done));
        struct ekv_kv_stats st;
        ekv_seq_kv_stats(b, &st);
        if (st.bytes > pr.bytes_peak) peak_ok = false;
        int64_t now = ekv_prefill_units_left(pf);
        if (!done && now != left - units) peak_ok = false; /* units counted exactly */
        left = now;
        steps++;
    }
    CHECK_MSG(done && left == 0, "%s: prefill not done after %d steps", policy, steps);
    CHECK_MSG(peak_ok, "%s budget %g rows %d: bytes above the projected peak or units miscounted", policy, budget, rows);
    CHECK_MSG(!memcmp(la, lb, (size_t)g_mi.n_vocab * sizeof *la), "%s budget %g chunk %d rows %d: prompt logits differ",
              policy, budget, chunk, rows);
    CHECK_MSG(same_cache(a, b), "%s budget %g chunk %d rows %d: caches differ after the prompt", policy, budget, chunk, rows);
    ekv_prefill_free(pf);
    bool dec_same = true;
    for (int i = 0; i < gen; i++) {
        int32_t t = 1 + (int32_t)((unsigned)(i * 37 + n) % (unsigned)(g_mi.n_vocab - 1));
        CHECK_OK(ekv_seq_decode(a, t, la));
        struct ekv_seq *bs[1] = {b};
        CHECK_OK(ekv_decode_batch(g_ctx, bs, &t, 1, lb));
        dec_same &= !memcmp(la, lb, (size_t)g_mi.n_vocab * sizeof *la);
    }
    CHECK_MSG(dec_same && same_cache(a, b), "%s budget %g: decode after a stepped prompt differs", policy, budget);
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(b, &st);
    /* PyramidKV's integer schedule may overshoot L * C by its rounding */
    uint64_t slack = !strcmp(policy, "pyramidkv") ? 2 * pr.bytes_per_token : 0;
    CHECK_MSG(st.bytes <= pr.bytes_final + slack, "%s budget %g: %llu bytes kept, projected %llu", policy, budget,
              (unsigned long long)st.bytes, (unsigned long long)pr.bytes_final);
    CHECK(pr.bytes_full == st.bytes_full);
    ekv_seq_free(a);
    ekv_seq_free(b);
    free(tok);
    free(la);
    free(lb);
}

static void check_projection(void) {
    /* one position, one layer, in the default storage type (f16) */
    const uint64_t eb = g_mi.kv_bytes_per_token / (uint64_t)g_mi.n_layer;
    CHECK(eb == 2ull * (uint64_t)g_mi.head_dim * 2u * (uint64_t)g_mi.n_head_kv);
    const uint64_t L = (uint64_t)g_mi.n_layer;
    struct ekv_kv_params kv = ekv_kv_default_params();
    struct ekv_kv_projection pr;
    CHECK_OK(ekv_kv_project(g_model, &kv, 100, 20, &pr));
    CHECK(pr.bytes_final == 120 * L * eb && pr.bytes_peak == pr.bytes_final && pr.bytes_full == pr.bytes_final);
    CHECK(pr.bytes_per_token == g_mi.kv_bytes_per_token);
    kv.policy = "h2o";
    kv.budget = 0.5;
    CHECK_OK(ekv_kv_project(g_model, &kv, 100, 20, &pr));
    CHECK(pr.bytes_final == 60 * L * eb); /* ceil(0.5 * 120) per layer */
    CHECK(pr.bytes_peak == (L * 50 + 100) * eb); /* compressed layers + one whole layer */
    kv.budget = 0.2;
    kv.max_tokens = 10;
    CHECK_OK(ekv_kv_project(g_model, &kv, 100, 20, &pr));
    CHECK(pr.bytes_final == 10 * L * eb);
    kv.policy = "snapkv"; /* prompt only: ceil(0.2 * 100) then + 20 */
    kv.max_tokens = 0;
    CHECK_OK(ekv_kv_project(g_model, &kv, 100, 20, &pr));
    CHECK(pr.bytes_final == 40 * L * eb);
    kv.policy = "vlcache"; /* compresses after the last layer: the whole prompt in every layer first */
    CHECK_OK(ekv_kv_project(g_model, &kv, 100, 20, &pr));
    CHECK(pr.bytes_peak == 100 * L * eb && pr.bytes_final == 40 * L * eb);
    kv.policy = "nosuch";
    CHECK(ekv_kv_project(g_model, &kv, 100, 20, &pr) == EKV_ERR_INVALID_ARG);
    kv.policy = "h2o";
    kv.budget = NAN;
    CHECK(ekv_kv_project(g_model, &kv, 100, 20, &pr) == EKV_ERR_INVALID_ARG);
    kv.budget = 0.5;
    CHECK(ekv_kv_project(g_model, &kv, -1, 20, &pr) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kv_project(NULL, &kv, 1, 1, &pr) == EKV_ERR_INVALID_ARG);
}

static void check_misuse(void) {
    int32_t tok[64];
    make_tokens(tok, 64, 5);
    float *lg = malloc((size_t)g_mi.n_vocab * sizeof *lg);
    struct ekv_seq *s = NULL;
    struct ekv_prefill *pf = NULL, *pf2 = NULL;
    struct ekv_segment seg = {.tokens = tok, .n = 64, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &seg, .n_segs = 1, .is_prompt = true};
    CHECK_OK(ekv_seq_new(g_ctx, NULL, &s));
    CHECK_OK(ekv_prefill_new(s, &in, 16, &pf));
    CHECK(ekv_prefill_new(s, &in, 16, &pf2) == EKV_ERR_INVALID_ARG && !pf2);
    CHECK(ekv_seq_decode(s, 1, lg) == EKV_ERR_INVALID_ARG);
    struct ekv_seq *bs[1] = {s};
    int32_t t = 1;
    CHECK(ekv_decode_batch(g_ctx, bs, &t, 1, lg) == EKV_ERR_INVALID_ARG);
    bool done = false;
    CHECK_OK(ekv_prefill_step(pf, 3, lg, &done));
    CHECK(!done);
    ekv_prefill_free(pf); /* abandoned half read */
    CHECK(ekv_seq_decode(s, 1, lg) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_prefill_new(s, &in, 16, &pf2) == EKV_ERR_INVALID_ARG);
    ekv_seq_free(s);
    /* the sequence freed first: the reader is cut off, not dangling */
    CHECK_OK(ekv_seq_new(g_ctx, NULL, &s));
    CHECK_OK(ekv_prefill_new(s, &in, 16, &pf));
    ekv_seq_free(s);
    CHECK(ekv_prefill_step(pf, 1, lg, &done) == EKV_ERR_INVALID_ARG);
    ekv_prefill_free(pf);
    /* bad arguments and a prompt beyond the context */
    CHECK_OK(ekv_seq_new(g_ctx, NULL, &s));
    CHECK(ekv_prefill_new(s, &in, 0, &pf) == EKV_ERR_INVALID_ARG);
    int32_t *big = calloc(4096, sizeof *big);
    struct ekv_segment bseg = {.tokens = big, .n = 4096, .tag = EKV_TAG_TEXT};
    struct ekv_input bin = {.segs = &bseg, .n_segs = 1, .is_prompt = true};
    CHECK(ekv_prefill_new(s, &bin, 16, &pf) == EKV_ERR_CONTEXT_FULL);
    tok[3] = g_mi.n_vocab; /* out of range */
    CHECK(ekv_prefill_new(s, &in, 16, &pf) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_prefill_step(NULL, 1, lg, &done) == EKV_ERR_INVALID_ARG);
    ekv_prefill_free(NULL);
    ekv_seq_free(s);
    free(big);
    free(lg);
}

int main(void) {
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    cp.n_ctx = 1024;
    if (ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &g_model) != EKV_OK ||
        ekv_context_new(g_model, &cp, &g_ctx) != EKV_OK) {
        fprintf(stderr, "cannot load the bundled model: %s\n", ekv_last_error());
        return 1;
    }
    ekv_model_get_info(g_model, &g_mi);
    static const char *const policies[] = {"full", "random", "local", "h2o", "scissorhands", "tova",
                                           "roco", "snapkv", "pyramidkv", "vlcache", "elastic"};
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        compare(policies[i], 0.3, 0, 150, 16, 1, 12);  /* one unit per step */
        compare(policies[i], 0.3, 0, 150, 64, 7, 6);   /* units across layers in one step */
        compare(policies[i], 1.0, 0, 90, 7, 3, 4);
        compare(policies[i], 0.25, 32, 150, 20, 2, 6); /* block-wise compression */
    }
    compare("elastic", 0.2, 0, 300, 1, 50, 8); /* one row per unit */
    check_projection();
    check_misuse();
    ekv_context_free(g_ctx);
    ekv_model_free(g_model);
    return test_finish("test_serve_prefill");
}
