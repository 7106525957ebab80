/*
 * project.c — how many bytes a sequence's KV cache will hold under its
 * policy (ekv_kv_project, include/ekv.h), so that a server can admit
 * requests by memory before running them (ekv serve --kv-mem).
 *
 * Entries per layer and KV head follow the budget rule every policy keeps
 * (kv.h, ekv_kv_target): T(n) = min(n, ceil(budget * n), max_tokens) after
 * n positions. Policies that act only on the prompt (SnapKV, PyramidKV,
 * VL-Cache: ops->prompt_only) keep T(prompt) and then grow by one entry per
 * generated token; a policy with no hook at all (full) keeps everything.
 * While a prompt is read (engine/prompt.c, one layer at a time), the layers
 * already compressed hold at most T(prompt) each and the current layer the
 * whole prompt; a policy that compresses only after the last layer (no layer
 * hook) holds the whole prompt in every layer until then, and so may a
 * block-wise prompt (chunk) whose policy acts only at its end. PyramidKV spreads
 * L * T over the layers unevenly and may overshoot by its rounding (a few
 * entries per layer); admission should also look at the bytes in use.
 *
 * Bytes are those of the storage type (ekv_kv_entry_bytes): K and V of one
 * entry of one KV head.
 */
#include <math.h>
#include <stdlib.h>

#include "core/util.h"
#include "engine/engine.h"

uint64_t ekv_kv_entry_bytes(const struct ekv_kv_params *p, int32_t head_dim) {
    (void)p; /* f32 K and V today; quantised storage types change this */
    return 2ull * (uint64_t)head_dim * sizeof(float);
}

/* T(n) of kv.h's budget rule. */
static int64_t target(const struct ekv_kv_params *p, int64_t n) {
    if (n <= 0) return 0;
    double c = ceil(p->budget * (double)n - 1e-9);
    int64_t t = c < (double)n ? (int64_t)c : n;
    if (p->max_tokens > 0 && p->max_tokens < t) t = p->max_tokens;
    return t < 1 ? 1 : t;
}

enum ekv_status ekv_kv_project(const struct ekv_model *model, const struct ekv_kv_params *params, int64_t n_prompt,
                               int64_t n_gen, struct ekv_kv_projection *out) {
    ekv_err_clear();
    if (!model || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_project: model and out are required");
    if (n_prompt < 0 || n_gen < 0 || n_prompt > INT32_MAX || n_gen > INT32_MAX)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_project: %lld prompt and %lld generated positions out of range",
                       (long long)n_prompt, (long long)n_gen);
    const struct ekv_model_info *mi = &model->info;
    /* the cache validates the parameters and resolves the policy's defaults */
    struct ekv_kv *kv = NULL;
    enum ekv_status s = ekv_kv_new(mi->n_layer, mi->n_head, mi->n_head_kv, mi->head_dim, params, &kv);
    if (s != EKV_OK) return s;
    const struct ekv_policy_ops *ops = kv->ops;
    const struct ekv_kv_params p = kv->params;
    const int64_t n = n_prompt + n_gen, L = mi->n_layer;
    int64_t final, peak; /* entries of one KV head summed over layers */
    if (!ops->layer && !ops->end) { /* keeps everything */
        final = L * n;
        peak = final;
    } else {
        final = ops->prompt_only ? L * (target(&p, n_prompt) + n_gen) : L * target(&p, n);
        /* block-wise prompts (chunk) hold the earlier blocks whole in the layers
         * not yet reached when the policy acts only at the prompt's end */
        const bool blocks = p.chunk > 0 && p.chunk < n_prompt;
        peak = ops->layer && !blocks ? EKV_MIN(L * n_prompt, L * target(&p, n_prompt) + n_prompt) : L * n_prompt;
    }
    ekv_kv_free(kv);
    const uint64_t eb = ekv_kv_entry_bytes(&p, mi->head_dim) * (uint64_t)mi->n_head_kv;
    out->bytes_final = (uint64_t)final * eb;
    out->bytes_peak = (uint64_t)EKV_MAX(peak, final) * eb;
    out->bytes_full = (uint64_t)(L * n) * eb;
    out->bytes_per_token = (uint64_t)L * eb;
    return EKV_OK;
}
