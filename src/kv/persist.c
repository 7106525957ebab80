/*
 * persist.c — a KV cache as bytes and back (kv.h "saved caches", issue 22):
 * what a loaded cache needs to go on exactly as if it had never stopped —
 * the policy spec and resolved parameters, tokens seen, the statistics
 * flags and window, every (layer, KV head)'s entries (positions, tags,
 * merge weights, statistics, counters, K and V in their storage types, bit
 * for bit) and the policy's own state. The file around it (header, model
 * fingerprint, sections, checksums) is src/engine/seqfile.c's.
 *
 * Loading trusts nothing: every count is checked against the shape, the
 * tokens seen and the bytes that remain before anything is allocated, so a
 * hostile file costs at most a small multiple of its own size.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"

#define ARRAY_STATS \
    (EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_WINSUM | EKV_STAT_BINCOUNT)
#define ALL_STATS (ARRAY_STATS | EKV_STAT_SPARSITY)

static unsigned head_flags(const struct ekv_kv_head *h) {
    unsigned f = 0;
    if (h->colsum && h->count) f |= EKV_STAT_COLSUM;
    if (h->sumsq) f |= EKV_STAT_SUMSQ;
    if (h->lastrow) f |= EKV_STAT_LASTROW;
    if (h->winsum) f |= EKV_STAT_WINSUM;
    if (h->bincount) f |= EKV_STAT_BINCOUNT;
    return f;
}

/* Positions, tags and weights, compactly: positions as increasing gaps
 * (LEB128), tags as runs, weights as a flag (0: all 1, as unmerged entries
 * have) or the floats. */
static void save_meta(const struct ekv_kv_head *h, struct ekv_wbuf *w) {
    int32_t prev = -1;
    for (int32_t j = 0; j < h->len; j++) {
        ekv_wbuf_varint(w, (uint64_t)(h->pos[j] - prev));
        prev = h->pos[j];
    }
    for (int32_t j = 0; j < h->len;) {
        int32_t k = j + 1;
        while (k < h->len && h->tag[k] == h->tag[j]) k++;
        ekv_wbuf_u8(w, h->tag[j]);
        ekv_wbuf_varint(w, (uint64_t)(k - j));
        j = k;
    }
    bool ones = true;
    for (int32_t j = 0; j < h->len && ones; j++) ones = h->weight[j] == 1.0f;
    ekv_wbuf_u8(w, ones ? 0 : 1);
    if (!ones) ekv_wbuf_f32s(w, h->weight, (size_t)h->len);
    /* M-RoPE: each entry's three RoPE positions, as zigzag offsets from
     * its position (0 for text) */
    if (h->mpos)
        for (int32_t j = 0; j < 3 * h->len; j++) {
            const int64_t d = (int64_t)h->mpos[j] - h->pos[j / 3];
            ekv_wbuf_varint(w, d >= 0 ? (uint64_t)d << 1 : (((uint64_t)(-d)) << 1) - 1);
        }
}

/* What save_meta wrote, into the head's arrays (len entries allocated);
 * positions come out strictly increasing and below n_seen, tags known. */
