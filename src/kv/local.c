/*
 * local.c — StreamingLLM / Local (POLICIES.md §2): attention sinks plus a
 * recent window. Whenever a head holds more than ekv_kv_target entries it
 * keeps the first `sinks` entries (default 4, the StreamingLLM/kvpress
 * value) and the most recent target - sinks. Position-only: no statistics.
 *
 * [CHOICE] When the target is not larger than `sinks`, the sinks shrink to
 * target - 1 so that the newest token is always kept.
 */
#include <stdlib.h>

#include "core/util.h"
#include "kv/kv.h"

static enum ekv_status local_configure(struct ekv_kv *kv) {
    if (kv->params.sinks < 0) kv->params.sinks = 4;
    return EKV_OK;
}

static enum ekv_status local_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    (void)step;
    const int32_t target = ekv_kv_target(kv, il);
    const int32_t sinks = kv->params.sinks < target - 1 ? kv->params.sinks : target - 1;
    const int32_t recent = target - sinks;
    int32_t *idx = NULL;
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (h->len <= target) continue;
        if (!idx) {
            idx = malloc((size_t)target * sizeof *idx);
            if (!idx) return ekv_err(EKV_ERR_NOMEM, "local: out of memory for %d entries", (int)target);
        }
        /* kept: [0, sinks) and [len - recent, len) */
        int32_t n = 0;
        for (int32_t j = 0; j < sinks; j++) idx[n++] = j;
        for (int32_t j = h->len - recent; j < h->len; j++) idx[n++] = j;
        enum ekv_status s = ekv_kv_head_keep_idx(kv, h, idx, n);
        if (s != EKV_OK) {
            free(idx);
            return s;
        }
    }
    free(idx);
    return EKV_OK;
}

const struct ekv_policy_ops ekv_policy_local = {
    .name = "local",
    .summary = "StreamingLLM: keep the first `sinks` tokens and the most recent ones",
    .configure = local_configure,
    .layer = local_layer,
};
