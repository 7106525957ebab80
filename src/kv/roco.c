/*
 * roco.c — RoCo (EasyKV, paper 002; docs/policies.md "roco"): robust cache omission.
 * Tokens are judged by the mean attention they received (MAS) and by how
 * much it varied (its standard deviation): the tokens whose attention is
 * the most variable are kept out of the eviction scope, and among the rest
 * the lowest-mean ones are evicted.
 *
 * Statistics: EKV_STAT_COLSUM (+count) and EKV_STAT_SUMSQ, accumulated over
 * every query since the entry was cached, group means over the R query
 * heads of a KV head; decisions per KV head.
 *   mean = colsum / count, std = sqrt(max(0, sumsq / count - mean^2))
 *   (the reference does not clamp and can produce NaN). [CHOICE]
 *
 * When a head holds E entries over its target (ekv_kv_target):
 *   - protect the first `sinks` entries (default 4, EasyKV's temp_length)
 *     and the last `window` entries (default max(1, trunc(recent_ratio *
 *     target)) with recent_ratio 0.1 = EasyKV's encoding-mode 10%);
 *     when sinks + window exceed the target they shrink (window first to
 *     the target, then sinks to what is left) so the budget stays exact;
 *     [CHOICE]
 *   - candidates = the K lowest-std unprotected entries,
 *     K = max(target - window - sinks, E)  (EasyKV: B - trunc(0.1 B) - 4
 *     with B the budget, never fewer than the entries to evict);
 *   - evict the E candidates with the lowest mean.
 * Ties follow docs/policies.md "Ties" (lower index first, for both the std
 * and mean ranks).
 *
 * When: at the end of every prompt chunk (with params.chunk the engine runs
 * block-wise encoding, EasyKV's evict-and-encode) and at every decode step,
 * so the cache never exceeds the budget after a forward. Unlike EasyKV's
 * decoding mode (K = budget - trunc(0.3 budget), prompt never evicted) one
 * rule serves both phases. [CHOICE]
 *
 * With +adakv (adakv.c) the heads of a layer share the budget: each head's
 * candidates are its scope at the target (above), ranked by mean; the rest of
 * the head is protected (roco_layer_ada).
 *
 * EasyKV's last-10 protection is the `window` here (10% of the target);
 * its stride-quantised capacity is not reproduced: ekv keeps
 * exactly ceil(budget * n_seen) entries. [CHOICE]
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/policies_adv.h"

int32_t ekv_roco_select(const double *mean, const double *std, int32_t n, int32_t sinks,
                        int32_t window, int32_t K, int32_t E, uint8_t *keep) {
    for (int32_t j = 0; j < n; j++) keep[j] = 1;
    if (E <= 0 || n <= 0) return 0;
    int32_t unprot = n - sinks - window;
    if (K > unprot) K = unprot;
    if (E > K) E = K;
    if (E <= 0) return 0;

    double *neg = calloc((size_t)n, sizeof *neg);
    uint8_t *mask = calloc((size_t)n, 1);
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    if (!neg || !mask || !idx) {
        free(neg); free(mask); free(idx);
        return -1;
    }
    /* candidates: the K lowest std among the unprotected, ties to the lower
     * index. When K is most of them (decode: all but a few), select the
     * excluded rest instead -- the highest std, ties to the HIGHER index,
     * which is ekv_topk's rule on the reversed array -- so the work stays
     * O(n log(excluded)). */
    const int32_t nx = unprot - K;
    if (nx < K) {
        for (int32_t i = 0; i < n; i++) {
            const int32_t j = n - 1 - i;
            neg[i] = std[j];
            mask[i] = (j >= sinks && j < n - window) ? 1 : 0;
        }
        const int32_t got = ekv_topk(neg, n, nx, mask, idx);
        for (int32_t j = 0; j < n; j++) mask[j] = (j >= sinks && j < n - window) ? 1 : 0;
        for (int32_t i = 0; i < got; i++) mask[n - 1 - idx[i]] = 0;
    } else {
        for (int32_t j = 0; j < n; j++) {
            neg[j] = -std[j];
            mask[j] = (j >= sinks && j < n - window) ? 1 : 0;
        }
        const int32_t nc = ekv_topk(neg, n, K, mask, idx);
        memset(mask, 0, (size_t)n);
        for (int32_t i = 0; i < nc; i++) mask[idx[i]] = 1;
    }
    /* evict the E lowest means among the candidates */
    for (int32_t j = 0; j < n; j++) neg[j] = -mean[j];
    int32_t ne = ekv_topk(neg, n, E, mask, idx);
    for (int32_t i = 0; i < ne; i++) keep[idx[i]] = 0;
    free(neg); free(mask); free(idx);
    return ne;
}

