/*
 * elastic.c — Elastic Cache (paper 000, docs/policies.md "elastic"), the heart of ekv:
 * at the end of the prompt, importance-driven cache *merging* (the most
 * attended prompt tokens become anchors and every other token is averaged
 * into its nearest anchor); during generation, fixed-point elimination
 * (one entry at a fixed cache index is dropped whenever the cache is over
 * budget, so the region after it behaves as a FIFO while the merged
 * instruction in front of it stays).
 *
 * Statistics: EKV_STAT_COLSUM over ALL prompt queries (image tokens
 * included), reset at the start of each prompt and frozen afterwards
 * (stats are off at decode: decode attention is not used). The
 * score of a layer is the all-head mean: the mean over the KV heads
 * of their group-mean column sums = the mean over all query heads, so
 * anchors are shared by every head of a layer; values stay per head.
 *
 * Budget (docs/policies.md "The budget"), per layer after its attention, with T the layer's entries,
 * n = kv->n_seen and b = params.budget (fraction kept, = 1 - r):
 *   f = T - ekv_kv_target = T - min(T, ceil(n*b - 1e-9), max_tokens when
 *   > 0), i.e. trunc(T - n*b) up to floating-point rounding (ekv's one
 *   budget rule). The reference mode keeps kv_cache.py's own double
 *   arithmetic, f = trunc(T - n*b). [CHOICE]
 *
 * Paper-faithful mode (default):
 *   Prompt's last chunk, f > 1 — merge: N = T - f entries remain.
 *     start = params.sinks (default 1) protected first entries, and the last
 *     entry; M = [start, T-1); anchors = the top (N - start - 1) of M by
 *     score (ekv_topk; ties: lower index first, docs/policies.md "Ties"). Every
 *     other entry of M joins the nearest anchor by |a - t|, ties to the LEFT
 *     anchor (Eq. 2 floor midpoints, torch argmin's first occurrence). Each anchor becomes
 *     the mean of itself and its members, K and V independently, per head
 *     (Eq. 3; ekv_kv_head_merge, weight-weighted so that an entry that
 *     already stands for several tokens counts as many). When N < start + 1
 *     the sinks shrink to N - 1; with no anchor, members are evicted.
 *     [CHOICE]
 *     Fixed point P = N + distance (distance default -25 = "the 25 most
 *     recent"; a positive distance is an absolute index), clamped to
 *     [start, N - 2]. [CHOICE]
 *   Prompt's last chunk, f == 1: no merge (the paper merges only for
 *     f > 1); P is set as above with N = T, then one entry is eliminated at
 *     P as at decode (Algorithm 1's f == 1 branch; keeps the budget exact).
 *     f <= 0: nothing but P (N = T). [CHOICE]
 *   Other prompt chunks: nothing (statistics accumulate).
 *   Decode, f >= 1: delete f entries starting at index P (f > 1 cannot
 *     normally happen with one token per step; then the run [P, P+f) goes),
 *     P lowered if needed so the newest entry stays. A decode step before
 *     any prompt sets P from N = T - f. [CHOICE]
 *
 * Compatibility mode params.compat_ref (`--kv-compat ref`),
 * reproducing the authors' kv_cache.py:
 *   - s = score[start : T-1], pi = argsort(s) ascending (stable here: the
 *     CUDA sort leaves ties unspecified); kept = {start + r : pi[r] > f}
 *     (argsort used as ranks), thrown = {r : pi[r] <= f} read as ABSOLUTE
 *     indices (no start offset), so f + 1 entries go and kv_r may be a sink
 *     or an anchor (counted twice) while some entries are dropped unmerged;
 *   - each thrown entry joins the kept index nearest to r (first on ties),
 *     and the anchor becomes the plain mean of its old value and the
 *     thrown values (scatter_reduce 'mean', include_self);
 *   - output [0, start) + kept + [T-1]; P = T - f + distance (distance > 0:
 *     P = distance), not clamped, initially 0 (so f == 1 at prefill, or a
 *     decode eviction without a prefill merge, deletes index 0);
 *   - deletion follows Python slicing k[:P] + k[P+1:]: P < -1 deletes
 *     len + P when that is >= 0, else nothing; P >= len deletes nothing.
 *     P == -1 would duplicate the cache in the reference; ekv deletes
 *     nothing there. If no anchor survives the reference crashes; ekv
 *     drops the thrown entries unmerged. f > 1 at decode (the reference
 *     asserts) deletes f times at P. [CHOICE]
 *   - merge weights and counters stay honest (tokens represented), even
 *     though the averaged values are the reference's.
 *   - new tokens are rotated at the compressed cache length, not their
 *     true position (docs/policies.md "Positions and the reference mode"):
 *     ops->rope_pos, which the forward asks for.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/policies_adv.h"

#define P_UNSET INT32_MIN

struct elastic_state {
    int32_t *P; /* [n_layer] fixed point per layer (cache index), P_UNSET until set */
};

