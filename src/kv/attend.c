/*
 * attend.c — one forward through the KV cache (kv.h): appends the new keys
 * and values of a layer, runs causal attention of the new queries over each
 * KV head's kept entries while collecting the statistics the policy asked
 * for, then hands the layer to the policy (which may compact it at once:
 * the layer-by-layer prefill compression of docs/policies.md "When a policy acts").
 *
 * With kv->logit_bias (elastic-v2:bias=1) each head's key view carries
 * log(weight) of its entries as a logit bias (attention.h), so prefill,
 * chunked prefill, decode and batched decode all attend a merged entry as
 * the tokens it stands for.
 *
 * Work is split over KV heads on the thread pool (over all sequences' (cache,
 * KV head) pairs in one job for batched decode); a head's statistics are
 * written only by the thread that owns the head, and the per-layer sparsity
 * counts are summed per head and added after the run, so results do not
 * depend on the number of threads.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"
#include "kv/kv.h"
#include "kv/policies_adv.h"

enum ekv_status ekv_kv_begin(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!kv || !step) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_begin: NULL argument");
    if (step->n_new < 0 || step->pos0 < 0 || step->pos0 + step->n_new > INT32_MAX)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv step: positions %lld + %d out of range",
                       (long long)step->pos0, (int)step->n_new);
    if (step->is_prompt && (step->prompt_len < 0 || step->prompt_pos0 < 0))
        return ekv_err(EKV_ERR_INVALID_ARG, "kv step: prompt length %d at %lld is invalid",
                       (int)step->prompt_len, (long long)step->prompt_pos0);
    kv->n_seen = step->pos0 + step->n_new;
    kv->in_prompt = step->is_prompt;
    kv->stats = kv->ops ? kv->ops->stats : 0;
    if (kv->ops && kv->ops->begin) {
        enum ekv_status s = kv->ops->begin(kv, step);
        if (s != EKV_OK) return ekv_err_prefix(s, "kv policy %s", kv->policy_name);
    }
    kv->stats |= kv->extra_stats; /* begin() sets kv->stats afresh each forward */
    enum ekv_status s = ekv_kv_ensure_stats(kv);
    for (int32_t i = 0; s == EKV_OK && i < kv->n_shadows; i++) s = ekv_kv_begin(kv->shadows[i], step);
    return s;
}

bool ekv_kv_stats_read_after(const struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!kv->ops || !kv->ops->prompt_only || step->is_prompt || kv->layer_hook) return true;
    return ekv_recompress_due(kv, step);
}

enum ekv_status ekv_kv_end(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!kv || !step) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_end: NULL argument");
    if (kv->ops && kv->ops->end) {
        enum ekv_status s = kv->ops->end(kv, step);
        if (s != EKV_OK) return ekv_err_prefix(s, "kv policy %s", kv->policy_name);
    }
    for (int32_t i = 0; i < kv->n_shadows; i++) {
        enum ekv_status s = ekv_kv_end(kv->shadows[i], step);
        if (s != EKV_OK) return s;
    }
    return EKV_OK;
}

struct attend_task {
    struct ekv_kv *kv;
    struct ekv_pool *pool;
    int il;
    const struct ekv_kv_step *step;
    const float *q;     /* [n_new][n_head][head_dim] */
    float *out;         /* [n_new][n_head][head_dim] */
    float scale;
    float sparsity_p;
    unsigned row_flags; /* statistics of every row */
    unsigned win_flags; /* statistics of rows at positions >= win_start */
    double *sparse;     /* [n_head_kv][2] zero / total counts, or NULL */
    atomic_int failed;
    struct attend_task *sh; /* [n_sh] the shadow caches' tasks (kv->shadows), or NULL */
    int32_t n_sh;
};

int32_t ekv_kv_head_first_at(const struct ekv_kv_head *h, int32_t n, int64_t min_pos) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (h->pos[mid] < min_pos) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Statistics of a row that sees entries [lo, n) only: the per-entry arrays
 * start at lo; the latest row's attention of the entries before is 0. */
