/*
 * cache.c — storage of the compressed KV cache (kv.h "cache" section):
 * creation with policy lookup and parameter validation, per-(layer, KV
 * head) arrays that grow geometrically on reserve and shrink after a
 * policy compacts or merges (so allocated memory follows what is kept, as
 * docs/architecture.md "The KV cache contract" says), byte accounting with a peak, and the eviction/merge
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

/* Bytes per entry of position, tag and weight (K and V live in the stores). */
static size_t meta_entry_bytes(void) { return sizeof(int32_t) + sizeof(uint8_t) + sizeof(float); }

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

/* Bytes a head has allocated: per-entry arrays up to cap, and its stores. */
static uint64_t head_alloc(const struct ekv_kv *kv, const struct ekv_kv_head *h) {
    const size_t mpos = h->mpos ? 3 * sizeof(int32_t) : 0;
    return (uint64_t)h->cap * (meta_entry_bytes() + mpos + stats_entry_bytes(head_stat_flags(h))) +
           ekv_store_alloc_bytes(&kv->fk, &h->ks) + ekv_store_alloc_bytes(&kv->fv, &h->vs);
}

/* Accounts the change of a head's allocation since `before`. */
static void account_head(struct ekv_kv *kv, const struct ekv_kv_head *h, uint64_t before) {
    const uint64_t now = head_alloc(kv, h);
    if (now >= before) account_add(kv, now - before);
    else account_sub(kv, before - now);
}

/* Reallocates every per-entry array of h (and the rows of row-type
 * stores) to `newcap` entries. Growing fails as a whole (cap unchanged;
 * arrays already grown are merely larger); shrinking cannot fail (an array
 * that realloc cannot shrink keeps its old block). */
static enum ekv_status head_set_cap(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t newcap) {
    const size_t n = (size_t)newcap ? (size_t)newcap : 1;
    const bool grow = newcap > h->cap;
    if (n > SIZE_MAX / sizeof(double) / 4)
        return ekv_err(EKV_ERR_OVERFLOW, "kv cache: %d entries of head_dim %d overflow", (int)newcap,
                       (int)kv->head_dim);
    const uint64_t before = head_alloc(kv, h);
    bool failed = false;
#define EKV_RESIZE(member, bytes, always)                   \
    do {                                                    \
        if ((always) || h->member) {                        \
            void *np_ = realloc(h->member, (bytes));        \
            if (np_) h->member = np_;                       \
            else if (grow) failed = true;                   \
        }                                                   \
    } while (0)
    EKV_RESIZE(pos, n * sizeof(int32_t), true);
    EKV_RESIZE(mpos, n * 3 * sizeof(int32_t), ekv_kv_mrope(kv));
    EKV_RESIZE(tag, n * sizeof(uint8_t), true);
    EKV_RESIZE(weight, n * sizeof(float), true);
    EKV_RESIZE(colsum, n * sizeof(double), false);
    EKV_RESIZE(count, n * sizeof(int32_t), false);
    EKV_RESIZE(sumsq, n * sizeof(double), false);
    EKV_RESIZE(lastrow, n * sizeof(float), false);
    EKV_RESIZE(winsum, n * sizeof(double), false);
    EKV_RESIZE(bincount, n * sizeof(float), false);
#undef EKV_RESIZE
    enum ekv_status s = EKV_OK; /* rows held by a device (kv->dev) are not here */
    if (!kv->dev && !ekv_kv_type_is_kivi(kv->fk.type)) s = ekv_store_set_rows(&kv->fk, &h->ks, newcap);
    if (!kv->dev && s == EKV_OK && !ekv_kv_type_is_kivi(kv->fv.type)) s = ekv_store_set_rows(&kv->fv, &h->vs, newcap);
    if (failed || s != EKV_OK) {
        account_head(kv, h, before);
        return s != EKV_OK ? s : ekv_err(EKV_ERR_NOMEM, "kv cache: cannot grow a head to %d entries", (int)newcap);
    }
    h->cap = newcap;
    account_head(kv, h, before);
    return EKV_OK;
}

/* Shrinks capacity when much more is allocated than kept. */
static void head_maybe_shrink(struct ekv_kv *kv, struct ekv_kv_head *h) {
    if ((int64_t)h->cap > 2 * (int64_t)h->len + 64) {
        int32_t newcap = h->len + h->len / 4 + 16;
        (void)head_set_cap(kv, h, newcap); /* shrinking cannot fail */
    }
    const uint64_t before = head_alloc(kv, h);
    ekv_store_shrink(&kv->fk, &h->ks, h->len);
    ekv_store_shrink(&kv->fv, &h->vs, h->len);
    account_head(kv, h, before);
}

