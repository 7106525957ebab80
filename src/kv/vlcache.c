/*
 * vlcache.c — VL-Cache (paper 001, docs/policies.md "vlcache"): sparsity- and
 * modality-aware KV-cache compression for vision-language models. The
 * attention of the prompt's post-vision queries (the text after the last
 * image token) tells, per layer, how sparse attention is — dense layers get
 * more cache — and, per token, how much it is attended to.
 *
 * Statistics (prompt only; off at decode):
 *   EKV_STAT_SPARSITY: per layer, over the post-vision query rows and all
 *     query heads, the causal entries below p * row max (ThresholdFilter,
 *     p = params.sparsity_p, default 0.01) and all causal entries;
 *   EKV_STAT_WINSUM: per KV head (group mean), psi_j = the sum of the
 *     post-vision queries' attention on key j.
 * Post-vision window: kv->win_start = the position right after the LAST
 * image-tagged token of the prompt (tau = tokens after it).
 *   No image token: tau = m (win_start = prompt start), so sparsity is the
 *   full lower triangle and psi the H2O column sum. [CHOICE]
 *   Image at the very end (tau = 0): tau = 1. [CHOICE]
 *
 * At the end of the prompt (end() of its last chunk, once every layer has
 * its sparsity):
 *   gamma_l = sparse_zero / sparse_total, Z = sum_l (1 - gamma_l),
 *   beta_l  = clip((1 - gamma_l) / Z * alpha * L, 0.01, 1), alpha = budget,
 *   k_l     = max(1, floor(beta_l * m)) with m = n_seen (the prompt length
 *             in a single-turn session). [CHOICE: floor; a 1e-9 guard
 *             absorbs rounding so that e.g. 0.04 * 1000 gives 40]
 *   No renormalisation after clipping (the paper has none): the total can
 *   differ from alpha * L * m. With max_tokens, alpha becomes
 *   min(alpha, max_tokens / m): --kv-tokens is the mean per-layer cap.
 *   [CHOICE] alpha >= 1 (budget 1, no max_tokens) compresses nothing.
 * Then per layer and KV head: keep the most recent r_l = floor(recent_ratio
 * * k_l) entries (recent_ratio default 0.1, the paper's "10% of budget",
 * per layer [CHOICE]) plus the top (k_l - r_l) older entries by psi
 * (ties: docs/policies.md "Ties"). kv->layers[l].budget = k_l.
 *
 * With +adakv (adakv.c) the heads of a layer share H * k_l by psi instead,
 * each keeping its own r_l most recent entries (ekv_adakv_recent_top).
 *
 * Decode: the paper lets the cache grow after prefill (params.recompress =
 * 0). With recompress N > 0 (default 32), whenever n_seen reaches a multiple
 * of N (end() of that step) every layer is cut again to k_l = max(1,
 * floor(beta_l * n_seen)) with the prompt's beta_l (the sparsity allocation
 * is not re-measured: decode queries are text), keeping the r_l most recent
 * entries plus the top older ones by psi over the decode window (the last
 * min(obs_window, N) queries, snapkv.c's ekv_recompress_*). Because the
 * allocation needs every layer's sparsity, compression happens in end(),
 * so the prefill peak holds all layers at full prompt length.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/policies_adv.h"

void ekv_vlcache_alloc(const double *gamma, int32_t L, double alpha, int64_t m, double *beta,
                       int32_t *k) {
    double Z = 0.0;
    for (int32_t l = 0; l < L; l++) Z += 1.0 - gamma[l];
    for (int32_t l = 0; l < L; l++) {
        double b = Z > 0.0 ? (1.0 - gamma[l]) / Z * alpha * (double)L : alpha;
        if (!(b >= 0.01)) b = 0.01; /* also catches NaN */
        if (b > 1.0) b = 1.0;
        beta[l] = b;
        if (k) {
            double kk = floor(b * (double)m + 1e-9);
            if (kk < 1.0) kk = 1.0;
            if (kk > (double)INT32_MAX) kk = (double)INT32_MAX;
            k[l] = (int32_t)kk;
        }
    }
}

/* beta_l of the last prompt, for decode-time re-selection */
struct vlcache_state {
    bool have_beta;
    double beta[]; /* [n_layer] */
};

static enum ekv_status vlcache_init(struct ekv_kv *kv) {
    struct vlcache_state *s = calloc(1, sizeof *s + (size_t)kv->n_layer * sizeof(double));
    if (!s) return ekv_err(EKV_ERR_NOMEM, "vlcache: state of %d layers", (int)kv->n_layer);
    kv->pstate = s;
    return EKV_OK;
}

static void vlcache_destroy(struct ekv_kv *kv) {
    free(kv->pstate);
    kv->pstate = NULL;
}

