/*
 * local.c — StreamingLLM / Local (docs/policies.md "local"): attention sinks plus a
 * recent window. Whenever a head holds more than ekv_kv_target entries it
 * keeps the first `sinks` entries (default 4, the StreamingLLM/kvpress
 * value) and the most recent target - sinks. Position-only: no statistics.
 *
 * [CHOICE] When the target is not larger than `sinks`, the sinks shrink to
 * target - 1 so that the newest token is always kept.
 */
#include <stdlib.h>
#include <string.h>

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
    int32_t mx = 0;
    for (int hk = 0; hk < kv->n_head_kv; hk++)
        if (kv->layers[il].heads[hk].len > mx) mx = kv->layers[il].heads[hk].len;
    if (mx <= target) return EKV_OK;
    uint8_t *keep = malloc((size_t)mx); /* a mask set by ranges: no per-entry work before the compaction */
    if (!keep) return ekv_err(EKV_ERR_NOMEM, "local: out of memory for %d entries", (int)mx);
    enum ekv_status s = EKV_OK;
    for (int hk = 0; hk < kv->n_head_kv && s == EKV_OK; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (h->len <= target) continue;
        /* kept: [0, sinks) and [len - recent, len) */
        memset(keep, 1, (size_t)sinks);
        memset(keep + sinks, 0, (size_t)(h->len - recent - sinks));
        memset(keep + h->len - recent, 1, (size_t)recent);
        s = ekv_kv_head_keep(kv, h, keep);
    }
    free(keep);
    return s;
}

const struct ekv_policy_ops ekv_policy_local = {
    .name = "local",
    .summary = "StreamingLLM: keep the first `sinks` tokens and the most recent ones",
    .configure = local_configure,
    .layer = local_layer,
};