static void head_free(struct ekv_kv_head *h) {
    ekv_store_free(&h->ks);
    ekv_store_free(&h->vs);
    free(h->pos);
    free(h->mpos);
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

/* Resolves the storage types and KIVI parameters of p (defaults filled in
 * place) into the two stores' formats. */
static enum ekv_status resolve_storage(struct ekv_kv_params *p, int32_t head_dim, struct ekv_store_fmt *fk,
                                       struct ekv_store_fmt *fv) {
    for (int side = 0; side < 2; side++) {
        enum ekv_kv_type *t = side ? &p->type_v : &p->type_k;
        if (*t == EKV_KV_DEFAULT) *t = ekv_kv_type_default();
        if (!ekv_kv_traits(*t))
            return ekv_err(EKV_ERR_INVALID_ARG, "kv %s type %d is not a storage type", side ? "value" : "key", (int)*t);
    }
    if (p->kv_group <= 0) p->kv_group = 32;
    if (p->kv_residual == -1) p->kv_residual = 128;
    if (p->kv_group > 1024) return ekv_err(EKV_ERR_INVALID_ARG, "kv group %d out of range [1, 1024]", (int)p->kv_group);
    if (p->kv_residual < 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv residual %d must be >= 0 (-1 = default 128)", (int)p->kv_residual);
    const bool kivi = ekv_kv_type_is_kivi(p->type_k) || ekv_kv_type_is_kivi(p->type_v);
    if (kivi && p->kv_residual % p->kv_group != 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv residual %d must be a multiple of the kv group %d (KIVI)",
                       (int)p->kv_residual, (int)p->kv_group);
    const char *why = ekv_store_fmt_init(fk, p->type_k, false, head_dim, p->kv_group, p->kv_residual);
    if (why)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv key type %s with head_dim %d, group %d: %s", ekv_kv_type_name(p->type_k),
                       (int)head_dim, (int)p->kv_group, why);
    why = ekv_store_fmt_init(fv, p->type_v, true, head_dim, p->kv_group, p->kv_residual);
    if (why)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv value type %s with head_dim %d, group %d: %s",
                       ekv_kv_type_name(p->type_v), (int)head_dim, (int)p->kv_group, why);
    return EKV_OK;
}
static bool real_param_ok(double v) { return isnan(v) || isfinite(v); }

/* "key=value:key=value" of a policy spec: merge_* keys to +merge's
 * options (src/kv/merge.c), the others through ops->option. */
static enum ekv_status apply_options(struct ekv_kv *kv, const char *opts) {
    char buf[256];
    if (strlen(opts) >= sizeof buf) return ekv_err(EKV_ERR_INVALID_ARG, "options '%.64s...' are too long", opts);
    snprintf(buf, sizeof buf, "%s", opts);
    for (char *save = NULL, *kvp = strtok_r(buf, ":", &save); kvp; kvp = strtok_r(NULL, ":", &save)) {
        char *eq = strchr(kvp, '=');
        if (!eq || eq == kvp || !eq[1])
            return ekv_err(EKV_ERR_INVALID_ARG, "option '%.64s' is not key=value", kvp);
        *eq = 0;
        enum ekv_status s;
        if (!strncmp(kvp, "merge_", 6) || !strncmp(kvp, "ada_", 4)) {
            const bool m = kvp[0] == 'm', on = m ? kv->merge.on : kv->adakv.on;
            s = !on ? ekv_err(EKV_ERR_INVALID_ARG, "option '%.64s' needs +%s in the spec", kvp, m ? "merge" : "adakv")
                : m ? ekv_kv_merge_option(&kv->merge, kvp, eq + 1) : ekv_kv_adakv_option(&kv->adakv, kvp, eq + 1);
        }
        else if (!kv->ops->option)
            s = ekv_err(EKV_ERR_INVALID_ARG, "takes no options (got '%.64s')", kvp);
        else
            s = kv->ops->option(kv, kvp, eq + 1);
        if (s != EKV_OK) return s;
    }
    return EKV_OK;
}

/* The "+modifier" words between a spec's policy name and its options
 * ("snapkv+merge:merge_to=key"): +merge turns on merging. */
static enum ekv_status apply_modifiers(struct ekv_kv *kv, const char *spec) {
    const char *p = spec + strcspn(spec, ":+");
    while (*p == '+') {
        const size_t n = strcspn(p + 1, ":+");
        if (n == 5 && !strncmp(p + 1, "merge", 5) && !kv->merge.on)
            kv->merge = ekv_kv_merge_defaults();
        else if (n == 5 && !strncmp(p + 1, "adakv", 5) && !kv->adakv.on && kv->ops->headwise)
            kv->adakv = ekv_kv_adakv_defaults();
        else if (n == 5 && !strncmp(p + 1, "adakv", 5) && !kv->adakv.on)
            return ekv_kv_adakv_refused();
        else
            return ekv_err(EKV_ERR_INVALID_ARG, "unknown or repeated modifier '+%.*s' (known: +merge, +adakv)",
                           (int)(n < 32 ? n : 32), p + 1);
        p += 1 + n;
    }
    return EKV_OK;
}

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
    if (strlen(name) >= sizeof(((struct ekv_kv *)0)->spec))
        return ekv_err(EKV_ERR_INVALID_ARG, "kv policy spec of %zu bytes is too long (at most %zu)", strlen(name),
                       sizeof(((struct ekv_kv *)0)->spec) - 1);
    struct ekv_store_fmt fk, fv;
    enum ekv_status ts = resolve_storage(&p, head_dim, &fk, &fv);
    if (ts != EKV_OK) return ts;
    if (p.compat_ref && !ops->has_compat_ref)
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "kv policy %s has no reference-compatibility mode (--kv-compat ref applies to elastic only)",
                       ops->name);

    struct ekv_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory");
    kv->n_layer = n_layer;
    kv->n_head = n_head;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->win_start = INT64_MAX;
    kv->fk = fk;
    kv->fv = fv;
    snprintf(kv->policy_name, sizeof kv->policy_name, "%s", ops->name);
    snprintf(kv->spec, sizeof kv->spec, "%s", name);
    p.policy = kv->policy_name;
    kv->params = p;
    kv->stats = ops->stats;
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
    if (s == EKV_OK) s = apply_modifiers(kv, name);
    if (s == EKV_OK && strchr(name, ':')) s = apply_options(kv, strchr(name, ':') + 1);
    if (s == EKV_OK && kv->merge.on && kv->merge.bias) kv->logit_bias = true; /* after the policy's own options */
    if (s != EKV_OK) {
        ekv_kv_free(kv);
        return ekv_err_prefix(s, "kv policy %s", ops->name);
    }
    kv->params.policy = kv->policy_name;
    *out = kv;
    return EKV_OK;
}

