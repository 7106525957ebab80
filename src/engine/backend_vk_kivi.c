/*
 * backend_vk_kivi.c — KIVI storage (kivi2, kivi4) under a compressing
 * policy on the GPU: what src/kv/store.c does to a CPU store's rows — a
 * compaction that drops entries from their key groups and re-quantises the
 * groups that join or take a new row, a write, the residual rule after a
 * forward — done to the device's rows (kvq.glsl's compressed KIVI layout)
 * by plans (kv_compact.comp moves rows, codes and parameters by their bits)
 * and KIVI units (kivi_pack.comp quantises with the CPU's quantiser), in
 * the submission that runs a forward's plans (backend_vk_plan.c).
 *
 * The host cache's stores of such a side hold no rows but count as the
 * CPU's would: nq, the key groups' sizes gn[], the bytes in use; the
 * decisions come from store.c's own counting (ekv_store_kgroups_plan,
 * ekv_store_flush_count) and its counts follow (ekv_store_note_*), so the
 * device holds the codes the CPU cache would hold, and the bytes reported
 * are the CPU's. A merged entry's mean is computed by kv_merge.comp into a
 * float row (ekv_vk_kivi_mean_row) that kivi_pack quantises into its key
 * group or value row, or in fp16 into the residual; rows a policy gives
 * itself are quantised here with the CPU's codec (values) or handed to
 * kivi_pack as floats (keys, whose group is re-quantised with them).
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend_vk_mg.h"
#include "gpu/vk_push.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"
#include "kv/store.h"

#define PK_RESID 0x40000000u /* a kivi_pack member in the residual (slot) */
#define PK_FROW 0x80000000u  /* ... a float row of the plan */

static struct ekv_kv_store *store_of(struct ekv_vk_mg *m, int side, int il, int hk) {
    struct ekv_kv_head *h = &m->seq->kv->layers[il].heads[hk];
    return side == MG_V ? &h->vs : &h->ks;
}
static const struct ekv_store_fmt *fmt_of(const struct ekv_vk_mg *m, int side) {
    return side == MG_V ? &m->seq->kv->fv : &m->seq->kv->fk;
}

/* A stage row of a side holding words (n of them; the rest zero); its code. */
static enum ekv_status stage_words(struct ekv_vk_mg *m, int side, const uint32_t *w, uint32_t n, uint32_t *code) {
    enum ekv_status st = ekv_vk_mg_stage_blank(m, side, code);
    if (st == EKV_OK) memcpy(m->stage[side] + (size_t)(*code & ~MG_HI) * m->srw[side], w, (size_t)n * 4);
    return st;
}

/* A residual row (fp16, as ekv_store_write's tail rows) of side rs staged. */
static enum ekv_status stage_f16(struct ekv_vk_mg *m, int rs, const float *x, uint32_t *code) {
    enum ekv_status st = ekv_vk_mg_stage_blank(m, rs, code);
    if (st == EKV_OK) ekv_quant_f16(x, (uint16_t *)(m->stage[rs] + (size_t)(*code & ~MG_HI) * m->srw[rs]), (int64_t)m->s->D);
    return st;
}

/* A value row quantised as the CPU's store does (ekv_kivi_quant_vrow),
 * staged in the device's layout: the codes of every channel group side by
 * side, then one word per group (fp16 scale | fp16 minimum << 16). */
static enum ekv_status stage_vrow(struct ekv_vk_mg *m, const float *x, uint32_t *code) {
    const struct ekv_store_fmt *f = fmt_of(m, MG_V);
    const uint32_t D = m->s->D, G = m->s->G, rw = m->rw[MG_V] /* code words (ekv_vk_row_words) */, gb = G * (rw * 32 / D) / 8;
    uint8_t cpu[1024];
    uint32_t w[256 + 64] = {0};
    if (f->row_bytes > sizeof cpu || rw + D / G > sizeof w / 4)
        return ekv_err(EKV_ERR_INTERNAL, "a KIVI value row of %zu bytes", f->row_bytes);
    ekv_kivi_quant_vrow(x, f->d, f->g, ekv_kv_traits(f->type)->bits, cpu);
    for (uint32_t cg = 0; cg < D / G; cg++) {
        const uint8_t *p = cpu + (size_t)cg * (4 + gb);
        uint16_t s16, m16;
        memcpy(&s16, p, 2), memcpy(&m16, p + 2, 2);
        memcpy((uint8_t *)w + (size_t)cg * gb, p + 4, gb);
        w[rw + cg] = (uint32_t)s16 | (uint32_t)m16 << 16;
    }
    return stage_words(m, MG_V, w, rw + D / G, code);
}

