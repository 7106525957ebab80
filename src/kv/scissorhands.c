/*
 * scissorhands.c — ScissorHands, persistence of importance (docs/policies.md "scissorhands",
 * the [CHOICE] spec there), per KV head.
 *
 * Score: for every query i seen (history window = all queries), count the
 * keys whose attention is >= 1/n_i, n_i the keys query i sees
 * (EKV_STAT_BINCOUNT; with GQA the group mean of the indicators). Whenever
 * a head holds more than ekv_kv_target entries it protects the last
 * `window` entries (default target / 2, RoCo's protocol; params.window
 * sets it absolutely) and keeps the top of the rest by count (ties: lower
 * index first, docs/policies.md "Ties").
 */
#include <stdlib.h>

#include "core/util.h"
#include "kv/kv.h"

/* +adakv (adakv.c): the heads of layer il share the budget by their counts. */
static enum ekv_status sh_layer_ada(struct ekv_kv *kv, int il, int32_t target, int32_t window) {
    const int32_t H = kv->n_head_kv;
    bool over = false;
    for (int hk = 0; hk < H; hk++) {
        const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        over |= h->len > target;
        if (!h->bincount) return ekv_err(EKV_ERR_INTERNAL, "scissorhands: layer %d head %d has no counts", il, hk);
    }
    if (!over) return EKV_OK;
    double **sc = calloc((size_t)H, sizeof *sc);
    enum ekv_status s = sc ? EKV_OK : ekv_err(EKV_ERR_NOMEM, "scissorhands+adakv: scratch");
    for (int hk = 0; hk < H && s == EKV_OK; hk++) {
        const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (!(sc[hk] = malloc((size_t)(h->len ? h->len : 1) * sizeof **sc)))
            s = ekv_err(EKV_ERR_NOMEM, "scissorhands: out of memory for %d scores", (int)h->len);
        for (int32_t j = 0; sc[hk] && j < h->len; j++) sc[hk][j] = h->bincount[j];
    }
    if (s == EKV_OK) s = ekv_adakv_recent_top(kv, il, target, window, (const double *const *)sc);
    for (int hk = 0; sc && hk < H; hk++) free(sc[hk]);
    free(sc);
    return s;
}

static enum ekv_status sh_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    (void)step;
    const int32_t target = ekv_kv_target(kv, il);
    const int32_t window = kv->params.window >= 0 ? kv->params.window : target / 2;
    if (kv->adakv.on && kv->n_head_kv > 1) return sh_layer_ada(kv, il, target, window);
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (h->len <= target) continue;
        if (!h->bincount)
            return ekv_err(EKV_ERR_INTERNAL, "scissorhands: layer %d head %d has no counts", il, hk);
        double *score = malloc((size_t)h->len * sizeof *score);
        if (!score) return ekv_err(EKV_ERR_NOMEM, "scissorhands: out of memory for %d scores", (int)h->len);
        for (int32_t j = 0; j < h->len; j++) score[j] = h->bincount[j];
        enum ekv_status s = ekv_kv_head_keep_recent_top(kv, h, target, window, score);
        free(score);
        if (s != EKV_OK) return s;
    }
    return EKV_OK;
}

const struct ekv_policy_ops ekv_policy_scissorhands = {
    .name = "scissorhands",
    .summary = "ScissorHands: keep tokens most often attended above average, plus a recent window",
    .stats = EKV_STAT_BINCOUNT,
    .layer = sh_layer,
    .headwise = true,
};
