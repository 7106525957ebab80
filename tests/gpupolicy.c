/*
 * gpupolicy.c — the helpers test_gpu_policy.c's parts share (gpupolicy.h):
 * test models and token streams, and run_case_n, one policy run on the GPU
 * beside the CPU with every check the policy tests make.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "engine/backend_vk.h"
#include "engine/engine.h"
#include "gpu/vk.h"
#include "kv/kv.h"
#include "gpupolicy.h"
#include "gputest.h"
#include "testutil.h"

char g_dev[32];
int32_t g_toks[N_PROMPT + N_STEPS + 1];
int32_t g_toks_b[N_PROMPT + N_STEPS + 1];
struct ekv_model *g_mb;

/* `ekv mkmodel ARGS` into /tmp/ekv-test-gpu-policy-TAG-PID.gguf (path), loaded. */
struct ekv_model *mk_model(const char *args, const char *tag, char *path, size_t cap) {
    char cmd[512];
    snprintf(path, cap, "/tmp/ekv-test-gpu-policy-%s-%ld.gguf", tag, (long)getpid());
    snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel %s -o '%s' > /dev/null 2>&1", tu_bin(), args, path);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    return m;
}

struct ekv_model *model_b(char *path, size_t cap) {
    struct ekv_model *m = mk_model("--preset tiny-llama3 --type f32", "b", path, cap);
    for (int32_t i = 0; m && i < N_PROMPT + N_STEPS + 1; i++) g_toks_b[i] = 1 + (i * 37 + 11) % (m->info.n_vocab - 1);
    return m;
}

bool make_tokens(const struct ekv_model *m) {
    const char *text =
        "Once upon a time there was a little boy named Ben. Ben loved to explore the world around him. He saw many "
        "amazing things, like beautiful vases that were on display in a store. One day, Ben was walking through the "
        "store when he came across a very special vase. When Ben saw it he was amazed! He said, Wow, that is a really "
        "amazing vase! Can I buy it? The shopkeeper smiled and said, Of course you can. You can take it home and "
        "show all your friends how amazing it is! So Ben took the vase home and he was so proud of it!";
    size_t n = 0;
    int32_t buf[512];
    if (ekv_tokenize(m, text, strlen(text), true, false, buf, 512, &n) != EKV_OK || n < N_PROMPT + N_STEPS + 1)
        return false;
    memcpy(g_toks, buf, sizeof g_toks);
    return true;
}

/* KIVI's group and residual in these tests: small, so that a 64-token
 * prompt quantises (the default residual of 128 would keep it in fp16) */

struct ekv_kv_params kv_params(const char *policy, double budget, enum ekv_kv_type t) {
    struct ekv_kv_params kp = ekv_kv_default_params();
    kp.policy = policy;
    kp.budget = budget;
    kp.type_k = kp.type_v = t;
    kp.kv_group = KIVI_G;
    kp.kv_residual = KIVI_R;
    return kp;
}

/* An image for M-RoPE models (test_mrope): when set, a prompt is text
 * toks[0, 8), these g_img_w x g_img_h rows, then text toks[8, n). */
const float *g_img;
int32_t g_img_w, g_img_h;

/* Reads a prompt of n tokens (and g_img when set), last row's logits. */
enum ekv_status prompt_in(struct ekv_seq *s, const int32_t *toks, int32_t n, float *logits) {
    if (!g_img) return ekv_seq_prefill(s, toks, n, logits);
    const struct ekv_segment seg[3] = {
        {.tokens = toks, .n = 8, .tag = EKV_TAG_TEXT},
        {.embd = g_img, .n = g_img_w * g_img_h, .tag = EKV_TAG_IMAGE, .grid_w = g_img_w, .grid_h = g_img_h},
        {.tokens = toks + 8, .n = n - 8, .tag = EKV_TAG_TEXT}};
    const struct ekv_input in = {.segs = seg, .n_segs = 3, .is_prompt = true};
    return ekv_seq_eval(s, &in, logits);
}

/* Relative difference of two arrays (max |a - b| / max |b|). */
double rel_diff_d(const double *a, const double *b, int32_t n) {
    double md = 0.0, mv = 0.0;
    for (int32_t i = 0; i < n; i++) md = fmax(md, fabs(a[i] - b[i])), mv = fmax(mv, fabs(b[i]));
    return mv > 0 ? md / mv : md;
}