/* A float row for kivi_pack (a key's new row); its member code. */
static enum ekv_status add_frow(struct ekv_vk_mg *m, const float *x, uint32_t *code) {
    const size_t D = m->s->D;
    if (m->n_frows >= PK_RESID) return ekv_err(EKV_ERR_OVERFLOW, "too many rows for KIVI groups");
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->frows, &m->cap_frows, (m->n_frows + 1) * D, sizeof(float));
    if (st != EKV_OK) return st;
    memcpy(m->frows + m->n_frows * D, x, D * sizeof(float));
    *code = PK_FROW | (uint32_t)m->n_frows++;
    return EKV_OK;
}

enum ekv_status ekv_vk_kivi_mean_row(struct ekv_vk_mg *m, uint32_t *row) {
    const size_t D = m->s->D;
    if (m->n_frows >= PK_RESID) return ekv_err(EKV_ERR_OVERFLOW, "too many rows for KIVI groups");
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->frows, &m->cap_frows, (m->n_frows + 1) * D, sizeof(float));
    if (st != EKV_OK) return st;
    memset(m->frows + m->n_frows * D, 0, D * sizeof(float)); /* kv_merge.comp writes it */
    *row = MG_HI | (uint32_t)m->n_frows++;
    return EKV_OK;
}

/* Where entry j's new row is, as a kivi_pack member (0: none): floats the
 * host gives (added to frows now) or a device mean's row of frows. */
static enum ekv_status new_row_code(struct ekv_vk_mg *m, const float *const *of, const int32_t *mean_of, int32_t j,
                                    uint32_t *code) {
    *code = 0;
    if (of && of[j]) return add_frow(m, of[j], code);
    if (mean_of && mean_of[j] >= 0) *code = PK_FROW | m->means[mean_of[j]].row;
    return EKV_OK;
}

static enum ekv_status add_member(struct ekv_vk_mg *m, uint32_t code) {
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->pmembers, &m->cap_pmembers, m->n_pmembers + 1, 4);
    if (st == EKV_OK) m->pmembers[m->n_pmembers++] = code;
    return st;
}

/* A KIVI unit of side (MG_K: a group of n entries, its codes into n stage
 * rows and its parameters into one of MG_KPAR; MG_V: one entry) whose
 * members are added next; *crow: the stage code of its first codes row,
 * *prow: of its parameters (keys). */
static enum ekv_status add_pack(struct ekv_vk_mg *m, int side, int il, int hk, uint32_t n, uint32_t *crow, uint32_t *prow) {
    enum ekv_status st = ekv_vk_mg_grow((void **)&m->packs, &m->cap_packs, m->n_packs + 1, sizeof *m->packs);
    uint32_t c = 0, p = 0, more;
    for (uint32_t i = 0; i < n && st == EKV_OK; i++) st = ekv_vk_mg_stage_blank(m, side, i ? &more : &c); /* rows in a row */
    if (st == EKV_OK && side == MG_K) st = ekv_vk_mg_stage_blank(m, MG_KPAR, &p);
    if (st != EKV_OK) return st;
    m->packs[m->n_packs++] = (struct mg_pack){.il = il, .hk = hk, .side = side, .phase = m->phase, .n = n,
                                              .first = (uint32_t)m->n_pmembers,
                                              .crow = c & ~MG_HI, .prow = p & ~MG_HI};
    *crow = c;
    if (prow) *prow = p;
    return EKV_OK;
}

/* The key groups of head (il, hk) after keeping keep[j] of its quantised
 * entries (of[j] / mean_of[j]: a new row, either may be NULL; join:
 * ekv_store_kgroups_plan's):
 * the codes rows (MG_K: kept groups' rows move, re-quantised groups come
 * from kivi_pack), the groups' parameters (MG_KPAR) and the group of each
 * entry (MG_KGIX) as plans; *out / *n_out the groups (the caller frees). */
