/*
 * merge.c — merging as a layer over any policy ("snapkv+merge", issue 21),
 * and the merged-row rules that elastic-v2 and that layer share.
 *
 * Why: merging was welded to Elastic's selection rule, so "does merging
 * beat eviction" could not be asked of any other policy. With "+merge" in a
 * policy spec the policy selects exactly as before, and every entry it
 * would drop joins a kept entry of the same head instead (the CaM / D2O /
 * KVMerger idea: merge the evicted into the kept, keep the selection):
 *
 *   merge_to=key  [default] the kept entry whose key has the highest
 *                 cosine similarity with the dropped entry's key (D2O's
 *                 choice), if that similarity is at least merge_sim
 *                 (default 0.7); below it the entry is dropped as the base
 *                 policy would drop it;
 *   merge_to=pos  the kept entry nearest in position (the kept neighbours
 *                 before and after it in the head's order; ties to the
 *                 earlier one: Elastic's rule, docs/policies.md "elastic");
 *   merge_key=mean|anchor|rotate  the merged key (elastic-v2's key= rule,
 *                 shared code below: weighted mean of the cached keys; the
 *                 survivor's own key; or the mean of the keys turned to the
 *                 survivor's position first);
 *   merge_bias=1|0  [1] attention adds log(weight) to a merged entry's
 *                 logit (kv->logit_bias), so an entry standing for w tokens
 *                 is attended as if its key appeared w times;
 *   merge_stats=1|0 [1] the survivor's additive statistics take its
 *                 members' (0: it keeps its own);
 *   merge_at=all|prompt [all] merge at every compression, or only at the
 *                 prompt's (decode steps then evict as the base does).
 *
 * Defaults: the best of the measurements on data/longctx/cont_3.5k (first
 * 8 items, budget 0.2, docs/results.md "+merge"): by position every
 * eviction policy but local and SnapKV got worse (a kept entry, chosen
 * for its attention, turns into the mean of itself and its unimportant
 * neighbours); by key similarity at 0.7 all six got better (1.0-2.3 %
 * lower PPL); 0.5 and 0.9 were worse than 0.7, 0.8 about equal.
 *
 * Values are the weight-weighted mean; weights add (tokens stood for), and
 * the survivor's additive statistics (colsum, count, window sums, ...)
 * take its members' (ekv_kv_head_merge_set), so a policy that ranks by
 * accumulated attention sees a merged entry as the tokens it holds. The
 * kept set, and so the budget, is the base policy's; an eviction that
 * drops nothing is left to the base path untouched (bit for bit the base
 * policy, tests/test_merge.c). Every eviction of a policy goes through
 * ekv_kv_head_keep (cache.c), which sends it here when the spec says +merge.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"

/* ---- options ---- */

struct ekv_kv_merge ekv_kv_merge_defaults(void) {
    struct ekv_kv_merge m = {.on = true, .to = EKV_MERGE_TO_KEY, .sim = 0.7, .key = EKV_MERGE_KEY_MEAN, .bias = true,
                             .stats = true};
    return m;
}

enum ekv_status ekv_kv_merge_option(struct ekv_kv_merge *m, const char *key, const char *v) {
    bool ok = true;
    if (!strcmp(key, "merge_to")) {
        if (!strcmp(v, "pos")) m->to = EKV_MERGE_TO_POS;
        else if (!strcmp(v, "key")) m->to = EKV_MERGE_TO_KEY;
        else ok = false;
    } else if (!strcmp(key, "merge_sim")) {
        char *end;
        const double x = strtod(v, &end);
        ok = *v && !*end && x >= -1.0 && x <= 1.0;
        if (ok) m->sim = x;
    } else if (!strcmp(key, "merge_key")) {
        if (!strcmp(v, "mean")) m->key = EKV_MERGE_KEY_MEAN;
        else if (!strcmp(v, "anchor")) m->key = EKV_MERGE_KEY_ANCHOR;
        else if (!strcmp(v, "rotate")) m->key = EKV_MERGE_KEY_ROTATE;
        else ok = false;
    } else if (!strcmp(key, "merge_bias")) {
        ok = ekv_kv_option_bool(v, &m->bias);
    } else if (!strcmp(key, "merge_stats")) {
        ok = ekv_kv_option_bool(v, &m->stats);
    } else if (!strcmp(key, "merge_at")) {
        if (!strcmp(v, "all")) m->prompt_only = false;
        else if (!strcmp(v, "prompt")) m->prompt_only = true;
        else ok = false;
    } else {
        return ekv_err(EKV_ERR_INVALID_ARG, "+merge: unknown option '%s' (known: merge_to, merge_sim, merge_key, "
                                            "merge_bias, merge_stats, merge_at)", key);
    }
    if (!ok) return ekv_err(EKV_ERR_INVALID_ARG, "+merge: bad value '%s' for option '%s'", v, key);
    return EKV_OK;
}