/* Kept positions and weights of every head equal (count of heads that differ). */
int heads_differ(const struct ekv_kv *a, const struct ekv_kv *b) {
    int bad = 0;
    for (int il = 0; il < a->n_layer; il++)
        for (int hk = 0; hk < a->n_head_kv; hk++) {
            const struct ekv_kv_head *ha = &a->layers[il].heads[hk], *hb = &b->layers[il].heads[hk];
            if (ha->len != hb->len) bad++;
            else if (ha->len > 0) /* (a full cache on the device keeps no entries on the host: len 0) */
                bad += memcmp(ha->pos, hb->pos, sizeof(int32_t) * (size_t)ha->len) != 0 ||
                       memcmp(ha->weight, hb->weight, sizeof(float) * (size_t)ha->len) != 0 ||
                       (!ha->mpos) != (!hb->mpos) ||
                       (ha->mpos && memcmp(ha->mpos, hb->mpos, 3 * sizeof(int32_t) * (size_t)ha->len) != 0);
        }
    return bad;
}

/* The rows the device holds against the CPU cache's, max |gpu - cpu| / max |cpu| over each head. */
double rows_diff(struct ekv_kv *a, struct ekv_kv *b) {
    const int d = a->head_dim;
    double worst = 0.0;
    for (int il = 0; il < a->n_layer; il++)
        for (int hk = 0; hk < a->n_head_kv; hk++) {
            struct ekv_kv_head *ha = &a->layers[il].heads[hk], *hb = &b->layers[il].heads[hk];
            const int32_t n = ha->len;
            if (n != hb->len || n == 0) continue;
            float *buf = malloc(sizeof(float) * (size_t)n * d * 4);
            CHECK_OK(ekv_kv_head_gather(a, ha, NULL, n, buf, buf + (size_t)n * d));
            CHECK_OK(ekv_kv_head_gather(b, hb, NULL, n, buf + 2 * (size_t)n * d, buf + 3 * (size_t)n * d));
            for (int side = 0; side < 2; side++) {
                const float *x = buf + (size_t)side * n * d, *y = buf + (size_t)(2 + side) * n * d;
                double md = 0, mv = 0;
                for (size_t i = 0; i < (size_t)n * d; i++) md = fmax(md, fabs(x[i] - y[i])), mv = fmax(mv, fabs(y[i]));
                worst = fmax(worst, mv > 0 ? md / mv : md);
            }
            free(buf);
        }
    return worst;
}

double log_softmax_at(const float *x, int32_t n, int32_t t) {
    double mx = x[0], s = 0.0;
    for (int32_t i = 1; i < n; i++) mx = fmax(mx, x[i]);
    for (int32_t i = 0; i < n; i++) s += exp(x[i] - mx);
    return x[t] - mx - log(s);
}

/* One policy x budget x type, GPU beside CPU (and, at budget 1.0, beside
 * the GPU's full cache), on the token stream toks. */
