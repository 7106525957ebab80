/*
 * test_gpu_policy.c — compressed KV caches on the GPU (every policy but
 * full, engine/backend_vk_policy.c), on a real Vulkan device: lavapipe in
 * CI under the validation layer (any message fails), or $EKV_TEST_DEVICE.
 *
 * - statistics: the attention shaders' colsum, count, sumsq, lastrow,
 *   winsum, bincount and VL-Cache's sparsity counts against the CPU's, on a
 *   prompt where nothing is evicted (budget 1.0);
 * - every policy (and elastic-v2 with rotated keys, value=attn and logit biases, and
 *   h2o+merge by position with rotated keys: merge_to=key would follow
 *   the rounding of each backend's own keys near its similarity threshold) x
 *   budget {0.2, 0.5, 1.0} x storage (f16, q8_0; f32 and q4_0 for some),
 *   stories260K, a 64-token prompt then 40 teacher-forced decode steps,
 *   GPU beside CPU: the kept positions and weights of every (layer, KV head)
 *   equal the CPU's after the prompt and after every step (so the budget
 *   is held exactly as on the CPU, whose tests check it), the rows the
 *   device holds equal the CPU cache's rows (read back: the plans moved the
 *   right rows, merged rows — averaged on the device — are the CPU's means),
 *   no head read back during the run unless the policy reads rows itself
 *   (+merge's merge_to=key; merges by any rule run on the device),
 *   the device cache no larger than its rule (kept + 2 x (64 + recompress)), the logits close, the
 *   whole run's perplexity within 0.5% of the CPU's; at budget 1.0 the
 *   logits equal the GPU's full cache bit for bit;
 * - kept sets equal the CPU's given identical statistics: the GPU run's
 *   statistics fed to the CPU's policy (kv->layer_hook) at every step, every
 *   policy x f16, f32, q8_0, q4_0, positions and weights equal at every step;
 * - batched decode of sequences with different policies and storage types
 *   in one forward == each alone, bit for bit;
 * - a sliding-window model: every policy against the CPU (the entries'
 *   positions on the device decide what a row sees);
 * - out of device memory mid-run (injected): the sequence whose cache must
 *   grow fails cleanly and can go on, another one goes on undisturbed;
 * - M-RoPE (tiny-qwen2vl, an image grid between text): rotation by three
 *   positions per row, the same mpos per entry and kept sets as the CPU;
 * - KIVI storage (kivi2, kivi4) under every compressing policy: kept sets,
 *   rows and bytes against the CPU's, merges on the device, submissions
 *   counted;
 * - `full` with a cap on entries (--kv-tokens) keeps every entry, as on
 *   the CPU (part "refused", its former rule: refused on the device);
 * - copies (ekv_seq_copy) of full and compressed device caches go on as
 *   their originals, bit for bit, batched with them and alone.
 *
 * The helpers the parts share are in gpupolicy.c. EKV_GPU_TEST_ONLY=part[,part...]
 * runs only those parts (stats, policies, same, batched, deferred, oom,
 * record, swa, mrope, kivi, refused, copy); EKV_GPU_POLICIES narrows kivi's.
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
#include "gputest.h"
#include "testutil.h"

#include "gpupolicy.h"

/* The GPU's statistics against the CPU's after a prompt that keeps everything. */
static void test_stats(const struct ekv_model *m) {
    static const char *pols[] = {"h2o", "roco", "tova", "snapkv", "scissorhands", "vlcache"};
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 256), *cc = gt_ctx_on(m, "cpu", 256);
    const int32_t V = m->info.n_vocab;
    float *lg = malloc(sizeof(float) * V), *lc = malloc(sizeof(float) * V);
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc; pi++) {
        /* f32 rows: the GPU's keys then differ from the CPU's by the order
         * of sums only (with f16 a key may round the other way, which moves
         * its probabilities by ~1e-3: not the statistics' own error) */
        struct ekv_kv_params kp = kv_params(pols[pi], 1.0, EKV_KV_F32);
        struct ekv_seq *sg = NULL, *sc = NULL;
        CHECK_OK(ekv_seq_new(cg, &kp, &sg));
        CHECK_OK(ekv_seq_new(cc, &kp, &sc));
        if (!sg || !sc) {
            ekv_seq_free(sg), ekv_seq_free(sc);
            continue;
        }
        CHECK(ekv_seq_on_device(sg));
        CHECK_OK(ekv_seq_prefill(sg, g_toks, N_PROMPT, lg));
        CHECK_OK(ekv_seq_prefill(sc, g_toks, N_PROMPT, lc));
        CHECK_OK(ekv_seq_decode(sg, g_toks[N_PROMPT], lg)); /* statistics of a decode row too */
        CHECK_OK(ekv_seq_decode(sc, g_toks[N_PROMPT], lc));
        /* SnapKV and VL-Cache do not read their statistics before the next
         * re-selection point: the decode row's stay summed on the device
         * until asked for */
        const uint64_t summed = ekv_vk_mg_summed(sg->gpu->mg);
        const bool sums = !strcmp(pols[pi], "snapkv") || !strcmp(pols[pi], "vlcache");
        CHECK_MSG((summed > 0) == sums, "%s: %llu forwards summed on the device", pols[pi], (unsigned long long)summed);
        CHECK_OK(ekv_vk_mg_stats_sync(sg->gpu->mg));
        const struct ekv_kv *a = sg->kv, *b = sc->kv;
        double w_col = 0, w_sq = 0, w_last = 0, w_win = 0, w_bin = 0;
        int64_t count_bad = 0, bin_total = 0;
        for (int il = 0; il < a->n_layer; il++)
            for (int hk = 0; hk < a->n_head_kv; hk++) {
                const struct ekv_kv_head *ha = &a->layers[il].heads[hk], *hb = &b->layers[il].heads[hk];
                CHECK(ha->len == hb->len);
                if (ha->len != hb->len) continue;
                const int32_t n = ha->len;
                if (hb->colsum && ha->colsum) {
                    w_col = fmax(w_col, rel_diff_d(ha->colsum, hb->colsum, n));
                    for (int32_t j = 0; j < n; j++) count_bad += ha->count[j] != hb->count[j];
                }
                if (hb->sumsq && ha->sumsq) w_sq = fmax(w_sq, rel_diff_d(ha->sumsq, hb->sumsq, n));
                if (hb->winsum && ha->winsum) w_win = fmax(w_win, rel_diff_d(ha->winsum, hb->winsum, n));
                for (int32_t j = 0; hb->lastrow && ha->lastrow && j < n; j++)
                    w_last = fmax(w_last, fabs(ha->lastrow[j] - hb->lastrow[j]));
                for (int32_t j = 0; hb->bincount && ha->bincount && j < n; j++) {
                    w_bin = fmax(w_bin, fabs(ha->bincount[j] - hb->bincount[j]));
                    bin_total += hb->bincount[j] > 0;
                }
                CHECK((ha->colsum != NULL) == (hb->colsum != NULL) && (ha->sumsq != NULL) == (hb->sumsq != NULL) &&
                      (ha->lastrow != NULL) == (hb->lastrow != NULL) && (ha->winsum != NULL) == (hb->winsum != NULL) &&
                      (ha->bincount != NULL) == (hb->bincount != NULL));
            }
        double sp_a = 0, sp_b = 0, tot_a = 0, tot_b = 0;
        for (int il = 0; il < a->n_layer; il++) {
            sp_a += a->layers[il].sparse_zero, sp_b += b->layers[il].sparse_zero;
            tot_a += a->layers[il].sparse_total, tot_b += b->layers[il].sparse_total;
        }
        printf("stats %-12s: colsum %.2g, sumsq %.2g, winsum %.2g (max rel diff), lastrow %.2g, bincount %.2g "
               "(max abs diff), counts differing %lld, sparsity zeros %.0f / %.0f vs CPU %.0f / %.0f\n",
               pols[pi], w_col, w_sq, w_win, w_last, w_bin, (long long)count_bad, sp_a, tot_a, sp_b, tot_b);
        /* the GPU sums a row's probabilities in float in another order than the
         * CPU (double): relative differences of order 1e-6 */
        CHECK_MSG(w_col <= 1e-4 && w_sq <= 1e-4 && w_win <= 1e-4 && w_last <= 1e-5, "%s: statistics differ", pols[pi]);
        CHECK_MSG(count_bad == 0, "%s: %lld counts differ", pols[pi], (long long)count_bad);
        /* an indicator (p >= 1 / visible keys) flips only for a probability at the threshold */
        CHECK_MSG(w_bin <= 1.0 / (m->info.n_head / m->info.n_head_kv) + 1e-6, "%s: bincount differs by %g", pols[pi], w_bin);
        CHECK_MSG(tot_a == tot_b && fabs(sp_a - sp_b) <= 1e-3 * fmax(tot_b, 1.0), "%s: sparsity counts differ", pols[pi]);
        if (!strcmp(pols[pi], "vlcache")) CHECK(tot_b > 0);
        ekv_seq_free(sg), ekv_seq_free(sc);
    }
    gt_check_validation(cg);
    free(lg), free(lc);
    ekv_context_free(cg), ekv_context_free(cc);
}