static void shift_stats(struct ekv_attn_stats *s, const struct ekv_kv_head *h, int32_t lo) {
    if (s->colsum) s->colsum += lo;
    if (s->count) s->count += lo;
    if (s->sumsq) s->sumsq += lo;
    if (s->winsum) s->winsum += lo;
    if (s->bincount) s->bincount += lo;
    if (s->lastrow) {
        if (s->flags & EKV_STAT_LASTROW) memset(h->lastrow, 0, (size_t)lo * sizeof *h->lastrow);
        s->lastrow += lo;
    }
}

/* kv->logit_bias: bias[j] = log(weight[j]) for the head's len entries;
 * NULL when no entry stands for more than one token (every bias would be
 * 0), so an unmerged head attends exactly as without the option. */
static const float *weight_bias(const struct ekv_kv_head *h, float *bias) {
    bool any = false;
    for (int32_t j = 0; j < h->len; j++) {
        bias[j] = h->weight[j] != 1.0f ? logf(h->weight[j]) : 0.0f;
        any |= bias[j] != 0.0f;
    }
    return any ? bias : NULL;
}

/* The statistics arrays of head h as attention writes them (flags unset),
 * with the sparsity counts going to *zero / *total. */
static struct ekv_attn_stats head_stats(struct ekv_kv_head *h, double *zero, double *total, float sparsity_p) {
    return (struct ekv_attn_stats){
        .colsum = h->colsum,
        .count = h->count,
        .sumsq = h->sumsq,
        .lastrow = h->lastrow,
        .winsum = h->winsum,
        .bincount = h->bincount,
        .sparse_zero = zero,
        .sparse_total = total,
        .sparsity_p = sparsity_p,
    };
}

/* Shadow task s's statistics of one row of head hk at position pos, which
 * sees entries [lo, n_keys), from the probabilities [R][n_keys - lo] the
 * lead cache's attention has just computed: what the shadow's own
 * attention would have added. */
static void shadow_row(struct attend_task *s, int hk, int64_t pos, int32_t lo, int R, int32_t n_keys,
                       const float *probs) {
    const struct ekv_kv *kv = s->kv;
    struct ekv_kv_head *h = &kv->layers[s->il].heads[hk];
    const unsigned flags = s->row_flags | (pos >= kv->win_start ? s->win_flags : 0u);
    if (!flags) return;
    struct ekv_attn_stats st =
        head_stats(h, s->sparse ? &s->sparse[2 * hk] : NULL, s->sparse ? &s->sparse[2 * hk + 1] : NULL, s->sparsity_p);
    st.flags = flags;
    if (lo > 0) shift_stats(&st, h, lo);
    ekv_attn_row_stats(kv->head_dim, probs, R, n_keys - lo, &st);
}

/* A prompt's rows read the same stored rows again and again (row i reads
 * all rows before it): for a forward of at least WIDEN_ROWS rows a head
 * whose keys or values are not f32 is decoded to f32 once, and every row
 * reads the f32 copy. Decoding is exact and the kernels compute each score
 * and output from the decoded floats either way, in the same order, so the
 * bits do not change (prefill == decode, test_batch_invariance). Floats of
 * scratch it needs for head h (0: rows read as stored). */
#define WIDEN_ROWS 8
#define WIDEN_MAX_BYTES ((size_t)16 << 20) /* per thread: 16K entries of head_dim 128 */
static size_t widen_floats(const struct attend_task *t, const struct ekv_kv_head *h) {
    const struct ekv_kv *kv = t->kv;
    if (t->step->n_new < WIDEN_ROWS || kv->dev || (kv->fk.type == EKV_KV_F32 && kv->fv.type == EKV_KV_F32))
        return 0;
    const size_t n = 2 * (size_t)h->len * (size_t)kv->head_dim;
    return n * sizeof(float) <= WIDEN_MAX_BYTES ? n : 0;
}

