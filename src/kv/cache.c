/*
 * cache.c — storage of the compressed KV cache (kv.h "cache" section):
 * creation with policy lookup and parameter validation, per-(layer, KV
 * head) arrays that grow geometrically on reserve and shrink after a
 * policy compacts or merges (so allocated memory follows what is kept, as
 * DESIGN.md asks), byte accounting with a peak, and the eviction/merge
 * primitives every policy uses.
 *
 * Every array of a head has at least `cap` entries. Statistics arrays exist
 * only for the EKV_STAT_* flags in kv->stats (ekv_kv_ensure_stats), so a
 * policy that needs none pays nothing for them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"

/* Statistics flags that own per-entry arrays (SPARSITY is per layer). */
#define STAT_ARRAY_FLAGS \
    (EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_WINSUM | EKV_STAT_BINCOUNT)

/* Bytes per entry of the statistics arrays selected by `flags`. */
static size_t stats_entry_bytes(unsigned flags) {
    size_t b = 0;
    if (flags & EKV_STAT_COLSUM) b += sizeof(double) + sizeof(int32_t);
    if (flags & EKV_STAT_SUMSQ) b += sizeof(double);
    if (flags & EKV_STAT_LASTROW) b += sizeof(float);
    if (flags & EKV_STAT_WINSUM) b += sizeof(double);
    if (flags & EKV_STAT_BINCOUNT) b += sizeof(float);
    return b;
}

/* Bytes per entry of K, V, position, tag and weight. */
static size_t base_entry_bytes(const struct ekv_kv *kv) {
    return 2 * (size_t)kv->head_dim * sizeof(float) + sizeof(int32_t) + sizeof(uint8_t) + sizeof(float);
}

/* Statistics arrays a head currently has. */
static unsigned head_stat_flags(const struct ekv_kv_head *h) {
    unsigned f = 0;
    if (h->colsum) f |= EKV_STAT_COLSUM;
    if (h->sumsq) f |= EKV_STAT_SUMSQ;
    if (h->lastrow) f |= EKV_STAT_LASTROW;
    if (h->winsum) f |= EKV_STAT_WINSUM;
    if (h->bincount) f |= EKV_STAT_BINCOUNT;
    return f;
}

static void account_add(struct ekv_kv *kv, uint64_t bytes) {
    kv->bytes_alloc += bytes;
    if (kv->bytes_alloc > kv->peak_bytes_alloc) kv->peak_bytes_alloc = kv->bytes_alloc;
}

static void account_sub(struct ekv_kv *kv, uint64_t bytes) {
    kv->bytes_alloc = bytes > kv->bytes_alloc ? 0 : kv->bytes_alloc - bytes;
}

/* Reallocates every array of h to `newcap` entries. Growing fails as a
 * whole (cap unchanged; arrays already grown are merely larger); shrinking
 * cannot fail (an array that realloc cannot shrink keeps its old block). */
static enum ekv_status head_set_cap(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t newcap) {
    const size_t n = (size_t)newcap ? (size_t)newcap : 1;
    const bool grow = newcap > h->cap;
    const size_t d = (size_t)kv->head_dim;
    size_t kv_bytes;
    if (!ekv_mul_ok(n, d * sizeof(float), &kv_bytes) || n > SIZE_MAX / sizeof(double))
        return ekv_err(EKV_ERR_OVERFLOW, "kv cache: %d entries of head_dim %d overflow", (int)newcap,
                       (int)kv->head_dim);
    bool failed = false;
#define EKV_RESIZE(member, bytes, always)                   \
    do {                                                    \
        if ((always) || h->member) {                        \
            void *np_ = realloc(h->member, (bytes));        \
            if (np_) h->member = np_;                       \
            else if (grow) failed = true;                   \
        }                                                   \
    } while (0)
    EKV_RESIZE(k, kv_bytes, true);
    EKV_RESIZE(v, kv_bytes, true);
    EKV_RESIZE(pos, n * sizeof(int32_t), true);
    EKV_RESIZE(tag, n * sizeof(uint8_t), true);
    EKV_RESIZE(weight, n * sizeof(float), true);
    EKV_RESIZE(colsum, n * sizeof(double), false);
    EKV_RESIZE(count, n * sizeof(int32_t), false);
    EKV_RESIZE(sumsq, n * sizeof(double), false);
    EKV_RESIZE(lastrow, n * sizeof(float), false);
    EKV_RESIZE(winsum, n * sizeof(double), false);
    EKV_RESIZE(bincount, n * sizeof(float), false);
#undef EKV_RESIZE
    if (failed)
        return ekv_err(EKV_ERR_NOMEM, "kv cache: cannot grow a head to %d entries", (int)newcap);
    const uint64_t per = base_entry_bytes(kv) + stats_entry_bytes(head_stat_flags(h));
    if (grow) account_add(kv, (uint64_t)(newcap - h->cap) * per);
    else account_sub(kv, (uint64_t)(h->cap - newcap) * per);
    h->cap = newcap;
    return EKV_OK;
}