/* ---- merged rows under a key rule (shared with elastic-v2) ---- */

struct merge_scratch {
    int32_t *cnt;  /* [T] entries that join t, t itself included */
    int32_t *row;  /* [T] row of j in K/V, -1 when j takes no part */
    int32_t *idx;  /* [T] entries read */
    double *gsum;  /* [T] sum of member scores of t's group */
    double *W;     /* [T] sum of member weights of t's group */
    double *acc;   /* [n_read][2][d] sums of keys and values (rows of survivors) */
    float *K, *V;  /* [n_read][d] rows read */
    float *Ks, *Vs; /* [T][d] survivors' new rows (merge_set's layout) */
    float *tmp;    /* [d] */
};

static void scratch_free(struct merge_scratch *s) {
    free(s->cnt); free(s->row); free(s->idx); free(s->gsum); free(s->W);
    free(s->acc); free(s->K); free(s->V); free(s->Ks); free(s->Vs); free(s->tmp);
}

static bool scratch_alloc(struct merge_scratch *s, size_t T, size_t d) {
    size_t td;
    memset(s, 0, sizeof *s);
    if (!ekv_mul_ok(T, d, &td)) return false;
    s->cnt = malloc(T * sizeof *s->cnt);
    s->row = malloc(T * sizeof *s->row);
    s->idx = malloc(T * sizeof *s->idx);
    s->gsum = malloc(T * sizeof *s->gsum);
    s->W = malloc(T * sizeof *s->W);
    s->acc = malloc(2 * td * sizeof *s->acc);
    s->K = malloc(td * sizeof *s->K);
    s->V = malloc(td * sizeof *s->V);
    s->Ks = malloc(td * sizeof *s->Ks);
    s->Vs = malloc(td * sizeof *s->Vs);
    s->tmp = malloc(d * sizeof *s->tmp);
    return s->cnt && s->row && s->idx && s->gsum && s->W && s->acc && s->K && s->V && s->Ks && s->Vs && s->tmp;
}

/* Sums of the groups in index order (survivor at its own index), each
 * member j with weight weight[j] (x score[j] when its group's scores sum
 * above 0), keys turned to the survivor's position under KEY_ROTATE. */
static void group_sums(const struct ekv_kv *kv, const struct ekv_kv_head *h, const int32_t *into,
                       enum ekv_merge_key key, const double *score, struct merge_scratch *s) {
    const int32_t T = h->len, d = kv->head_dim;
    for (int32_t j = 0; j < T; j++) {
        const int32_t t = into[j];
        if (t < 0 || s->cnt[t] < 2) continue;
        double w = h->weight[j];
        if (score && s->gsum[t] > 0) w *= score[j] > 0 ? score[j] : 0.0;
        const float *kj = s->K + (size_t)s->row[j] * d;
        if (key == EKV_MERGE_KEY_ROTATE && h->mpos) { /* M-RoPE: each component from its own position */
            const int32_t *a = h->mpos + 3 * (size_t)t, *b = h->mpos + 3 * (size_t)j;
            const int64_t delta[4] = {(int64_t)a[0] - b[0], (int64_t)a[1] - b[1], (int64_t)a[2] - b[2], 0};
            if (delta[0] || delta[1] || delta[2]) {
                memcpy(s->tmp, kj, (size_t)d * sizeof *s->tmp);
                ekv_rope_shift_multi(&kv->rope, delta, s->tmp, 1, d);
                kj = s->tmp;
            }
        } else if (key == EKV_MERGE_KEY_ROTATE && h->pos[j] != h->pos[t]) { /* the member's key in the survivor's frame */
            memcpy(s->tmp, kj, (size_t)d * sizeof *s->tmp);
            ekv_rope_shift_ext(&kv->rope, (int64_t)h->pos[t] - h->pos[j], s->tmp, 1, d);
            kj = s->tmp;
        }
        double *ak = s->acc + (size_t)s->row[t] * 2 * d, *av = ak + d;
        const float *vj = s->V + (size_t)s->row[j] * d;
        for (int32_t c = 0; c < d; c++) {
            ak[c] += w * kj[c];
            av[c] += w * vj[c];
        }
        s->W[t] += w;
    }
}