static enum ekv_status load_meta(const struct ekv_kv *kv, struct ekv_kv_head *h, int32_t len, struct ekv_rbuf *r) {
    int64_t p = -1;
    for (int32_t j = 0; j < len; j++) {
        const uint64_t gap = ekv_rbuf_varint(r);
        if (r->bad) return ekv_err(EKV_ERR_FORMAT, "positions truncated");
        if (gap == 0 || gap > (uint64_t)(kv->n_seen - 1 - p))
            return ekv_err(EKV_ERR_FORMAT, "entry %d: position gap %llu out of order or past %lld tokens seen", (int)j,
                           (unsigned long long)gap, (long long)kv->n_seen);
        p += (int64_t)gap;
        h->pos[j] = (int32_t)p;
    }
    for (int32_t j = 0; j < len;) {
        const uint8_t t = ekv_rbuf_u8(r);
        const uint64_t run = ekv_rbuf_varint(r);
        if (r->bad) return ekv_err(EKV_ERR_FORMAT, "tags truncated");
        if (t > EKV_TAG_GENERATED) return ekv_err(EKV_ERR_FORMAT, "entry %d: tag %d", (int)j, t);
        if (run == 0 || run > (uint64_t)(len - j))
            return ekv_err(EKV_ERR_FORMAT, "a run of %llu tags at entry %d of %d", (unsigned long long)run, (int)j,
                           (int)len);
        memset(h->tag + j, t, (size_t)run);
        j += (int32_t)run;
    }
    const uint8_t raw = ekv_rbuf_u8(r);
    if (raw > 1) return ekv_err(EKV_ERR_FORMAT, "weight flag %d", raw);
    if (raw) {
        if (!ekv_rbuf_has_n(r, (size_t)len, 4)) return ekv_err(EKV_ERR_FORMAT, "weights truncated");
        ekv_rbuf_f32s(r, h->weight, (size_t)len);
    } else {
        for (int32_t j = 0; j < len; j++) h->weight[j] = 1.0f;
    }
    if (h->mpos)
        for (int32_t j = 0; j < 3 * len; j++) {
            const uint64_t z = ekv_rbuf_varint(r);
            const int64_t d = (z & 1) ? -(int64_t)((z + 1) >> 1) : (int64_t)(z >> 1);
            const int64_t q = (int64_t)h->pos[j / 3] + d;
            if (r->bad || z > (1ull << 40) || q < 0 || q > INT32_MAX)
                return ekv_err(EKV_ERR_FORMAT, "entry %d: M-RoPE position out of range or truncated", (int)(j / 3));
            h->mpos[j] = (int32_t)q;
        }
    return r->bad ? ekv_err(EKV_ERR_FORMAT, "truncated") : EKV_OK;
}

enum ekv_status ekv_kv_save_head(const struct ekv_kv *kv, struct ekv_wbuf *w) {
    if (kv->dev) return ekv_err(EKV_ERR_UNSUPPORTED, "saving a cache whose rows a GPU holds is not supported yet");
    if (kv->pstate && (!kv->ops->state_save || !kv->ops->state_load))
        return ekv_err(EKV_ERR_UNSUPPORTED, "kv policy %s: its state cannot be saved", kv->ops->name);
    const struct ekv_kv_params *p = &kv->params;
    const size_t sl = strlen(kv->spec);
    ekv_wbuf_u32(w, (uint32_t)sl);
    ekv_wbuf_put(w, kv->spec, sl);
    ekv_wbuf_f64(w, p->budget);
    const int32_t ints[] = {p->max_tokens, p->sinks, p->window, p->obs_window, p->pool, (int32_t)p->pool_kind,
                            p->distance, p->chunk, p->recompress, (int32_t)p->type_k, (int32_t)p->type_v,
                            p->kv_group, p->kv_residual, p->compat_ref ? 1 : 0};
    ekv_wbuf_i32s(w, ints, EKV_ARRAY_LEN(ints));
    ekv_wbuf_f64(w, p->beta);
    ekv_wbuf_f64(w, p->sparsity_p);
    ekv_wbuf_f64(w, p->recent_ratio);
    ekv_wbuf_u64(w, p->seed);
    ekv_wbuf_u64(w, (uint64_t)kv->n_seen);
    ekv_wbuf_u32(w, kv->stats);
    ekv_wbuf_u32(w, kv->extra_stats);
    ekv_wbuf_u64(w, (uint64_t)kv->win_start);
    ekv_wbuf_u64(w, kv->peak_bytes_alloc);
    struct ekv_wbuf st = {0};
    if (kv->pstate) kv->ops->state_save(kv, &st);
    if (st.oom) {
        ekv_wbuf_free(&st);
        return ekv_err(EKV_ERR_NOMEM, "kv policy %s: out of memory saving its state", kv->ops->name);
    }
    ekv_wbuf_u64(w, (uint64_t)st.n);
    ekv_wbuf_put(w, st.p, st.n);
    ekv_wbuf_free(&st);
    return w->oom ? ekv_err(EKV_ERR_NOMEM, "out of memory saving the cache") : EKV_OK;
}