/* Shrinks capacity when much more is allocated than kept. */
static void head_maybe_shrink(struct ekv_kv *kv, struct ekv_kv_head *h) {
    if ((int64_t)h->cap > 2 * (int64_t)h->len + 64) {
        int32_t newcap = h->len + h->len / 4 + 16;
        (void)head_set_cap(kv, h, newcap); /* shrinking cannot fail */
    }
}

static void head_free(struct ekv_kv_head *h) {
    free(h->k);
    free(h->v);
    free(h->pos);
    free(h->tag);
    free(h->weight);
    free(h->colsum);
    free(h->count);
    free(h->sumsq);
    free(h->lastrow);
    free(h->winsum);
    free(h->bincount);
    memset(h, 0, sizeof *h);
}

void ekv_kv_free(struct ekv_kv *kv) {
    if (!kv) return;
    if (kv->ops && kv->ops->destroy) kv->ops->destroy(kv);
    if (kv->layers) {
        for (int il = 0; il < kv->n_layer; il++) {
            if (!kv->layers[il].heads) continue;
            for (int hk = 0; hk < kv->n_head_kv; hk++) head_free(&kv->layers[il].heads[hk]);
            free(kv->layers[il].heads);
        }
        free(kv->layers);
    }
    free(kv);
}

static bool int_param_ok(int32_t v) { return v >= -1; }
static bool real_param_ok(double v) { return isnan(v) || isfinite(v); }

enum ekv_status ekv_kv_new(int32_t n_layer, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                           const struct ekv_kv_params *params, struct ekv_kv **out) {
    if (!out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_new: out is NULL");
    *out = NULL;
    if (n_layer < 1 || n_head < 1 || n_head_kv < 1 || head_dim < 1)
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "kv cache shape n_layer=%d n_head=%d n_head_kv=%d head_dim=%d: all must be >= 1",
                       (int)n_layer, (int)n_head, (int)n_head_kv, (int)head_dim);
    if (n_head % n_head_kv != 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv cache: n_head %d is not a multiple of n_head_kv %d",
                       (int)n_head, (int)n_head_kv);
    if (head_dim > (1 << 20))
        return ekv_err(EKV_ERR_INVALID_ARG, "kv cache: head_dim %d too large", (int)head_dim);