/* dst (zeroed) becomes a copy of head src of a cache with formats fk/fv:
 * its per-entry arrays (the first len entries copied) and stores. */
static enum ekv_status head_clone(const struct ekv_kv *kv, const struct ekv_kv_head *src, struct ekv_kv_head *dst) {
    *dst = *src;
    dst->ks = (struct ekv_kv_store){0};
    dst->vs = (struct ekv_kv_store){0};
    dst->pos = NULL, dst->mpos = NULL, dst->tag = NULL, dst->weight = NULL, dst->colsum = NULL, dst->count = NULL;
    dst->sumsq = NULL, dst->lastrow = NULL, dst->winsum = NULL, dst->bincount = NULL;
    const size_t n = src->cap > 0 ? (size_t)src->cap : 1, len = (size_t)src->len;
    bool ok = true;
#define EKV_DUP(member)                                                       \
    do {                                                                      \
        if (src->member) {                                                    \
            dst->member = malloc(n * sizeof *src->member);                    \
            if (dst->member) memcpy(dst->member, src->member, len * sizeof *src->member); \
            else ok = false;                                                  \
        }                                                                     \
    } while (0)
    EKV_DUP(pos);
    if (src->mpos) { /* three per entry */
        dst->mpos = malloc(n * 3 * sizeof *src->mpos);
        if (dst->mpos) memcpy(dst->mpos, src->mpos, len * 3 * sizeof *src->mpos);
        else ok = false;
    }
    EKV_DUP(tag);
    EKV_DUP(weight);
    EKV_DUP(colsum);
    EKV_DUP(count);
    EKV_DUP(sumsq);
    EKV_DUP(lastrow);
    EKV_DUP(winsum);
    EKV_DUP(bincount);
#undef EKV_DUP
    enum ekv_status s = ok ? EKV_OK : ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory copying a head of %d entries",
                                              (int)src->cap);
    if (s == EKV_OK) s = ekv_store_clone(&kv->fk, &src->ks, &dst->ks);
    if (s == EKV_OK) s = ekv_store_clone(&kv->fv, &src->vs, &dst->vs);
    if (s != EKV_OK) head_free(dst);
    return s;
}