enum ekv_status ekv_kv_save_layer(const struct ekv_kv *kv, int il, struct ekv_wbuf *w) {
    const struct ekv_kv_layer *ly = &kv->layers[il];
    ekv_wbuf_f64(w, ly->sparse_zero);
    ekv_wbuf_f64(w, ly->sparse_total);
    ekv_wbuf_u32(w, (uint32_t)ly->budget);
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        const struct ekv_kv_head *h = &ly->heads[hk];
        const size_t n = (size_t)h->len;
        const unsigned f = head_flags(h);
        ekv_wbuf_u32(w, (uint32_t)h->len);
        ekv_wbuf_u64(w, (uint64_t)h->n_evicted);
        ekv_wbuf_u64(w, (uint64_t)h->n_merged);
        ekv_wbuf_u32(w, f);
        save_meta(h, w);
        if (f & EKV_STAT_COLSUM) {
            ekv_wbuf_f64s(w, h->colsum, n);
            ekv_wbuf_i32s(w, h->count, n);
        }
        if (f & EKV_STAT_SUMSQ) ekv_wbuf_f64s(w, h->sumsq, n);
        if (f & EKV_STAT_LASTROW) ekv_wbuf_f32s(w, h->lastrow, n);
        if (f & EKV_STAT_WINSUM) ekv_wbuf_f64s(w, h->winsum, n);
        if (f & EKV_STAT_BINCOUNT) ekv_wbuf_f32s(w, h->bincount, n);
        ekv_store_save(&kv->fk, &h->ks, h->len, w);
        ekv_store_save(&kv->fv, &h->vs, h->len, w);
    }
    return w->oom ? ekv_err(EKV_ERR_NOMEM, "out of memory saving layer %d of the cache", il) : EKV_OK;
}

/* The parameters as saved; spec[cap] gets the policy spec. */
static enum ekv_status read_params(struct ekv_rbuf *r, struct ekv_kv_params *p, char *spec, size_t cap) {
    const uint32_t sl = ekv_rbuf_u32(r);
    if (r->bad || sl >= cap || !ekv_rbuf_has(r, sl)) return ekv_err(EKV_ERR_FORMAT, "policy spec truncated or too long");
    ekv_rbuf_get(r, spec, sl);
    spec[sl] = 0;
    if (memchr(spec, 0, sl)) return ekv_err(EKV_ERR_FORMAT, "policy spec holds a NUL byte");
    *p = ekv_kv_default_params();
    p->policy = spec;
    p->budget = ekv_rbuf_f64(r);
    int32_t v[14];
    ekv_rbuf_i32s(r, v, EKV_ARRAY_LEN(v));
    p->max_tokens = v[0], p->sinks = v[1], p->window = v[2], p->obs_window = v[3], p->pool = v[4];
    p->pool_kind = (enum ekv_pool_kind)v[5], p->distance = v[6], p->chunk = v[7], p->recompress = v[8];
    p->type_k = (enum ekv_kv_type)v[9], p->type_v = (enum ekv_kv_type)v[10], p->kv_group = v[11];
    p->kv_residual = v[12];
    if (v[13] != 0 && v[13] != 1) return ekv_err(EKV_ERR_FORMAT, "compat flag %d is not 0 or 1", (int)v[13]);
    p->compat_ref = v[13] == 1;
    p->beta = ekv_rbuf_f64(r);
    p->sparsity_p = ekv_rbuf_f64(r);
    p->recent_ratio = ekv_rbuf_f64(r);
    p->seed = ekv_rbuf_u64(r);
    return r->bad ? ekv_err(EKV_ERR_FORMAT, "parameters truncated") : EKV_OK;
}