static enum ekv_status elastic_configure(struct ekv_kv *kv) {
    struct ekv_kv_params *p = &kv->params;
    if (p->sinks < 0) p->sinks = 1;
    if (p->distance == -1) p->distance = -25;
    return EKV_OK;
}

static enum ekv_status elastic_init(struct ekv_kv *kv) {
    struct elastic_state *s = calloc(1, sizeof *s);
    if (!s) return ekv_err(EKV_ERR_NOMEM, "elastic: state");
    s->P = malloc((size_t)(kv->n_layer > 0 ? kv->n_layer : 1) * sizeof *s->P);
    if (!s->P) {
        free(s);
        return ekv_err(EKV_ERR_NOMEM, "elastic: fixed points of %d layers", (int)kv->n_layer);
    }
    for (int32_t l = 0; l < kv->n_layer; l++) s->P[l] = P_UNSET;
    kv->pstate = s;
    return EKV_OK;
}

static enum ekv_status elastic_clone(struct ekv_kv *dst, const struct ekv_kv *src) {
    const struct elastic_state *from = src->pstate;
    enum ekv_status st = elastic_init(dst);
    if (st != EKV_OK) return st;
    struct elastic_state *s = dst->pstate;
    memcpy(s->P, from->P, (size_t)src->n_layer * sizeof *s->P);
    return EKV_OK;
}

static void elastic_destroy(struct ekv_kv *kv) {
    struct elastic_state *s = kv->pstate;
    if (s) {
        free(s->P);
        free(s);
    }
    kv->pstate = NULL;
}

/* Saved caches: the fixed points (any value: every use clamps it). */
static void elastic_state_save(const struct ekv_kv *kv, struct ekv_wbuf *w) {
    const struct elastic_state *s = kv->pstate;
    ekv_wbuf_i32s(w, s->P, (size_t)kv->n_layer);
}

static enum ekv_status elastic_state_load(struct ekv_kv *kv, struct ekv_rbuf *r) {
    struct elastic_state *s = kv->pstate;
    ekv_rbuf_i32s(r, s->P, (size_t)kv->n_layer);
    return r->bad ? ekv_err(EKV_ERR_FORMAT, "elastic: truncated state") : EKV_OK;
}

int32_t ekv_elastic_fixed_point(const struct ekv_kv *kv, int il) {
    const struct elastic_state *s = kv->pstate;
    if (!s || il < 0 || il >= kv->n_layer || kv->ops != &ekv_policy_elastic) return P_UNSET;
    return s->P[il];
}

static enum ekv_status elastic_begin(struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (step->is_prompt) {
        kv->stats = EKV_STAT_COLSUM;
        if (step->pos0 == step->prompt_pos0) ekv_kv_reset_stats(kv, EKV_STAT_COLSUM);
    } else {
        kv->stats = 0; /* scores are frozen after prefill */
    }
    return EKV_OK;
}