static void test_policies(const struct ekv_model *m) {
    static const char *pols[] = {"local",   "h2o",      "scissorhands", "tova",    "roco",
                                 "snapkv",  "pyramidkv", "vlcache",     "random",  "elastic",
                                 "elastic-v2", "elastic-v2:key=rotate:bias=1:recent=0.25",
                                 "h2o+merge:merge_to=pos:merge_key=rotate"};
    static const double budgets[] = {0.2, 0.5, 1.0};
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 256), *cc = gt_ctx_on(m, "cpu", 256);
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc; pi++) {
        for (size_t bi = 0; bi < 3; bi++) run_case(m, cg, cc, g_toks, pols[pi], budgets[bi], EKV_KV_F16);
        run_case(m, cg, cc, g_toks, pols[pi], 0.2, EKV_KV_F32);
    }
    /* value=attn: members weighted by their attention scores, which each
     * backend computes from its own rounding of fp16 keys, so merged fp16
     * rows drift apart by more than a rounding step; with f32 rows they stay
     * within 1e-5 (measured 1.1e-6) */
    if (cg && cc) {
        run_case(m, cg, cc, g_toks, "elastic-v2:key=rotate:value=attn:bias=1:recent=0.25", 0.2, EKV_KV_F32);
        run_case(m, cg, cc, g_toks, "elastic-v2:key=anchor:value=attn", 0.5, EKV_KV_F32);
    }
    /* a longer prompt (the story twice): the device cache grows to the
     * prompt, then shrinks to what the policy kept, and grows again as
     * decoding adds entries */
    int32_t *twice = malloc(sizeof(int32_t) * (3 * N_PROMPT + N_STEPS + 1));
    for (int32_t i = 0; i < 3 * N_PROMPT + N_STEPS + 1; i++) twice[i] = g_toks[i % N_PROMPT];
    run_case_n(m, cg, cc, twice, 3 * N_PROMPT, "h2o", 0.2, EKV_KV_F16); /* three times: the cache shrinks */
    run_case_n(m, cg, cc, twice, 2 * N_PROMPT, "snapkv", 0.3, EKV_KV_F32);
    run_case_n(m, cg, cc, twice, 2 * N_PROMPT, "elastic-v2:bias=1", 0.25, EKV_KV_F16);
    free(twice);
    /* compactions in chunks of about one (layer, side) each (by default a
     * forward's compactions are one pair of dispatches): the same against the CPU */
    ekv_vk_mg_set_chunk(64);
    run_case(m, cg, cc, g_toks, "h2o", 0.2, EKV_KV_F16);
    run_case(m, cg, cc, g_toks, "elastic-v2:bias=1", 0.5, EKV_KV_F32);
    ekv_vk_mg_set_chunk(0);
    gt_check_validation(cg);
    ekv_context_free(cg), ekv_context_free(cc);
    /* q8_0 and q4_0 rows (head_dim 64), every policy at 0.2 and 0.5 */
    const struct ekv_model *mb = g_mb;
    cg = mb ? gt_ctx_on(mb, g_dev, 256) : NULL;
    cc = mb ? gt_ctx_on(mb, "cpu", 256) : NULL;
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc; pi++) {
        for (size_t bi = 0; bi < 2; bi++) run_case(mb, cg, cc, g_toks_b, pols[pi], budgets[bi], EKV_KV_Q8_0);
        run_case(mb, cg, cc, g_toks_b, pols[pi], 0.2, EKV_KV_Q4_0);
    }
    run_case(mb, cg, cc, g_toks_b, "h2o", 1.0, EKV_KV_Q8_0);
    gt_check_validation(cg);
    ekv_context_free(cg), ekv_context_free(cc);
}

/* ---- the same statistics fed to both ---- */