void run_case_n(const struct ekv_model *m, struct ekv_context *cg, struct ekv_context *cc, const int32_t *g_toks,
                       int32_t n_prompt, const char *pol, double budget, enum ekv_kv_type t) {
    struct ekv_kv_params kp = kv_params(pol, budget, t), kf = kv_params("full", 1.0, t);
    struct ekv_seq *sg = NULL, *sc = NULL, *sf = NULL;
    CHECK_OK(ekv_seq_new(cg, &kp, &sg));
    CHECK_OK(ekv_seq_new(cc, &kp, &sc));
    if (budget == 1.0) CHECK_OK(ekv_seq_new(cg, &kf, &sf));
    if (!sg || !sc || (budget == 1.0 && !sf)) {
        ekv_seq_free(sg), ekv_seq_free(sc), ekv_seq_free(sf);
        return;
    }
    CHECK(ekv_seq_on_device(sg));
    const int32_t V = m->info.n_vocab;
    float *lg = malloc(sizeof(float) * V), *lc = malloc(sizeof(float) * V), *lf = malloc(sizeof(float) * V);
    CHECK_OK(prompt_in(sg, g_toks, n_prompt, lg));
    CHECK_OK(prompt_in(sc, g_toks, n_prompt, lc));
    if (sf) CHECK_OK(prompt_in(sf, g_toks, n_prompt, lf));
    /* the device cache follows what is kept (backend_vk_policy.c: after a forward at most the longest
     * head + twice the slack, 64 entries + --kv-recompress; a long prompt kept at 0.2 shrinks it) */
    const int32_t cap_prompt = sg->gpu->cap;
    int32_t longest = 0;
    for (int il = 0; il < sg->kv->n_layer; il++)
        for (int hk = 0; hk < sg->kv->n_head_kv; hk++) longest = EKV_MAX(longest, sg->kv->layers[il].heads[hk].len);
    const int32_t slack = 64 + EKV_MAX(0, sg->kv->params.recompress);
    CHECK_MSG(cap_prompt >= longest && cap_prompt <= longest + 2 * slack && (n_prompt < 3 * N_PROMPT || cap_prompt < n_prompt),
              "%s %.1f: a device cache of %d entries per head for at most %d kept (prompt %d)", pol, budget, cap_prompt,
              longest, n_prompt);
    if (sg->gpu->k.managed) /* KIVI: the residual slots a prompt needed, given back after it */
        CHECK_MSG(sg->gpu->k.tc <= ekv_vk_kivi_tc_min(sg->gpu) + 64, "%s %.1f: %u residual slots per head after the prompt",
                  pol, budget, sg->gpu->k.tc);
    int bad_prompt = heads_differ(sg->kv, sc->kv), bad_steps = 0;
    bool same_full = !sf || !memcmp(lg, lf, sizeof(float) * V);
    double nll_g = 0, nll_c = 0, maxd = 0, maxv = 0;
    for (int step = 0; step < N_STEPS; step++) {
        for (int32_t i = 0; i < V; i++) maxd = fmax(maxd, fabs(lg[i] - lc[i])), maxv = fmax(maxv, fabs(lc[i]));
        const int32_t next = g_toks[n_prompt + step];
        nll_g -= log_softmax_at(lg, V, next);
        nll_c -= log_softmax_at(lc, V, next);
        CHECK_OK(ekv_seq_decode(sg, next, lg));
        CHECK_OK(ekv_seq_decode(sc, next, lc));
        if (sf) {
            CHECK_OK(ekv_seq_decode(sf, next, lf));
            same_full = same_full && !memcmp(lg, lf, sizeof(float) * V);
        }
        bad_steps += heads_differ(sg->kv, sc->kv) != 0;
    }
    const uint64_t read_backs = ekv_vk_mg_read_backs(sg->gpu->mg); /* before this test reads the rows */
    if (sg->kv->logit_bias) { /* the device's biases: log(weight) of each entry, 0 past each head's entries */
        const int32_t cap = sg->gpu->cap, H = sg->kv->n_head_kv;
        float *b = malloc(sizeof(float) * (size_t)H * cap);
        int bad = 0, merged = 0;
        for (int il = 0; il < sg->kv->n_layer; il++) {
            CHECK_OK(ekv_vk_mg_read_bias(sg->gpu->mg, il, b));
            for (int hk = 0; hk < H; hk++) {
                const struct ekv_kv_head *h = &sg->kv->layers[il].heads[hk];
                for (int32_t j = 0; j < cap; j++) {
                    const float want = j < h->len && h->weight[j] != 1.0f ? logf(h->weight[j]) : 0.0f;
                    bad += b[(size_t)hk * cap + j] != want;
                    merged += j < h->len && h->weight[j] != 1.0f;
                }
            }
        }
        CHECK_MSG(bad == 0, "%s %.1f %s: %d logit biases differ from log(weight)", pol, budget, ekv_kv_type_name(t), bad);
        if (budget < 1.0) CHECK(merged > 0);
        free(b);
    }
    const double rows = rows_diff(sg->kv, sc->kv);
    const double ppl_g = exp(nll_g / N_STEPS), ppl_c = exp(nll_c / N_STEPS);
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(sg, &st);
    printf("%-28s %.1f %-4s %3d: heads differing after the prompt %d, steps with a difference %d/%d, rows %.2g, "
           "logits %.2g, ppl gpu %.4f cpu %.4f, entries %lld of %lld%s\n",
           pol, budget, ekv_kv_type_name(t), (int)n_prompt, bad_prompt, bad_steps, N_STEPS, rows, maxv > 0 ? maxd / maxv : maxd, ppl_g,
           ppl_c, (long long)st.entries, (long long)st.entries_full, sf ? (same_full ? ", == full" : ", != full") : "");
    /* With f32 rows the GPU's statistics differ from the CPU's by the order
     * of sums only: the kept sets must be the same at every step. With
     * fp16 or quantised rows a key or value may round the other way (see
     * below), which moves probabilities by ~1e-3: an entry whose score ties
     * another's to that precision may be kept on one side and not the other
     * during decoding (measured on lavapipe: at most 2 of 40 steps). */
    CHECK_MSG(bad_prompt == 0 && (t == EKV_KV_F32 ? bad_steps == 0 : bad_steps <= N_STEPS / 8),
              "%s %.1f %s: kept sets differ from the CPU's (after the prompt: %d heads, then %d steps)", pol, budget,
              ekv_kv_type_name(t), bad_prompt, bad_steps);
    /* K and V come out of the GPU's own sums: an fp16 value may round the
     * other way (1 ulp, ~1e-3 of the value), a q8_0 / q4_0 code may move by
     * a step (1/127, 1/7 of its block's largest), a KIVI code by a step of
     * its group's range (1/15, 1/3; a merged mean weighted by the attention
     * moves most: measured 0.12 with kivi4); a wrong row moved by a plan is
     * off by the row's whole size (0.66-1.0 measured, kivi2 and kivi4) */
    const double row_bound = t == EKV_KV_KIVI2 ? 0.5 : t == EKV_KV_KIVI4 ? 0.25 : t == EKV_KV_Q4_0 ? 0.15 : t == EKV_KV_Q8_0 ? 2e-2
                             : t == EKV_KV_F16 ? 2e-3 : 1e-5;
    CHECK_MSG(rows <= row_bound, "%s %.1f %s: device rows differ by %.3g", pol, budget, ekv_kv_type_name(t), rows);
    CHECK_MSG(fabs(ppl_g / ppl_c - 1.0) <= 0.005, "%s %.1f %s: ppl %.5f vs CPU %.5f", pol, budget,
              ekv_kv_type_name(t), ppl_g, ppl_c);
    if (sf) CHECK_MSG(same_full, "%s at budget 1.0 differs from the full cache on the GPU", pol);
    /* M-RoPE (test_mrope): an image row turned by the wrong position moves the logits far past this */
    if (g_img && t == EKV_KV_F32)
        CHECK_MSG(maxv > 0 && maxd <= 1e-4 * maxv, "%s %.1f: logits differ from the CPU's by %.3g of %.3g", pol, budget,
                  maxd, maxv);
    /* merges run on the device (weighted means, keys turned by key=rotate,
     * value=attn's weights, key=anchor; with KIVI storage the means
     * quantised into their groups and rows there too): only a policy that
     * reads rows itself (+merge's default merge_to=key compares keys) reads
     * heads back */
    const bool reads_rows = strstr(pol, "+merge") && !strstr(pol, "merge_to=pos");
    if (!reads_rows)
        CHECK_MSG(read_backs == 0, "%s: %llu heads read back", pol, (unsigned long long)read_backs);
    else if (budget < 1.0)
        CHECK(read_backs > 0);
    if (budget == 1.0) CHECK(st.entries == st.entries_full);
    /* bytes held in the storage type's sizes, as the CPU's cache counts them (--kv-mem admission and the
     * bench's sessions read them); with different kept sets the counts differ by those entries */
    struct ekv_kv_stats sc_st;
    ekv_seq_kv_stats(sc, &sc_st);
    if (!heads_differ(sg->kv, sc->kv))
        CHECK_MSG(st.bytes == sc_st.bytes && st.bytes_full == sc_st.bytes_full,
                  "%s %.1f %s: GPU holds %llu bytes, the CPU %llu", pol, budget, ekv_kv_type_name(t),
                  (unsigned long long)st.bytes, (unsigned long long)sc_st.bytes);
    free(lg), free(lc), free(lf);
    ekv_seq_free(sg), ekv_seq_free(sc), ekv_seq_free(sf);
}

void run_case(const struct ekv_model *m, struct ekv_context *cg, struct ekv_context *cc, const int32_t *toks,
                     const char *pol, double budget, enum ekv_kv_type t) {
    run_case_n(m, cg, cc, toks, N_PROMPT, pol, budget, t);
}