/* Paper-faithful fixed point for a cache of N entries. */
static int32_t paper_fixed_point(int32_t N, int32_t start, int32_t distance) {
    int64_t P = distance > 0 ? (int64_t)distance : (int64_t)N + distance;
    if (P > (int64_t)N - 2) P = (int64_t)N - 2;
    if (P < start) P = start;
    if (P > (int64_t)N - 2) P = (int64_t)N - 2; /* tiny caches: start itself is too far */
    if (P < 0) P = 0;
    return (int32_t)P;
}

/* All-head mean column sum of layer il: score [T]. */
static enum ekv_status layer_score(const struct ekv_kv *kv, int il, int32_t T, double *score) {
    const struct ekv_kv_layer *ly = &kv->layers[il];
    for (int32_t j = 0; j < T; j++) score[j] = 0.0;
    for (int32_t hh = 0; hh < kv->n_head_kv; hh++) {
        const double *c = ly->heads[hh].colsum;
        if (!c) return ekv_err(EKV_ERR_INTERNAL, "elastic: colsum statistics are missing");
        for (int32_t j = 0; j < T; j++) score[j] += c[j];
    }
    const double inv = 1.0 / (double)kv->n_head_kv;
    for (int32_t j = 0; j < T; j++) score[j] *= inv;
    return EKV_OK;
}

/* Deletes the entries [p, p + cnt) of every head of layer il. */
static enum ekv_status delete_run(struct ekv_kv *kv, int il, int32_t p, int32_t cnt) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int32_t T = ly->heads[0].len;
    if (cnt <= 0 || p < 0 || p >= T) return EKV_OK;
    if (p + cnt > T) cnt = T - p;
    uint8_t *keep = malloc((size_t)T);
    if (!keep) return ekv_err(EKV_ERR_NOMEM, "elastic: scratch for %d entries", (int)T);
    memset(keep, 1, (size_t)T);
    memset(keep + p, 0, (size_t)cnt);
    enum ekv_status st = EKV_OK;
    for (int32_t hh = 0; hh < kv->n_head_kv && st == EKV_OK; hh++)
        st = ekv_kv_head_keep(kv, &ly->heads[hh], keep);
    free(keep);
    return st;
}

/* Paper-faithful elimination of cnt entries at the fixed point. */
static enum ekv_status paper_eliminate(struct ekv_kv *kv, int il, int32_t T, int32_t cnt) {
    struct elastic_state *s = kv->pstate;
    const int32_t start = kv->params.sinks;
    if (cnt > T - 1) cnt = T - 1; /* the newest entry always stays */
    if (cnt <= 0) return EKV_OK;
    if (s->P[il] == P_UNSET) s->P[il] = paper_fixed_point(T - cnt, start, kv->params.distance);
    int32_t p = s->P[il];
    if (p > T - 1 - cnt) p = T - 1 - cnt;
    if (p < 0) p = 0;
    return delete_run(kv, il, p, cnt);
}

/* Paper-faithful merge of layer il from T down to N entries (docs/policies.md "elastic"). */
static enum ekv_status paper_merge(struct ekv_kv *kv, int il, int32_t T, int32_t N) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int32_t start = EKV_MIN(kv->params.sinks, N - 1);
    const int32_t na = N - start - 1;        /* anchors */
    const int32_t mlen = T - 1 - start;      /* middle region [start, T-1) */
    double *score = malloc((size_t)T * sizeof *score);
    int32_t *anch = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *anch);
    int32_t *into = malloc((size_t)T * sizeof *into);
    enum ekv_status st = EKV_OK;
    if (!score || !anch || !into) {
        st = ekv_err(EKV_ERR_NOMEM, "elastic: merge scratch for %d entries", (int)T);
        goto out;
    }
    st = layer_score(kv, il, T, score);
    if (st != EKV_OK) goto out;
    const int32_t got = na > 0 && mlen > 0 ? ekv_topk(score + start, mlen, na, NULL, anch) : 0;
    if (got != (na > 0 ? na : 0)) {
        st = ekv_err(EKV_ERR_INTERNAL, "elastic: %d anchors of %d", (int)got, (int)na);
        goto out;
    }
    for (int32_t i = 0; i < got; i++) anch[i] += start;

    for (int32_t j = 0; j < start; j++) into[j] = j;
    into[T - 1] = T - 1;
    /* nearest anchor, ties to the left: walk t with the first anchor >= t */
    int32_t ai = 0;
    for (int32_t t = start; t < T - 1; t++) {
        while (ai < got && anch[ai] < t) ai++;
        if (got == 0) {
            into[t] = -1;
        } else if (ai < got && anch[ai] == t) {
            into[t] = t;
        } else if (ai == 0) {
            into[t] = anch[0];
        } else if (ai == got) {
            into[t] = anch[got - 1];
        } else {
            const int32_t dl = t - anch[ai - 1], dr = anch[ai] - t;
            into[t] = dl <= dr ? anch[ai - 1] : anch[ai];
        }
    }
    for (int32_t hh = 0; hh < kv->n_head_kv && st == EKV_OK; hh++) {
        st = ekv_kv_head_merge(kv, &ly->heads[hh], into);
        if (st == EKV_OK && ly->heads[hh].len != N)
            st = ekv_err(EKV_ERR_INTERNAL, "elastic: merge left %d entries, expected %d",
                         (int)ly->heads[hh].len, (int)N);
    }