    struct ekv_kv_params p = params ? *params : ekv_kv_default_params();
    const char *name = (p.policy && p.policy[0]) ? p.policy : "full";
    const struct ekv_policy_ops *ops = ekv_policy_find(name);
    if (!ops) {
        char known[256] = "";
        size_t used = 0;
        for (int i = 0; i < ekv_policy_count() && used < sizeof known; i++) {
            int w = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", ekv_policy_at(i)->name);
            if (w < 0) break;
            used += (size_t)w;
        }
        return ekv_err(EKV_ERR_INVALID_ARG, "unknown kv policy '%s' (known: %s)", name, known);
    }
    if (!(p.budget > 0.0 && p.budget <= 1.0))
        return ekv_err(EKV_ERR_INVALID_ARG, "kv budget %g out of range (0, 1]", p.budget);
    if (p.max_tokens < 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv max_tokens %d must be >= 0 (0 = no cap)", (int)p.max_tokens);
    if (!int_param_ok(p.sinks)) return ekv_err(EKV_ERR_INVALID_ARG, "kv sinks %d must be >= 0 (-1 = default)", (int)p.sinks);
    if (!int_param_ok(p.window)) return ekv_err(EKV_ERR_INVALID_ARG, "kv window %d must be >= 0 (-1 = default)", (int)p.window);
    if (!int_param_ok(p.obs_window)) return ekv_err(EKV_ERR_INVALID_ARG, "kv obs_window %d must be >= 0 (-1 = default)", (int)p.obs_window);
    if (!int_param_ok(p.pool)) return ekv_err(EKV_ERR_INVALID_ARG, "kv pool %d must be >= 0 (-1 = default)", (int)p.pool);
    if (!int_param_ok(p.chunk)) return ekv_err(EKV_ERR_INVALID_ARG, "kv chunk %d must be >= 0 (-1 = default)", (int)p.chunk);
    if (p.pool_kind != EKV_POOL_AVG && p.pool_kind != EKV_POOL_MAX)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv pool_kind %d is neither avg (0) nor max (1)", (int)p.pool_kind);
    if (!real_param_ok(p.beta)) return ekv_err(EKV_ERR_INVALID_ARG, "kv beta must be finite (NaN = default)");
    if (!real_param_ok(p.sparsity_p)) return ekv_err(EKV_ERR_INVALID_ARG, "kv sparsity_p must be finite (NaN = default)");
    if (!real_param_ok(p.recent_ratio)) return ekv_err(EKV_ERR_INVALID_ARG, "kv recent_ratio must be finite (NaN = default)");

    struct ekv_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory");
    kv->n_layer = n_layer;
    kv->n_head = n_head;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->win_start = INT64_MAX;
    snprintf(kv->policy_name, sizeof kv->policy_name, "%s", ops->name);
    p.policy = kv->policy_name;
    kv->params = p;
    kv->layers = calloc((size_t)n_layer, sizeof *kv->layers);
    if (!kv->layers) {
        free(kv);
        return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory for %d layers", (int)n_layer);
    }
    for (int il = 0; il < n_layer; il++) {
        kv->layers[il].budget = -1;
        kv->layers[il].heads = calloc((size_t)n_head_kv, sizeof(struct ekv_kv_head));
        if (!kv->layers[il].heads) {
            ekv_kv_free(kv);
            return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory for %d heads", (int)n_head_kv);
        }
    }
    enum ekv_status s = EKV_OK;
    if (ops->configure) s = ops->configure(kv);
    if (s == EKV_OK) {
        kv->ops = ops; /* destroy() runs only after init() was attempted */
        if (ops->init) s = ops->init(kv);
    }
    if (s != EKV_OK) {
        ekv_kv_free(kv);
        return ekv_err_prefix(s, "kv policy %s", ops->name);
    }
    kv->params.policy = kv->policy_name;
    *out = kv;
    return EKV_OK;
}

enum ekv_status ekv_kv_reserve(struct ekv_kv *kv, int il, int32_t extra) {
    if (!kv || il < 0 || il >= kv->n_layer || extra < 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_reserve: layer %d / extra %d out of range", il, (int)extra);
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        int64_t need = (int64_t)h->len + extra;
        if (need > INT32_MAX)
            return ekv_err(EKV_ERR_OVERFLOW, "kv cache: layer %d head %d would exceed %d entries", il, hk,
                           (int)INT32_MAX);
        if (need <= h->cap) continue;
        int64_t newcap = (int64_t)h->cap + h->cap / 2;
        if (newcap < need) newcap = need;
        if (newcap < 16) newcap = 16;
        if (newcap > INT32_MAX) newcap = INT32_MAX;
        enum ekv_status s = head_set_cap(kv, h, (int32_t)newcap);
        if (s != EKV_OK) return s;
    }
    return EKV_OK;
}

/* Allocates (zeroed) or frees one statistics array so that its presence
 * matches `want`. Arrays hold at least one element so that presence is
 * visible even at cap 0. */
#define EKV_STAT_ARRAY(h, member, want, ok)                                                    \
    do {                                                                                      \
        if ((want) && !(h)->member) {                                                         \
            (h)->member = calloc((size_t)((h)->cap ? (h)->cap : 1), sizeof(*(h)->member));    \
            if (!(h)->member) ok = false;                                                     \
        } else if (!(want) && (h)->member) {                                                  \
            free((h)->member);                                                                \
            (h)->member = NULL;                                                               \
        }                                                                                     \
    } while (0)

enum ekv_status ekv_kv_ensure_stats(struct ekv_kv *kv) {
    const unsigned want = kv->stats & STAT_ARRAY_FLAGS;
    for (int il = 0; il < kv->n_layer; il++) {
        for (int hk = 0; hk < kv->n_head_kv; hk++) {
            struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            const unsigned have = head_stat_flags(h);
            if (have == want) continue;
            bool ok = true;
            EKV_STAT_ARRAY(h, colsum, want & EKV_STAT_COLSUM, ok);
            EKV_STAT_ARRAY(h, count, want & EKV_STAT_COLSUM, ok);
            EKV_STAT_ARRAY(h, sumsq, want & EKV_STAT_SUMSQ, ok);
            EKV_STAT_ARRAY(h, lastrow, want & EKV_STAT_LASTROW, ok);
            EKV_STAT_ARRAY(h, winsum, want & EKV_STAT_WINSUM, ok);
            EKV_STAT_ARRAY(h, bincount, want & EKV_STAT_BINCOUNT, ok);
            /* count follows colsum; a failed half leaves the pair absent */
            if (!h->colsum || !h->count) {
                free(h->colsum);
                free(h->count);
                h->colsum = NULL;
                h->count = NULL;
            }
            const unsigned now = head_stat_flags(h);
            const uint64_t cap = (uint64_t)h->cap;
            account_sub(kv, cap * stats_entry_bytes(have & ~now));
            account_add(kv, cap * stats_entry_bytes(now & ~have));
            if (!ok)
                return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory for statistics of layer %d head %d",
                               il, hk);
        }
    }
    return EKV_OK;
}
#undef EKV_STAT_ARRAY