/* The rule on a device that merges (kv->dev->merge): the member weights
 * group_sums would use, and the key rule as flags; the device averages
 * (turning members' keys itself under ROTATE), nothing is read back. */
static enum ekv_status merge_rule_dev(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into,
                                      enum ekv_merge_key key, const double *score) {
    const int32_t T = h->len;
    float *wm = malloc((size_t)T * sizeof *wm);
    double *gsum = score ? calloc((size_t)T, sizeof *gsum) : NULL;
    if (!wm || (score && !gsum)) {
        free(wm), free(gsum);
        return ekv_err(EKV_ERR_NOMEM, "merge: weights of %d entries", (int)T);
    }
    for (int32_t j = 0; score && j < T; j++)
        if (into[j] >= 0 && score[j] > 0) gsum[into[j]] += score[j];
    for (int32_t j = 0; j < T; j++) {
        double w = h->weight[j];
        if (score && into[j] >= 0 && gsum[into[j]] > 0) w *= score[j] > 0 ? score[j] : 0.0;
        wm[j] = (float)w;
    }
    const unsigned flags = key == EKV_MERGE_KEY_ROTATE ? EKV_KV_DEV_K_ROTATE : key == EKV_MERGE_KEY_ANCHOR ? EKV_KV_DEV_K_KEEP : 0;
    const enum ekv_status st = ekv_kv_head_merge_dev(kv, h, into, wm, flags);
    free(wm), free(gsum);
    return st;
}

enum ekv_status ekv_kv_head_merge_rule(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into,
                                       enum ekv_merge_key key, const double *score) {
    if (!kv || !h || (!into && h->len > 0)) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_merge_rule: NULL argument");
    if (key == EKV_MERGE_KEY_MEAN && !score) return ekv_kv_head_merge(kv, h, into); /* cache.c's own mean */
    if (key == EKV_MERGE_KEY_ROTATE && kv->rope.dim <= 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "key=rotate needs the model's RoPE, and this cache was made without it "
                                            "(kv->rope unset; ekv_seq_new sets it)");
    const int32_t T = h->len, d = kv->head_dim;
    if (T <= 0) return EKV_OK;
    for (int32_t j = 0; j < T; j++)
        if (into[j] < -1 || into[j] >= T || (into[j] >= 0 && into[into[j]] != into[j]))
            return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_head_merge_rule: entry %d joins %d, which is not a surviving "
                                                "entry", (int)j, (int)into[j]);
    if (kv->dev && kv->dev->merge) return merge_rule_dev(kv, h, into, key, score);
    struct merge_scratch s;
    if (!scratch_alloc(&s, (size_t)T, (size_t)d)) {
        scratch_free(&s);
        return ekv_err(EKV_ERR_NOMEM, "merge: scratch for %d entries of %d", (int)T, (int)d);
    }
    for (int32_t j = 0; j < T; j++) s.cnt[j] = 0, s.gsum[j] = 0.0, s.W[j] = 0.0, s.row[j] = -1;
    for (int32_t j = 0; j < T; j++) {
        if (into[j] < 0) continue;
        s.cnt[into[j]]++;
        if (score && score[j] > 0) s.gsum[into[j]] += score[j];
    }
    int32_t n = 0; /* rows read: every entry of a group with members */
    for (int32_t j = 0; j < T; j++)
        if (into[j] >= 0 && s.cnt[into[j]] >= 2) s.row[j] = n, s.idx[n++] = j;
    enum ekv_status st = ekv_kv_head_gather(kv, h, s.idx, n, s.K, s.V);
    if (st == EKV_OK) {
        memset(s.acc, 0, (size_t)n * 2 * (size_t)d * sizeof *s.acc);
        group_sums(kv, h, into, key, score, &s);
        for (int32_t t = 0; t < T; t++) {
            if (into[t] != t || s.cnt[t] < 2) continue;
            const double *ak = s.acc + (size_t)s.row[t] * 2 * d, *av = ak + d;
            float *kt = s.Ks + (size_t)t * d, *vt = s.Vs + (size_t)t * d;
            for (int32_t c = 0; c < d; c++) {
                kt[c] = key == EKV_MERGE_KEY_ANCHOR ? s.K[(size_t)s.row[t] * d + c] : (float)(ak[c] / s.W[t]);
                vt[c] = (float)(av[c] / s.W[t]);
            }
        }
        st = ekv_kv_head_merge_set(kv, h, into, s.Ks, s.Vs);
    }
    scratch_free(&s);
    return st;
}