/* One layer's statistics as the GPU run computed them, [head] arrays. */
struct saved_layer {
    int32_t len[16];
    double *colsum[16], *sumsq[16], *winsum[16];
    int32_t *count[16];
    float *lastrow[16], *bincount[16];
    double sparse_zero, sparse_total;
};
struct stats_feed {
    struct saved_layer *layers; /* [n_layer] */
    int n_layer, n_head_kv;
    int mismatches;             /* the CPU's entries were not the GPU's when fed */
};

#define DUP(dst, src, n)                                                  \
    do {                                                                  \
        free(dst);                                                        \
        (dst) = NULL;                                                     \
        if (src) {                                                        \
            (dst) = malloc(sizeof *(src) * (size_t)((n) ? (n) : 1));      \
            memcpy((dst), (src), sizeof *(src) * (size_t)(n));            \
        }                                                                 \
    } while (0)

/* GPU side: keep layer il's statistics before its policy acts. */
static void feed_save(struct ekv_kv *kv, int il, void *user) {
    struct stats_feed *f = user;
    struct saved_layer *L = &f->layers[il];
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        L->len[hk] = h->len;
        DUP(L->colsum[hk], h->colsum, h->len);
        DUP(L->count[hk], h->count, h->len);
        DUP(L->sumsq[hk], h->sumsq, h->len);
        DUP(L->lastrow[hk], h->lastrow, h->len);
        DUP(L->winsum[hk], h->winsum, h->len);
        DUP(L->bincount[hk], h->bincount, h->len);
    }
    L->sparse_zero = kv->layers[il].sparse_zero;
    L->sparse_total = kv->layers[il].sparse_total;
}

/* CPU side: the GPU's statistics replace the CPU's before its policy acts. */
static void feed_load(struct ekv_kv *kv, int il, void *user) {
    struct stats_feed *f = user;
    const struct saved_layer *L = &f->layers[il];
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (h->len != L->len[hk]) {
            f->mismatches++;
            continue;
        }
        const size_t n = (size_t)h->len;
        if (h->colsum && L->colsum[hk]) memcpy(h->colsum, L->colsum[hk], n * sizeof *h->colsum);
        if (h->count && L->count[hk]) memcpy(h->count, L->count[hk], n * sizeof *h->count);
        if (h->sumsq && L->sumsq[hk]) memcpy(h->sumsq, L->sumsq[hk], n * sizeof *h->sumsq);
        if (h->lastrow && L->lastrow[hk]) memcpy(h->lastrow, L->lastrow[hk], n * sizeof *h->lastrow);
        if (h->winsum && L->winsum[hk]) memcpy(h->winsum, L->winsum[hk], n * sizeof *h->winsum);
        if (h->bincount && L->bincount[hk]) memcpy(h->bincount, L->bincount[hk], n * sizeof *h->bincount);
    }
    kv->layers[il].sparse_zero = L->sparse_zero;
    kv->layers[il].sparse_total = L->sparse_total;
}

static void feed_free(struct stats_feed *f) {
    for (int il = 0; il < f->n_layer; il++)
        for (int hk = 0; hk < f->n_head_kv; hk++) {
            struct saved_layer *L = &f->layers[il];
            free(L->colsum[hk]), free(L->count[hk]), free(L->sumsq[hk]);
            free(L->lastrow[hk]), free(L->winsum[hk]), free(L->bincount[hk]);
        }
    free(f->layers);
}

/* Every policy x storage type at 0.3, the GPU's statistics fed to the CPU's
 * policy at every step: the kept positions and weights must then be the
 * CPU's exactly, after the prompt and after every decode step. */
static void same_stats_case(const struct ekv_model *m, struct ekv_context *cg, struct ekv_context *cc,
                            const int32_t *toks, const char *pol, enum ekv_kv_type t) {
    struct ekv_kv_params kp = kv_params(pol, 0.3, t);
    struct ekv_seq *sg = NULL, *sc = NULL;
    CHECK_OK(ekv_seq_new(cg, &kp, &sg));
    CHECK_OK(ekv_seq_new(cc, &kp, &sc));
    if (!sg || !sc || m->info.n_head_kv > 16) {
        ekv_seq_free(sg), ekv_seq_free(sc);
        return;
    }
    struct stats_feed f = {.n_layer = m->info.n_layer, .n_head_kv = m->info.n_head_kv};
    f.layers = calloc((size_t)f.n_layer, sizeof *f.layers);
    sg->kv->layer_hook = feed_save, sg->kv->layer_hook_user = &f;
    sc->kv->layer_hook = feed_load, sc->kv->layer_hook_user = &f;
    const int32_t V = m->info.n_vocab;
    float *l = malloc(sizeof(float) * V);
    CHECK_OK(prompt_in(sg, toks, N_PROMPT, l));
    CHECK_OK(prompt_in(sc, toks, N_PROMPT, l));
    int bad = heads_differ(sg->kv, sc->kv) != 0;
    for (int step = 0; step < 12; step++) {
        CHECK_OK(ekv_seq_decode(sg, toks[N_PROMPT + step], l));
        CHECK_OK(ekv_seq_decode(sc, toks[N_PROMPT + step], l));
        bad += heads_differ(sg->kv, sc->kv) != 0;
    }
    CHECK_MSG(bad == 0 && f.mismatches == 0, "%s %s, the same statistics: kept sets differ at %d of 13 points (%d feeds "
              "mismatched)", pol, ekv_kv_type_name(t), bad, f.mismatches);
    free(l);
    feed_free(&f);
    ekv_seq_free(sg), ekv_seq_free(sc);
}

static void test_same_stats(const struct ekv_model *m) {
    static const char *pols[] = {"local",     "h2o",    "scissorhands", "tova",    "roco",       "snapkv",
                                 "pyramidkv", "vlcache", "random",      "elastic", "elastic-v2", "elastic-v2:key=rotate:value=attn",
                                 "snapkv+merge:merge_to=pos", "snapkv+adakv", "h2o+adakv", "roco+adakv", "vlcache+adakv"};
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 256), *cc = gt_ctx_on(m, "cpu", 256);
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc; pi++) {
        same_stats_case(m, cg, cc, g_toks, pols[pi], EKV_KV_F16);
        same_stats_case(m, cg, cc, g_toks, pols[pi], EKV_KV_F32);
    }
    ekv_context_free(cg), ekv_context_free(cc);
    const struct ekv_model *mb = g_mb;
    cg = mb ? gt_ctx_on(mb, g_dev, 256) : NULL;
    cc = mb ? gt_ctx_on(mb, "cpu", 256) : NULL;
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc; pi++) {
        same_stats_case(mb, cg, cc, g_toks_b, pols[pi], EKV_KV_Q8_0);
        same_stats_case(mb, cg, cc, g_toks_b, pols[pi], EKV_KV_Q4_0);
    }
    gt_check_validation(cg);
    ekv_context_free(cg), ekv_context_free(cc);
    printf("the same statistics fed to the CPU: every policy x f16, f32, q8_0, q4_0 checked\n");
}