static enum ekv_status key_groups(struct ekv_vk_mg *m, int il, int hk, const uint8_t *keep, const float *const *of,
                                  const int32_t *mean_of, bool join, struct ekv_kgroup_out **out_p, int32_t *n_out) {
    struct ekv_kv_store *st_ = store_of(m, MG_K, il, hk);
    const int32_t nq = st_->nq, ng = st_->ng;
    struct ekv_kgroup_out *out = malloc((size_t)(ng ? ng : 1) * sizeof *out);
    const bool any = of || mean_of;
    uint8_t *nr = any && nq ? malloc((size_t)nq) : NULL;
    uint32_t *pcode = malloc((size_t)(ng ? ng : 1) * sizeof *pcode);
    *out_p = out;
    *n_out = 0;
    if (!out || !pcode || (any && nq && !nr)) {
        free(nr), free(pcode);
        return ekv_err(EKV_ERR_NOMEM, "out of memory for %d key groups", (int)ng);
    }
    for (int32_t j = 0; nr && j < nq; j++) nr[j] = (of && of[j]) || (mean_of && mean_of[j] >= 0);
    const int32_t no = ekv_store_kgroups_plan(st_->gn, ng, m->s->G, keep, nr, join, out);
    *n_out = no;
    free(nr);
    /* (two neighbouring groups hold more than G entries: never more groups than the layout's) */
    enum ekv_status st = no > (int32_t)m->s->k.ngc ? ekv_err(EKV_ERR_INTERNAL, "%d key groups for %u", (int)no, m->s->k.ngc)
                                                   : EKV_OK;
    /* codes: a kept group's kept rows move down; a re-quantised group's come from its unit */
    size_t first = m->n_pairs;
    uint32_t e = 0;
    for (int32_t o = 0, sg = 0, sf = 0; o < no && st == EKV_OK; o++) {
        for (; sg < out[o].src0; sg++) sf += st_->gn[sg];
        if (!out[o].requant) {
            for (int32_t r = 0; r < st_->gn[sg] && st == EKV_OK; r++)
                if (keep[sf + r]) {
                    if ((uint32_t)(sf + r) != e) st = ekv_vk_mg_add_pair(m, first, e, (uint32_t)(sf + r));
                    e++;
                }
            sf += st_->gn[sg++];
            continue;
        }
        uint32_t crow;
        st = add_pack(m, MG_K, il, hk, (uint32_t)out[o].n, &crow, &pcode[o]);
        for (; sg < out[o].src1 && st == EKV_OK; sf += st_->gn[sg++])
            for (int32_t r = 0; r < st_->gn[sg] && st == EKV_OK; r++) {
                const int32_t j = sf + r;
                if (!keep[j]) continue;
                uint32_t mc;
                st = new_row_code(m, of, mean_of, j, &mc);
                if (st == EKV_OK) st = add_member(m, mc ? mc : (uint32_t)j); /* else the entry where it is */
            }
        if (st == EKV_OK) st = ekv_vk_mg_add_run(m, first, e, crow, (uint32_t)out[o].n);
        e += (uint32_t)out[o].n;
    }
    if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_K, first);
    /* parameters: kept groups move down, re-quantised ones come from their units */
    first = m->n_pairs;
    for (int32_t o = 0; o < no && st == EKV_OK; o++) {
        if (out[o].requant) st = ekv_vk_mg_add_pair(m, first, (uint32_t)o, pcode[o]);
        else if (out[o].src0 != o) st = ekv_vk_mg_add_pair(m, first, (uint32_t)o, (uint32_t)out[o].src0);
    }
    if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_KPAR, first);
    /* the group of each entry, where it changes (a new group number or a moved entry) */
    first = m->n_pairs;
    e = 0;
    for (int32_t o = 0, sg = 0, sf = 0; o < no && st == EKV_OK; o++) {
        for (; sg < out[o].src0; sg++) sf += st_->gn[sg];
        for (; sg < out[o].src1 && st == EKV_OK; sf += st_->gn[sg++])
            for (int32_t r = 0; r < st_->gn[sg] && st == EKV_OK; r++) {
                if (!keep[sf + r]) continue;
                if ((uint32_t)(sf + r) != e || sg != o) {
                    uint32_t code, g = (uint32_t)o;
                    st = stage_words(m, MG_KGIX, &g, 1, &code);
                    if (st == EKV_OK) st = ekv_vk_mg_add_pair(m, first, e, code);
                }
                e++;
            }
    }
    if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_KGIX, first);
    free(pcode);
    return st;
}