static enum ekv_status roco_configure(struct ekv_kv *kv) {
    struct ekv_kv_params *p = &kv->params;
    if (p->sinks < 0) p->sinks = 4;
    if (isnan(p->recent_ratio)) p->recent_ratio = 0.1;
    if (!(p->recent_ratio >= 0.0 && p->recent_ratio <= 1.0))
        return ekv_err(EKV_ERR_INVALID_ARG, "roco: recent_ratio %g is outside [0, 1]", p->recent_ratio);
    /* window < 0 stays: "recent_ratio of the current target" */
    return EKV_OK;
}

/* A head's protected window and sinks for the target, and K, the size of
 * the eviction scope (the candidates) when it holds n entries. */
static void roco_shape(const struct ekv_kv *kv, int32_t target, int32_t n, int32_t *window, int32_t *sinks,
                       int32_t *K) {
    int32_t w = kv->params.window >= 0 ? kv->params.window
                                       : EKV_MAX(1, (int32_t)(kv->params.recent_ratio * (double)target));
    int32_t sk = kv->params.sinks;
    if (w > target) w = target;
    if (sk > target - w) sk = target - w;
    *window = w, *sinks = sk;
    *K = EKV_MAX(target - w - sk, n - target);
}

/* mean and standard deviation of the attention each entry received. */
static void roco_moments(const struct ekv_kv_head *h, double *mean, double *sd) {
    for (int32_t j = 0; j < h->len; j++) {
        const double c = (double)h->count[j];
        const double m = c > 0 ? h->colsum[j] / c : 0.0;
        const double var = c > 0 ? h->sumsq[j] / c - m * m : 0.0;
        mean[j] = m;
        sd[j] = sqrt(var > 0.0 ? var : 0.0);
    }
}

/* Keeps `keep_n` entries of one head whose target is `target`: the scope
 * is the target's (roco_shape), and the len - keep_n lowest means in it go
 * (keep_n = target without +adakv). */
static enum ekv_status roco_head(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t target, int32_t keep_n) {
    const int32_t n = h->len;
    const int32_t E = n - keep_n;
    if (E <= 0) return EKV_OK;
    if (!h->colsum || !h->count || !h->sumsq)
        return ekv_err(EKV_ERR_INTERNAL, "roco: statistics colsum/count/sumsq are missing");
    int32_t window, sinks, K;
    roco_shape(kv, target, n, &window, &sinks, &K);
    double *mean = malloc((size_t)n * sizeof *mean);
    double *sd = malloc((size_t)n * sizeof *sd);
    uint8_t *keep = malloc((size_t)n);
    enum ekv_status st = EKV_OK;
    if (!mean || !sd || !keep) {
        st = ekv_err(EKV_ERR_NOMEM, "roco: scratch for %d entries", (int)n);
        goto out;
    }
    roco_moments(h, mean, sd);
    int32_t ne = ekv_roco_select(mean, sd, n, sinks, window, K, E, keep);
    if (ne < 0) {
        st = ekv_err(EKV_ERR_NOMEM, "roco: scratch for %d entries", (int)n);
        goto out;
    }
    if (ne != E) {
        st = ekv_err(EKV_ERR_INTERNAL, "roco: evicted %d of %d entries", (int)ne, (int)E);
        goto out;
    }
    st = ekv_kv_head_keep(kv, h, keep);
out:
    free(mean); free(sd); free(keep);
    return st;
}