/* Deferred statistics (backend_vk_mg.h): a policy that sums its decode
 * statistics on the device between re-selection points keeps the rows'
 * queries in a ring and runs one statistics pass when it reads them. The
 * same run with every step's own pass (the ring off) gives the same logits
 * at every step, the same kept entries and the same statistics, bit for bit:
 * re-selection every 8 steps (passes over 8 rows), every 100 with a 100-query
 * window (36 decode rows: the ring of 32 full, a pass inside the window), copies
 * taken with rows waiting, and rows waiting when the statistics are asked for. */
/* The host's window sums of two caches: heads that differ. */
static int winsum_differ(const struct ekv_kv *a, const struct ekv_kv *b) {
    int bad = 0;
    for (int il = 0; il < a->n_layer; il++)
        for (int hk = 0; hk < a->n_head_kv; hk++) {
            const struct ekv_kv_head *ha = &a->layers[il].heads[hk], *hb = &b->layers[il].heads[hk];
            if (ha->len != hb->len || (ha->winsum == NULL) != (hb->winsum == NULL)) bad++;
            else if (ha->winsum) bad += memcmp(ha->winsum, hb->winsum, sizeof(double) * (size_t)ha->len) != 0;
        }
    return bad;
}

static void defer_case(const struct ekv_model *m, struct ekv_context *cx, const char *pol, int recompress, int window,
                       int copy_at, int sync_at) {
    struct ekv_kv_params kp = kv_params(pol, 0.3, EKV_KV_F16);
    kp.recompress = recompress;
    kp.obs_window = window;
    const size_t V = (size_t)m->info.n_vocab;
    struct ekv_seq *a = NULL, *b = NULL, *ca = NULL, *cb = NULL;
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    CHECK_OK(ekv_seq_new(cx, &kp, &a));
    CHECK_OK(ekv_seq_new(cx, &kp, &b));
    if (!a || !b || !la || !lb) goto out;
    ekv_vk_mg_set_defer(b->gpu->mg, false);
    CHECK_OK(ekv_seq_prefill(a, g_toks, N_PROMPT, la));
    CHECK_OK(ekv_seq_prefill(b, g_toks, N_PROMPT, lb));
    int bad = 0, bad_stats = 0;
    for (int step = 0; step < N_STEPS; step++) {
        CHECK_OK(ekv_seq_decode(a, g_toks[N_PROMPT + step], la));
        CHECK_OK(ekv_seq_decode(b, g_toks[N_PROMPT + step], lb));
        bad += memcmp(la, lb, V * sizeof *la) != 0;
        if (step == copy_at) { /* copies with rows waiting (in a) go on as their originals */
            CHECK_OK(ekv_seq_copy(a, &ca));
            CHECK_OK(ekv_seq_copy(b, &cb));
        }
        if (step == sync_at) { /* the sums asked for with rows waiting */
            CHECK_OK(ekv_vk_mg_stats_sync(a->gpu->mg));
            CHECK_OK(ekv_vk_mg_stats_sync(b->gpu->mg));
            bad_stats += winsum_differ(a->kv, b->kv);
        }
    }
    CHECK_MSG(ekv_vk_mg_deferred(a->gpu->mg) > 0 && ekv_vk_mg_deferred(b->gpu->mg) == 0,
              "%s recompress %d: %llu rows deferred (and %llu with the ring off)", pol, recompress,
              (unsigned long long)ekv_vk_mg_deferred(a->gpu->mg), (unsigned long long)ekv_vk_mg_deferred(b->gpu->mg));
    for (int step = 0; ca && cb && step < 6; step++) {
        CHECK_OK(ekv_seq_decode(ca, g_toks[step], la));
        CHECK_OK(ekv_seq_decode(cb, g_toks[step], lb));
        bad += memcmp(la, lb, V * sizeof *la) != 0;
    }
    CHECK_OK(ekv_vk_mg_stats_sync(a->gpu->mg));
    CHECK_OK(ekv_vk_mg_stats_sync(b->gpu->mg));
    bad_stats += winsum_differ(a->kv, b->kv);
    CHECK_MSG(bad == 0 && bad_stats == 0 && heads_differ(a->kv, b->kv) == 0 && (!ca || heads_differ(ca->kv, cb->kv) == 0),
              "%s recompress %d window %d: deferred statistics differ from per-step ones (%d steps, %d heads' sums)",
              pol, recompress, window, bad, bad_stats);
out:
    ekv_seq_free(a), ekv_seq_free(b), ekv_seq_free(ca), ekv_seq_free(cb);
    free(la), free(lb);
}

static void test_deferred(const struct ekv_model *m) {
    struct ekv_context *cx = gt_ctx_on(m, g_dev, 256);
    if (!cx) return;
    defer_case(m, cx, "snapkv", 8, -1, 12, -1);
    /* a window of 36 decode rows (64..99): the ring of 32 fills at 95, rows
     * 96..98 wait when the sums are asked for */
    defer_case(m, cx, "snapkv", 100, 100, -1, 34);
    defer_case(m, cx, "pyramidkv", 8, -1, 12, 20);
    defer_case(m, cx, "snapkv+merge:merge_to=pos", 8, -1, 12, -1);
    gt_check_validation(cx);
    ekv_context_free(cx);
    printf("deferred statistics equal per-step ones: snapkv, pyramidkv, snapkv+merge\n");
}

/* Sequences with different policies and storage types decoded in one
 * forward equal each decoded alone, bit for bit. */
struct batch_case {
    const char *pol;
    double budget;
    enum ekv_kv_type t;
};