enum ekv_status ekv_vk_kivi_compact(struct ekv_vk_mg *m, int side, int il, int hk, int32_t len, const uint8_t *keep,
                                    const float *const *of, const int32_t *mean_of) {
    struct ekv_kv_store *sto = store_of(m, side, il, hk);
    const int32_t nq = sto->nq;
    const int rs = side == MG_V ? MG_VRES : MG_KRES;
    struct ekv_kgroup_out *out = NULL;
    int32_t n_out = 0;
    enum ekv_status st = EKV_OK;
    if (side == MG_V) { /* rows with their parameters, by runs; a new row quantised here */
        const size_t first = m->n_pairs;
        uint32_t e = 0;
        for (int32_t j = 0; j < nq && st == EKV_OK; j++) {
            if (!keep[j]) continue;
            uint32_t src = (uint32_t)j;
            if (of && of[j]) {
                st = stage_vrow(m, of[j], &src);
            } else if (mean_of && mean_of[j] >= 0) { /* a device mean: quantised by kivi_pack */
                st = add_pack(m, MG_V, il, hk, 1, &src, NULL);
                if (st == EKV_OK) st = add_member(m, PK_FROW | m->means[mean_of[j]].row);
            }
            if (st == EKV_OK && src != e) st = ekv_vk_mg_add_pair(m, first, e, src);
            e++;
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_V, first);
    } else {
        st = key_groups(m, il, hk, keep, of, mean_of, true, &out, &n_out);
    }
    /* the residual: kept entries from slot j - nq to slot e, their place among the kept residual entries */
    const size_t first = m->n_pairs;
    uint32_t e = 0;
    for (int32_t j = nq; j < len && st == EKV_OK; j++) {
        if (!keep[j]) continue;
        uint32_t src = (uint32_t)(j - nq);
        if (of && of[j]) {
            st = stage_f16(m, rs, of[j], &src);
        } else if (mean_of && mean_of[j] >= 0) { /* a device mean: kv_merge writes it there in fp16 */
            st = ekv_vk_mg_stage_blank(m, rs, &src);
            m->means[mean_of[j]].r16 = src & ~MG_HI;
        }
        if (st == EKV_OK && src != e) st = ekv_vk_mg_add_pair(m, first, e, src);
        e++;
    }
    if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, rs, first);
    if (st == EKV_OK) st = ekv_store_note_compact(fmt_of(m, side), sto, len, keep, out, n_out);
    free(out);
    return st;
}

enum ekv_status ekv_vk_kivi_write(struct ekv_vk_mg *m, int side, int il, int hk, int32_t len, const int32_t *idx,
                                  int32_t n, const float *x) {
    struct ekv_kv_store *sto = store_of(m, side, il, hk);
    const int32_t nq = sto->nq;
    const size_t D = m->s->D;
    const int rs = side == MG_V ? MG_VRES : MG_KRES;
    enum ekv_status st = EKV_OK;
    size_t first = m->n_pairs;
    if (side == MG_V) {
        for (int32_t t = 0; t < n && st == EKV_OK; t++) {
            if (idx[t] >= nq) continue;
            uint32_t code;
            st = stage_vrow(m, x + (size_t)t * D, &code);
            if (st == EKV_OK) st = ekv_vk_mg_add_pair(m, first, (uint32_t)idx[t], code);
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_V, first);
    } else if (nq > 0) { /* the groups that hold a written entry, re-quantised with it (no group joins) */
        uint8_t *keep = malloc((size_t)nq);
        const float **of = calloc((size_t)nq, sizeof *of);
        if (!keep || !of) st = ekv_err(EKV_ERR_NOMEM, "out of memory for a write of %d keys", (int)n);
        struct ekv_kgroup_out *out = NULL;
        int32_t n_out = 0;
        if (st == EKV_OK) {
            memset(keep, 1, (size_t)nq);
            for (int32_t t = 0; t < n; t++)
                if (idx[t] < nq) of[idx[t]] = x + (size_t)t * D;
            st = key_groups(m, il, hk, keep, of, NULL, false, &out, &n_out);
        }
        free(keep), free(of), free(out);
    }
    first = m->n_pairs; /* rows in the residual: fp16 */
    for (int32_t t = 0; t < n && st == EKV_OK; t++) {
        if (idx[t] < nq) continue;
        uint32_t code;
        st = stage_f16(m, rs, x + (size_t)t * D, &code);
        if (st == EKV_OK) st = ekv_vk_mg_add_pair(m, first, (uint32_t)(idx[t] - nq), code);
    }
    if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, rs, first);
    (void)len;
    return st;
}

/* The residual rule for one side of a head: kivi_pack quantises the oldest
 * cnt tail entries where they are (slots 0 .. cnt - 1) into new key groups of
 * G or value rows after the quantised ones, the rest of the residual moves
 * to the front. */