/* *v (first 0) decoded into dst [v->n][d] and replaced by an f32 view of
 * it (its logit bias kept). */
static void widen(struct ekv_kv_view *v, float *dst) {
    struct ekv_kv_cursor cur = {0, 0, 0};
    const size_t d = (size_t)v->d;
    for (int32_t j0 = 0; j0 < v->n; j0 += EKV_ATTN_ROWS) {
        const int32_t j1 = EKV_MIN(v->n, j0 + EKV_ATTN_ROWS);
        float *to = dst + (size_t)j0 * d;
        const float *got = ekv_kv_view_block(v, j0, j1, to, &cur, ekv_kernels_simd());
        if (got != to) memcpy(to, got, (size_t)(j1 - j0) * d * sizeof(float));
    }
    *v = (struct ekv_kv_view){.type = EKV_KV_F32, .d = v->d, .n = v->n, .nq = v->n,
                              .data = (const uint8_t *)(const void *)dst, .row_bytes = d * sizeof(float),
                              .bias = v->bias};
}

/* probs: [R][len] scratch followed by the row buffer [EKV_ATTN_ROWS][head_dim],
 * with kv->logit_bias [len] floats for the entries' logit biases, and
 * widen_floats() floats for the decoded keys and values. */
static void attend_head(struct attend_task *t, int hk, float *probs) {
    const struct ekv_kv *kv = t->kv;
    struct ekv_kv_head *h = &kv->layers[t->il].heads[hk];
    const int R = kv->n_head / kv->n_head_kv;
    const int d = kv->head_dim;
    const int32_t n_new = t->step->n_new;
    const int32_t len0 = h->len - n_new; /* entries before this forward's appends */
    double sparse_zero = 0.0, sparse_total = 0.0;
    struct ekv_attn_stats st = head_stats(h, &sparse_zero, &sparse_total, t->sparsity_p);
    struct ekv_kv_view kview = ekv_store_view(&kv->fk, &h->ks, h->len);
    struct ekv_kv_view vview = ekv_store_view(&kv->fv, &h->vs, h->len);
    const size_t len1 = (size_t)(h->len ? h->len : 1);
    float *rowbuf = probs + (size_t)R * len1;
    if (kv->logit_bias) kview.bias = weight_bias(h, rowbuf + (size_t)EKV_ATTN_ROWS * (size_t)d);
    if (widen_floats(t, h)) {
        float *kf = rowbuf + (size_t)EKV_ATTN_ROWS * (size_t)d + (kv->logit_bias ? len1 : 0);
        widen(&kview, kf);
        widen(&vview, kf + (size_t)h->len * (size_t)d);
    }
    for (int32_t i = 0; i < n_new; i++) {
        const int64_t pos = t->step->pos0 + i;
        st.flags = t->row_flags | (pos >= kv->win_start ? t->win_flags : 0u);
        const size_t qoff = ((size_t)i * (size_t)kv->n_head + (size_t)hk * (size_t)R) * (size_t)d;
        const int32_t n_keys = len0 + i + 1;
        const int32_t lo = kv->swa_window > 0 ? ekv_kv_head_first_at(h, n_keys, pos - kv->swa_window + 1) : 0;
        if (lo == 0) {
            ekv_attn_row_kv(t->q + qoff, R, &kview, &vview, n_keys, t->scale, t->out + qoff, probs, rowbuf,
                            st.flags ? &st : NULL);
        } else { /* the entries before lo are outside the window: they get no attention */
            struct ekv_attn_stats sw = st;
            shift_stats(&sw, h, lo);
            struct ekv_kv_view kw = kview, vw = vview;
            kw.first = lo;
            vw.first = lo;
            ekv_attn_row_kv(t->q + qoff, R, &kw, &vw, n_keys - lo, t->scale, t->out + qoff, probs, rowbuf,
                            st.flags ? &sw : NULL);
        }
        for (int32_t si = 0; si < t->n_sh; si++) shadow_row(&t->sh[si], hk, pos, lo, R, n_keys, probs);
    }
    if (t->sparse) {
        t->sparse[2 * hk] = sparse_zero;
        t->sparse[2 * hk + 1] = sparse_total;
    }
}