static void batched_cases(const struct ekv_model *m, const int32_t *g_toks, const struct batch_case c[4]) {
    struct ekv_context *cx = gt_ctx_on(m, g_dev, 256);
    if (!cx) return;
    struct ekv_seq *bat[4] = {0}, *alone[4] = {0};
    const int32_t V = m->info.n_vocab;
    float *lb = malloc(sizeof(float) * V * 4), *la = malloc(sizeof(float) * V);
    bool same = true;
    for (int i = 0; i < 4; i++) {
        struct ekv_kv_params kp = kv_params(c[i].pol, c[i].budget, c[i].t);
        CHECK_OK(ekv_seq_new(cx, &kp, &bat[i]));
        CHECK_OK(ekv_seq_new(cx, &kp, &alone[i]));
        if (!bat[i] || !alone[i]) goto out;
        const int32_t np = 20 + 9 * i; /* different lengths */
        CHECK_OK(ekv_seq_prefill(bat[i], g_toks + i, np, la));
        CHECK_OK(ekv_seq_prefill(alone[i], g_toks + i, np, la));
    }
    for (int step = 0; step < 12; step++) {
        int32_t tk[4];
        for (int i = 0; i < 4; i++) tk[i] = g_toks[40 + step + i];
        CHECK_OK(ekv_decode_batch(cx, bat, tk, 4, lb));
        for (int i = 0; i < 4; i++) {
            CHECK_OK(ekv_seq_decode(alone[i], tk[i], la));
            same = same && !memcmp(la, lb + (size_t)i * V, sizeof(float) * V);
        }
    }
    for (int i = 0; i < 4; i++) same = same && heads_differ(bat[i]->kv, alone[i]->kv) == 0;
    CHECK_MSG(same, "batched decode of mixed policies differs from each alone");
    gt_check_validation(cx);
out:
    for (int i = 0; i < 4; i++) ekv_seq_free(bat[i]), ekv_seq_free(alone[i]);
    free(lb), free(la);
    ekv_context_free(cx);
}

static void test_batched(const struct ekv_model *m) {
    const struct batch_case c[4] = {
        {"h2o", 0.3, EKV_KV_F16}, {"full", 1.0, EKV_KV_F16}, {"elastic-v2", 0.4, EKV_KV_F16}, {"snapkv", 0.25, EKV_KV_F32}};
    batched_cases(m, g_toks, c);
}

/* Out of device memory mid-run: the sequence whose cache must grow fails
 * with a clear error (its cache as it was: it can go on), another sequence
 * on the same device goes on, equal to runs that never saw the failure. */
static void test_oom(const struct ekv_model *m) {
    struct ekv_context *cx = gt_ctx_on(m, g_dev, 256), *cr = gt_ctx_on(m, g_dev, 256);
    if (!cx || !cr) {
        ekv_context_free(cx), ekv_context_free(cr);
        return;
    }
    struct ekv_kv_params kp = kv_params("h2o", 0.5, EKV_KV_F16);
    struct ekv_seq *a = NULL, *b = NULL, *ra = NULL, *rb = NULL, *w = NULL;
    const int32_t V = m->info.n_vocab;
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    int32_t *twice = malloc(sizeof(int32_t) * 2 * N_PROMPT);
    for (int32_t i = 0; i < 2 * N_PROMPT; i++) twice[i] = g_toks[i % N_PROMPT];
    /* the forward's scratch sized for 2 N_PROMPT rows first, so that only the cache needs memory later */
    CHECK_OK(ekv_seq_new(cx, &kp, &w));
    if (w) CHECK_OK(ekv_seq_prefill(w, twice, 2 * N_PROMPT, l1));
    ekv_seq_free(w);
    CHECK_OK(ekv_seq_new(cx, &kp, &a));
    CHECK_OK(ekv_seq_new(cx, &kp, &b));
    CHECK_OK(ekv_seq_new(cr, &kp, &ra));
    CHECK_OK(ekv_seq_new(cr, &kp, &rb));
    if (!a || !b || !ra || !rb) goto out;
    CHECK_OK(ekv_seq_prefill(a, g_toks, 16, l1));
    CHECK_OK(ekv_seq_prefill(ra, g_toks, 16, l1));
    CHECK_OK(ekv_seq_prefill(b, g_toks + 3, 16, l1));
    CHECK_OK(ekv_seq_prefill(rb, g_toks + 3, 16, l1));
    ekv_vk_fail_allocs_after(cx->gpu->vk, 0);
    const enum ekv_status s = ekv_seq_prefill(a, twice, 2 * N_PROMPT, l1); /* a's cache must grow: no memory */
    CHECK_MSG(s == EKV_ERR_NOMEM && strstr(ekv_last_error(), "device memory"), "%s: %s", ekv_status_str(s),
              ekv_last_error());
    bool same = true;
    for (int step = 0; step < 20; step++) { /* b goes on, without needing memory */
        CHECK_OK(ekv_seq_decode(b, g_toks[20 + step], l1));
        CHECK_OK(ekv_seq_decode(rb, g_toks[20 + step], l2));
        same = same && !memcmp(l1, l2, sizeof(float) * V);
    }
    ekv_vk_fail_allocs_after(cx->gpu->vk, -1);
    for (int step = 0; step < 8; step++) { /* and a too, once memory is back */
        CHECK_OK(ekv_seq_decode(a, g_toks[30 + step], l1));
        CHECK_OK(ekv_seq_decode(ra, g_toks[30 + step], l2));
        same = same && !memcmp(l1, l2, sizeof(float) * V);
    }
    CHECK_MSG(same, "after a failed allocation the sequences differ from runs without it");
    gt_check_validation(cx);
out:
    ekv_seq_free(a), ekv_seq_free(b), ekv_seq_free(ra), ekv_seq_free(rb);
    free(l1), free(l2), free(twice);
    ekv_context_free(cx), ekv_context_free(cr);
}

/* The attention of the latest query recorded on the GPU (ekv eval's hit
 * rate): a full cache there records from its first forward, as the CPU. */
