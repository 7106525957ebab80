/*
 * test_kv_types_model.c — storage types on the real ekv-ref-28m
 * (../shared; head_dim 64, GQA 8/2), so that q8_0/q4_0/KIVI apply:
 *   - within each type (and a mixed q8_0 keys / kivi4 values cache),
 *     policies at budget 1.0 give logits bit-identical to the same type with
 *     no policy over a 40-token prompt and 16 decode steps (full, h2o and
 *     elastic on kivi2, h2o on the mixed cache, q8_0, q4_0 and kivi4; KIVI
 *     with G = R = 16 so that key groups form at prefill and at decode; f16,
 *     the default, is covered by test_kv_model). The test is small because
 *     the ASan build runs it too (541 s there at load 16 when it ran twice
 *     as many cases); test_kv_types_policies drives every policy on every
 *     type without a model;
 *   - at budget 0.25 h2o, snapkv, elastic and roco keep their entry budget
 *     on q8_0, h2o and elastic on q4_0-keys/kivi2-values and h2o on kivi2
 *     (64-token prompt, 4 steps, G = R = 16), the
 *     bytes are those of the type (below the same type's full cache, row
 *     types below the f16 cache of the same entries, KIVI never above it),
 *     and logits stay finite;
 *   - ekv_kv_project (server admission) gives a full cache's real bytes in
 *     every type, and bounds the row types' bytes under a policy;
 *   - KIVI with decode-time eviction (h2o) keeps its key groups consistent
 *     (entries == groups + residual) while evicting inside groups.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "kv/kv.h"
#include "testutil.h"

/* ekv_seq is opaque; the test reads the cache through the engine's struct. */
#include "engine/engine.h"

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

struct combo {
    enum ekv_kv_type k, v;
};