void ekv_kv_head_append(struct ekv_kv *kv, struct ekv_kv_head *h, const float *k, const float *v,
                        int32_t pos, uint8_t tag) {
    if (h->len >= h->cap) return; /* caller did not reserve: nothing is written */
    const size_t d = (size_t)kv->head_dim;
    const size_t j = (size_t)h->len;
    memcpy(h->k + j * d, k, d * sizeof(float));
    memcpy(h->v + j * d, v, d * sizeof(float));
    h->pos[j] = pos;
    h->tag[j] = tag;
    h->weight[j] = 1.0f;
    if (h->colsum) h->colsum[j] = 0.0;
    if (h->count) h->count[j] = 0;
    if (h->sumsq) h->sumsq[j] = 0.0;
    if (h->lastrow) h->lastrow[j] = 0.0f;
    if (h->winsum) h->winsum[j] = 0.0;
    if (h->bincount) h->bincount[j] = 0.0f;
    h->len++;
}

/* Moves entry src to slot dst (dst < src) in every array. */
static void head_move(const struct ekv_kv *kv, struct ekv_kv_head *h, int32_t dst, int32_t src) {
    const size_t d = (size_t)kv->head_dim;
    memcpy(h->k + (size_t)dst * d, h->k + (size_t)src * d, d * sizeof(float));
    memcpy(h->v + (size_t)dst * d, h->v + (size_t)src * d, d * sizeof(float));
    h->pos[dst] = h->pos[src];
    h->tag[dst] = h->tag[src];
    h->weight[dst] = h->weight[src];
    if (h->colsum) h->colsum[dst] = h->colsum[src];
    if (h->count) h->count[dst] = h->count[src];
    if (h->sumsq) h->sumsq[dst] = h->sumsq[src];
    if (h->lastrow) h->lastrow[dst] = h->lastrow[src];
    if (h->winsum) h->winsum[dst] = h->winsum[src];
    if (h->bincount) h->bincount[dst] = h->bincount[src];
}