static enum ekv_status vlcache_clone(struct ekv_kv *dst, const struct ekv_kv *src) {
    const size_t bytes = sizeof(struct vlcache_state) + (size_t)src->n_layer * sizeof(double);
    dst->pstate = malloc(bytes);
    if (!dst->pstate) return ekv_err(EKV_ERR_NOMEM, "vlcache: state of %d layers", (int)src->n_layer);
    memcpy(dst->pstate, src->pstate, bytes);
    return EKV_OK;
}

/* Saved caches: whether a prompt set the budgets, and beta per layer (a
 * share of the tokens seen, in [0, 1]). */
static void vlcache_state_save(const struct ekv_kv *kv, struct ekv_wbuf *w) {
    const struct vlcache_state *s = kv->pstate;
    ekv_wbuf_u8(w, s->have_beta ? 1 : 0);
    ekv_wbuf_f64s(w, s->beta, (size_t)kv->n_layer);
}

static enum ekv_status vlcache_state_load(struct ekv_kv *kv, struct ekv_rbuf *r) {
    struct vlcache_state *s = kv->pstate;
    const uint8_t have = ekv_rbuf_u8(r);
    ekv_rbuf_f64s(r, s->beta, (size_t)kv->n_layer);
    if (r->bad) return ekv_err(EKV_ERR_FORMAT, "vlcache: truncated state");
    if (have > 1) return ekv_err(EKV_ERR_FORMAT, "vlcache: state flag %d is not 0 or 1", (int)have);
    for (int32_t l = 0; l < kv->n_layer; l++)
        if (!(s->beta[l] >= 0.0 && s->beta[l] <= 1.0))
            return ekv_err(EKV_ERR_FORMAT, "vlcache: layer %d budget share %g is not in [0, 1]", (int)l, s->beta[l]);
    s->have_beta = have;
    return EKV_OK;
}

static enum ekv_status vlcache_configure(struct ekv_kv *kv) {
    struct ekv_kv_params *p = &kv->params;
    enum ekv_status st = ekv_recompress_configure(kv);
    if (st != EKV_OK) return st;
    if (isnan(p->sparsity_p)) p->sparsity_p = 0.01;
    if (!(p->sparsity_p >= 0.0 && p->sparsity_p <= 1.0))
        return ekv_err(EKV_ERR_INVALID_ARG, "vlcache: sparsity_p %g is outside [0, 1]", p->sparsity_p);
    if (isnan(p->recent_ratio)) p->recent_ratio = 0.1;
    if (!(p->recent_ratio >= 0.0 && p->recent_ratio <= 1.0))
        return ekv_err(EKV_ERR_INVALID_ARG, "vlcache: recent_ratio %g is outside [0, 1]",
                       p->recent_ratio);
    return EKV_OK;
}

static enum ekv_status vlcache_begin(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!step->is_prompt) {
        ekv_recompress_begin(kv, step);
        return EKV_OK;
    }
    const int32_t m = step->prompt_len;
    if (m <= 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "vlcache: prompt step with prompt_len %d", (int)m);
    int32_t last_img = -1;
    if (step->prompt_tags)
        for (int32_t i = 0; i < m; i++)
            if (step->prompt_tags[i] == EKV_TAG_IMAGE) last_img = i;
    int32_t tau = last_img < 0 ? m : m - (last_img + 1);
    if (tau < 1) tau = 1;
    kv->win_start = step->prompt_pos0 + m - tau;
    kv->stats = EKV_STAT_SPARSITY | EKV_STAT_WINSUM;
    if (step->pos0 == step->prompt_pos0) { /* a new prompt: fresh statistics */
        ekv_kv_reset_stats(kv, EKV_STAT_WINSUM);
        for (int32_t l = 0; l < kv->n_layer; l++) {
            kv->layers[l].sparse_zero = 0.0;
            kv->layers[l].sparse_total = 0.0;
        }
    }
    return EKV_OK;
}

/* Keeps the r most recent entries plus the top (k - r) older ones by psi. */
static enum ekv_status vlcache_head(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t k) {
    const int32_t n = h->len;
    if (n <= k) return EKV_OK;
    if (!h->winsum) return ekv_err(EKV_ERR_INTERNAL, "vlcache: winsum statistics are missing");
    int32_t r = (int32_t)floor(kv->params.recent_ratio * (double)k);
    if (r > k) r = k;
    int32_t *idx = malloc((size_t)k * sizeof *idx);
    if (!idx) return ekv_err(EKV_ERR_NOMEM, "vlcache: scratch for %d entries", (int)k);
    const int32_t older = n - r;
    const int32_t got = ekv_topk(h->winsum, older, k - r, NULL, idx);
    if (got != k - r) {
        free(idx);
        return ekv_err(EKV_ERR_INTERNAL, "vlcache: top-k returned %d of %d", (int)got, (int)(k - r));
    }
    for (int32_t i = 0; i < r; i++) idx[got + i] = older + i;
    enum ekv_status st = ekv_kv_head_keep_idx(kv, h, idx, k);
    free(idx);
    return st;
}