int main(void) {
    const char *path = tu_shared("models/ekv-ref-28m-f16.gguf");
    if (access(path, R_OK) != 0) {
        printf("test_kv_types_model: skipped: ../shared absent\n");
        return test_finish("test_kv_types_model");
    }
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m) return test_finish("test_kv_types_model");
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    cp.n_ctx = 512;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    const int V = mi.n_vocab;
    size_t tlen = 0;
    char *text = tu_read_file(tu_shared("data/longctx/heldout_dev.jsonl"), &tlen);
    CHECK(text != NULL);
    if (!text || !c) return test_finish("test_kv_types_model");
    int32_t *toks = malloc((tlen + 8) * sizeof *toks);
    size_t n_all = 0;
    CHECK_OK(ekv_tokenize(m, text, tlen < 20000 ? tlen : 20000, true, false, toks, tlen + 8, &n_all));
    CHECK(n_all >= 400);
    float *ref = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    const struct combo combos[] = {{EKV_KV_F16, EKV_KV_F16},   {EKV_KV_KIVI2, EKV_KV_KIVI2}, {EKV_KV_Q8_0, EKV_KV_KIVI4},
                                   {EKV_KV_Q8_0, EKV_KV_Q8_0},   {EKV_KV_Q4_0, EKV_KV_Q4_0},   {EKV_KV_KIVI4, EKV_KV_KIVI4}};
    const int n_combos = (int)(sizeof combos / sizeof combos[0]);
    const int n_policies = ekv_kv_policy_count();
    const struct combo combos2[] = {{EKV_KV_Q8_0, EKV_KV_Q8_0}, {EKV_KV_Q4_0, EKV_KV_KIVI2}, {EKV_KV_KIVI2, EKV_KV_KIVI2}};

    /* 1. budget 1.0 == no policy, within each type */
    for (int ci = 0; ci < n_combos; ci++) {
        for (int pi = 0; pi < n_policies; pi++) {
            struct ekv_kv_params none = ekv_kv_default_params(), kp = none;
            none.type_k = kp.type_k = combos[ci].k;
            none.type_v = kp.type_v = combos[ci].v;
            none.kv_residual = kp.kv_residual = 16;
            none.kv_group = kp.kv_group = 16;
            kp.policy = ekv_kv_policy_name(pi);
            if (ci == 0) continue;
            if (ci >= 3 && strcmp(kp.policy, "h2o")) continue;
            if (ci == 2 && strcmp(kp.policy, "h2o")) continue;
            if (strcmp(kp.policy, "full") && strcmp(kp.policy, "h2o") && strcmp(kp.policy, "elastic")) continue;
            struct ekv_seq *a = NULL, *b = NULL;
            CHECK_OK(ekv_seq_new(c, &none, &a));
            CHECK_OK(ekv_seq_new(c, &kp, &b));
            if (!a || !b) continue;
            CHECK_OK(ekv_seq_prefill(a, toks, 40, ref));
            CHECK_OK(ekv_seq_prefill(b, toks, 40, got));
            int same = memcmp(ref, got, (size_t)V * sizeof(float)) == 0, step = 0;
            for (; step < 16 && same; step++) {
                const int32_t t = argmax(ref, V);
                CHECK_OK(ekv_seq_decode(a, t, ref));
                CHECK_OK(ekv_seq_decode(b, t, got));
                same = memcmp(ref, got, (size_t)V * sizeof(float)) == 0;
            }
            CHECK_MSG(same && step == 16, "K %s / V %s, policy %s at budget 1.0 differs from no policy at step %d",
                      ekv_kv_type_name(combos[ci].k), ekv_kv_type_name(combos[ci].v), kp.policy, step);
            /* admission's projection of a full cache is its real size in the types */
            struct ekv_kv_projection pr;
            struct ekv_kv_stats sa;
            ekv_seq_kv_stats(a, &sa);
            CHECK_OK(ekv_kv_project(m, &none, 40, 16, &pr));
            CHECK_MSG(pr.bytes_final == sa.bytes && pr.bytes_full == sa.bytes_full,
                      "K %s / V %s: projected %llu bytes, holds %llu", ekv_kv_type_name(combos[ci].k),
                      ekv_kv_type_name(combos[ci].v), (unsigned long long)pr.bytes_final, (unsigned long long)sa.bytes);
            ekv_seq_free(a);
            ekv_seq_free(b);
        }
    }

    /* 2. budget 0.25 on every type: entries, bytes, finite logits */
    for (int ci = 0; ci < (int)(sizeof combos2 / sizeof combos2[0]); ci++) {
        for (int pi = 0; pi < n_policies; pi++) {
            const char *name = ekv_kv_policy_name(pi);
            if (!strcmp(name, "full")) continue;
            struct ekv_kv_params kp = ekv_kv_default_params();
            kp.type_k = combos2[ci].k;
            kp.type_v = combos2[ci].v;
            kp.kv_residual = 16;
            kp.kv_group = 16;
            /* every policy x type is covered without a model (test_kv_types_policies); here a few on real weights */
            if (ci == 0 && strcmp(name, "h2o") && strcmp(name, "snapkv") && strcmp(name, "elastic") && strcmp(name, "roco"))
                continue;
            if (ci == 1 && strcmp(name, "h2o") && strcmp(name, "elastic")) continue;
            if (ci == 2 && strcmp(name, "h2o")) continue;
            kp.policy = name;
            kp.budget = 0.25;
            struct ekv_seq *s = NULL;
            CHECK_OK(ekv_seq_new(c, &kp, &s));
            if (!s) continue;
            CHECK_OK(ekv_seq_prefill(s, toks, 64, got));
            for (int step = 0; step < 4; step++) CHECK_OK(ekv_seq_decode(s, argmax(got, V), got));
            struct ekv_kv_stats st;
            ekv_seq_kv_stats(s, &st);
            const bool prefill_only = !strcmp(name, "snapkv") || !strcmp(name, "pyramidkv") || !strcmp(name, "vlcache");
            const double ef = (double)st.entries / (double)st.entries_full;
            const uint64_t f16_same = (uint64_t)st.entries * 2u * (uint64_t)mi.head_dim * 2u;
            CHECK_MSG(prefill_only ? ef < 0.36 : ef <= 0.25 + 1.0 / 68 + 1e-9, "%s on K %s: %.3f of the entries", name,
                      ekv_kv_type_name(kp.type_k), ef);
            CHECK_MSG(st.bytes < st.bytes_full && st.bytes_full < st.bytes_full_f32 && st.n_seen == 68,
                      "%s on K %s: %llu bytes of %llu (f32 %llu)", name, ekv_kv_type_name(kp.type_k),
                      (unsigned long long)st.bytes, (unsigned long long)st.bytes_full,
                      (unsigned long long)st.bytes_full_f32);
            const bool kivi = kp.type_k == EKV_KV_KIVI2 || kp.type_v == EKV_KV_KIVI2;
            struct ekv_kv_projection pr;
            CHECK_OK(ekv_kv_project(m, &kp, 64, 4, &pr));
            if (!kivi) /* row types: exactly what the entries take (PyramidKV may round over by a few) */
                CHECK_MSG(st.bytes <= pr.bytes_final + (strcmp(name, "pyramidkv") ? 0 : 2 * pr.bytes_per_token),
                          "%s on K %s: %llu bytes, projected %llu", name, ekv_kv_type_name(kp.type_k),
                          (unsigned long long)st.bytes, (unsigned long long)pr.bytes_final);
            if (kp.type_k != EKV_KV_F16)
                CHECK_MSG(kivi ? st.bytes <= f16_same : st.bytes < f16_same, "%s on K %s: %llu bytes, f16 would take %llu", name,
                          ekv_kv_type_name(kp.type_k), (unsigned long long)st.bytes, (unsigned long long)f16_same);
            bool fin = true;
            for (int v = 0; v < V; v++) fin &= isfinite(got[v]) != 0;
            CHECK_MSG(fin, "%s on K %s: non-finite logits", name, ekv_kv_type_name(kp.type_k));
            /* KIVI key groups stay consistent under eviction */
            if (kp.type_k == EKV_KV_KIVI2) {
                const struct ekv_kv *kv = s->kv;
                bool ok = true;
                for (int l = 0; l < kv->n_layer; l++)
                    for (int h = 0; h < kv->n_head_kv; h++) {
                        const struct ekv_kv_head *hd = &kv->layers[l].heads[h];
                        int32_t q = 0;
                        for (int g = 0; g < hd->ks.ng; g++) {
                            ok &= hd->ks.gn[g] >= 1 && hd->ks.gn[g] <= kv->params.kv_group;
                            if (g + 1 < hd->ks.ng) ok &= hd->ks.gn[g] + hd->ks.gn[g + 1] > kv->params.kv_group;
                            q += hd->ks.gn[g];
                        }
                        ok &= q == hd->ks.nq && hd->ks.nq <= hd->len;
                    }
                CHECK_MSG(ok, "%s on kivi2: key groups inconsistent", name);
            }
            ekv_seq_free(s);
        }
    }
    free(ref);
    free(got);
    free(toks);
    free(text);
    ekv_context_free(c);
    ekv_model_free(m);
    return test_finish("test_kv_types_model");
}
