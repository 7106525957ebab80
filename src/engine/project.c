/*
 * project.c — how many bytes a sequence's KV cache will hold under its
 * policy (ekv_kv_project, include/ekv.h), so that a server can admit
 * requests by memory before running them (ekv serve --kv-mem).
 *
 * Entries per layer and KV head follow the budget rule every policy keeps
 * (kv.h, ekv_kv_target): T(n) = min(n, ceil(budget * n), max_tokens) after
 * n positions. Policies that act only on the prompt (SnapKV, PyramidKV,
 * VL-Cache: ops->prompt_only) keep T(prompt) and then grow by one entry per
 * generated token, up to T(n) + N when they re-select every N tokens
 * (params.recompress, default 32); a policy with no hook at all (full) keeps everything.
 * While a prompt is read (engine/prefill.c, one layer at a time), the layers
 * already compressed hold at most T(prompt) each and the current layer the
 * whole prompt; a policy that compresses only after the last layer (no layer
 * hook) holds the whole prompt in every layer until then, and so may a
 * block-wise prompt (chunk) whose policy acts only at its end. PyramidKV spreads
 * L * T over the layers unevenly and may overshoot by its rounding (a few
 * entries per layer); admission should also look at the bytes in use.
 *
 * Bytes are those of the storage types: a layer of one KV head holding T
 * entries takes ekv_store_full_bytes(T) for K and for V (rows of the type;
 * for KIVI, full key groups plus the fp16 residual the cache keeps after T
 * appends). A KIVI cache that evicts inside key groups may hold up to a
 * group header and the codes of G/2 entries more per group than that (its
 * groups stay more than half full); admission also counts bytes in use.
 */
#include <math.h>
#include <stdlib.h>

#include "core/util.h"
#include "engine/engine.h"

/* K and V bytes of one layer of one KV head holding t entries. */
static uint64_t layer_bytes(const struct ekv_kv *kv, int64_t t) {
    return ekv_store_full_bytes(&kv->fk, t) + ekv_store_full_bytes(&kv->fv, t);
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
    uint64_t final, peak; /* bytes of one KV head summed over layers */
    if (!ops->layer && !ops->end) { /* keeps everything */
        final = (uint64_t)L * layer_bytes(kv, n);
        peak = final;
    } else {
        int64_t t_final = ekv_kv_budget_rule(&p, n);
        if (ops->prompt_only) { /* grows after the prompt, re-selected every p.recompress tokens when > 0 */
            t_final = ekv_kv_budget_rule(&p, n_prompt) + n_gen;
            if (p.recompress > 0) t_final = EKV_MIN(t_final, EKV_MIN(ekv_kv_budget_rule(&p, n) + p.recompress, n));
        }
        final = (uint64_t)L * layer_bytes(kv, t_final);
        /* block-wise prompts (chunk) hold the earlier blocks whole in the layers
         * not yet reached when the policy acts only at the prompt's end; else
         * the layers hold T(prompt) each, and the current one the whole prompt
         * on top (a margin for per-layer rounding, as PyramidKV's) */
        const bool blocks = p.chunk > 0 && p.chunk < n_prompt;
        const uint64_t whole = (uint64_t)L * layer_bytes(kv, n_prompt);
        const uint64_t layered = (uint64_t)L * layer_bytes(kv, ekv_kv_budget_rule(&p, n_prompt)) + layer_bytes(kv, n_prompt);
        peak = ops->layer && !blocks ? EKV_MIN(whole, layered) : whole;
    }
    const uint64_t H = (uint64_t)mi->n_head_kv;
    out->bytes_final = final * H;
    out->bytes_peak = EKV_MAX(peak, final) * H;
    out->bytes_full = (uint64_t)L * layer_bytes(kv, n) * H;
    /* per position of a full cache: exact for row types; for KIVI the
     * average over n positions (the residual is fp16), or one fp16 entry */
    out->bytes_per_token = n > 0 ? out->bytes_full / (uint64_t)n : (uint64_t)L * layer_bytes(kv, 1) * H;
    ekv_kv_free(kv);
    return EKV_OK;
}