/* Layer l at its budget k: every head by itself, or with +adakv (adakv.c)
 * the heads share H * k by their post-vision scores (the same query rows
 * for every head, so the sums compare across heads), each keeping its own
 * floor(recent_ratio * k) most recent entries. */
static enum ekv_status vlcache_layer(struct ekv_kv *kv, int32_t l, int32_t k) {
    struct ekv_kv_layer *ly = &kv->layers[l];
    if (!kv->adakv.on || kv->n_head_kv < 2) {
        enum ekv_status st = EKV_OK;
        for (int32_t hh = 0; hh < kv->n_head_kv && st == EKV_OK; hh++) st = vlcache_head(kv, &ly->heads[hh], k);
        return st;
    }
    bool over = false;
    for (int32_t hh = 0; hh < kv->n_head_kv; hh++) {
        over |= ly->heads[hh].len > k;
        if (ly->heads[hh].len > k && !ly->heads[hh].winsum)
            return ekv_err(EKV_ERR_INTERNAL, "vlcache: winsum statistics are missing");
    }
    if (!over) return EKV_OK;
    const double **sc = malloc((size_t)kv->n_head_kv * sizeof *sc);
    if (!sc) return ekv_err(EKV_ERR_NOMEM, "vlcache+adakv: scratch");
    for (int32_t hh = 0; hh < kv->n_head_kv; hh++) sc[hh] = ly->heads[hh].winsum;
    int32_t r = (int32_t)floor(kv->params.recent_ratio * (double)k);
    const enum ekv_status st = ekv_adakv_recent_top(kv, l, k, r > k ? k : r, sc);
    free(sc);
    return st;
}

/* Decode re-selection with the prompt's allocation. */
static enum ekv_status vlcache_recompress(struct ekv_kv *kv) {
    const struct vlcache_state *vs = kv->pstate;
    if (!vs || !vs->have_beta) return EKV_OK;
    enum ekv_status st = EKV_OK;
    for (int32_t l = 0; l < kv->n_layer && st == EKV_OK; l++) {
        double kk = floor(vs->beta[l] * (double)kv->n_seen + 1e-9);
        if (kk < 1.0) kk = 1.0;
        if (kk > (double)INT32_MAX) kk = (double)INT32_MAX;
        kv->layers[l].budget = (int32_t)kk;
        st = vlcache_layer(kv, l, (int32_t)kk);
    }
    return st;
}

static enum ekv_status vlcache_end(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!step->is_prompt) return ekv_recompress_due(kv, step) ? vlcache_recompress(kv) : EKV_OK;
    if (!step->last_chunk) return EKV_OK;
    struct vlcache_state *vs = kv->pstate;
    if (vs) vs->have_beta = false;
    const int32_t L = kv->n_layer;
    double *gamma = calloc((size_t)(L > 0 ? L : 1), sizeof *gamma);
    double *beta = malloc((size_t)L * sizeof *beta);
    int32_t *k = malloc((size_t)L * sizeof *k);
    enum ekv_status st = EKV_OK;
    if (!gamma || !beta || !k) {
        st = ekv_err(EKV_ERR_NOMEM, "vlcache: allocation of %d layers", (int)L);
        goto out;
    }
    for (int32_t l = 0; l < L; l++) {
        const struct ekv_kv_layer *ly = &kv->layers[l];
        gamma[l] = ly->sparse_total > 0.0 ? ly->sparse_zero / ly->sparse_total : 0.0;
    }
    const int64_t m = kv->n_seen;
    const double alpha = ekv_kv_budget_frac(kv);
    if (alpha >= 1.0) goto out; /* keep everything: nothing to allocate */
    ekv_vlcache_alloc(gamma, L, alpha, m, beta, k);
    if (vs) {
        memcpy(vs->beta, beta, (size_t)L * sizeof *beta);
        vs->have_beta = true;
    }
    for (int32_t l = 0; l < L && st == EKV_OK; l++) {
        kv->layers[l].budget = k[l];
        st = vlcache_layer(kv, l, k[l]);
    }
out:
    free(gamma); free(beta); free(k);
    return st;
}

const struct ekv_policy_ops ekv_policy_vlcache = {
    .name = "vlcache",
    .summary = "VL-Cache: per-layer budgets from post-vision attention sparsity, top post-vision scores",
    .configure = vlcache_configure,
    .init = vlcache_init,
    .destroy = vlcache_destroy,
    .clone = vlcache_clone,
    .state_save = vlcache_state_save,
    .state_load = vlcache_state_load,
    .begin = vlcache_begin,
    .layer = NULL,
    .end = vlcache_end,
    .prompt_only = true,
    .headwise = true,
};