/* +adakv (adakv.c): head h's candidates are its eviction scope at the
 * layer's target C (the K lowest-std unprotected entries: what RoCo would
 * choose from), everything else is protected; the heads share the budget
 * by the candidates' mean attention (comparable across heads: the same
 * queries), then each head evicts its own lowest means down to its cap. */
static enum ekv_status roco_layer_ada(struct ekv_kv *kv, int il, int32_t C) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int32_t H = kv->n_head_kv;
    int32_t nmax = 1;
    for (int32_t h = 0; h < H; h++) {
        nmax = EKV_MAX(nmax, ly->heads[h].len);
        if (ly->heads[h].len > C && (!ly->heads[h].colsum || !ly->heads[h].count || !ly->heads[h].sumsq))
            return ekv_err(EKV_ERR_INTERNAL, "roco: statistics colsum/count/sumsq are missing");
    }
    int32_t *ints = calloc((size_t)H * 3, sizeof *ints);
    double **sc = calloc((size_t)H, sizeof *sc);
    double *mean = malloc((size_t)nmax * sizeof *mean), *sd = malloc((size_t)nmax * sizeof *sd);
    uint8_t *cand = malloc((size_t)nmax);
    enum ekv_status st = ints && sc && mean && sd && cand ? EKV_OK : ekv_err(EKV_ERR_NOMEM, "roco+adakv: scratch");
    int32_t *prot = ints, *m = ints + H, *caps = ints + 2 * H;
    for (int32_t h = 0; h < H && st == EKV_OK; h++) {
        const struct ekv_kv_head *hd = &ly->heads[h];
        prot[h] = hd->len;
        if (hd->len <= C) continue; /* nothing to choose from: all of it stays */
        int32_t window, sinks, K;
        roco_shape(kv, C, hd->len, &window, &sinks, &K);
        roco_moments(hd, mean, sd);
        /* evicting K marks exactly the scope (ekv_roco_select clamps K to the unprotected) */
        const int32_t nk = ekv_roco_select(mean, sd, hd->len, sinks, window, K, K, cand);
        if (nk < 0 || !(sc[h] = malloc((size_t)(nk > 0 ? nk : 1) * sizeof **sc))) {
            st = ekv_err(EKV_ERR_NOMEM, "roco+adakv: scratch");
            break;
        }
        for (int32_t j = 0; j < hd->len; j++)
            if (!cand[j]) sc[h][m[h]++] = mean[j];
        prot[h] = hd->len - m[h];
    }
    if (st == EKV_OK) st = ekv_adakv_caps(kv, C, prot, m, (const double *const *)sc, caps);
    for (int32_t h = 0; h < H && st == EKV_OK; h++) st = roco_head(kv, &ly->heads[h], C, caps[h]);
    for (int32_t h = 0; sc && h < H; h++) free(sc[h]);
    free(ints), free(sc), free(mean), free(sd), free(cand);
    return st;
}

static enum ekv_status roco_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    (void)step;
    const int32_t target = ekv_kv_target(kv, il);
    struct ekv_kv_layer *ly = &kv->layers[il];
    bool over = false;
    for (int32_t hh = 0; hh < kv->n_head_kv; hh++) over |= ly->heads[hh].len > target;
    if (kv->adakv.on && kv->n_head_kv > 1 && over) return roco_layer_ada(kv, il, target);
    for (int32_t hh = 0; hh < kv->n_head_kv; hh++) {
        enum ekv_status st = roco_head(kv, &ly->heads[hh], target, target);
        if (st != EKV_OK) return st;
    }
    return EKV_OK;
}

const struct ekv_policy_ops ekv_policy_roco = {
    .name = "roco",
    .summary = "RoCo: evict the lowest mean attention among the low-variance tokens (prefill chunks + decode)",
    .stats = EKV_STAT_COLSUM | EKV_STAT_SUMSQ,
    .configure = roco_configure,
    .layer = roco_layer,
    .end = NULL,
    .headwise = true,
};