enum ekv_status ekv_kv_load_head(int32_t n_layer, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                 struct ekv_rbuf *r, struct ekv_kv **out) {
    *out = NULL;
    char spec[sizeof(((struct ekv_kv *)0)->spec)];
    struct ekv_kv_params p;
    enum ekv_status s = read_params(r, &p, spec, sizeof spec);
    if (s != EKV_OK) return s;
    struct ekv_kv *kv = NULL;
    s = ekv_kv_new(n_layer, n_head, n_head_kv, head_dim, &p, &kv);
    if (s != EKV_OK) return ekv_err_prefix(s == EKV_ERR_NOMEM ? s : EKV_ERR_FORMAT, "saved policy '%s'", spec);
    const int64_t n_seen = ekv_rbuf_i64(r);
    const uint32_t stats = ekv_rbuf_u32(r), extra = ekv_rbuf_u32(r);
    const int64_t win_start = ekv_rbuf_i64(r);
    const uint64_t peak = ekv_rbuf_u64(r);
    const uint64_t st_len = ekv_rbuf_u64(r);
    if (r->bad || !ekv_rbuf_has(r, (size_t)st_len) || st_len > SIZE_MAX) s = ekv_err(EKV_ERR_FORMAT, "truncated");
    else if (n_seen < 0 || n_seen > INT32_MAX) s = ekv_err(EKV_ERR_FORMAT, "%lld tokens seen", (long long)n_seen);
    else if ((stats | extra) & ~ALL_STATS) s = ekv_err(EKV_ERR_FORMAT, "unknown statistics flags 0x%x", stats | extra);
    else if (st_len && !kv->ops->state_load)
        s = ekv_err(EKV_ERR_FORMAT, "policy %s has no state, the file holds %llu bytes of one", kv->ops->name,
                    (unsigned long long)st_len);
    if (s == EKV_OK && kv->pstate) {
        if (!kv->ops->state_load) {
            s = ekv_err(EKV_ERR_UNSUPPORTED, "kv policy %s: its state cannot be loaded", kv->ops->name);
        } else {
            struct ekv_rbuf sr = {.p = r->p + r->at, .n = (size_t)st_len};
            s = kv->ops->state_load(kv, &sr);
            if (s == EKV_OK && sr.at != sr.n)
                s = ekv_err(EKV_ERR_FORMAT, "policy %s: %zu bytes of its state left over", kv->ops->name, sr.n - sr.at);
        }
    }
    if (s != EKV_OK) {
        ekv_kv_free(kv);
        return s;
    }
    r->at += (size_t)st_len;
    kv->n_seen = n_seen;
    kv->stats = stats;
    kv->extra_stats = extra;
    kv->win_start = win_start;
    kv->peak_bytes_alloc = peak;
    *out = kv;
    return EKV_OK;
}

/* Checks a loaded head's per-entry arrays. */
static enum ekv_status check_head(const struct ekv_kv *kv, const struct ekv_kv_head *h, unsigned f) {
    for (int32_t j = 0; j < h->len; j++) {
        if (!(isfinite(h->weight[j]) && h->weight[j] > 0.0f))
            return ekv_err(EKV_ERR_FORMAT, "entry %d: merge weight %g", (int)j, (double)h->weight[j]);
        bool ok = true;
        if (f & EKV_STAT_COLSUM) ok = ok && isfinite(h->colsum[j]) && h->count[j] >= 0;
        if (f & EKV_STAT_SUMSQ) ok = ok && isfinite(h->sumsq[j]);
        if (f & EKV_STAT_LASTROW) ok = ok && isfinite(h->lastrow[j]);
        if (f & EKV_STAT_WINSUM) ok = ok && isfinite(h->winsum[j]);
        if (f & EKV_STAT_BINCOUNT) ok = ok && isfinite(h->bincount[j]);
        if (!ok) return ekv_err(EKV_ERR_FORMAT, "entry %d: statistics not finite", (int)j);
    }
    return EKV_OK;
}