out:
    free(score); free(anch); free(into);
    return st;
}

struct vi {
    double v;
    int32_t i;
};

static int cmp_vi(const void *a, const void *b) {
    const struct vi *x = a, *y = b;
    if (x->v < y->v) return -1;
    if (x->v > y->v) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Reference (kv_cache.py) merge of layer il with forget count f (docs/policies.md "elastic"). */
static enum ekv_status compat_merge(struct ekv_kv *kv, int il, int32_t T, int32_t f) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int32_t start = kv->params.sinks < T - 1 ? kv->params.sinks : T - 1;
    const int32_t mlen = T - 1 - start;
    const int32_t d = kv->head_dim;
    double *score = malloc((size_t)T * sizeof *score);
    int32_t *pi = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *pi);
    struct vi *ord = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *ord);
    int32_t *sel = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *sel);
    int32_t *thr = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *thr);
    int32_t *to = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *to);
    int32_t *cnt = calloc((size_t)T, sizeof *cnt);
    uint8_t *keep = malloc((size_t)T);
    int32_t *tos = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *tos);
    double *acc = malloc((size_t)(mlen > 0 ? mlen : 1) * 2 * (size_t)d * sizeof *acc); /* [nsel][2][d] */
    float *rk = malloc((size_t)(mlen > 0 ? mlen : 1) * (size_t)d * sizeof *rk); /* [nsel][d] rows read / written */
    float *rv = malloc((size_t)(mlen > 0 ? mlen : 1) * (size_t)d * sizeof *rv);
    int32_t *widx = malloc((size_t)(mlen > 0 ? mlen : 1) * sizeof *widx);
    enum ekv_status st = EKV_OK;
    if (!score || !pi || !ord || !sel || !thr || !to || !cnt || !keep || !tos || !acc || !rk || !rv || !widx) {
        st = ekv_err(EKV_ERR_NOMEM, "elastic: merge scratch for %d entries", (int)T);
        goto out;
    }
    st = layer_score(kv, il, T, score);
    if (st != EKV_OK) goto out;

    /* stable ascending argsort of s = score[start : T-1] (the CUDA sort
     * leaves ties unspecified; index order breaks them here) */
    for (int32_t r = 0; r < mlen; r++) {
        ord[r].v = isnan(score[start + r]) ? -INFINITY : score[start + r];
        ord[r].i = r;
    }
    if (mlen > 1) qsort(ord, (size_t)mlen, sizeof *ord, cmp_vi);
    for (int32_t r = 0; r < mlen; r++) pi[r] = ord[r].i;
    int32_t nsel = 0, nthr = 0;
    for (int32_t r = 0; r < mlen; r++) {
        if (pi[r] > f) sel[nsel++] = start + r;
        else thr[nthr++] = r; /* absolute index r: the missing start offset */
    }
    /* nearest kept index to each thrown r, first occurrence on ties (sel
     * is ascending, so that is the left one): binary search */
    for (int32_t i = 0; i < nthr; i++) {
        int32_t best = -1, bslot = -1;
        if (nsel > 0) {
            int32_t lo = 0, hi = nsel; /* first sel >= thr[i] */
            while (lo < hi) {
                const int32_t mid = lo + (hi - lo) / 2;
                if (sel[mid] < thr[i]) lo = mid + 1;
                else hi = mid;
            }
            if (lo == nsel) bslot = nsel - 1;
            else if (lo == 0) bslot = 0;
            else bslot = thr[i] - sel[lo - 1] <= sel[lo] - thr[i] ? lo - 1 : lo;
            best = sel[bslot];
        }
        to[i] = best;
        tos[i] = bslot;
        if (best >= 0) cnt[best]++;
    }
    memset(keep, 0, (size_t)T);
    for (int32_t j = 0; j < start; j++) keep[j] = 1;
    for (int32_t a = 0; a < nsel; a++) keep[sel[a]] = 1;
    keep[T - 1] = 1;

    for (int32_t hh = 0; hh < kv->n_head_kv && st == EKV_OK; hh++) {
        struct ekv_kv_head *h = &ly->heads[hh];
        /* anchors: plain mean of the old value and the thrown values, all
         * read before any is written (scatter_reduce reads the originals) */
        st = ekv_kv_head_gather(kv, h, sel, nsel, rk, rv);
        for (int32_t a = 0; a < nsel && st == EKV_OK; a++) {
            double *ac = acc + (size_t)a * 2 * d;
            for (int32_t c = 0; c < d; c++) {
                ac[c] = rk[(size_t)a * d + c];
                ac[d + c] = rv[(size_t)a * d + c];
            }
        }
        for (int32_t i = 0; i < nthr && st == EKV_OK; i++) {
            if (tos[i] < 0) continue;
            st = ekv_kv_head_get(kv, h, thr[i], rk, rv);
            double *ac = acc + (size_t)tos[i] * 2 * d;
            for (int32_t c = 0; c < d; c++) {
                ac[c] += rk[c];
                ac[d + c] += rv[c];
            }
        }
        int32_t nw = 0; /* anchors that received members, written in one scatter */
        for (int32_t a = 0; a < nsel && st == EKV_OK; a++) {
            const int32_t j = sel[a];
            if (!cnt[j]) continue;
            const double *ac = acc + (size_t)a * 2 * d;
            const double den = (double)(cnt[j] + 1);
            for (int32_t c = 0; c < d; c++) {
                rk[(size_t)nw * d + c] = (float)(ac[c] / den);
                rv[(size_t)nw * d + c] = (float)(ac[d + c] / den);
            }
            widx[nw++] = j;
        }
        if (st == EKV_OK) st = ekv_kv_head_scatter(kv, h, widx, nw, rk, rv);
        if (st != EKV_OK) break;
        /* honest token accounting: a dropped entry that was merged somewhere
         * moves its weight to its anchor and counts as merged */
        double wmerged = 0.0;
        for (int32_t i = 0; i < nthr; i++) {
            const int32_t t = thr[i];
            if (to[i] < 0 || keep[t]) continue;
            /* a thrown index may repeat only once: each r appears once in thr */
            h->weight[to[i]] += h->weight[t];
            wmerged += h->weight[t];
        }
        st = ekv_kv_head_keep(kv, h, keep);
        if (st == EKV_OK) {
            const int64_t wm = (int64_t)llround(wmerged);
            h->n_evicted -= wm;
            h->n_merged += wm;
        }
    }
