/*
 * snapkv.c — SnapKV (docs/policies.md "snapkv"): at the end of the prompt, the last w
 * prompt queries (the observation window) vote for the earlier keys; the
 * votes are smoothed by 1-D pooling along the key axis and the top-ranked
 * keys are kept together with the whole window.
 *
 * Statistics: EKV_STAT_WINSUM with kv->win_start = prompt_pos0 +
 * prompt_len - w, i.e. the column sums of the window queries' attention
 * (winsum, docs/policies.md "Heads, positions and statistics"), group means
 * over the R query heads of a KV head.
 * Granularity: per KV head on the group-mean score, pooled after the mean
 * (KVCache-Factory's kv_head mode with mean reduction; the original repeats
 * K/V per query head, which does not shrink a GQA cache). [CHOICE]
 *
 * Rule, per KV head, at the prompt's last chunk (step->is_prompt &&
 * step->last_chunk), with C = ekv_kv_target (window included):
 *   - nothing when the head holds <= C entries;
 *   - C <= w: keep the last C entries; [CHOICE] (the reference needs C > w)
 *   - else s = winsum over the keys before the window, pooled with kernel k
 *     (avg divides by k counting the zero padding, max pads with -inf),
 *     keep the top (C - w) of s (ties: lower index first, docs/policies.md
 *     "Ties") plus the w window entries. Kept entries stay in ascending
 *     position order.
 *
 * Defaults (SnapKV's LongBench configurations): w = obs_window = 32 (clamped
 * to the prompt length), pool = 7, max pooling. pool <= 1 disables pooling;
 * an even kernel is rejected (it would select out of range; docs/policies.md "Pooling").
 * params.pool_kind has no "unset" value: ekv_kv_default_params() gives
 * EKV_POOL_MAX, the default here; EKV_POOL_AVG must be asked for.
 *
 * Decode: the paper compresses the prompt once and the cache then grows by
 * one entry per generated token (params.recompress = 0, `--kv-recompress
 * 0`). ekv's default (recompress N = 32) re-selects with the same rule
 * whenever n_seen reaches a multiple of N, the observation window being the
 * last min(w, N) queries before that point (ekv_recompress_*, below), so
 * the cache never holds more than C + N entries. Statistics are off at
 * decode outside those windows.
 */
#include <stdlib.h>

#include "core/util.h"
#include "kv/policies_adv.h"

enum ekv_status ekv_recompress_configure(struct ekv_kv *kv) {
    if (kv->params.recompress < 0) kv->params.recompress = 32;
    return EKV_OK;
}

/* The first re-selection point after a step starting at pos0 and the
 * window of queries that votes for it. */
static int64_t recompress_point(const struct ekv_kv *kv, int64_t pos0) {
    const int64_t N = kv->params.recompress;
    return (pos0 / N + 1) * N;
}

static int32_t recompress_window(const struct ekv_kv *kv) {
    const int32_t w = kv->params.obs_window > 0 ? kv->params.obs_window : 32;
    return EKV_MIN(w, kv->params.recompress);
}

void ekv_recompress_begin(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    kv->stats = 0;
    if (kv->params.recompress <= 0 || step->n_new <= 0) return;
    const int64_t point = recompress_point(kv, step->pos0);
    const int64_t ws = point - recompress_window(kv);
    if (step->pos0 + step->n_new <= ws) return; /* no query of the window yet: arrays freed */
    if (step->pos0 <= ws) ekv_kv_reset_stats(kv, EKV_STAT_WINSUM);
    kv->win_start = ws;
    kv->stats = EKV_STAT_WINSUM;
}

bool ekv_recompress_due(const struct ekv_kv *kv, const struct ekv_kv_step *step) {
    const int64_t N = kv->params.recompress;
    if (step->is_prompt || N <= 0 || step->n_new <= 0) return false;
    return (step->pos0 + step->n_new) / N > step->pos0 / N;
}

enum ekv_status ekv_snapkv_configure_params(struct ekv_kv *kv) {
    struct ekv_kv_params *p = &kv->params;
    enum ekv_status st = ekv_recompress_configure(kv);
    if (st != EKV_OK) return st;
    if (p->obs_window < 0) p->obs_window = 32;
    if (p->obs_window < 1)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: obs_window must be at least 1 (got %d)",
                       kv->policy_name, (int)p->obs_window);
    if (p->pool < 0) p->pool = 7;
    if (p->pool > 1 && p->pool % 2 == 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: pooling kernel %d must be odd", kv->policy_name,
                       (int)p->pool);
    if (p->pool_kind != EKV_POOL_AVG && p->pool_kind != EKV_POOL_MAX) p->pool_kind = EKV_POOL_MAX;
    return EKV_OK;
}

enum ekv_status ekv_snapkv_begin_common(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!step->is_prompt) {
        ekv_recompress_begin(kv, step);
        return EKV_OK;
    }
    if (step->prompt_len <= 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: prompt step with prompt_len %d", kv->policy_name,
                       (int)step->prompt_len);
    int32_t w = EKV_MIN(kv->params.obs_window, step->prompt_len);
    kv->win_start = step->prompt_pos0 + step->prompt_len - w;
    kv->stats = EKV_STAT_WINSUM;
    /* a new prompt: forget the votes of an earlier one */
    if (step->pos0 == step->prompt_pos0) ekv_kv_reset_stats(kv, EKV_STAT_WINSUM);
    return EKV_OK;
}

/* The candidates of head h (the entries before the observation window: *np
 * of them, *nw after) and their pooled window scores, *out [np] (caller frees). */