static void test_record(const struct ekv_model *m) {
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 256), *cc = gt_ctx_on(m, "cpu", 256);
    struct ekv_kv_params kp = kv_params("full", 1.0, EKV_KV_F32);
    struct ekv_seq *sg = NULL, *sc = NULL;
    if (cg && cc) CHECK_OK(ekv_seq_new(cg, &kp, &sg));
    if (cg && cc) CHECK_OK(ekv_seq_new(cc, &kp, &sc));
    if (sg && sc) {
        CHECK_OK(ekv_seq_kv_record_attention(sg, true));
        CHECK_OK(ekv_seq_kv_record_attention(sc, true));
        CHECK(ekv_seq_on_device(sg));
        CHECK_OK(ekv_seq_prefill(sg, g_toks, N_PROMPT, NULL));
        CHECK_OK(ekv_seq_prefill(sc, g_toks, N_PROMPT, NULL));
        CHECK_OK(ekv_seq_decode(sg, g_toks[N_PROMPT], NULL));
        CHECK_OK(ekv_seq_decode(sc, g_toks[N_PROMPT], NULL));
        float a[N_PROMPT + 1], b[N_PROMPT + 1];
        double worst = 0.0;
        for (int il = 0; il < m->info.n_layer; il++)
            for (int hk = 0; hk < m->info.n_head_kv; hk++) {
                size_t na = 0, nb = 0;
                CHECK_OK(ekv_seq_kv_last_attention(sg, il, hk, a, N_PROMPT + 1, &na));
                CHECK_OK(ekv_seq_kv_last_attention(sc, il, hk, b, N_PROMPT + 1, &nb));
                CHECK(na == N_PROMPT + 1 && nb == na);
                for (size_t j = 0; j < na && j < nb; j++) worst = fmax(worst, fabs(a[j] - b[j]));
            }
        printf("recorded attention of the latest query, GPU against CPU: max |diff| %.2g\n", worst);
        CHECK_MSG(worst <= 1e-5, "recorded attention differs by %.3g", worst);
        /* only before the first forward */
        CHECK(ekv_seq_kv_record_attention(sg, false) == EKV_OK);
    }
    ekv_seq_free(sg), ekv_seq_free(sc);
    struct ekv_seq *late = NULL;
    if (cg) CHECK_OK(ekv_seq_new(cg, &kp, &late));
    if (late) {
        CHECK_OK(ekv_seq_prefill(late, g_toks, 8, NULL));
        CHECK(ekv_seq_kv_record_attention(late, true) == EKV_ERR_INVALID_ARG);
        CHECK_OK(ekv_seq_decode(late, g_toks[8], NULL)); /* and it goes on as it was */
    }
    ekv_seq_free(late);
    gt_check_validation(cg);
    ekv_context_free(cg), ekv_context_free(cc);
}

static void copy_case(const struct ekv_model *m, struct ekv_context *cx, const int32_t *toks, const char *pol,
                      double budget, enum ekv_kv_type tk, enum ekv_kv_type tv, int pre, int recompress);

/* A sliding-window model (Mistral's layout at small width, a window of 24
 * over a 64-token prompt and 40 steps): the positions of a compressed
 * cache's entries decide what a row sees; every policy against the CPU, and
 * with the same statistics. */
static void test_swa(void) {
    static const char *pols[] = {"local", "h2o", "tova", "snapkv", "vlcache", "elastic", "elastic-v2"};
    char path[96];
    struct ekv_model *m = mk_model("--preset tiny-mistral --sliding-window 24 --type f32", "swa", path, sizeof path);
    if (!m) return;
    CHECK(m->info.sliding_window == 24);
    int32_t toks[N_PROMPT + N_STEPS + 1];
    for (int32_t i = 0; i < N_PROMPT + N_STEPS + 1; i++) toks[i] = 1 + (i * 53 + 7) % (m->info.n_vocab - 1);
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 256), *cc = gt_ctx_on(m, "cpu", 256);
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc; pi++) {
        run_case(m, cg, cc, toks, pols[pi], 0.3, EKV_KV_F16);
        run_case(m, cg, cc, toks, pols[pi], 0.5, EKV_KV_Q8_0);
        same_stats_case(m, cg, cc, toks, pols[pi], EKV_KV_F32);
    }
    run_case(m, cg, cc, toks, "h2o", 1.0, EKV_KV_F16); /* == the full cache bit for bit */
    if (cg) copy_case(m, cg, toks, "h2o", 0.3, EKV_KV_F16, EKV_KV_F16, 0, -1); /* a copy's entry positions (ekv_seq_copy) */
    gt_check_validation(cg);
    ekv_context_free(cg), ekv_context_free(cc);
    ekv_model_free(m);
    remove(path);
}

/* Qwen2-VL's M-RoPE (tiny-qwen2vl): a prompt with a 6 x 4 image grid
 * between text, GPU beside CPU — the device rotates each row by its
 * (time, height, width) positions (the host's {cos, sin} rows), the host
 * cache records the same three positions per entry as the CPU's, full and
 * compressing policies (elastic-v2 turning merged keys per component)
 * keep the same sets, logits close (f32: 1e-4 of the largest). */
static void test_mrope(void) {
    char path[96], mm[112];
    struct ekv_model *m = mk_model("--preset tiny-qwen2vl --type f32 --seed 4", "mrope", path, sizeof path);
    snprintf(mm, sizeof mm, "/tmp/ekv-test-gpu-policy-mrope-%ld.mmproj.gguf", (long)getpid());
    if (!m) {
        remove(mm);
        return;
    }
    CHECK(m->info.rope_sections[0] > 0);
    int32_t toks[N_PROMPT + N_STEPS + 1];
    for (int32_t i = 0; i < N_PROMPT + N_STEPS + 1; i++) toks[i] = 1 + (i * 53 + 7) % (m->info.n_vocab - 1);
    const int32_t W = 6, Hh = 4, E = m->info.n_embd;
    float *img = malloc(sizeof(float) * (size_t)W * Hh * E);
    uint64_t x = 42;
    for (int32_t i = 0; img && i < W * Hh * E; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        img[i] = (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5);
    }
    g_img = img, g_img_w = W, g_img_h = Hh;
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 256), *cc = gt_ctx_on(m, "cpu", 256);
    static const char *pols[] = {"h2o", "snapkv", "local", "elastic-v2:key=rotate", "tova+merge:merge_to=pos:merge_key=anchor"};
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc && img; pi++) {
        run_case(m, cg, cc, toks, pols[pi], 0.3, EKV_KV_F32);
        run_case(m, cg, cc, toks, pols[pi], 0.5, EKV_KV_F16);
    }
    if (cg && cc && img) {
        run_case(m, cg, cc, toks, "h2o", 1.0, EKV_KV_F32); /* == the full cache bit for bit, close to the CPU */
        same_stats_case(m, cg, cc, toks, "elastic-v2:key=rotate", EKV_KV_F32);
    }
    g_img = NULL;
    gt_check_validation(cg);
    ekv_context_free(cg), ekv_context_free(cc);
    free(img);
    ekv_model_free(m);
    remove(path), remove(mm);
}

/* KIVI storage under every policy (backend_vk_kivi.c): key groups that
 * shrink, join and are re-quantised on the device, values and the residual
 * rule, as the CPU's store does it (EKV_GPU_POLICIES=a,b narrows the list) */