/* Attention scratch for thread ith: [R][len] probabilities, then a block
 * of decoded rows [EKV_ATTN_ROWS][head_dim], then (kv->logit_bias) [len]
 * logit biases. */
static float *probs_scratch(struct attend_task *t, int ith, int hk) {
    const struct ekv_kv *kv = t->kv;
    const int R = kv->n_head / kv->n_head_kv;
    const struct ekv_kv_head *h = &kv->layers[t->il].heads[hk];
    const size_t len = (size_t)(h->len ? h->len : 1);
    const size_t n = (size_t)R * len + (size_t)EKV_ATTN_ROWS * (size_t)kv->head_dim + (kv->logit_bias ? len : 0) +
                     widen_floats(t, h);
    return ekv_pool_scratch(t->pool, ith, n * sizeof(float));
}

static void attend_worker(void *ctx, int ith, int nth) {
    struct attend_task *t = ctx;
    for (int hk = ith; hk < t->kv->n_head_kv; hk += nth) {
        float *probs = probs_scratch(t, ith, hk);
        if (!probs) {
            atomic_store(&t->failed, 1);
            return;
        }
        attend_head(t, hk, probs);
    }
}

/* Checks the step, appends the new keys and values, and fills the task of
 * this layer's attention (t->sparse is allocated when VL-Cache counts are
 * due; layer_finish frees it). */
static enum ekv_status layer_prepare(struct ekv_kv *kv, struct ekv_pool *pool, int il, const struct ekv_kv_step *step,
                                     const float *q, const float *k, const float *v, float *out,
                                     struct attend_task *t) {
    if (!kv || !step) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_layer_forward: NULL argument");
    if (il < 0 || il >= kv->n_layer)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv layer %d out of range [0, %d)", il, (int)kv->n_layer);
    const int32_t n_new = step->n_new;
    if (n_new < 0 || step->pos0 < 0 || step->pos0 + n_new > INT32_MAX)
        return ekv_err(EKV_ERR_INVALID_ARG, "kv step: positions %lld + %d out of range",
                       (long long)step->pos0, (int)n_new);
    if (n_new > 0 && (!q || !k || !v || !out))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_layer_forward: NULL q/k/v/out");
    struct ekv_kv_layer *L = &kv->layers[il];
    const int G = kv->n_head_kv;
    const size_t d = (size_t)kv->head_dim;
    *t = (struct attend_task){.kv = kv, .pool = pool, .il = il, .step = step, .q = q, .out = out};
    atomic_init(&t->failed, 0);
    if (n_new == 0) return EKV_OK;

    for (int hk = 0; hk < G; hk++) {
        const struct ekv_kv_head *h = &L->heads[hk];
        if (h->len > 0 && step->pos0 <= h->pos[h->len - 1])
            return ekv_err(EKV_ERR_INVALID_ARG, "kv layer %d head %d: new position %lld is not after the cached %d",
                           il, hk, (long long)step->pos0, (int)h->pos[h->len - 1]);
    }
    enum ekv_status s = ekv_kv_reserve(kv, il, n_new);
    if (s != EKV_OK) return s;
    for (int32_t i = 0; i < n_new; i++) {
        const uint8_t tag = step->tags ? step->tags[i] : (uint8_t)EKV_TAG_GENERATED;
        for (int hk = 0; hk < G; hk++) {
            const size_t off = ((size_t)i * (size_t)G + (size_t)hk) * d;
            int32_t buf[3];
            ekv_kv_head_append(kv, &L->heads[hk], k + off, v + off, (int32_t)(step->pos0 + i), tag,
                               ekv_kv_step_mpos(step, i, buf));
        }
    }
    t->scale = 1.0f / sqrtf((float)kv->head_dim);
    t->sparsity_p = (float)kv->params.sparsity_p /* resolved by vlcache.c */;
    t->row_flags = kv->stats & (EKV_STAT_COLSUM | EKV_STAT_SUMSQ | EKV_STAT_LASTROW | EKV_STAT_BINCOUNT);
    t->win_flags = kv->stats & (EKV_STAT_WINSUM | EKV_STAT_SPARSITY);
    /* arrays are present exactly when kv->stats asks (ekv_kv_begin) */
    if ((t->row_flags & EKV_STAT_COLSUM) && !L->heads[0].colsum) t->row_flags &= ~EKV_STAT_COLSUM;
    if ((t->row_flags & EKV_STAT_SUMSQ) && !L->heads[0].sumsq) t->row_flags &= ~EKV_STAT_SUMSQ;
    if ((t->row_flags & EKV_STAT_LASTROW) && !L->heads[0].lastrow) t->row_flags &= ~EKV_STAT_LASTROW;
    if ((t->row_flags & EKV_STAT_BINCOUNT) && !L->heads[0].bincount) t->row_flags &= ~EKV_STAT_BINCOUNT;
    if ((t->win_flags & EKV_STAT_WINSUM) && !L->heads[0].winsum) t->win_flags &= ~EKV_STAT_WINSUM;
    if ((t->win_flags & EKV_STAT_SPARSITY) && step->pos0 + n_new > kv->win_start) {
        t->sparse = calloc((size_t)G * 2, sizeof(double));
        if (!t->sparse) return ekv_err(EKV_ERR_NOMEM, "kv layer %d: out of memory for sparsity counts", il);
    } else {
        t->win_flags &= ~EKV_STAT_SPARSITY;
    }
    return EKV_OK;
}