/* ---- +merge: the dropped entries of an eviction join kept ones ---- */

/* into[j] for merge_to=pos: the kept neighbour nearer in position. */
static void into_by_pos(const struct ekv_kv_head *h, const uint8_t *keep, int32_t *into) {
    const int32_t T = h->len;
    int32_t left = -1, right = -1;
    for (int32_t j = 0; j < T; j++) {
        if (keep[j]) {
            into[j] = j;
            left = j;
            continue;
        }
        if (right < j) right = ekv_keep_next(keep, j + 1, T, true); /* once per run of dropped entries */
        if (left < 0 && right >= T) into[j] = -1;
        else if (left < 0) into[j] = right;
        else if (right >= T) into[j] = left;
        else into[j] = (int64_t)h->pos[j] - h->pos[left] <= (int64_t)h->pos[right] - h->pos[j] ? left : right;
    }
}

/* Dot product of two unit rows in a fixed order (8 partial sums, then
 * the tail): the same bits on every run and host. */
static float dot_fixed(const float *a, const float *b, int32_t d) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, r = 0.0f;
    int32_t c = 0;
    for (; c + 8 <= d; c += 8)
        for (int l = 0; l < 8; l++) s[l] += a[c + l] * b[c + l];
    for (; c < d; c++) r += a[c] * b[c];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + r;
}

/* into[j] for merge_to=key: the kept entry of highest key cosine
 * similarity (first on ties), if it reaches min_sim; else -1. Keys are
 * scaled to unit length once (a zero key has similarity 0 to all). */
static enum ekv_status into_by_key(const struct ekv_kv *kv, const struct ekv_kv_head *h, const uint8_t *keep,
                                   double min_sim, int32_t *into) {
    const int32_t T = h->len, d = kv->head_dim;
    size_t td;
    if (!ekv_mul_ok((size_t)T, (size_t)d, &td)) return ekv_err(EKV_ERR_OVERFLOW, "merge: %d entries", (int)T);
    float *U = malloc(td * sizeof *U);
    int32_t *kept = malloc((size_t)T * sizeof *kept);
    enum ekv_status st = U && kept ? ekv_kv_head_gather(kv, h, NULL, T, U, NULL)
                                   : ekv_err(EKV_ERR_NOMEM, "merge: keys of %d entries", (int)T);
    int32_t nk = 0;
    for (int32_t j = 0; j < T && st == EKV_OK; j++) {
        float *u = U + (size_t)j * d;
        double ss = 0.0;
        for (int32_t c = 0; c < d; c++) ss += (double)u[c] * u[c];
        const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
        for (int32_t c = 0; c < d; c++) u[c] = (float)(u[c] * inv);
        if (keep[j]) kept[nk++] = j;
    }
    for (int32_t j = 0; j < T && st == EKV_OK; j++) {
        if (keep[j]) {
            into[j] = j;
            continue;
        }
        int32_t best = -1;
        float bsim = -INFINITY;
        const float *a = U + (size_t)j * d;
        for (int32_t i = 0; i < nk; i++) {
            const float sim = dot_fixed(a, U + (size_t)kept[i] * d, d);
            if (sim > bsim) bsim = sim, best = kept[i];
        }
        into[j] = best >= 0 && (double)bsim >= min_sim ? best : -1;
    }
    free(U);
    free(kept);
    return st;
}

enum ekv_status ekv_kv_merge_dropped(struct ekv_kv *kv, struct ekv_kv_head *h, const uint8_t *keep) {
    const int32_t T = h->len;
    int32_t *into = malloc((size_t)(T > 0 ? T : 1) * sizeof *into);
    if (!into) return ekv_err(EKV_ERR_NOMEM, "merge: targets of %d entries", (int)T);
    enum ekv_status st = EKV_OK;
    if (kv->merge.to == EKV_MERGE_TO_KEY) st = into_by_key(kv, h, keep, kv->merge.sim, into);
    else into_by_pos(h, keep, into);
    if (st == EKV_OK) st = ekv_kv_head_merge_rule(kv, h, into, kv->merge.key, NULL);
    free(into);
    return st;
}
