/*
 * test_kv_model.c — KV policies on the real stories260K model:
 *  - policy full and every policy at budget 1.0 give logits bit-identical
 *    to a sequence created without a policy, over a 400-token greedy run;
 *  - after a 400-token TinyStories prompt at budget 0.2 every policy but
 *    full holds at most 0.25 of the full cache's bytes (and keeps it there
 *    while decoding when it acts at decode time);
 *  - block-wise prefill (chunk) respects the budget;
 *  - --kv-compat ref is refused by every policy but Elastic (regression:
 *    it moved every policy's RoPE positions), whose reference mode runs
 *    and differs from the paper mode once the cache is compressed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "testutil.h"

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

int main(void) {
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &m));
    if (!m) return test_finish("test_kv_model");
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    const int V = mi.n_vocab;

    size_t tlen = 0;
    char *text = tu_read_file(tu_shared("data/perplexity/tinystories_sample.txt"), &tlen);
    CHECK(text != NULL);
    if (!text) return test_finish("test_kv_model");
    int32_t *toks = malloc((tlen + 8) * sizeof *toks);
    size_t n_all = 0;
    CHECK_OK(ekv_tokenize(m, text, tlen, true, false, toks, tlen + 8, &n_all));
    CHECK(n_all >= 400);

    float *ref = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    const int n_policies = ekv_kv_policy_count();
    CHECK(n_policies >= 11);

    /* 1. budget 1.0 == no policy, bit for bit, 16-token prompt + 400 generated */
    for (int pi = 0; pi < n_policies; pi++) {
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.policy = ekv_kv_policy_name(pi);
        kp.budget = 1.0;
        struct ekv_seq *a = NULL, *b = NULL;
        CHECK_OK(ekv_seq_new(c, NULL, &a));
        CHECK_OK(ekv_seq_new(c, &kp, &b));
        if (!a || !b) continue;
        CHECK_OK(ekv_seq_prefill(a, toks, 16, ref));
        CHECK_OK(ekv_seq_prefill(b, toks, 16, got));
        int same = memcmp(ref, got, (size_t)V * sizeof(float)) == 0, step = 0;
        for (; step < 400 && same; step++) {
            int32_t t = argmax(ref, V);
            CHECK_OK(ekv_seq_decode(a, t, ref));
            CHECK_OK(ekv_seq_decode(b, t, got));
            same = memcmp(ref, got, (size_t)V * sizeof(float)) == 0;
        }
        CHECK_MSG(same && step == 400, "policy %s at budget 1.0 differs from no policy at step %d", kp.policy, step);
        struct ekv_kv_stats st;
        ekv_seq_kv_stats(b, &st);
        CHECK_MSG(st.evicted == 0 && st.merged == 0 && st.bytes == st.bytes_full, "policy %s evicted at budget 1",
                  kp.policy);
        ekv_seq_free(a);
        ekv_seq_free(b);
    }

    /* 2. 400-token prompt at budget 0.2: at most 0.25 of the full cache */
    for (int pi = 0; pi < n_policies; pi++) {
        const char *name = ekv_kv_policy_name(pi);
        if (!strcmp(name, "full")) continue;
        for (int chunked = 0; chunked < 2; chunked++) {
            struct ekv_kv_params kp = ekv_kv_default_params();
            kp.policy = name;
            kp.budget = 0.2;
            if (chunked) kp.chunk = 64; /* block-wise evict-and-encode */
            kp.recompress = 0; /* the papers' rule for snapkv/pyramidkv/vlcache (test_kv_budget_decode: N > 0) */
            struct ekv_seq *s = NULL;
            CHECK_OK(ekv_seq_new(c, &kp, &s));
            if (!s) continue;
            CHECK_OK(ekv_seq_prefill(s, toks, 400, got));
            struct ekv_kv_stats st;
            ekv_seq_kv_stats(s, &st);
            double frac = (double)st.bytes / (double)st.bytes_full;
            printf("%-13s chunk %-3d after prefill: %.4f of full (%lld entries, %lld evicted, %lld merged)\n", name,
                   kp.chunk, frac, (long long)st.entries, (long long)st.evicted, (long long)st.merged);
            CHECK_MSG(frac <= 0.25, "policy %s (chunk %d): %.3f of the full cache after prefill", name, kp.chunk, frac);
            CHECK(st.bytes_full == 400ull * mi.kv_bytes_per_token);
            bool prefill_only = !strcmp(name, "snapkv") || !strcmp(name, "pyramidkv") || !strcmp(name, "vlcache");
            int64_t entries_prefill = st.entries;
            for (int step = 0; step < 40; step++) CHECK_OK(ekv_seq_decode(s, argmax(got, V), got));
            ekv_seq_kv_stats(s, &st);
            frac = (double)st.bytes / (double)st.bytes_full;
            if (prefill_only) /* these act once, after the prompt: the cache then grows by one per step */
                CHECK_MSG(st.entries == entries_prefill + 40LL * mi.n_layer * mi.n_head_kv, "%s grew from %lld to %lld",
                          name, (long long)entries_prefill, (long long)st.entries);
            else
                CHECK_MSG(frac <= 0.2 + 1.0 / 440 + 1e-9, "policy %s: %.4f of the full cache after decoding", name, frac);
            for (int v = 0; v < V; v++) CHECK_MSG(isfinite(got[v]), "policy %s: non-finite logit", name);
            ekv_seq_free(s);
        }
    }

    /* 3. --kv-compat ref belongs to Elastic alone: any other policy refuses it
     *    (it used to move every policy's RoPE positions; on h2o that gave garbage) */
    for (int pi = 0; pi < n_policies; pi++) {
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.policy = ekv_kv_policy_name(pi);
        kp.budget = 0.2;
        kp.compat_ref = true;
        struct ekv_seq *s = NULL;
        enum ekv_status st = ekv_seq_new(c, &kp, &s);
        if (!strcmp(kp.policy, "elastic")) CHECK_OK(st);
        else CHECK_MSG(st == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "elastic only") && !s,
                       "%s accepted --kv-compat ref", kp.policy);
        ekv_seq_free(s);
    }
    /* 4. Elastic in the authors' reference mode (positions from the compressed length) runs and compresses,
     *    and its logits differ from the paper mode's once the cache is compressed */
    struct ekv_kv_params kp = ekv_kv_default_params();
    kp.policy = "elastic";
    kp.budget = 0.5;
    kp.compat_ref = true;
    struct ekv_seq *s = NULL, *pp = NULL;
    struct ekv_kv_params kpp = kp;
    kpp.compat_ref = false;
    CHECK_OK(ekv_seq_new(c, &kp, &s));
    CHECK_OK(ekv_seq_new(c, &kpp, &pp));
    if (s && pp) {
        CHECK_OK(ekv_seq_prefill(s, toks, 200, got));
        CHECK_OK(ekv_seq_prefill(pp, toks, 200, ref));
        int differ = 0;
        for (int step = 0; step < 20; step++) {
            const int32_t t = toks[200 + step];
            CHECK_OK(ekv_seq_decode(s, t, got));
            CHECK_OK(ekv_seq_decode(pp, t, ref));
            differ += memcmp(ref, got, (size_t)V * sizeof(float)) != 0;
        }
        CHECK_MSG(differ == 20, "reference and paper modes agree on %d of 20 steps", 20 - differ);
        struct ekv_kv_stats st;
        ekv_seq_kv_stats(s, &st);
        CHECK(st.merged > 0 && st.entries < st.entries_full);
    }
    ekv_seq_free(s);
    ekv_seq_free(pp);

    free(ref);
    free(got);
    free(toks);
    free(text);
    ekv_context_free(c);
    ekv_model_free(m);
    return test_finish("test_kv_model");
}
