/*
 * tova.c — TOVA, token omission via attention (docs/policies.md "tova", pure TOVA).
 *
 * Score: the attention of the latest query (EKV_STAT_LASTROW, a group mean
 * per KV head) averaged over the KV heads, i.e. over all query heads; one
 * selection is shared by every head of the layer. Whenever the layer holds
 * more than ekv_kv_target entries it keeps the top `target` of the whole
 * row (ties: lower index first, docs/policies.md "Ties"). No sinks and no
 * window: unlike kvpress, the newest token is not forced in.
 *
 * Heads of a layer stay equally long under TOVA; if they ever differ (a
 * cache shaped by something else), each head is ranked by its own row.
 */
#include <stdlib.h>

#include "core/util.h"
#include "kv/kv.h"

static enum ekv_status tova_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    (void)step;
    struct ekv_kv_layer *L = &kv->layers[il];
    const int32_t target = ekv_kv_target(kv, il);
    int32_t maxlen = 0;
    bool same = true;
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        if (!L->heads[hk].lastrow)
            return ekv_err(EKV_ERR_INTERNAL, "tova: layer %d head %d has no last-row attention", il, hk);
        if (L->heads[hk].len != L->heads[0].len) same = false;
        if (L->heads[hk].len > maxlen) maxlen = L->heads[hk].len;
    }
    if (maxlen <= target) return EKV_OK;
    double *score = malloc((size_t)maxlen * sizeof *score);
    int32_t *idx = malloc((size_t)target * sizeof *idx);
    enum ekv_status s = EKV_OK;
    if (!score || !idx) {
        s = ekv_err(EKV_ERR_NOMEM, "tova: out of memory for %d entries", (int)maxlen);
        goto done;
    }
    if (same) {
        const int32_t n = L->heads[0].len;
        for (int32_t j = 0; j < n; j++) {
            double acc = 0.0;
            for (int hk = 0; hk < kv->n_head_kv; hk++) acc += L->heads[hk].lastrow[j];
            score[j] = acc / (double)kv->n_head_kv;
        }
        const int32_t m = ekv_topk(score, n, target, NULL, idx);
        for (int hk = 0; hk < kv->n_head_kv && s == EKV_OK; hk++)
            s = ekv_kv_head_keep_idx(kv, &L->heads[hk], idx, m);
    } else {
        for (int hk = 0; hk < kv->n_head_kv && s == EKV_OK; hk++) {
            struct ekv_kv_head *h = &L->heads[hk];
            if (h->len <= target) continue;
            for (int32_t j = 0; j < h->len; j++) score[j] = h->lastrow[j];
            const int32_t m = ekv_topk(score, h->len, target, NULL, idx);
            s = ekv_kv_head_keep_idx(kv, h, idx, m);
        }
    }
done:
    free(score);
    free(idx);
    return s;
}

const struct ekv_policy_ops ekv_policy_tova = {
    .name = "tova",
    .summary = "TOVA: keep the tokens the latest query attends to most (all-head mean)",
    .stats = EKV_STAT_LASTROW,
    .layer = tova_layer,
};
