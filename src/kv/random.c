/*
 * random.c — the Random baseline (docs/policies.md "random", [CHOICE]: a per-KV-head
 * uniform subset). Whenever a head holds more than ekv_kv_target entries it
 * keeps a uniformly drawn subset of exactly `target` of them. The draw is
 * deterministic: splitmix64 seeded from params.seed mixed with the layer,
 * the KV head and n_seen, so a fixed seed reproduces a run exactly.
 */
#include <stdlib.h>

#include "core/util.h"
#include "kv/kv.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static enum ekv_status random_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    (void)step;
    const int32_t target = ekv_kv_target(kv, il);
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (h->len <= target) continue;
        uint64_t st = kv->params.seed;
        st ^= splitmix64(&st) ^ ((uint64_t)il * 0xD1B54A32D192ED03ull);
        st ^= splitmix64(&st) ^ ((uint64_t)hk * 0xABC98388FB8FAC03ull);
        st ^= splitmix64(&st) ^ ((uint64_t)kv->n_seen * 0x8CB92BA72F3D8DD7ull);
        uint8_t *keep = malloc((size_t)h->len);
        if (!keep) return ekv_err(EKV_ERR_NOMEM, "random: out of memory for %d entries", (int)h->len);
        /* selection sampling (Knuth's Algorithm S): each entry is kept with
         * probability still-needed / still-left, giving a uniform subset */
        int32_t need = target, left = h->len;
        for (int32_t j = 0; j < h->len; j++, left--) {
            const double u = (double)(splitmix64(&st) >> 11) * 0x1.0p-53;
            keep[j] = u * (double)left < (double)need;
            need -= keep[j];
        }
        enum ekv_status s = ekv_kv_head_keep(kv, h, keep);
        free(keep);
        if (s != EKV_OK) return s;
    }
    return EKV_OK;
}

const struct ekv_policy_ops ekv_policy_random = {
    .name = "random",
    .summary = "keep a uniformly random subset of each KV head (seeded)",
    .layer = random_layer,
};