enum ekv_status ekv_kv_clone(const struct ekv_kv *src, struct ekv_kv **out) {
    if (!src || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_clone: src and out are required");
    *out = NULL;
    if (src->pstate && !src->ops->clone)
        return ekv_err(EKV_ERR_UNSUPPORTED, "kv policy %s: its state cannot be copied", src->ops->name);
    struct ekv_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory");
    *kv = *src;
    kv->layers = NULL;
    kv->pstate = NULL;
    kv->dev = NULL;         /* the copy's device rows, if any, are its owner's to attach */
    kv->layer_hook = NULL;
    kv->layer_hook_user = NULL;
    kv->shadows = NULL;
    kv->n_shadows = 0;
    kv->params.policy = kv->policy_name;
    const struct ekv_policy_ops *ops = kv->ops;
    kv->ops = NULL;         /* no destroy() until the state is copied */
    enum ekv_status s = EKV_OK;
    kv->layers = calloc((size_t)kv->n_layer, sizeof *kv->layers);
    if (!kv->layers) s = ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory for %d layers", (int)kv->n_layer);
    for (int il = 0; il < kv->n_layer && s == EKV_OK; il++) {
        kv->layers[il] = src->layers[il];
        kv->layers[il].heads = calloc((size_t)kv->n_head_kv, sizeof(struct ekv_kv_head));
        if (!kv->layers[il].heads) {
            s = ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory for %d heads", (int)kv->n_head_kv);
            break;
        }
        for (int hk = 0; hk < kv->n_head_kv && s == EKV_OK; hk++)
            s = head_clone(kv, &src->layers[il].heads[hk], &kv->layers[il].heads[hk]);
    }
    if (s == EKV_OK && src->pstate) {
        kv->ops = ops;
        s = ops->clone(kv, src);
    }
    if (s != EKV_OK) {
        ekv_kv_free(kv);
        return s;
    }
    kv->ops = ops;
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
        if (need > h->cap) {
            int64_t newcap = (int64_t)h->cap + h->cap / 2;
            if (newcap < need) newcap = need;
            if (newcap < 16) newcap = 16;
            if (newcap > INT32_MAX) newcap = INT32_MAX;
            enum ekv_status s = head_set_cap(kv, h, (int32_t)newcap);
            if (s != EKV_OK) return s;
        }
        if (kv->dev) continue;
        const uint64_t before = head_alloc(kv, h);
        enum ekv_status s = ekv_store_reserve(&kv->fk, &h->ks, h->len, extra);
        if (s == EKV_OK) s = ekv_store_reserve(&kv->fv, &h->vs, h->len, extra);
        account_head(kv, h, before);
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

/* Makes the statistics arrays of h those of `want` (array flags); false
 * when an allocation failed. */
static bool stat_arrays(struct ekv_kv_head *h, unsigned want) {
    bool ok = true;
    EKV_STAT_ARRAY(h, colsum, want & EKV_STAT_COLSUM, ok);
    EKV_STAT_ARRAY(h, count, want & EKV_STAT_COLSUM, ok);
    EKV_STAT_ARRAY(h, sumsq, want & EKV_STAT_SUMSQ, ok);
    EKV_STAT_ARRAY(h, lastrow, want & EKV_STAT_LASTROW, ok);
    EKV_STAT_ARRAY(h, winsum, want & EKV_STAT_WINSUM, ok);
    EKV_STAT_ARRAY(h, bincount, want & EKV_STAT_BINCOUNT, ok);
    return ok;
}

enum ekv_status ekv_kv_ensure_stats(struct ekv_kv *kv) {
    const unsigned want = kv->stats & STAT_ARRAY_FLAGS;
    for (int il = 0; il < kv->n_layer; il++) {
        for (int hk = 0; hk < kv->n_head_kv; hk++) {
            struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            const unsigned have = head_stat_flags(h);
            if (have == want) continue;
            const bool ok = stat_arrays(h, want);
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

void ekv_kv_recount(struct ekv_kv *kv) {
    uint64_t b = 0;
    for (int il = 0; il < kv->n_layer; il++)
        for (int hk = 0; hk < kv->n_head_kv; hk++) b += head_alloc(kv, &kv->layers[il].heads[hk]);
    kv->bytes_alloc = b;
    if (b > kv->peak_bytes_alloc) kv->peak_bytes_alloc = b;
}

enum ekv_status ekv_kv_head_alloc(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t cap, unsigned stat_flags) {
    if (h->cap != 0 || h->len != 0 || cap < 0)
        return ekv_err(EKV_ERR_INTERNAL, "ekv_kv_head_alloc: the head is not empty");
    if (!stat_arrays(h, stat_flags & STAT_ARRAY_FLAGS)) return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory for statistics"); /* freed with the head */
    return cap > 0 ? head_set_cap(kv, h, cap) : EKV_OK;
}
#undef EKV_STAT_ARRAY

void ekv_kv_head_append(struct ekv_kv *kv, struct ekv_kv_head *h, const float *k, const float *v,
                        int32_t pos, uint8_t tag, const int32_t *mpos) {
    if (h->len >= h->cap) return; /* caller did not reserve: nothing is written */
    const size_t j = (size_t)h->len;
    if (!kv->dev) {
        if (ekv_kv_type_is_kivi(kv->fk.type) && h->len - h->ks.nq >= h->ks.tail_cap) return;
        if (ekv_kv_type_is_kivi(kv->fv.type) && h->len - h->vs.nq >= h->vs.tail_cap) return;
        ekv_store_append(&kv->fk, &h->ks, h->len, k);
        ekv_store_append(&kv->fv, &h->vs, h->len, v);
    }
    h->pos[j] = pos;
    if (h->mpos) {
        h->mpos[3 * j] = mpos ? mpos[0] : pos;
        h->mpos[3 * j + 1] = mpos ? mpos[1] : pos;
        h->mpos[3 * j + 2] = mpos ? mpos[2] : pos;
    }
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

/* Moves entry src to slot dst (dst < src) in every per-entry array. */
/* Entries [src, src + n) to [dst, dst + n) (dst <= src), every per-entry array. */
static void head_move(struct ekv_kv_head *h, int32_t dst, int32_t src, int32_t n) {
#define EKV_MOVE(a) \
    if (h->a) memmove(h->a + dst, h->a + src, (size_t)n * sizeof *h->a)
    EKV_MOVE(pos);
    if (h->mpos) memmove(h->mpos + 3 * (size_t)dst, h->mpos + 3 * (size_t)src, (size_t)n * 3 * sizeof *h->mpos);
    EKV_MOVE(tag);
    EKV_MOVE(weight);
    EKV_MOVE(colsum);
    EKV_MOVE(count);
    EKV_MOVE(sumsq);
    EKV_MOVE(lastrow);
    EKV_MOVE(winsum);
    EKV_MOVE(bincount);
#undef EKV_MOVE
}

int32_t ekv_keep_next(const uint8_t *keep, int32_t from, int32_t len, bool kept) {
    if (from >= len) return len;
    if (!kept) { /* the next 0 */
        const uint8_t *p = memchr(keep + from, 0, (size_t)(len - from));
        return p ? (int32_t)(p - keep) : len;
    }
    while (from + 8 <= len) { /* the next non-zero, 8 bytes at a time through zeros */
        uint64_t w;
        memcpy(&w, keep + from, 8);
        if (w) break;
        from += 8;
    }
    while (from < len && !keep[from]) from++;
    return from;
}

/* The layer and KV head of h (one of kv's heads). */
static void head_where(const struct ekv_kv *kv, const struct ekv_kv_head *h, int *il, int *hk) {
    for (int l = 0; l < kv->n_layer; l++) {
        const struct ekv_kv_head *h0 = kv->layers[l].heads;
        if (h >= h0 && h < h0 + kv->n_head_kv) {
            *il = l;
            *hk = (int)(h - h0);
            return;
        }
    }
    *il = *hk = -1;
}

/* Packs the entries with keep[j] != 0 to the front, K and V in their
 * storage included; kept entries j with k_of[j] / v_of[j] (arrays may be
 * NULL) get those rows (one quantisation per KIVI key group). The
 * per-entry arrays always compact; a store that cannot (no memory to
 * re-pack KIVI key groups) reports it. */
static enum ekv_status head_compact(struct ekv_kv *kv, struct ekv_kv_head *h, const uint8_t *keep,
                                    const float *const *k_of, const float *const *v_of, const int32_t *into,
                                    const float *w0, unsigned flags) {
    const uint64_t before = head_alloc(kv, h);
    enum ekv_status s = EKV_OK, s2 = EKV_OK;
    if (kv->dev) {
        int il, hk;
        head_where(kv, h, &il, &hk);
        if (il < 0) s = ekv_err(EKV_ERR_INVALID_ARG, "kv cache: the head is not one of this cache's");
        else if (into) s = kv->dev->merge(kv->dev->user, il, hk, h->len, into, w0, flags, k_of, v_of);
        else s = kv->dev->compact(kv->dev->user, il, hk, h->len, keep, k_of, v_of);
    } else {
        s = ekv_store_compact(&kv->fk, &h->ks, h->len, keep, k_of);
        s2 = ekv_store_compact(&kv->fv, &h->vs, h->len, keep, v_of);
    }
    account_head(kv, h, before);
    int32_t w = 0; /* by runs of kept entries: a few memmoves when few entries go */
    for (int32_t j = ekv_keep_next(keep, 0, h->len, true); j < h->len; j = ekv_keep_next(keep, j, h->len, true)) {
        const int32_t e = ekv_keep_next(keep, j, h->len, false);
        if (w != j) head_move(h, w, j, e - j);
        w += e - j;
        j = e;
    }
    h->len = w;
    return s != EKV_OK ? s : s2;
}

enum ekv_status ekv_kv_head_keep(struct ekv_kv *kv, struct ekv_kv_head *h, const uint8_t *keep) {
    if (!kv || !h || (!keep && h->len > 0)) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_keep: NULL argument");
    if (kv->merge.on && (kv->in_prompt || !kv->merge.prompt_only) && ekv_keep_next(keep, 0, h->len, false) < h->len)
        return ekv_kv_merge_dropped(kv, h, keep);
    double dropped = 0.0; /* weights are whole numbers of tokens: any order of sums is exact */
    for (int32_t j = ekv_keep_next(keep, 0, h->len, false); j < h->len; j = ekv_keep_next(keep, j + 1, h->len, false))
        dropped += h->weight[j];
    enum ekv_status s = head_compact(kv, h, keep, NULL, NULL, NULL, NULL, 0);
    h->n_evicted += (int64_t)llround(dropped);
    head_maybe_shrink(kv, h);
    return s;
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
    uint8_t *keep = calloc((size_t)(h->len ? h->len : 1), 1);
    if (!keep) return ekv_err(EKV_ERR_NOMEM, "ekv_kv_head_keep_idx: out of memory for %d entries", (int)h->len);
    for (int32_t t = 0; t < n; t++) keep[idx[t]] = 1;
    enum ekv_status s = ekv_kv_head_keep(kv, h, keep);
    free(keep);
    return s;
}

/* ---- entry access ---- */

static enum ekv_status check_entry(const struct ekv_kv *kv, const struct ekv_kv_head *h, int32_t j, const char *fn) {
    if (!kv || !h) return ekv_err(EKV_ERR_INVALID_ARG, "%s: NULL cache or head", fn);
    if (j < 0 || j >= h->len)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: entry %d out of range [0, %d)", fn, (int)j, (int)h->len);
    return EKV_OK;
}

/* kv->dev's address of head h (*il, *hk) and its explicit indices: idx, or
 * (idx NULL) 0..n-1 in *seq, which the caller frees. */
static enum ekv_status dev_head(const struct ekv_kv *kv, const struct ekv_kv_head *h, const int32_t *idx, int32_t n,
                                int *il, int *hk, int32_t **seq) {
    *seq = NULL;
    head_where(kv, h, il, hk);
    if (*il < 0) return ekv_err(EKV_ERR_INVALID_ARG, "kv cache: the head is not one of this cache's");
    if (idx) return EKV_OK;
    *seq = malloc((size_t)(n ? n : 1) * sizeof **seq);
    if (!*seq) return ekv_err(EKV_ERR_NOMEM, "out of memory for %d indices", (int)n);
    for (int32_t t = 0; t < n; t++) (*seq)[t] = t;
    return EKV_OK;
}

/* Rows idx[0..n) (valid; idx NULL = 0..n-1) of K and/or V as floats. */
static enum ekv_status rows_read(const struct ekv_kv *kv, const struct ekv_kv_head *h, const int32_t *idx, int32_t n,
                                 float *k, float *v) {
    if (kv->dev) {
        int il, hk;
        int32_t *seq;
        enum ekv_status s = dev_head(kv, h, idx, n, &il, &hk, &seq);
        if (s == EKV_OK) s = kv->dev->read(kv->dev->user, il, hk, h->len, idx ? idx : seq, n, k, v);
        free(seq);
        return s;
    }
    const size_t d = (size_t)kv->head_dim;
    for (int32_t t = 0; t < n; t++) {
        const int32_t j = idx ? idx[t] : t;
        if (k) ekv_store_read(&kv->fk, &h->ks, h->len, j, j + 1, k + (size_t)t * d);
        if (v) ekv_store_read(&kv->fv, &h->vs, h->len, j, j + 1, v + (size_t)t * d);
    }
    return EKV_OK;
}

/* Writes rows idx[t] (distinct, valid) of one side from src [n][head_dim]. */
static enum ekv_status rows_write(const struct ekv_kv *kv, struct ekv_kv_head *h, bool is_v, const int32_t *idx,
                                  int32_t n, const float *src) {
    if (kv->dev) {
        int il, hk;
        int32_t *seq;
        enum ekv_status s = dev_head(kv, h, idx, n, &il, &hk, &seq);
        if (s == EKV_OK)
            s = kv->dev->write(kv->dev->user, il, hk, h->len, idx ? idx : seq, n, is_v ? NULL : src, is_v ? src : NULL);
        free(seq);
        return s;
    }
    if (is_v) return ekv_store_write(&kv->fv, &h->vs, h->len, idx, n, src);
    return ekv_store_write(&kv->fk, &h->ks, h->len, idx, n, src);
}

enum ekv_status ekv_kv_head_get(const struct ekv_kv *kv, const struct ekv_kv_head *h, int32_t j, float *k,
                                float *v) {
    enum ekv_status s = check_entry(kv, h, j, "ekv_kv_head_get");
    if (s != EKV_OK) return s;
    return rows_read(kv, h, &j, 1, k, v);
}

enum ekv_status ekv_kv_head_gather(const struct ekv_kv *kv, const struct ekv_kv_head *h, const int32_t *idx,
                                   int32_t n, float *k, float *v) {
    if (!kv || !h || n < 0) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_gather: bad arguments (n = %d)", (int)n);
    for (int32_t t = 0; t < n; t++) {
        enum ekv_status s = check_entry(kv, h, idx ? idx[t] : t, "ekv_kv_head_gather");
        if (s != EKV_OK) return s;
    }
    return n > 0 && (k || v) ? rows_read(kv, h, idx, n, k, v) : EKV_OK;
}

enum ekv_status ekv_kv_head_scatter(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *idx, int32_t n,
                                    const float *k, const float *v) {
    if (!kv || !h || n < 0) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_scatter: bad arguments (n = %d)", (int)n);
    if (n == 0 || (!k && !v)) return EKV_OK;
    uint8_t *seen = calloc((size_t)h->len ? (size_t)h->len : 1, 1);
    if (!seen) return ekv_err(EKV_ERR_NOMEM, "ekv_kv_head_scatter: out of memory for %d entries", (int)h->len);
    enum ekv_status s = EKV_OK;
    for (int32_t t = 0; t < n && s == EKV_OK; t++) {
        const int32_t j = idx ? idx[t] : t;
        s = check_entry(kv, h, j, "ekv_kv_head_scatter");
        if (s == EKV_OK && seen[j]++)
            s = ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_scatter: entry %d is written twice", (int)j);
    }
    free(seen);
    if (s != EKV_OK) return s;
    if (k) s = rows_write(kv, h, false, idx, n, k);
    if (v && s == EKV_OK) s = rows_write(kv, h, true, idx, n, v);
    return s;
}

enum ekv_status ekv_kv_head_set(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t j, const float *k,
                                const float *v) {
    enum ekv_status s = check_entry(kv, h, j, "ekv_kv_head_set");
    if (s != EKV_OK) return s;
    if (k) s = rows_write(kv, h, false, &j, 1, k);
    if (v && s == EKV_OK) s = rows_write(kv, h, true, &j, 1, v);
    return s;
}

/* ---- merging ---- */

/* Validates into[] and numbers the survivors that receive members:
 * slot[t] = 0.. for those, -1 otherwise. Returns the count, or -1 when an
 * entry joins an entry that does not survive. */
static int32_t merge_slots(const int32_t *into, int32_t len, int32_t *slot, int32_t *bad) {
    for (int32_t j = 0; j < len; j++) {
        const int32_t t = into[j];
        if (t == -1 || t == j) continue;
        if (t < 0 || t >= len || into[t] != t) {
            *bad = j;
            return -1;
        }
    }
    int32_t n = 0;
    for (int32_t j = 0; j < len; j++) slot[j] = -1;
    for (int32_t j = 0; j < len; j++) {
        const int32_t t = into[j];
        if (t >= 0 && t != j && slot[t] < 0) slot[t] = n++;
    }
    return n;
}

/* Weighted sums of one side (K or V) of every receiving survivor and its
 * members into acc [n_targets][d] (zeroed by the caller), survivors first
 * then members in index order. row: scratch [d]. */
static enum ekv_status merge_accumulate(const struct ekv_kv *kv, const struct ekv_kv_head *h, bool is_v,
                                        const int32_t *into, const int32_t *slot, double *acc, float *row) {
    const size_t d = (size_t)kv->head_dim;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t j = 0; j < h->len; j++) {
            const int32_t t = into[j];
            if (t < 0 || (pass == 0) != (t == j) || slot[t] < 0) continue;
            double *a = acc + (size_t)slot[t] * d;
            const double w = h->weight[j];
            enum ekv_status s = rows_read(kv, h, &j, 1, is_v ? NULL : row, is_v ? row : NULL);
            if (s != EKV_OK) return s;
            for (size_t c = 0; c < d; c++) a[c] += w * row[c];
        }
    }
    return EKV_OK;
}

/* ekv_kv_head_merge_set, and with wm (a device only) ekv_kv_head_merge_dev. */
static enum ekv_status merge_impl(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into, const float *k_set,
                                  const float *v_set, const float *wm, unsigned flags) {
    if (!kv || !h || (!into && h->len > 0)) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_merge: NULL argument");
    const int32_t len = h->len;
    const size_t d = (size_t)kv->head_dim;
    const size_t nl = (size_t)(len ? len : 1);
    int32_t *slot = malloc(nl * sizeof *slot);
    uint8_t *keep = malloc(nl);
    if (!slot || !keep) {
        free(slot);
        free(keep);
        return ekv_err(EKV_ERR_NOMEM, "ekv_kv_head_merge: out of memory for %d entries", (int)len);
    }
    int32_t bad = -1;
    const int32_t n_targets = merge_slots(into, len, slot, &bad);
    if (n_targets < 0) {
        free(slot);
        free(keep);
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_merge: entry %d joins %d, which is not a surviving entry",
                       (int)bad, (int)into[bad]);
    }
    double *acc = NULL;   /* [n_targets][d]: weighted sums of one side */
    double *wsum = NULL;  /* [n_targets] */
    float *rows = NULL;   /* [2][n_targets][d] new K rows, new V rows, then a scratch row [d] */
    float *w0 = NULL;     /* [len] weights before the merge, for a device that computes the means */
    const bool dev_mean = kv->dev && kv->dev->merge;
    int32_t *tidx = NULL; /* [n_targets] survivor index of each slot */
    const float **row_of = NULL; /* [2][len] new row of each survivor (K, V) or NULL */
    enum ekv_status s = EKV_OK;
    if (n_targets > 0) {
        acc = malloc((size_t)n_targets * d * sizeof *acc);
        wsum = calloc((size_t)n_targets, sizeof *wsum);
        rows = malloc((2 * (size_t)n_targets + 1) * d * sizeof *rows);
        tidx = malloc((size_t)n_targets * sizeof *tidx);
        row_of = calloc(2 * nl, sizeof *row_of);
        if (dev_mean) w0 = malloc(nl * sizeof *w0);
        if (!acc || !wsum || !rows || !tidx || !row_of || (dev_mean && !w0)) {
            s = ekv_err(EKV_ERR_NOMEM, "ekv_kv_head_merge: out of memory for %d merge targets", (int)n_targets);
            goto out;
        }
    }
    double merged = 0.0, dropped = 0.0;
    if (w0) memcpy(w0, wm ? wm : h->weight, (size_t)len * sizeof *w0);
    for (int32_t j = 0; j < len; j++) { /* survivors' own weights first, as in merge_accumulate */
        if (into[j] == j && slot[j] >= 0) {
            wsum[slot[j]] += h->weight[j];
            tidx[slot[j]] = j;
        }
    }
    for (int32_t j = 0; j < len; j++) {
        const int32_t t = into[j];
        if (t < 0) {
            dropped += h->weight[j];
            continue;
        }
        if (t == j || slot[t] < 0) continue;
        wsum[slot[t]] += h->weight[j];
        merged += h->weight[j];
        if (kv->merge.on && !kv->merge.stats) continue; /* +merge:merge_stats=0: the survivor keeps its own */
        if (h->colsum) h->colsum[t] += h->colsum[j];
        if (h->count) h->count[t] += h->count[j];
        if (h->sumsq) h->sumsq[t] += h->sumsq[j];
        if (h->lastrow) h->lastrow[t] += h->lastrow[j];
        if (h->winsum) h->winsum[t] += h->winsum[j];
        if (h->bincount) h->bincount[t] += h->bincount[j];
    }
    /* new K rows, then new V rows, of every receiving survivor; the
     * compaction writes them (members are read before anything changes) */
    for (int side = 0; side < 2 && n_targets > 0; side++) {
        const bool is_v = side == 1;
        const float *given = is_v ? v_set : k_set;
        float *out_rows = rows + (size_t)side * (size_t)n_targets * d;
        if (given) {
            for (int32_t a = 0; a < n_targets; a++)
                memcpy(out_rows + (size_t)a * d, given + (size_t)tidx[a] * d, d * sizeof(float));
        } else if (dev_mean) {
            continue; /* the device computes this side's means (kv->dev->merge) */
        } else {
            memset(acc, 0, (size_t)n_targets * d * sizeof *acc);
            s = merge_accumulate(kv, h, is_v, into, slot, acc, rows + 2 * (size_t)n_targets * d);
            if (s != EKV_OK) goto out;
            for (int32_t a = 0; a < n_targets; a++)
                for (size_t c = 0; c < d; c++) out_rows[(size_t)a * d + c] = (float)(acc[(size_t)a * d + c] / wsum[a]);
        }
        for (int32_t a = 0; a < n_targets; a++) row_of[(size_t)side * nl + (size_t)tidx[a]] = out_rows + (size_t)a * d;
    }
    for (int32_t j = 0; j < len; j++) {
        keep[j] = (into[j] == j);
        if (keep[j] && slot[j] >= 0) h->weight[j] = (float)wsum[slot[j]];
    }
    if (dev_mean) /* rows given by the caller only; the device averages the other sides */
        s = head_compact(kv, h, keep, row_of && k_set ? row_of : NULL, row_of && v_set ? row_of + nl : NULL,
                         n_targets > 0 ? into : NULL, w0, flags);
    else
        s = head_compact(kv, h, keep, row_of, row_of ? row_of + nl : NULL, NULL, NULL, 0);
    h->n_merged += (int64_t)llround(merged);
    h->n_evicted += (int64_t)llround(dropped);
    head_maybe_shrink(kv, h);
out:
    free(slot);
    free(keep);
    free(acc);
    free(wsum);
    free(rows);
    free(tidx);
    free(row_of);
    free(w0);
    return s;
}

enum ekv_status ekv_kv_head_merge_set(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into,
                                      const float *k_set, const float *v_set) {
    return merge_impl(kv, h, into, k_set, v_set, NULL, 0);
}

enum ekv_status ekv_kv_head_merge_dev(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into, const float *wm,
                                      unsigned flags) {
    if (!kv || !kv->dev || !kv->dev->merge || !wm)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_merge_dev: a cache on a device that merges, and weights");
    return merge_impl(kv, h, into, NULL, NULL, wm, flags);
}

enum ekv_status ekv_kv_head_merge(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into) {
    return ekv_kv_head_merge_set(kv, h, into, NULL, NULL);
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

enum ekv_status ekv_kv_flush(struct ekv_kv *kv, int il) {
    if (!kv || il < 0 || il >= kv->n_layer) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_flush: layer %d out of range", il);
    if (!ekv_kv_type_is_kivi(kv->fk.type) && !ekv_kv_type_is_kivi(kv->fv.type)) return EKV_OK;
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        if (kv->dev) { /* rows on a device: it quantises, the stores count */
            const uint64_t before = head_alloc(kv, h);
            enum ekv_status s = kv->dev->flush ? kv->dev->flush(kv->dev->user, il, hk, h->len)
                                               : ekv_err(EKV_ERR_INTERNAL, "a device cache without KIVI's residual rule");
            account_head(kv, h, before);
            if (s != EKV_OK) return ekv_err_prefix(s, "kv layer %d head %d", il, hk);
            continue;
        }
        const uint64_t before = head_alloc(kv, h);
        enum ekv_status s = ekv_store_flush(&kv->fk, &h->ks, h->len);
        if (s == EKV_OK) s = ekv_store_flush(&kv->fv, &h->vs, h->len);
        if (s == EKV_OK) {
            ekv_store_shrink(&kv->fk, &h->ks, h->len);
            ekv_store_shrink(&kv->fv, &h->vs, h->len);
        }
        account_head(kv, h, before);
        if (s != EKV_OK) return ekv_err_prefix(s, "kv layer %d head %d", il, hk);
    }
    return EKV_OK;
}

uint64_t ekv_kv_bytes(const struct ekv_kv *kv) {
    uint64_t b = 0;
    for (int il = 0; il < kv->n_layer; il++)
        for (int hk = 0; hk < kv->n_head_kv; hk++) {
            const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            /* rows on a device: len rows of a row type (its store is empty); a KIVI store counts its entries */
            b += kv->dev && !ekv_kv_type_is_kivi(kv->fk.type) ? ekv_store_full_bytes(&kv->fk, h->len)
                                                              : ekv_store_used_bytes(&kv->fk, &h->ks, h->len);
            b += kv->dev && !ekv_kv_type_is_kivi(kv->fv.type) ? ekv_store_full_bytes(&kv->fv, h->len)
                                                              : ekv_store_used_bytes(&kv->fv, &h->vs, h->len);
        }
    return b;
}

uint64_t ekv_kv_bytes_full(const struct ekv_kv *kv, int64_t n) {
    const uint64_t per = ekv_store_full_bytes(&kv->fk, n) + ekv_store_full_bytes(&kv->fv, n);
    return per * (uint64_t)kv->n_layer * (uint64_t)kv->n_head_kv;
}

int32_t ekv_kv_prompt_chunk(const struct ekv_kv *kv) {
    return kv && kv->params.chunk > 0 ? kv->params.chunk : 0;
}

int64_t ekv_kv_rope_pos(const struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!kv || !step) return 0;
    if (kv->ops && kv->ops->rope_pos) return kv->ops->rope_pos(kv, step);
    return step->pos0;
}
