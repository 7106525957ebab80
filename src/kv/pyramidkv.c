/*
 * pyramidkv.c — PyramidKV (docs/policies.md "pyramidkv"): SnapKV's selection (snapkv.c)
 * with a per-layer capacity that shrinks linearly from the bottom layer to
 * the top one ("pyramidal information funnelling"), the total staying about
 * L times the uniform capacity.
 *
 * Statistics: as SnapKV, EKV_STAT_WINSUM over the prompt's last w queries.
 * Acts at the prompt's last chunk; the paper then lets the cache grow
 * (params.recompress = 0). With recompress N > 0 (default 32) it re-selects
 * as SnapKV does (snapkv.c) at every multiple of N tokens seen, with the
 * schedule recomputed for T = n_seen tokens (what the layer would hold
 * uncompressed, so the pyramid keeps its shape), C = ekv_kv_budget_tokens
 * and w = the decode window.
 *
 * Schedule: KVCache-Factory's integer schedule (ekv_pyramid_caps), with
 *   T = the layer's entries at the end of the prompt,
 *   C = the uniform target min(T, ekv_kv_budget_tokens) (ceil(budget *
 *       n_seen) capped by max_tokens; window included), as Factory's
 *       max_capacity_prompt,
 *   w = the observation window (obs_window clamped to the prompt length),
 *   beta = params.beta (default 20).
 * Layer 0 gets the largest capacity. The capacity of layer il is written to
 * kv->layers[il].budget (for traces and ekv_kv_target). With --kv-tokens the
 * cap is the *mean* capacity, so lower layers may hold more. [CHOICE]
 * Factory's floor divisions can overshoot L*C slightly (65296 against
 * 65280 for C = 2048, L = 32); that is kept as the reference has it.
 * kvpress's float variant (ekv_pyramid_caps_kvpress) is available for
 * comparisons; the policy uses Factory's.
 */
#include <math.h>
#include <stdlib.h>

#include "core/util.h"
#include "kv/policies_adv.h"

void ekv_pyramid_caps(int32_t T, int32_t C, int32_t w, int32_t L, double beta, int32_t *caps) {
    if (L <= 0) return;
    if (T < C) {
        for (int32_t l = 0; l < L; l++) caps[l] = T;
        return;
    }
    const int64_t cw = (int64_t)C - w;
    if (cw <= 0 || L == 1 || T < 2 * cw || !(beta > 0.0)) {
        for (int32_t l = 0; l < L; l++) caps[l] = C;
        return;
    }
    int64_t mn = (int64_t)floor((double)cw / beta);
    int64_t mx = 2 * cw - mn;
    if (mx >= (int64_t)T - w) {
        mx = (int64_t)T - w;
        mn = 2 * cw - mx;
    }
    /* floor division, as Python's // (mx >= mn here, so it is plain /) */
    const int64_t step = (mx - mn) / (L - 1);
    for (int32_t l = 0; l < L; l++) caps[l] = (int32_t)(mx - (int64_t)l * step + w);
}

void ekv_pyramid_caps_kvpress(int32_t T, double cr, int32_t w, int32_t L, double beta, int32_t *caps) {
    if (L <= 0) return;
    const double maxcap = (double)w + (double)T * (1.0 - cr);
    double mn = (maxcap - (double)w) / beta;
    double mx = (maxcap - (double)w) * 2.0 - mn;
    if (mx >= (double)T - (double)w) {
        mx = (double)T - (double)w;
        mn = (maxcap - (double)w) * 2.0 - mx;
    }
    if (!((double)T >= mx && mx >= mn && mn >= (double)w) || L == 1) {
        const int32_t u = (int32_t)nearbyint((double)T * (1.0 - cr));
        for (int32_t l = 0; l < L; l++) caps[l] = u;
        return;
    }
    const double steps = (mx - mn) / (double)(L - 1);
    for (int32_t l = 0; l < L; l++) caps[l] = (int32_t)nearbyint(mx - (double)l * steps);
}

static enum ekv_status pyramid_configure(struct ekv_kv *kv) {
    if (isnan(kv->params.beta)) kv->params.beta = 20.0;
    if (!(kv->params.beta > 0.0) || isinf(kv->params.beta))
        return ekv_err(EKV_ERR_INVALID_ARG, "pyramidkv: beta %g must be positive and finite",
                       kv->params.beta);
    return ekv_snapkv_configure_params(kv);
}

static enum ekv_status pyramid_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    if (step->is_prompt ? !step->last_chunk : !ekv_recompress_due(kv, step)) return EKV_OK;
    struct ekv_kv_layer *ly = &kv->layers[il];
    int32_t T = 0, w;
    if (step->is_prompt) {
        for (int32_t hh = 0; hh < kv->n_head_kv; hh++) T = EKV_MAX(T, ly->heads[hh].len);
        w = (int32_t)EKV_MIN((int64_t)kv->params.obs_window, (int64_t)step->prompt_len);
    } else { /* decode re-selection: the schedule of n_seen tokens, the decode window */
        T = (int32_t)EKV_MIN(kv->n_seen, (int64_t)INT32_MAX);
        w = (int32_t)EKV_MIN(EKV_MAX(kv->n_seen - kv->win_start, (int64_t)1), (int64_t)T);
    }
    /* the uniform target (window included), at most the layer's entries */
    const int32_t C = (int32_t)EKV_MIN((int64_t)T, ekv_kv_budget_tokens(kv));

    /* the schedule is cheap: compute it for all layers and take ours */
    int32_t caps_small[64];
    int32_t *caps = caps_small;
    if (kv->n_layer > (int32_t)EKV_ARRAY_LEN(caps_small)) {
        caps = malloc((size_t)kv->n_layer * sizeof *caps);
        if (!caps) return ekv_err(EKV_ERR_NOMEM, "pyramidkv: schedule of %d layers", (int)kv->n_layer);
    }
    ekv_pyramid_caps(T, C, w, kv->n_layer, kv->params.beta, caps);
    const int32_t cap = caps[il];
    if (caps != caps_small) free(caps);

    ly->budget = cap;
    return ekv_snapkv_compress_layer(kv, il, cap, kv->params.pool, kv->params.pool_kind);
}

const struct ekv_policy_ops ekv_policy_pyramidkv = {
    .name = "pyramidkv",
    .summary = "PyramidKV: SnapKV selection with per-layer capacities shrinking upwards, at prefill",
    .configure = pyramid_configure,
    .init = NULL,
    .destroy = NULL,
    .begin = ekv_snapkv_begin_common,
    .layer = pyramid_layer,
    .end = NULL,
    .prompt_only = true,
    .headwise = true,
};