out:
    free(score); free(pi); free(ord); free(sel); free(thr); free(to); free(cnt); free(keep); free(tos); free(acc);
    free(rk); free(rv); free(widx);
    return st;
}

/* Reference deletion at P with Python slice semantics (k[:P] + k[P+1:]). */
static enum ekv_status compat_eliminate(struct ekv_kv *kv, int il, int32_t f) {
    struct elastic_state *s = kv->pstate;
    const int32_t P = s->P[il] == P_UNSET ? 0 : s->P[il];
    for (int32_t i = 0; i < f; i++) {
        const int32_t len = kv->layers[il].heads[0].len;
        int64_t q;
        if (P >= 0) q = P < len ? P : -1;
        else if (P == -1) q = -1; /* the reference would duplicate the cache */
        else q = (int64_t)len + P >= 0 ? (int64_t)len + P : -1;
        if (q < 0) break;
        enum ekv_status st = delete_run(kv, il, (int32_t)q, 1);
        if (st != EKV_OK) return st;
    }
    return EKV_OK;
}

static enum ekv_status elastic_layer(struct ekv_kv *kv, int il, const struct ekv_kv_step *step) {
    struct elastic_state *s = kv->pstate;
    if (!s) return ekv_err(EKV_ERR_INTERNAL, "elastic: no state (init not run)");
    if (step->is_prompt && !step->last_chunk) return EKV_OK;
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int32_t T = ly->heads[0].len;
    for (int32_t hh = 1; hh < kv->n_head_kv; hh++)
        if (ly->heads[hh].len != T)
            return ekv_err(EKV_ERR_INTERNAL, "elastic: heads of layer %d hold %d and %d entries", il,
                           (int)T, (int)ly->heads[hh].len);
    if (T <= 0) return EKV_OK;