static void test_kivi(void) {
    static const char *pols[] = {"local",   "h2o",      "scissorhands", "tova",    "roco",
                                 "snapkv",  "pyramidkv", "vlcache",     "random",  "elastic",
                                 "elastic-v2", "elastic-v2:key=rotate:bias=1:recent=0.25",
                                 "h2o+merge:merge_to=pos:merge_key=rotate"};
    const struct ekv_model *mb = g_mb;
    struct ekv_context *cg = mb ? gt_ctx_on(mb, g_dev, 256) : NULL, *cc = mb ? gt_ctx_on(mb, "cpu", 256) : NULL;
    const char *only_pols = getenv("EKV_GPU_POLICIES");
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0] && cg && cc; pi++) {
        if (only_pols && !strstr(only_pols, pols[pi])) continue;
        run_case(mb, cg, cc, g_toks_b, pols[pi], 0.2, EKV_KV_KIVI4);
        run_case(mb, cg, cc, g_toks_b, pols[pi], 0.5, EKV_KV_KIVI2);
    }
    if (!only_pols && cg && cc) {
        /* batched with other policies and types, each as alone */
        const struct batch_case c[4] = {{"h2o", 0.3, EKV_KV_KIVI4}, {"full", 1.0, EKV_KV_KIVI2},
                                        {"elastic-v2", 0.4, EKV_KV_KIVI2}, {"snapkv", 0.25, EKV_KV_F16}};
        batched_cases(mb, g_toks_b, c);
        run_case(mb, cg, cc, g_toks_b, "h2o", 1.0, EKV_KV_KIVI4); /* == the full cache's KIVI path, bit for bit */
        run_case(mb, cg, cc, g_toks_b, "elastic-v2:key=anchor", 0.5, EKV_KV_KIVI4);
        /* a longer prompt: the residual grows to a chunk of it, then shrinks back */
        int32_t *twice = malloc(sizeof(int32_t) * (3 * N_PROMPT + N_STEPS + 1));
        for (int32_t i = 0; i < 3 * N_PROMPT + N_STEPS + 1; i++) twice[i] = g_toks_b[i % N_PROMPT];
        run_case_n(mb, cg, cc, twice, 3 * N_PROMPT, "snapkv", 0.3, EKV_KV_KIVI4);
        free(twice);
        /* compactions in chunks of about one (layer, side) */
        ekv_vk_mg_set_chunk(64);
        run_case(mb, cg, cc, g_toks_b, "tova", 0.2, EKV_KV_KIVI2);
        ekv_vk_mg_set_chunk(0);
        /* a forward's plans in one submission: after h2o's prompt every
         * layer compacts, then quantises its residual (a second plan of the
         * same heads: the next phase of the one submission, not a submission
         * of its own: measured 2 for the prompt, 4 = 2 + n_layer before), and
         * a decode step costs the forward and one submission of plans, now
         * and then a move to other buffers */
        struct ekv_kv_params kp = kv_params("h2o", 0.3, EKV_KV_KIVI4);
        struct ekv_seq *sq = NULL;
        float *lg = malloc(sizeof(float) * (size_t)mb->info.n_vocab);
        CHECK_OK(ekv_seq_new(cg, &kp, &sq));
        if (sq && lg) {
            const uint64_t np0 = ekv_vk_submits(cg->gpu->vk);
            CHECK_OK(ekv_seq_prefill(sq, g_toks_b, N_PROMPT, lg));
            const uint64_t n0 = ekv_vk_submits(cg->gpu->vk), sp = n0 - np0;
            for (int i = 0; i < 20; i++) CHECK_OK(ekv_seq_decode(sq, g_toks_b[N_PROMPT + i], lg));
            const uint64_t subs = ekv_vk_submits(cg->gpu->vk) - n0;
            printf("h2o kivi4, %d layers: %llu submissions for the prompt, %llu in 20 decode steps\n",
                   (int)mb->info.n_layer, (unsigned long long)sp, (unsigned long long)subs);
            CHECK_MSG(sp <= 3, "%llu submissions for a prompt", (unsigned long long)sp);
            CHECK_MSG(subs <= 2 * 20 + 4, "%llu submissions in 20 decode steps", (unsigned long long)subs);
        }
        free(lg);
        ekv_seq_free(sq);
    }
    gt_check_validation(cg);
    ekv_context_free(cg), ekv_context_free(cc);
}

/* `full` with a cap on entries (--kv-tokens, which grids of policies pass to
 * every policy) keeps every entry on the device as on the CPU: the same
 * logits as without the cap, prompt and decode, in f16 and KIVI4 storage. */
static void full_capped_on(const struct ekv_model *m, const char *dev) {
    struct ekv_context *cx = gt_ctx_on(m, dev, 256);
    const int32_t V = m->info.n_vocab;
    float *a = cx ? malloc(sizeof(float) * (size_t)V) : NULL, *b = cx ? malloc(sizeof(float) * (size_t)V) : NULL;
    static const enum ekv_kv_type types[] = {EKV_KV_F16, EKV_KV_KIVI4};
    for (size_t ti = 0; ti < 2 && a && b; ti++) {
        struct ekv_kv_params kp = kv_params("full", 1.0, types[ti]);
        struct ekv_seq *s0 = NULL, *s1 = NULL;
        CHECK_OK(ekv_seq_new(cx, &kp, &s0));
        kp.max_tokens = 8;
        CHECK_OK(ekv_seq_new(cx, &kp, &s1));
        if (s0 && s1) {
            CHECK_OK(ekv_seq_prefill(s0, g_toks_b, N_PROMPT, a));
            CHECK_OK(ekv_seq_prefill(s1, g_toks_b, N_PROMPT, b));
            int bad = memcmp(a, b, sizeof(float) * (size_t)V) != 0;
            for (int i = 0; i < 4; i++) {
                CHECK_OK(ekv_seq_decode(s0, g_toks_b[N_PROMPT + i], a));
                CHECK_OK(ekv_seq_decode(s1, g_toks_b[N_PROMPT + i], b));
                bad += memcmp(a, b, sizeof(float) * (size_t)V) != 0;
            }
            CHECK_MSG(bad == 0, "full with --kv-tokens 8 on %s (%s): %d of 5 steps differ from no cap", dev,
                      ekv_kv_type_name(types[ti]), bad);
        }
        ekv_seq_free(s0), ekv_seq_free(s1);
    }
    free(a), free(b);
    ekv_context_free(cx);
}

static void test_full_capped(void) {
    if (!g_mb) return;
    full_capped_on(g_mb, g_dev);
    full_capped_on(g_mb, "cpu");
}

/* Copies on the device (ekv_seq_copy): a cache read once and copied goes
 * on as its original, bit for bit, alone and batched with it; the copy
 * outlives its original; an uncopied sequence fed the same tokens agrees
 * (copying changed nothing). m: a model of head_dim 64 (q8_0/q4_0/KIVI).
 * pre: decode steps before the copy; recompress: the policy's
 * --kv-recompress (-1: its default) — a copy taken between re-selection
 * points holds statistics summed on the device only. */