/* Packs the entries with keep[j] != 0 to the front; no accounting. */
static void head_compact(const struct ekv_kv *kv, struct ekv_kv_head *h, const uint8_t *keep) {
    int32_t w = 0;
    for (int32_t j = 0; j < h->len; j++) {
        if (!keep[j]) continue;
        if (w != j) head_move(kv, h, w, j);
        w++;
    }
    h->len = w;
}

enum ekv_status ekv_kv_head_keep(struct ekv_kv *kv, struct ekv_kv_head *h, const uint8_t *keep) {
    if (!kv || !h || (!keep && h->len > 0)) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_keep: NULL argument");
    double dropped = 0.0;
    for (int32_t j = 0; j < h->len; j++)
        if (!keep[j]) dropped += h->weight[j];
    head_compact(kv, h, keep);
    h->n_evicted += (int64_t)llround(dropped);
    head_maybe_shrink(kv, h);
    return EKV_OK;
}

enum ekv_status ekv_kv_head_keep_idx(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *idx,
                                     int32_t n) {
    if (!kv || !h || n < 0 || (n > 0 && !idx))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_keep_idx: bad arguments (n = %d)", (int)n);
    if (n > h->len)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_keep_idx: %d indices for %d entries", (int)n,
                       (int)h->len);
    for (int32_t t = 0; t < n; t++) {
        if (idx[t] < 0 || idx[t] >= h->len || (t > 0 && idx[t] <= idx[t - 1]))
            return ekv_err(EKV_ERR_INVALID_ARG,
                           "ekv_kv_head_keep_idx: index %d (= %d) is out of range [0, %d) or not ascending",
                           (int)t, (int)idx[t], (int)h->len);
    }
    double total = 0.0, kept = 0.0;
    for (int32_t j = 0; j < h->len; j++) total += h->weight[j];
    for (int32_t t = 0; t < n; t++) {
        kept += h->weight[idx[t]];
        if (idx[t] != t) head_move(kv, h, t, idx[t]);
    }
    h->len = n;
    h->n_evicted += (int64_t)llround(total - kept);
    head_maybe_shrink(kv, h);
    return EKV_OK;
}

enum ekv_status ekv_kv_head_merge(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into) {
    if (!kv || !h || (!into && h->len > 0)) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_merge: NULL argument");
    const int32_t len = h->len;
    const size_t d = (size_t)kv->head_dim;
    int32_t n_targets = 0;
    for (int32_t j = 0; j < len; j++) {
        const int32_t t = into[j];
        if (t == -1 || t == j) continue;
        if (t < 0 || t >= len || into[t] != t)
            return ekv_err(EKV_ERR_INVALID_ARG,
                           "ekv_kv_head_merge: entry %d joins %d, which is not a surviving entry", (int)j,
                           (int)t);
    }
    /* slot[t]: accumulator of survivor t that receives members (-1: none) */
    int32_t *slot = malloc((size_t)(len ? len : 1) * sizeof *slot);
    uint8_t *keep = malloc((size_t)(len ? len : 1));
    if (!slot || !keep) {
        free(slot);
        free(keep);
        return ekv_err(EKV_ERR_NOMEM, "ekv_kv_head_merge: out of memory for %d entries", (int)len);
    }
    for (int32_t j = 0; j < len; j++) slot[j] = -1;
    for (int32_t j = 0; j < len; j++) {
        const int32_t t = into[j];
        if (t >= 0 && t != j && slot[t] < 0) slot[t] = n_targets++;
    }
    double *acc = NULL; /* [n_targets][2 * d]: weighted sums of K then V */
    double *wsum = NULL; /* [n_targets] */
    if (n_targets > 0) {
        acc = calloc((size_t)n_targets * 2 * d, sizeof *acc);
        wsum = calloc((size_t)n_targets, sizeof *wsum);
        if (!acc || !wsum) {
            free(slot);
            free(keep);
            free(acc);
            free(wsum);
            return ekv_err(EKV_ERR_NOMEM, "ekv_kv_head_merge: out of memory for %d merge targets",
                           (int)n_targets);
        }
    }
    double merged = 0.0, dropped = 0.0;
    /* survivors' own contribution, then the members' */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t j = 0; j < len; j++) {
            const int32_t t = into[j];
            if (t < 0) continue;
            const bool self = (t == j);
            if ((pass == 0) != self || slot[t] < 0) continue;
            double *a = acc + (size_t)slot[t] * 2 * d;
            const double w = h->weight[j];
            const float *kj = h->k + (size_t)j * d;
            const float *vj = h->v + (size_t)j * d;
            for (size_t c = 0; c < d; c++) {
                a[c] += w * kj[c];
                a[d + c] += w * vj[c];
            }
            wsum[slot[t]] += w;
            if (!self) {
                merged += w;
                if (h->colsum) h->colsum[t] += h->colsum[j];
                if (h->count) h->count[t] += h->count[j];
                if (h->sumsq) h->sumsq[t] += h->sumsq[j];
                if (h->lastrow) h->lastrow[t] += h->lastrow[j];
                if (h->winsum) h->winsum[t] += h->winsum[j];
                if (h->bincount) h->bincount[t] += h->bincount[j];
            }
        }
    }
    for (int32_t j = 0; j < len; j++) {
        keep[j] = (into[j] == j);
        if (into[j] < 0) dropped += h->weight[j];
        if (into[j] == j && slot[j] >= 0) {
            const double *a = acc + (size_t)slot[j] * 2 * d;
            const double W = wsum[slot[j]];
            float *kj = h->k + (size_t)j * d;
            float *vj = h->v + (size_t)j * d;
            for (size_t c = 0; c < d; c++) {
                kj[c] = (float)(a[c] / W);
                vj[c] = (float)(a[d + c] / W);
            }
            h->weight[j] = (float)W;
        }
    }
    head_compact(kv, h, keep);
    h->n_merged += (int64_t)llround(merged);
    h->n_evicted += (int64_t)llround(dropped);
    free(slot);
    free(keep);
    free(acc);
    free(wsum);
    head_maybe_shrink(kv, h);
    return EKV_OK;
}