    const int32_t distance = kv->params.distance;

    if (kv->params.compat_ref) {
        /* the reference's own float arithmetic: f = int(T - n * (1 - r)) */
        double fd = trunc((double)T - (double)kv->n_seen * kv->params.budget);
        if (kv->params.max_tokens > 0 && (double)T - (double)kv->params.max_tokens > fd)
            fd = (double)T - (double)kv->params.max_tokens;
        if (fd > (double)T) fd = (double)T;
        const int32_t f = fd <= 0.0 ? 0 : (int32_t)fd;
        if (step->is_prompt && f > 1) {
            enum ekv_status st = compat_merge(kv, il, T, f);
            if (st != EKV_OK) return st;
            int64_t P = distance > 0 ? (int64_t)distance : (int64_t)T - f + distance;
            if (P <= (int64_t)INT32_MIN) P = (int64_t)INT32_MIN + 1; /* beyond any cache: deletes nothing */
            s->P[il] = (int32_t)P;
            return EKV_OK;
        }
        if (f >= 1) return compat_eliminate(kv, il, f);
        return EKV_OK;
    }

    /* f = T - N with N = ekv_kv_target (ceil(budget * n) capped by
     * max_tokens) */
    const int32_t f = T - ekv_kv_target(kv, il);
    if (step->is_prompt) {
        if (f > 1) {
            const int32_t N = T - f;
            enum ekv_status st = paper_merge(kv, il, T, N);
            if (st != EKV_OK) return st;
            s->P[il] = paper_fixed_point(N, kv->params.sinks, distance);
            return EKV_OK;
        }
        s->P[il] = paper_fixed_point(T, kv->params.sinks, distance);
        return f == 1 ? paper_eliminate(kv, il, T, 1) : EKV_OK;
    }
    return f >= 1 ? paper_eliminate(kv, il, T, f) : EKV_OK;
}

/* Reference mode (docs/policies.md "Positions and the reference mode"): new tokens are rotated at the
 * compressed length. */
static int64_t elastic_rope_pos(const struct ekv_kv *kv, const struct ekv_kv_step *step) {
    if (!kv->params.compat_ref) return step->pos0;
    return kv->layers[0].heads[0].len;
}

const struct ekv_policy_ops ekv_policy_elastic = {
    .name = "elastic",
    .summary = "Elastic Cache: merge prompt tokens into attention anchors, then fixed-point elimination",
    .has_compat_ref = true,
    .rope_pos = elastic_rope_pos,
    .configure = elastic_configure,
    .init = elastic_init,
    .destroy = elastic_destroy,
    .clone = elastic_clone,
    .state_save = elastic_state_save,
    .state_load = elastic_state_load,
    .begin = elastic_begin,
    .layer = elastic_layer,
    .end = NULL,
};
