/*
 * h2o.c — H2O, heavy hitters plus recent tokens (docs/policies.md "h2o", H2O repo
 * "real drop" rule, per KV head with group-mean scores as in EasyKV).
 *
 * Score: the column sum of attention over every query seen (prefill and
 * decode), EKV_STAT_COLSUM, compacted together with the entries. Whenever
 * a head holds more than ekv_kv_target entries it keeps the last `window`
 * entries plus the top (target - window) of the older ones by column sum
 * (ties: lower index first, docs/policies.md "Ties").
 *
 * [CHOICE] Default window = target / 2, H2O's equal heavy/recent split
 * (heavy_ratio = recent_ratio); params.window >= 0 sets it absolutely
 * (clamped to the target). No sinks, as in H2O.
 * With +adakv (adakv.c) the heads of a layer share the budget by column sum.
 */
#include <stdlib.h>

#include "core/util.h"
#include "kv/kv.h"

static enum ekv_status h2o_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    (void)step;
    const int32_t target = ekv_kv_target(kv, il);
    const int32_t window = kv->params.window >= 0 ? kv->params.window : target / 2;
    if (kv->adakv.on && kv->n_head_kv > 1) { /* +adakv: the layer's heads share the budget by column sums */
        bool over = false;
        for (int hk = 0; hk < kv->n_head_kv; hk++) {
            const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            over |= h->len > target;
            if (!h->colsum) return ekv_err(EKV_ERR_INTERNAL, "h2o: layer %d head %d has no column sums", il, hk);
        }
        if (!over) return EKV_OK;
        const double **sc = malloc((size_t)kv->n_head_kv * sizeof *sc);
        if (!sc) return ekv_err(EKV_ERR_NOMEM, "h2o+adakv: scratch");
        for (int hk = 0; hk < kv->n_head_kv; hk++) sc[hk] = kv->layers[il].heads[hk].colsum;
        const enum ekv_status s = ekv_adakv_recent_top(kv, il, target, window, sc);
        free(sc);
        return s;
    }
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (h->len <= target) continue;
        if (!h->colsum) return ekv_err(EKV_ERR_INTERNAL, "h2o: layer %d head %d has no column sums", il, hk);
        enum ekv_status s = ekv_kv_head_keep_recent_top(kv, h, target, window, h->colsum);
        if (s != EKV_OK) return s;
    }
    return EKV_OK;
}

const struct ekv_policy_ops ekv_policy_h2o = {
    .name = "h2o",
    .summary = "H2O: keep heavy hitters by accumulated attention plus a recent window",
    .stats = EKV_STAT_COLSUM,
    .layer = h2o_layer,
    .headwise = true,
};