static enum ekv_status flush_side(struct ekv_vk_mg *m, int side, int il, int hk, int32_t len, int32_t cnt) {
    struct ekv_kv_store *sto = store_of(m, side, il, hk);
    const struct ekv_store_fmt *f = fmt_of(m, side);
    const int32_t nq = sto->nq, tail = len - nq;
    if (cnt <= 0) return EKV_OK;
    const uint32_t G = m->s->G;
    enum ekv_status st = EKV_OK;
    size_t first = m->n_pairs;
    if (side == MG_V) {
        for (int32_t e = 0; e < cnt && st == EKV_OK; e++) {
            uint32_t crow;
            st = add_pack(m, MG_V, il, hk, 1, &crow, NULL);
            if (st == EKV_OK) st = add_member(m, PK_RESID | (uint32_t)e);
            if (st == EKV_OK) st = ekv_vk_mg_add_pair(m, first, (uint32_t)(nq + e), crow);
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_V, first);
    } else {
        const int32_t ngrp = cnt / (int32_t)G, ng = sto->ng;
        if (ng + ngrp > (int32_t)m->s->k.ngc)
            return ekv_err(EKV_ERR_INTERNAL, "%d key groups for %u", (int)(ng + ngrp), m->s->k.ngc);
        uint32_t *pcode = malloc((size_t)(ngrp ? ngrp : 1) * sizeof *pcode);
        if (!pcode) return ekv_err(EKV_ERR_NOMEM, "out of memory for %d key groups", (int)ngrp);
        for (int32_t t = 0; t < ngrp && st == EKV_OK; t++) {
            uint32_t crow;
            st = add_pack(m, MG_K, il, hk, G, &crow, &pcode[t]);
            for (uint32_t r = 0; r < G && st == EKV_OK; r++) st = add_member(m, PK_RESID | (uint32_t)(t * (int32_t)G + (int32_t)r));
            if (st == EKV_OK) st = ekv_vk_mg_add_run(m, first, (uint32_t)(nq + t * (int32_t)G), crow, G);
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_K, first);
        first = m->n_pairs;
        for (int32_t t = 0; t < ngrp && st == EKV_OK; t++) st = ekv_vk_mg_add_pair(m, first, (uint32_t)(ng + t), pcode[t]);
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_KPAR, first);
        first = m->n_pairs;
        for (int32_t e = 0; e < cnt && st == EKV_OK; e++) {
            uint32_t code, g = (uint32_t)(ng + e / (int32_t)G);
            st = stage_words(m, MG_KGIX, &g, 1, &code);
            if (st == EKV_OK) st = ekv_vk_mg_add_pair(m, first, (uint32_t)(nq + e), code);
        }
        if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, MG_KGIX, first);
        free(pcode);
    }
    first = m->n_pairs;
    if (st == EKV_OK && tail > cnt) st = ekv_vk_mg_add_run(m, first, 0, (uint32_t)cnt, (uint32_t)(tail - cnt));
    if (st == EKV_OK) st = ekv_vk_mg_add_plan(m, il, hk, side == MG_V ? MG_VRES : MG_KRES, first);
    return st == EKV_OK ? ekv_store_note_flush(f, sto, cnt) : st;
}

enum ekv_status ekv_vk_kivi_flush(void *user, int il, int hk, int32_t len) {
    struct ekv_vk_mg *m = user;
    int32_t cnt[2] = {0, 0}; /* tail entries each side quantises */
    for (int side = MG_K; side <= MG_V; side++)
        if (mg_side_of(m, side)->managed) cnt[side] = ekv_store_flush_count(fmt_of(m, side), store_of(m, side, il, hk), len);
    if (cnt[MG_K] <= 0 && cnt[MG_V] <= 0) return EKV_OK;
    enum ekv_status st = ekv_vk_mg_head_touch(m, il, hk); /* the head's earlier plan runs first */
    for (int side = MG_K; side <= MG_V && st == EKV_OK; side++) st = flush_side(m, side, il, hk, len, cnt[side]);
    return st;
}