static void copy_case(const struct ekv_model *m, struct ekv_context *cx, const int32_t *toks, const char *pol,
                      double budget, enum ekv_kv_type tk, enum ekv_kv_type tv, int pre, int recompress) {
    const size_t V = (size_t)m->info.n_vocab;
    struct ekv_kv_params kp = kv_params(pol, budget, tk);
    kp.type_v = tv;
    kp.recompress = recompress;
    struct ekv_seq *a = NULL, *c = NULL, *pair[2] = {0};
    float *la = malloc(V * 2 * sizeof *la), *lc = malloc(V * sizeof *lc);
    CHECK_OK(ekv_seq_new(cx, &kp, &a));
    CHECK_OK(ekv_seq_new(cx, &kp, &c));
    if (!a || !c || !la || !lc) goto out;
    CHECK_OK(ekv_seq_prefill(a, toks, N_PROMPT, NULL));
    CHECK_OK(ekv_seq_prefill(c, toks, N_PROMPT, NULL));
    for (int i = 0; i < pre; i++) {
        CHECK_OK(ekv_seq_decode(a, toks[N_PROMPT + i], la));
        CHECK_OK(ekv_seq_decode(c, toks[N_PROMPT + i], lc));
    }
    toks += pre;
    CHECK_OK(ekv_seq_copy(a, &pair[1]));
    pair[0] = a;
    if (!pair[1]) goto out;
    CHECK(ekv_seq_on_device(pair[1]) && heads_differ(a->kv, pair[1]->kv) == 0);
    void *saved = (void *)&kp;
    size_t n_saved = 1;
    CHECK(ekv_seq_save_mem(a, NULL, 0, &saved, &n_saved) == EKV_ERR_UNSUPPORTED && saved == NULL && n_saved == 0 &&
          strstr(ekv_last_error(), "GPU")); /* not yet: docs/kv-files.md */
    struct ekv_seq *loaded = (struct ekv_seq *)&kp;
    CHECK(ekv_seq_load_mem(cx, "EKVCACHE", 8, &loaded, NULL, NULL) == EKV_ERR_UNSUPPORTED && loaded == NULL);
    int bad = 0;
    for (int step = 0; step < 12; step++) { /* the copy batched with its original */
        int32_t t[2] = {toks[N_PROMPT + step], toks[N_PROMPT + step]};
        CHECK_OK(ekv_decode_batch(cx, pair, t, 2, la));
        CHECK_OK(ekv_seq_decode(c, t[0], lc));
        bad += memcmp(la, la + V, V * sizeof *la) != 0 || memcmp(la, lc, V * sizeof *la) != 0;
    }
    ekv_seq_free(a); /* the copy goes on alone */
    a = pair[0] = NULL;
    for (int step = 12; step < 24; step++) {
        CHECK_OK(ekv_seq_decode(pair[1], toks[N_PROMPT + step], la));
        CHECK_OK(ekv_seq_decode(c, toks[N_PROMPT + step], lc));
        bad += memcmp(la, lc, V * sizeof *la) != 0;
    }
    CHECK_MSG(bad == 0 && heads_differ(c->kv, pair[1]->kv) == 0 && rows_diff(c->kv, pair[1]->kv) == 0.0,
              "%s budget %.2f %s/%s: the copy differs from an uncopied run at %d steps", pol, budget,
              ekv_kv_type_name(tk), ekv_kv_type_name(tv), bad);
out:
    ekv_seq_free(a), ekv_seq_free(c), ekv_seq_free(pair[1]);
    free(la), free(lc);
}

static void test_copy(void) {
    const struct ekv_model *mb = g_mb;
    struct ekv_context *cx = mb ? gt_ctx_on(mb, g_dev, 256) : NULL;
    if (cx) {
        copy_case(mb, cx, g_toks_b, "full", 1.0, EKV_KV_F16, EKV_KV_F16, 0, -1);
        copy_case(mb, cx, g_toks_b, "full", 1.0, EKV_KV_KIVI4, EKV_KV_Q8_0, 0, -1);
        copy_case(mb, cx, g_toks_b, "h2o", 0.3, EKV_KV_F16, EKV_KV_F16, 0, -1);
        copy_case(mb, cx, g_toks_b, "snapkv", 0.3, EKV_KV_Q8_0, EKV_KV_Q4_0, 0, -1);
        copy_case(mb, cx, g_toks_b, "snapkv", 0.3, EKV_KV_F16, EKV_KV_F16, 5, 8); /* copied with sums pending */
        copy_case(mb, cx, g_toks_b, "elastic-v2:bias=1", 0.3, EKV_KV_F32, EKV_KV_F16, 0, -1);
        copy_case(mb, cx, g_toks_b, "vlcache", 0.3, EKV_KV_Q4_0, EKV_KV_Q4_0, 0, -1);
        copy_case(mb, cx, g_toks_b, "h2o", 0.3, EKV_KV_KIVI4, EKV_KV_KIVI2, 3, -1);
        copy_case(mb, cx, g_toks_b, "tova", 0.3, EKV_KV_F16, EKV_KV_KIVI4, 0, -1);
        gt_check_validation(cx);
    }
    ekv_context_free(cx);
    printf("copies on the device: 9 policy x storage cases checked\n");
}

/* EKV_GPU_TEST_ONLY=name[,name...] runs only those parts (ctest runs them all) */

int main(void) {
    if (!gt_start("test_gpu_policy", g_dev, sizeof g_dev)) return test_finish("test_gpu_policy");
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &m));
    if (!m) return test_finish("test_gpu_policy");
    CHECK(make_tokens(m));
    char path_b[96] = "";
    if (gt_only("policies") || gt_only("same") || gt_only("refused") || gt_only("copy") || gt_only("kivi")) g_mb = model_b(path_b, sizeof path_b);
    if (gt_only("stats")) test_stats(m);
    if (gt_only("policies")) test_policies(m);
    if (gt_only("same")) test_same_stats(m);
    if (gt_only("batched")) test_batched(m);
    if (gt_only("deferred")) test_deferred(m);
    if (gt_only("oom")) test_oom(m);
    if (gt_only("record")) test_record(m);
    if (gt_only("swa")) test_swa();
    if (gt_only("mrope")) test_mrope();
    if (gt_only("kivi")) test_kivi();
    if (gt_only("refused")) test_full_capped();
    if (gt_only("copy")) test_copy();
    ekv_model_free(g_mb);
    if (*path_b) remove(path_b);
    ekv_model_free(m);
    return test_finish("test_gpu_policy");
}