static enum ekv_status snap_scores(struct ekv_kv *kv, const struct ekv_kv_head *h, int32_t pool,
                                   enum ekv_pool_kind kind, int32_t *nw_out, int32_t *np_out, double **out) {
    const int32_t n = h->len;
    int32_t nw = 0; /* trailing entries inside the observation window */
    while (nw < n && h->pos[n - 1 - nw] >= kv->win_start) nw++;
    const int32_t np = n - nw;
    *nw_out = nw;
    *np_out = np;
    *out = NULL;
    if (!h->winsum) return ekv_err(EKV_ERR_INTERNAL, "%s: winsum statistics are missing", kv->policy_name);
    double *s = malloc((size_t)(np > 0 ? np : 1) * sizeof *s);
    if (!s) return ekv_err(EKV_ERR_NOMEM, "%s: scratch for %d entries", kv->policy_name, (int)np);
    if (pool > 1) {
        ekv_pool1d(h->winsum, np, pool, kind, s);
    } else {
        for (int32_t j = 0; j < np; j++) s[j] = h->winsum[j];
    }
    *out = s;
    return EKV_OK;
}

/* Keeps at most cap entries of one head; scores: its candidates' pooled
 * scores when the caller has them (+adakv), else NULL. */
static enum ekv_status snapkv_head(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t cap, int32_t pool,
                                   enum ekv_pool_kind kind, const double *scores) {
    const int32_t n = h->len;
    if (cap < 1) cap = 1;
    if (n <= cap) return EKV_OK;
    int32_t nw = 0; /* trailing entries inside the observation window */
    while (nw < n && h->pos[n - 1 - nw] >= kv->win_start) nw++;

    int32_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return ekv_err(EKV_ERR_NOMEM, "%s: scratch for %d entries", kv->policy_name, (int)n);
    enum ekv_status st = EKV_OK;
    if (cap <= nw) {
        for (int32_t i = 0; i < cap; i++) idx[i] = n - cap + i;
    } else {
        int32_t np = n - nw, nw2 = nw; /* keys before the window: candidates */
        double *own = NULL;
        if (!scores && (st = snap_scores(kv, h, pool, kind, &nw2, &np, &own)) != EKV_OK) {
            free(idx);
            return st;
        }
        const int32_t got = ekv_topk(scores ? scores : own, np, cap - nw, NULL, idx);
        free(own);
        if (got != cap - nw) {
            free(idx);
            return ekv_err(EKV_ERR_INTERNAL, "%s: top-k returned %d of %d", kv->policy_name, (int)got,
                           (int)(cap - nw));
        }
        for (int32_t i = 0; i < nw; i++) idx[got + i] = np + i;
    }
    st = ekv_kv_head_keep_idx(kv, h, idx, cap);
    free(idx);
    return st;
}

/* +adakv: the layer's heads share their budget by their pooled scores (adakv.c). */
static enum ekv_status snapkv_layer_ada(struct ekv_kv *kv, int il, int32_t cap, int32_t pool,
                                        enum ekv_pool_kind kind) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int32_t H = kv->n_head_kv;
    int32_t *prot = calloc((size_t)H * 3, sizeof *prot), *m = prot ? prot + H : NULL, *caps = m ? m + H : NULL;
    double **sc = calloc((size_t)H, sizeof *sc);
    enum ekv_status st = prot && sc ? EKV_OK : ekv_err(EKV_ERR_NOMEM, "%s+adakv: scratch", kv->policy_name);
    for (int32_t h = 0; h < H && st == EKV_OK; h++) {
        int32_t nw = 0, np = 0;
        st = snap_scores(kv, &ly->heads[h], pool, kind, &nw, &np, &sc[h]);
        prot[h] = cap <= nw ? EKV_MAX(cap, 1) : nw; /* a window that fills the target: the base rule, alone */
        m[h] = cap <= nw ? 0 : np;
    }
    if (st == EKV_OK) st = ekv_adakv_caps(kv, cap, prot, m, (const double *const *)sc, caps);
    for (int32_t h = 0; h < H && st == EKV_OK; h++)
        st = snapkv_head(kv, &ly->heads[h], caps[h], pool, kind, m[h] > 0 ? sc[h] : NULL);
    for (int32_t h = 0; sc && h < H; h++) free(sc[h]);
    free(sc);
    free(prot);
    return st;
}

enum ekv_status ekv_snapkv_compress_layer(struct ekv_kv *kv, int il, int32_t cap, int32_t pool,
                                          enum ekv_pool_kind kind) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    bool over = false;
    for (int32_t hh = 0; hh < kv->n_head_kv; hh++) over |= ly->heads[hh].len > EKV_MAX(cap, 1);
    if (kv->adakv.on && kv->n_head_kv > 1 && over) return snapkv_layer_ada(kv, il, cap, pool, kind);
    for (int32_t hh = 0; hh < kv->n_head_kv; hh++) {
        enum ekv_status st = snapkv_head(kv, &ly->heads[hh], cap, pool, kind, NULL);
        if (st != EKV_OK) return st;
    }
    return EKV_OK;
}

static enum ekv_status snapkv_configure(struct ekv_kv *kv) { return ekv_snapkv_configure_params(kv); }

static enum ekv_status snapkv_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    if (step->is_prompt ? !step->last_chunk : !ekv_recompress_due(kv, step)) return EKV_OK;
    return ekv_snapkv_compress_layer(kv, il, ekv_kv_target(kv, il), kv->params.pool,
                                     kv->params.pool_kind);
}

const struct ekv_policy_ops ekv_policy_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV: keep the keys the last prompt queries attend to (pooled), once at prefill",
    .configure = snapkv_configure,
    .init = NULL,
    .destroy = NULL,
    .begin = ekv_snapkv_begin_common,
    .layer = snapkv_layer,
    .end = NULL,
    .prompt_only = true,
    .headwise = true,
};