enum ekv_status ekv_vk_kivi_read(struct ekv_vk_mg *m, int side, int il, int hk, int32_t len, float *out) {
    const struct ekv_vk_seq *s = m->s;
    const struct ekv_vk_side *sd = mg_side_of(m, side);
    const struct ekv_kv_store *sto = store_of(m, side, il, hk);
    const int32_t nq = sto->nq;
    const uint32_t D = s->D, G = s->G, rw = m->rw[side], bits = rw * 32 / D;
    const size_t np = side == MG_V ? (size_t)nq * (D / G) : (size_t)sto->ng * D; /* parameter words */
    const size_t cw = (size_t)nq * rw, rwords = (size_t)(len - nq) * D / 2;
    uint32_t *buf = malloc((cw + np + rwords + 1) * 4);
    if (!buf) return ekv_err(EKV_ERR_NOMEM, "out of memory to read back %d entries", (int)len);
    uint32_t *codes = buf, *par = buf + cw;
    const uint16_t *res = (const uint16_t *)(buf + cw + np);
    const uint64_t h = (uint64_t)hk, C = (uint64_t)s->cap;
    const uint64_t p_off = side == MG_V ? sd->p0 + h * C * (D / G) : sd->p0 + h * sd->ngc * D;
    enum ekv_status st = EKV_OK;
    if (cw) st = ekv_vk_download(m->g->vk, &sd->buf[il], h * C * rw * 4, codes, cw * 4);
    if (st == EKV_OK && np) st = ekv_vk_download(m->g->vk, &sd->buf[il], p_off * 4, par, np * 4);
    if (st == EKV_OK && rwords)
        st = ekv_vk_download(m->g->vk, &sd->buf[il], (sd->r0 + h * sd->tc * D / 2) * 4, (void *)res, rwords * 4);
    if (st != EKV_OK) {
        free(buf);
        return st;
    }
    const uint32_t mask = (1u << bits) - 1u;
    for (int32_t j = 0, g = 0, in_g = 0; j < nq; j++) { /* code * scale + minimum, as ekv_kivi_dequant_* */
        if (side == MG_K && in_g == sto->gn[g]) g++, in_g = 0;
        for (uint32_t c = 0; c < D; c++) {
            const uint32_t bit = c * bits, q = (codes[(size_t)j * rw + bit / 32] >> (bit % 32)) & mask;
            const uint32_t pw = side == MG_V ? par[(size_t)j * (D / G) + c / G] : par[(size_t)g * D + c];
            out[(size_t)j * D + c] = (float)q * ekv_fp16_to_f32((uint16_t)(pw & 0xffff)) + ekv_fp16_to_f32((uint16_t)(pw >> 16));
        }
        in_g++;
    }
    if (len > nq) ekv_dequant_f16(res, out + (size_t)nq * D, (int64_t)(len - nq) * D);
    free(buf);
    return EKV_OK;
}

void ekv_vk_kivi_copy_side(struct ekv_vk_mg *m, int side, const struct ekv_vk_side *nsd, const struct ekv_vk_seq *ns,
                           const int32_t *lens) {
    const struct ekv_vk_seq *s = m->s;
    const struct ekv_vk_side *sd = mg_side_of(m, side);
    const uint64_t D = s->D, G = s->G, rw = m->rw[side], oc = (uint64_t)s->cap, nc = (uint64_t)ns->cap;
    struct ekv_vk *vk = m->g->vk;
    for (int32_t il = 0; il < s->n_layer; il++)
        for (uint32_t h = 0; h < s->H; h++) {
            const struct ekv_kv_store *sto = store_of(m, side, il, (int)h);
            const uint64_t nq = (uint64_t)sto->nq, tail = (uint64_t)lens[(size_t)il * s->H + h] - nq;
            struct ekv_vk_buf *a = &sd->buf[il], *b = &nsd->buf[il];
            if (nq) ekv_vk_copy(vk, a, h * oc * rw * 4, b, h * nc * rw * 4, nq * rw * 4);
            if (nq && side == MG_V)
                ekv_vk_copy(vk, a, (sd->p0 + h * oc * (D / G)) * 4, b, (nsd->p0 + h * nc * (D / G)) * 4, nq * (D / G) * 4);
            if (sto->ng && side == MG_K)
                ekv_vk_copy(vk, a, (sd->p0 + h * sd->ngc * D) * 4, b, (nsd->p0 + h * nsd->ngc * D) * 4,
                            (uint64_t)sto->ng * D * 4);
            if (nq && side == MG_K) ekv_vk_copy(vk, a, (sd->x0 + h * oc) * 4, b, (nsd->x0 + h * nc) * 4, nq * 4);
            if (tail)
                ekv_vk_copy(vk, a, (sd->r0 + h * sd->tc * D / 2) * 4, b, (nsd->r0 + h * nsd->tc * D / 2) * 4, tail * D * 2);
        }
}