void ekv_kv_reset_stats(struct ekv_kv *kv, unsigned which) {
    for (int il = 0; il < kv->n_layer; il++) {
        struct ekv_kv_layer *L = &kv->layers[il];
        if (which & EKV_STAT_SPARSITY) {
            L->sparse_zero = 0.0;
            L->sparse_total = 0.0;
        }
        for (int hk = 0; hk < kv->n_head_kv; hk++) {
            struct ekv_kv_head *h = &L->heads[hk];
            const size_t n = (size_t)h->len;
            if ((which & EKV_STAT_COLSUM) && h->colsum) {
                memset(h->colsum, 0, n * sizeof *h->colsum);
                memset(h->count, 0, n * sizeof *h->count);
            }
            if ((which & EKV_STAT_SUMSQ) && h->sumsq) memset(h->sumsq, 0, n * sizeof *h->sumsq);
            if ((which & EKV_STAT_LASTROW) && h->lastrow) memset(h->lastrow, 0, n * sizeof *h->lastrow);
            if ((which & EKV_STAT_WINSUM) && h->winsum) memset(h->winsum, 0, n * sizeof *h->winsum);
            if ((which & EKV_STAT_BINCOUNT) && h->bincount) memset(h->bincount, 0, n * sizeof *h->bincount);
        }
    }
}

int32_t ekv_kv_target(const struct ekv_kv *kv, int il) {
    if (!kv || il < 0 || il >= kv->n_layer) return 1;
    const struct ekv_kv_layer *L = &kv->layers[il];
    int64_t t = 0;
    for (int hk = 0; hk < kv->n_head_kv; hk++)
        if (L->heads[hk].len > t) t = L->heads[hk].len;
    /* the -1e-9 keeps budget * n_seen that is an integer up to rounding
     * (budget 1.0 in particular) from rounding up */
    /* a per-layer budget set by the policy (PyramidKV, VL-Cache) replaces
     * the uniform ceil(budget * n_seen): lower layers may keep more */
    const double c = L->budget >= 0 ? (double)L->budget : ceil(kv->params.budget * (double)kv->n_seen - 1e-9);
    if (c < (double)t) t = (int64_t)c;
    if (kv->params.max_tokens > 0 && kv->params.max_tokens < t) t = kv->params.max_tokens;
    if (t < 1) t = 1;
    return (int32_t)t;
}
