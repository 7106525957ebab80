/*
 * adakv.c — "+adakv", head-wise budgets after Ada-KV (issue 21): instead of
 * every KV head of a layer keeping the same number of entries, the layer's
 * budget goes to the entries with the best scores across all its heads, so
 * a head whose attention is spread over many keys keeps more of them and a
 * head that looks at a few keeps fewer. ekv's cache stores a length per
 * (layer, KV head) already, so this saves memory for real (kvpress only
 * masks). A policy that ranks a head's entries by a score comparable
 * between heads (attention sums: every query row sums to 1; counts over the
 * same queries) takes it (ops->headwise: snapkv, pyramidkv, h2o, scissorhands,
 * vlcache, roco).
 *
 * Rule, for one layer when its policy acts, with C the base per-head target
 * and, for head h, prot[h] entries the policy keeps whatever their score
 * (SnapKV's observation window) and m[h] candidates with scores s_h:
 *   room[h]  = max(0, C - prot[h])   (the candidates the base policy keeps)
 *   floor[h] = min(m[h], floor(ada_floor * room[h]))
 *              (Ada-KV's safeguard: every head keeps its own best floor[h])
 *   B        = min(sum room, sum m)  (the layer's candidate budget: a head
 *              with fewer candidates than its room leaves the rest to others)
 *   R        = B - sum floor
 *   the R best scores among all heads' candidates that are not in their
 *   head's best floor[h] (ties: lower head, then lower index: ekv_topk over
 *   the heads' candidates laid end to end) go to their heads: r[h];
 *   caps[h]  = prot[h] + floor[h] + r[h].
 * Each head then applies its policy's own rule with target caps[h]: its
 * top (caps[h] - prot[h]) candidates are exactly its floor[h] best plus the
 * ones the joint ranking chose. The layer keeps sum prot + B = min(H C,
 * its entries) entries: as many as without +adakv when the heads are equally
 * long (a prompt), else the budget a short head cannot use goes to the others;
 * the split between heads changes. With one KV head, or with ada_floor = 1
 * on heads of equal length, it is the base policy bit for bit. Default
 * ada_floor = 0.2 (Ada-KV's alpha). [CHOICE]
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"

struct ekv_kv_adakv ekv_kv_adakv_defaults(void) { return (struct ekv_kv_adakv){.on = true, .floor = 0.2}; }

enum ekv_status ekv_kv_adakv_refused(void) {
    char names[256] = "";
    size_t used = 0;
    for (int i = 0; i < ekv_policy_count() && used < sizeof names; i++) {
        if (!ekv_policy_at(i)->headwise) continue;
        const int w = snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", ekv_policy_at(i)->name);
        if (w < 0) break;
        used += (size_t)w;
    }
    return ekv_err(EKV_ERR_INVALID_ARG, "+adakv needs a policy that ranks entries by attention per head (%s)", names);
}

enum ekv_status ekv_kv_adakv_option(struct ekv_kv_adakv *a, const char *key, const char *value) {
    if (strcmp(key, "ada_floor") != 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "+adakv: unknown option '%s' (known: ada_floor)", key);
    char *end = NULL;
    errno = 0;
    const double v = strtod(value, &end);
    if (end == value || *end || errno || !(v >= 0 && v <= 1))
        return ekv_err(EKV_ERR_INVALID_ARG, "+adakv: ada_floor must be a number in [0, 1] (got '%s')", value);
    a->floor = v;
    return EKV_OK;
}

enum ekv_status ekv_adakv_caps(const struct ekv_kv *kv, int32_t cap, const int32_t *prot, const int32_t *m,
                               const double *const *score, int32_t *caps) {
    const int32_t H = kv->n_head_kv;
    int64_t total = 0, R = 0, rooms = 0, floors = 0;
    for (int32_t h = 0; h < H; h++) {
        caps[h] = cap;
        if (m[h] < 0 || prot[h] < 0) return ekv_err(EKV_ERR_INTERNAL, "+adakv: head %d: negative counts", (int)h);
        total += m[h];
    }
    if (H < 2 || total == 0) return EKV_OK;
    if (total > INT32_MAX) return ekv_err(EKV_ERR_INVALID_ARG, "+adakv: %lld candidates in a layer", (long long)total);
    double *all = malloc((size_t)total * sizeof *all);
    uint8_t *mask = malloc((size_t)total);
    int32_t *idx = malloc((size_t)total * sizeof *idx);
    if (!all || !mask || !idx) {
        free(all);
        free(mask);
        free(idx);
        return ekv_err(EKV_ERR_NOMEM, "%s+adakv: scratch for %lld candidates", kv->policy_name, (long long)total);
    }
    int64_t off = 0;
    for (int32_t h = 0; h < H; h++) { /* each head's best floor[h] are its own; the rest compete */
        const int32_t room = EKV_MAX(0, cap - prot[h]);
        const int32_t fl = EKV_MIN(m[h], (int32_t)floor(kv->adakv.floor * (double)room + 1e-9));
        rooms += room;
        floors += fl;
        if (m[h] > 0) { /* a head with no candidates may pass no scores */
            memcpy(all + off, score[h], (size_t)m[h] * sizeof *all);
            memset(mask + off, 1, (size_t)m[h]);
        }
        const int32_t got = m[h] > 0 ? ekv_topk(score[h], m[h], fl, NULL, idx) : 0;
        for (int32_t i = 0; i < got; i++) mask[off + idx[i]] = 0;
        caps[h] = prot[h] + got;
        off += m[h];
    }
    R = EKV_MIN(rooms, total) - floors;
    const int32_t got = ekv_topk(all, (int32_t)total, (int32_t)R, mask, idx);
    for (int32_t i = 0, h = 0, end = m[0]; i < got; i++) { /* idx ascending: heads in order */
        while (idx[i] >= end) end += m[++h];
        caps[h]++;
    }
    free(all);
    free(mask);
    free(idx);
    return got == R ? EKV_OK : ekv_err(EKV_ERR_INTERNAL, "+adakv: %d of %lld chosen", (int)got, (long long)R);
}

enum ekv_status ekv_adakv_recent_top(struct ekv_kv *kv, int il, int32_t target, int32_t window,
                                     const double *const *score) {
    struct ekv_kv_layer *ly = &kv->layers[il];
    const int32_t H = kv->n_head_kv;
    const int32_t w = EKV_MAX(0, EKV_MIN(window, target));
    int32_t *prot = calloc((size_t)H * 3, sizeof *prot);
    if (!prot) return ekv_err(EKV_ERR_NOMEM, "%s+adakv: scratch", kv->policy_name);
    int32_t *m = prot + H, *caps = m + H;
    for (int32_t h = 0; h < H; h++) {
        prot[h] = EKV_MIN(w, ly->heads[h].len);
        m[h] = ly->heads[h].len - prot[h]; /* the older entries, score[h][0..m[h]) */
    }
    enum ekv_status st = ekv_adakv_caps(kv, target, prot, m, score, caps);
    for (int32_t h = 0; h < H && st == EKV_OK; h++)
        st = ekv_kv_head_keep_recent_top(kv, &ly->heads[h], caps[h], w, score[h]);
    free(prot);
    return st;
}