static enum ekv_status load_head(struct ekv_kv *kv, struct ekv_kv_head *h, struct ekv_rbuf *r) {
    const int32_t len = ekv_rbuf_i32(r);
    h->n_evicted = ekv_rbuf_i64(r);
    h->n_merged = ekv_rbuf_i64(r);
    const uint32_t f = ekv_rbuf_u32(r);
    if (r->bad) return ekv_err(EKV_ERR_FORMAT, "truncated");
    if (len < 0 || len > kv->n_seen)
        return ekv_err(EKV_ERR_FORMAT, "%d entries of %lld tokens seen", (int)len, (long long)kv->n_seen);
    if (h->n_evicted < 0 || h->n_merged < 0) return ekv_err(EKV_ERR_FORMAT, "negative eviction counters");
    if (f & ~ARRAY_STATS) return ekv_err(EKV_ERR_FORMAT, "unknown statistics arrays 0x%x", f);
    /* each entry takes at least its position's gap and a row of codes per
     * side in the file: nothing is allocated for entries it cannot hold,
     * so memory stays within a small multiple of the file's size */
    if (!ekv_rbuf_has_n(r, (size_t)len, 1 + kv->fk.row_bytes + kv->fv.row_bytes))
        return ekv_err(EKV_ERR_FORMAT, "%d entries truncated", (int)len);
    enum ekv_status s = ekv_kv_head_alloc(kv, h, len, f);
    if (s == EKV_OK) s = load_meta(kv, h, len, r);
    if (s != EKV_OK) return s;
    const size_t n = (size_t)len;
    if (f & EKV_STAT_COLSUM) {
        ekv_rbuf_f64s(r, h->colsum, n);
        ekv_rbuf_i32s(r, h->count, n);
    }
    if (f & EKV_STAT_SUMSQ) ekv_rbuf_f64s(r, h->sumsq, n);
    if (f & EKV_STAT_LASTROW) ekv_rbuf_f32s(r, h->lastrow, n);
    if (f & EKV_STAT_WINSUM) ekv_rbuf_f64s(r, h->winsum, n);
    if (f & EKV_STAT_BINCOUNT) ekv_rbuf_f32s(r, h->bincount, n);
    if (r->bad) return ekv_err(EKV_ERR_FORMAT, "%d entries truncated", (int)len);
    h->len = len;
    s = check_head(kv, h, f);
    if (s == EKV_OK) s = ekv_store_load(&kv->fk, &h->ks, len, r);
    if (s == EKV_OK) s = ekv_store_load(&kv->fv, &h->vs, len, r);
    return s;
}

enum ekv_status ekv_kv_load_layer(struct ekv_kv *kv, int il, struct ekv_rbuf *r) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    ly->sparse_zero = ekv_rbuf_f64(r);
    ly->sparse_total = ekv_rbuf_f64(r);
    ly->budget = ekv_rbuf_i32(r);
    if (r->bad) return ekv_err(EKV_ERR_FORMAT, "layer %d: truncated", il);
    if (!(isfinite(ly->sparse_zero) && isfinite(ly->sparse_total) && ly->sparse_zero >= 0 &&
          ly->sparse_total >= ly->sparse_zero))
        return ekv_err(EKV_ERR_FORMAT, "layer %d: sparsity counts %g of %g", il, ly->sparse_zero, ly->sparse_total);
    if (ly->budget < -1) return ekv_err(EKV_ERR_FORMAT, "layer %d: budget %d", il, (int)ly->budget);
    for (int hk = 0; hk < kv->n_head_kv; hk++) {
        enum ekv_status s = load_head(kv, &ly->heads[hk], r);
        if (s != EKV_OK) return ekv_err_prefix(s, "layer %d head %d", il, hk);
    }
    ekv_kv_recount(kv);
    return EKV_OK;
}