/* After the attention ran: sparsity counts in head order, the policy's
 * layer hook. */
static enum ekv_status layer_finish(struct attend_task *t) {
    struct ekv_kv *kv = t->kv;
    struct ekv_kv_layer *L = &kv->layers[t->il];
    if (t->sparse) {
        for (int hk = 0; hk < kv->n_head_kv; hk++) {
            L->sparse_zero += t->sparse[2 * hk];
            L->sparse_total += t->sparse[2 * hk + 1];
        }
        free(t->sparse);
        t->sparse = NULL;
    }
    if (atomic_load(&t->failed))
        return ekv_err(EKV_ERR_NOMEM, "kv layer %d: out of memory for attention scratch", t->il);
    return t->step->defer ? EKV_OK : ekv_kv_layer_policy(kv, t->il, t->step);
}

enum ekv_status ekv_kv_layer_policy(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    if (kv->layer_hook) kv->layer_hook(kv, il, kv->layer_hook_user);
    if (kv->ops && kv->ops->layer) {
        enum ekv_status s = kv->ops->layer(kv, il, step);
        if (s != EKV_OK) return ekv_err_prefix(s, "kv policy %s, layer %d", kv->policy_name, il);
    }
    /* storage rule last (KIVI residual), so the policy saw this forward's rows as appended */
    return step->n_new > 0 ? ekv_kv_flush(kv, il) : EKV_OK;
}

/* The shadow caches of kv (kv.h) for this layer: each appended and
 * prepared as kv was, into t->sh (freed by the caller). */
static enum ekv_status shadows_prepare(struct ekv_kv *kv, struct ekv_pool *pool, int il, const struct ekv_kv_step *step,
                                       const float *q, const float *k, const float *v, float *out,
                                       struct attend_task *t) {
    if (kv->n_shadows <= 0 || step->n_new == 0) return EKV_OK;
    t->sh = calloc((size_t)kv->n_shadows, sizeof *t->sh);
    if (!t->sh) return ekv_err(EKV_ERR_NOMEM, "kv layer %d: out of memory for %d shadow caches", il, (int)kv->n_shadows);
    for (int32_t i = 0; i < kv->n_shadows; i++) {
        enum ekv_status s = layer_prepare(kv->shadows[i], pool, il, step, q, k, v, out, &t->sh[i]);
        if (s != EKV_OK) return ekv_err_prefix(s, "shadow cache %d", (int)i);
        t->n_sh = i + 1;
    }
    return EKV_OK;
}

enum ekv_status ekv_kv_layer_forward(struct ekv_kv *kv, struct ekv_pool *pool, int il,
                                     const struct ekv_kv_step *step, const float *q, const float *k,
                                     const float *v, float *out) {
    struct attend_task t;
    enum ekv_status s = layer_prepare(kv, pool, il, step, q, k, v, out, &t);
    if (s != EKV_OK) return s;
    if ((s = shadows_prepare(kv, pool, il, step, q, k, v, out, &t)) == EKV_OK && step->n_new > 0)
        ekv_pool_run(pool, attend_worker, &t);
    if (s != EKV_OK) { /* nothing ran: release the counts */
        free(t.sparse);
        for (int32_t i = 0; i < t.n_sh; i++) free(t.sh[i].sparse);
        free(t.sh);
        return s;
    }
    s = layer_finish(&t); /* then each shadow's hook, as if it had read the layer alone */
    for (int32_t i = 0; i < t.n_sh; i++) {
        enum ekv_status si = layer_finish(&t.sh[i]);
        if (s == EKV_OK) s = si;
    }
    free(t.sh);
    return s;
}

/* ---- several sequences in one job ---- */

struct attend_batch {
    struct attend_task *tasks; /* [n] */
    int n;
    int total;                 /* sum of the tasks' KV heads (0 for empty steps) */
};

static void attend_batch_worker(void *ctx, int ith, int nth) {
    struct attend_batch *b = ctx;
    int part = 0, base = 0; /* (part, head) pairs in order, dealt round-robin */
    for (int g = ith; g < b->total; g += nth) {
        while (g >= base + (b->tasks[part].step->n_new > 0 ? b->tasks[part].kv->n_head_kv : 0)) {
            base += b->tasks[part].step->n_new > 0 ? b->tasks[part].kv->n_head_kv : 0;
            part++;
        }
        struct attend_task *t = &b->tasks[part];
        const int hk = g - base;
        float *probs = probs_scratch(t, ith, hk);
        if (!probs) {
            atomic_store(&t->failed, 1);
            continue;
        }
        attend_head(t, hk, probs);
    }
}

enum ekv_status ekv_kv_layer_forward_batch(struct ekv_pool *pool, int il, const struct ekv_kv_part *parts, int n) {
    if (n <= 0 || !parts) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_layer_forward_batch: no parts");
    for (int i = 0; i < n; i++)
        if (parts[i].kv && parts[i].kv->n_shadows > 0)
            return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_layer_forward_batch: part %d reads a shared prompt", i);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (parts[i].kv == parts[j].kv)
                return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_layer_forward_batch: cache of part %d repeats part %d", i, j);
    struct attend_task *tasks = calloc((size_t)n, sizeof *tasks);
    if (!tasks) return ekv_err(EKV_ERR_NOMEM, "kv layer %d: out of memory for %d attention tasks", il, n);
    enum ekv_status s = EKV_OK;
    int prepared = 0, total = 0;
    for (; prepared < n; prepared++) {
        const struct ekv_kv_part *p = &parts[prepared];
        s = layer_prepare(p->kv, pool, il, p->step, p->q, p->k, p->v, p->out, &tasks[prepared]);
        if (s != EKV_OK) break;
        if (p->step->n_new > 0) total += p->kv->n_head_kv;
    }
    if (s == EKV_OK) {
        struct attend_batch b = {.tasks = tasks, .n = n, .total = total};
        if (total > 0) ekv_pool_run(pool, attend_batch_worker, &b);
        for (int i = 0; i < n; i++) {
            enum ekv_status si = layer_finish(&tasks[i]);
            if (s == EKV_OK) s = si;
        }
    } else {
        for (int i = 0; i < prepared; i++) free(tasks[i].sparse);
    }
    free(tasks);
    return s;
}
