/*
 * backend_vk_policy.c — compressed KV caches on the GPU (the plans that
 * act on the rows: backend_vk_plan.c): every policy but
 * full, with the policy code of src/kv unchanged (it decides; the device
 * holds the rows and executes).
 *
 * The sequence's host cache (seq->kv) keeps what policies read and write
 * besides the rows: positions, tags, merge weights, statistics, one entry
 * per row the device holds, in the same order; its kv->dev calls reach the
 * rows. A forward on the device then goes:
 *   part begin (ekv_vk_mg_part_begin): the policy's begin, the part's
 *     entries appended to every (layer, KV head) of the host cache, and the
 *     length each head had before them written to a small host-visible
 *     "meta" block per layer, with the log(weight) logit biases when the
 *     policy asks for them (elastic-v2:bias=1);
 *   per layer: rope_store appends the rows after each head's own entries,
 *     attn + attn_combine attend over each head's own length (causal by
 *     index: row i sees entries [0, L0 + i]), and attn_stats computes the
 *     statistics the policy asked for (EKV_STAT_*) as this forward's
 *     increments (or, while the policy will not read them — SnapKV,
 *     PyramidKV, VL-Cache between re-selection points — sums them into a
 *     device buffer, acc, whose total the re-selection step reads back:
 *     acc_begin);
 *   after the submission (ekv_vk_mg_after): per layer, the increments are
 *     added to the host cache's statistics and the policy's layer hook runs
 *     (as the CPU runs it right after the layer: a hook compacts its own
 *     layer only, so running it after the last layer gives the same result),
 *     then its end hook. What the hooks decide — keep these entries, give
 *     this kept entry a new (merged) row — becomes plans, which
 *     kv_compact.comp executes in one submission for all the forward's
 *     sequences: rows move by their bits,
 *     new rows are quantised on the host with the CPU's own codecs (so they
 *     are the codes the CPU cache would hold).
 * Weighted means of merged entries (ekv_kv_head_merge: Elastic Cache,
 * elastic-v2's default key=mean) are computed on the device too
 * (kv_merge.comp, before the compaction in the same submission), the
 * merging rules of elastic-v2 and +merge too (key=rotate: each member's key
 * turned to its survivor's position there; key=anchor; value=attn's member
 * weights: ekv_kv_head_merge_rule). A policy that reads rows itself
 * (Elastic's reference mode, +merge's merge_to=key similarity) gets them
 * read back, a head at a time (kept until the head changes).
 *
 * The buffers hold `cap` entries per (layer, KV head), the host cache's
 * lengths say how many are in use. cap follows what is kept, as the CPU's
 * capacity does: a forward that needs more moves the cache to buffers of
 * max(need, 1.5 cap) entries for a prompt, need + slack for a decode step
 * (copies recorded before its own work, the old
 * buffers freed once it ran), and after the policy acted a cache with more
 * than twice its slack of room (64 entries, plus --kv-recompress N for a
 * re-selecting policy) moves to its longest head + slack (so memory, and
 * --kv-mem's device bytes, follow the budget).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend_vk_mg.h"
#include "gpu/vk_push.h"
#include "kernels/kvquant.h"


bool ekv_vk_mg_supported(const struct ekv_seq *seq, const char **why) {
    const struct ekv_model_info *in = &seq->ctx->model->info;
    const int R = in->n_head / in->n_head_kv;
    if (R > 64 || (int64_t)R * in->head_dim > 4096) {
        *why = "the GPU's statistics need n_head / n_head_kv <= 64 and that times head_dim <= 4096";
        return false;
    }
    return true;
}

/* Words of the statistics summed on the device (acc's layout). */
static uint64_t acc_words(const struct ekv_vk_mg *m) {
    return (uint64_t)m->s->n_layer * m->acc_nslot * m->s->H * m->acc_cap;
}

/* Entries of room a cache keeps past its longest head: 64, plus the
 * entries a re-selecting policy adds between its re-selections. */
static int64_t mg_slack(const struct ekv_vk_mg *m) {
    const int32_t n = m->seq->kv->params.recompress;
    return 64 + (n > 0 ? n : 0);
}

static void pend_record(struct ekv_vk_mg *m);

/* ---- capacity ---- */

void ekv_vk_mg_release(struct ekv_vk_ctx *g) {
    for (int32_t i = 0; i < g->n_old; i++) ekv_vk_buf_free(g->vk, &g->old[i]);
    g->n_old = 0;
}

/* Puts the per-layer buffers nb in place of *bufs; the old ones are freed
 * now, or after the open recording ran (in_rec). */
static void replace_bufs(struct ekv_vk_ctx *g, int32_t n_layer, struct ekv_vk_buf **bufs, struct ekv_vk_buf *nb,
                         bool in_rec) {
    for (int32_t il = 0; il < n_layer; il++) {
        if (in_rec) g->old[g->n_old++] = (*bufs)[il];
        else ekv_vk_buf_free(g->vk, &(*bufs)[il]);
    }
    free(*bufs);
    *bufs = nb;
}

/* Moves the cache to buffers of newcap entries per head (and newtc
 * residual slots per head of a compressed KIVI side), copying the first
 * lens[il][hk] entries of each head. With in_rec the copies go into the
 * open recording and the old buffers are freed after it ran; otherwise one
 * submission here. On failure the cache is as before. */
static enum ekv_status mg_resize(struct ekv_vk_mg *m, int32_t newcap, uint32_t newtc, const int32_t *lens, bool in_rec) {
    struct ekv_vk_ctx *g = m->g;
    struct ekv_vk_seq *s = m->s;
    struct ekv_vk_seq ns = *s;
    ns.cap = newcap;
    struct ekv_vk_side nsd[2] = {s->k, s->v};
    nsd[0].buf = nsd[1].buf = NULL; /* the new buffers, none yet */
    for (int side = 0; side < 2; side++)
        if (nsd[side].managed) nsd[side].tc = newtc;
    if (!ekv_vk_side_layout(&nsd[0], &ns) || !ekv_vk_side_layout(&nsd[1], &ns))
        return ekv_err(EKV_ERR_OVERFLOW, "a cache of %d entries per head is too large for one GPU buffer per layer",
                       (int)newcap);
    enum ekv_status st = ekv_vk_mg_grow((void **)&g->old, &g->cap_old, (size_t)g->n_old + 4 * (size_t)s->n_layer + 1, sizeof *g->old);
    struct ekv_vk_buf *nb = NULL, *np = NULL; /* new logit biases, positions */
    if (st == EKV_OK && m->bias) {
        nb = calloc((size_t)s->n_layer, sizeof *nb);
        if (!nb) st = ekv_err(EKV_ERR_NOMEM, "out of memory");
        for (int32_t il = 0; il < s->n_layer && st == EKV_OK; il++)
            st = ekv_vk_buf_new(g->vk, (size_t)s->H * (size_t)newcap * 4, false, "GPU cache logit biases", &nb[il]);
    }
    if (st == EKV_OK && m->posb) {
        np = calloc((size_t)s->n_layer, sizeof *np);
        if (!np) st = ekv_err(EKV_ERR_NOMEM, "out of memory");
        for (int32_t il = 0; il < s->n_layer && st == EKV_OK; il++)
            st = ekv_vk_buf_new(g->vk, (size_t)s->H * (size_t)newcap * 4, false, "GPU cache positions", &np[il]);
    }
    for (int side = 0; side < 2 && st == EKV_OK; side++) {
        nsd[side].buf = calloc((size_t)s->n_layer, sizeof *nsd[side].buf);
        if (!nsd[side].buf) st = ekv_err(EKV_ERR_NOMEM, "out of memory");
        for (int32_t il = 0; il < s->n_layer && st == EKV_OK; il++)
            st = ekv_vk_buf_new(g->vk, (size_t)nsd[side].words * 4, false, "KV cache", &nsd[side].buf[il]);
    }
    if (st == EKV_OK && !in_rec) st = ekv_vk_begin(g->vk);
    if (st != EKV_OK) {
        for (int side = 0; side < 2; side++)
            for (int32_t il = 0; nsd[side].buf && il < s->n_layer; il++) ekv_vk_buf_free(g->vk, &nsd[side].buf[il]);
        for (int32_t il = 0; nb && il < s->n_layer; il++) ekv_vk_buf_free(g->vk, &nb[il]);
        for (int32_t il = 0; np && il < s->n_layer; il++) ekv_vk_buf_free(g->vk, &np[il]);
        free(nsd[0].buf), free(nsd[1].buf), free(nb), free(np);
        return st;
    }
    pend_record(m); /* rows waiting for their statistics read the cache where it is */
    for (int32_t il = 0; np && il < s->n_layer; il++)
        for (uint32_t h = 0; h < s->H; h++) {
            const uint64_t len = (uint64_t)lens[(size_t)il * s->H + h];
            ekv_vk_copy(g->vk, &m->posb[il], h * (uint64_t)s->cap * 4, &np[il], h * (uint64_t)newcap * 4, len * 4);
        }
    for (int32_t il = 0; nb && il < s->n_layer; il++) { /* zero, then each head's biases */
        ekv_vk_fill(g->vk, &nb[il], 0, (size_t)s->H * (size_t)newcap * 4, 0);
        for (uint32_t h = 0; h < s->H; h++) {
            const uint64_t len = (uint64_t)lens[(size_t)il * s->H + h];
            ekv_vk_copy(g->vk, &m->bias[il], h * (uint64_t)s->cap * 4, &nb[il], h * (uint64_t)newcap * 4, len * 4);
        }
    }
    for (int side = 0; side < 2; side++) {
        struct ekv_vk_side *sd = mg_side_of(m, side);
        const uint64_t rw = m->rw[side], sph = m->sph[side], oc = (uint64_t)s->cap, nc = (uint64_t)newcap;
        if (sd->managed) {
            ekv_vk_kivi_copy_side(m, side, &nsd[side], &ns, lens);
            continue;
        }
        for (int32_t il = 0; il < s->n_layer; il++)
            for (uint32_t h = 0; h < s->H; h++) {
                const uint64_t len = (uint64_t)lens[(size_t)il * s->H + h];
                if (len == 0) continue;
                ekv_vk_copy(g->vk, &sd->buf[il], h * oc * rw * 4, &nsd[side].buf[il], h * nc * rw * 4, len * rw * 4);
                if (sph)
                    ekv_vk_copy(g->vk, &sd->buf[il], (2 * sd->p0 + h * oc * sph) * 2, &nsd[side].buf[il],
                                (2 * nsd[side].p0 + h * nc * sph) * 2, len * sph * 2);
            }
    }
    if (!in_rec) st = ekv_vk_submit(g->vk);
    for (int side = 0; side < 2; side++) {
        struct ekv_vk_side *sd = mg_side_of(m, side);
        for (int32_t il = 0; il < s->n_layer; il++) {
            if (in_rec) g->old[g->n_old++] = sd->buf[il];
            else ekv_vk_buf_free(g->vk, &sd->buf[il]);
        }
        free(sd->buf);
        *sd = nsd[side];
    }
    if (nb) replace_bufs(g, s->n_layer, &m->bias, nb, in_rec);
    if (np) replace_bufs(g, s->n_layer, &m->posb, np, in_rec);
    s->cap = newcap;
    m->rc_il = -1;
    return st; /* on failure the copies did not run: the cache's rows are lost */
}

/* The longest head now. */
static int32_t longest(const struct ekv_kv *kv) {
    int32_t mx = 0;
    for (int32_t il = 0; il < kv->n_layer; il++)
        for (int32_t hk = 0; hk < kv->n_head_kv; hk++) mx = EKV_MAX(mx, kv->layers[il].heads[hk].len);
    return mx;
}

/* Current lengths of every head, [n_layer][H]. */
static void lengths(const struct ekv_kv *kv, int32_t *out) {
    for (int32_t il = 0; il < kv->n_layer; il++)
        for (int32_t hk = 0; hk < kv->n_head_kv; hk++) out[(size_t)il * kv->n_head_kv + hk] = kv->layers[il].heads[hk].len;
}

/* ---- life ---- */

enum ekv_status ekv_vk_mg_new(struct ekv_vk_ctx *g, struct ekv_seq *seq, struct ekv_vk_seq *s) {
    struct ekv_vk_mg *m = calloc(1, sizeof *m);
    if (!m) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    m->g = g;
    m->seq = seq;
    m->s = s;
    m->rc_il = -1;
    for (int side = 0; side < 2; side++) {
        const struct ekv_vk_side *sd = mg_side_of(m, side);
        if (sd->managed) { /* KIVI codes; a value's parameters with it (kvq.glsl) */
            m->rw[side] = ekv_vk_row_words(sd->type, s->D);
            m->sph[side] = side ? 2 * (s->D / s->G) : 0;
        } else {
            ekv_vk_mg_side_shape(sd->type, s->D, &m->rw[side], &m->sph[side]);
        }
    }
    m->rw[MG_BIAS] = m->rw[MG_POS] = 1; /* a logit bias, a position: one word */
    m->rw[MG_KRES] = m->rw[MG_VRES] = s->D / 2; /* fp16 rows */
    m->rw[MG_KPAR] = s->D; /* a key group's parameters */
    m->rw[MG_KGIX] = 1;
    for (int side = 0; side < MG_SIDES; side++) m->srw[side] = m->rw[side] + (m->sph[side] + 1) / 2;
    const size_t LH = (size_t)s->n_layer * s->H;
    m->meta_words = 3 * s->H + 10; /* meta_write */
    m->L0 = calloc(LH, sizeof *m->L0);
    m->maxlen = calloc((size_t)s->n_layer, sizeof *m->maxlen);
    m->pending = calloc(LH, sizeof *m->pending);
    s->mg = m;
    if (!m->L0 || !m->maxlen || !m->pending) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    enum ekv_status st = ekv_vk_buf_new(g->vk, (size_t)s->n_layer * m->meta_words * 4, true, "GPU cache lengths", &m->meta);
    if (st == EKV_OK)
        st = ekv_vk_buf_new(g->vk, (size_t)s->n_layer * m->meta_words * 4, true, "GPU cache lengths (deferred statistics)",
                            &m->pmeta);
    if (st != EKV_OK) return st;
    st = ekv_vk_prepare(g->vk, EKV_VK_KV_COMPACT);
    if (st == EKV_OK) st = ekv_vk_prepare(g->vk, ekv_vk_attn_stats_pipe(s->k.type));
    for (int side = 0; side < 2 && st == EKV_OK; side++) {
        const struct ekv_vk_side *sd = mg_side_of(m, side);
        st = ekv_vk_prepare(g->vk, ekv_vk_kv_merge_pipe(sd->type, side == 1));
        if (sd->managed && st == EKV_OK) st = ekv_vk_prepare(g->vk, ekv_vk_kivi_pack_pipe(sd->type, side == 1));
    }
    if (st != EKV_OK) return st;
    if (seq->kv->logit_bias) { /* zeroed biases of cap entries per head */
        m->bias = calloc((size_t)s->n_layer, sizeof *m->bias);
        if (!m->bias) return ekv_err(EKV_ERR_NOMEM, "out of memory");
        for (int32_t il = 0; il < s->n_layer && st == EKV_OK; il++)
            st = ekv_vk_buf_new(g->vk, (size_t)s->H * (size_t)s->cap * 4, false, "GPU cache logit biases", &m->bias[il]);
        if (st == EKV_OK) st = ekv_vk_begin(g->vk);
        if (st != EKV_OK) return st;
        for (int32_t il = 0; il < s->n_layer; il++) ekv_vk_fill(g->vk, &m->bias[il], 0, (size_t)s->H * (size_t)s->cap * 4, 0);
        if ((st = ekv_vk_submit(g->vk)) != EKV_OK) return st;
    }
    if (seq->ctx->model->info.sliding_window > 0) { /* each entry's position, for the window */
        m->posb = calloc((size_t)s->n_layer, sizeof *m->posb);
        if (!m->posb) return ekv_err(EKV_ERR_NOMEM, "out of memory");
        for (int32_t il = 0; il < s->n_layer && st == EKV_OK; il++)
            st = ekv_vk_buf_new(g->vk, (size_t)s->H * (size_t)s->cap * 4, false, "GPU cache positions", &m->posb[il]);
        if (st != EKV_OK) return st;
    }
    ekv_vk_mg_dev_init(m);
    seq->kv->dev = &m->dev;
    return EKV_OK;
}

enum ekv_status ekv_vk_mg_copy(struct ekv_vk_ctx *g, const struct ekv_vk_seq *src, struct ekv_vk_seq *dst) {
    const struct ekv_vk_mg *a = src->mg;
    struct ekv_vk_mg *b = dst->mg;
    const size_t bytes = (size_t)dst->H * (size_t)dst->cap * 4;
    for (int32_t il = 0; il < dst->n_layer; il++) {
        if (a->bias && b->bias) ekv_vk_copy(g->vk, &a->bias[il], 0, &b->bias[il], 0, bytes);
        if (a->posb && b->posb) ekv_vk_copy(g->vk, &a->posb[il], 0, &b->posb[il], 0, bytes);
    }
    if (!a->acc_pending) return EKV_OK;
    /* statistics summed on the device and not yet in the host cache: the copy goes on summing them */
    b->acc_cap = a->acc_cap, b->acc_nslot = a->acc_nslot;
    memcpy(b->acc_slot, a->acc_slot, sizeof a->acc_slot);
    const size_t ab = (size_t)acc_words(a) * 4;
    enum ekv_status st = ekv_vk_buf_new(g->vk, a->acc.bytes, false, "GPU cache statistics (sums)", &b->acc);
    if (st != EKV_OK) return st;
    ekv_vk_fill(g->vk, &b->acc, 0, b->acc.bytes & ~(size_t)3, 0);
    ekv_vk_copy(g->vk, &a->acc, 0, &b->acc, 0, ab);
    b->acc_pending = true;
    return EKV_OK;
}

void ekv_vk_mg_free(struct ekv_vk_ctx *g, struct ekv_vk_seq *s) {
    struct ekv_vk_mg *m = s ? s->mg : NULL;
    if (!m) return;
    if (m->seq && m->seq->kv && m->seq->kv->dev == &m->dev) m->seq->kv->dev = NULL;
    for (int32_t i = 0; i < g->n_fwd_mg; i++)
        if (g->fwd_mg[i] == m) g->fwd_mg[i] = g->fwd_mg[--g->n_fwd_mg];
    ekv_vk_buf_free(g->vk, &m->meta);
    ekv_vk_buf_free(g->vk, &m->st);
    ekv_vk_buf_free(g->vk, &m->acc);
    ekv_vk_buf_free(g->vk, &m->acc_host);
    ekv_vk_buf_free(g->vk, &m->pend);
    ekv_vk_buf_free(g->vk, &m->pmeta);
    for (int32_t il = 0; m->bias && il < s->n_layer; il++) ekv_vk_buf_free(g->vk, &m->bias[il]);
    free(m->bias);
    for (int32_t il = 0; m->posb && il < s->n_layer; il++) ekv_vk_buf_free(g->vk, &m->posb[il]);
    free(m->posb);
    for (int side = 0; side < MG_SIDES; side++) free(m->stage[side]);
    free(m->packs);
    free(m->pmembers);
    free(m->frows);
    free(m->L0);
    free(m->maxlen);
    free(m->pending);
    free(m->plans);
    free(m->pairs);
    free(m->means);
    free(m->members);
    free(m->rots);
    free(m->rot_keys);
    free(m->rot_hash);
    free(m->rc_k);
    free(m->rc_v);
    free(m->rc_raw);
    free(m);
    s->mg = NULL;
}

enum ekv_status ekv_vk_mg_read_bias(const struct ekv_vk_mg *m, int il, float *out) {
    if (!m || !m->bias || il < 0 || il >= m->s->n_layer) return ekv_err(EKV_ERR_INVALID_ARG, "no logit biases for layer %d", il);
    return ekv_vk_download(m->g->vk, &m->bias[il], 0, out, (size_t)m->s->H * (size_t)m->s->cap * 4);
}

uint64_t ekv_vk_mg_read_backs(const struct ekv_vk_mg *m) { return m ? m->n_read_back : 0; }

uint64_t ekv_vk_mg_posb(const struct ekv_vk_mg *m, int il) { return m && m->posb ? m->posb[il].addr : 0; }

uint64_t ekv_vk_mg_meta(const struct ekv_vk_mg *m, int il) {
    return m->meta.addr + (uint64_t)il * m->meta_words * 4;
}

int32_t ekv_vk_mg_max_len(const struct ekv_vk_mg *m, int il) { return m->maxlen[il]; }

bool ekv_vk_mg_wants_stats(const struct ekv_vk_mg *m) { return m && m->any_stats; }

bool ekv_vk_mg_stats_now(const struct ekv_vk_mg *m) { return m && m->any_stats && (!m->pend_on || m->pend_pass); }

/* ---- deferred statistics (the ring of decode rows, backend_vk_mg.h) ---- */

static uint32_t q_width(const struct ekv_vk_mg *m) {
    return (uint32_t)ekv_act_width(&m->seq->ctx->model->info, EKV_ACT_Q);
}

static uint64_t pend_q(const struct ekv_vk_mg *m, int il, int32_t slot) {
    return m->pend.addr + ((uint64_t)il * MG_PEND + (uint64_t)slot) * q_width(m) * 4;
}

static uint64_t pend_ml(const struct ekv_vk_mg *m, int il, int32_t slot) {
    const uint64_t nh = (uint64_t)m->seq->ctx->model->info.n_head;
    return m->pend.addr + ((uint64_t)m->s->n_layer * MG_PEND * q_width(m) + ((uint64_t)il * MG_PEND + (uint64_t)slot) * nh * 2) * 4;
}

uint64_t ekv_vk_mg_qdst(const struct ekv_vk_mg *m, int il) { return m && m->pend_on ? pend_q(m, il, m->n_pend) : 0; }

uint64_t ekv_vk_mg_ml(const struct ekv_vk_mg *m, int il, uint64_t dflt) {
    return m && m->pend_on ? pend_ml(m, il, m->n_pend) : dflt;
}

/* One attn_stats dispatch of layer il: rows query rows at q (stride
 * q_stride floats) with their row sums at ml, over the heads' entries from
 * the lengths in meta on (rows [0, wrow) outside the window), into the
 * statistics slots sl[] of a [n_slot][H][cap] layout, in mode (MG_ACC_*). */
struct stats_call {
    uint64_t q, ml, meta;
    uint32_t q_stride, rows, wrow, pos0, mode, n_slot, cap;
    const uint32_t *sl;
    bool sparsity; /* VL-Cache's counts too (never summed into acc) */
};

static void stats_dispatch(struct ekv_vk_mg *m, int il, const struct stats_call *c, bool barrier) {
    struct ekv_vk_ctx *g = m->g;
    const struct ekv_vk_seq *s = m->s;
    const struct ekv_kv *kv = m->seq->kv;
    const uint64_t layer = (uint64_t)il * c->n_slot * s->H * c->cap * 4;
    struct ekv_vk_pc_attn_stats pc = {
        .q = c->q, .kc = s->k.buf[il].addr, .ml = c->ml, .meta = c->meta, .st = m->st.addr + layer,
        .zeros = m->st.addr + (m->zeros_off + (uint64_t)il * s->H * m->nblk) * 4,
        .n_head = (uint32_t)m->seq->ctx->model->info.n_head, .n_head_kv = s->H, .head_dim = s->D,
        .n_ctx = (uint32_t)s->cap, .rows = c->rows, .q_stride = c->q_stride, .cap = c->cap, .wrow = c->wrow,
        .s_colsum = c->sl[SL_COLSUM], .s_sumsq = c->sl[SL_SUMSQ], .s_last = c->sl[SL_LAST], .s_win = c->sl[SL_WIN],
        .s_bin = c->sl[SL_BIN], .flags = (c->sparsity ? 1u : 0u) | c->mode << 1,
        .acc = c->mode != MG_ACC_NONE ? m->acc.addr + layer : 0, .scale = 1.0f / sqrtf((float)s->D),
        .sparsity_p = (float)kv->params.sparsity_p /* resolved by vlcache.c */,
        .window = m->posb ? (uint32_t)kv->swa_window : 0, .pos0 = c->pos0};
    const uint32_t gx = (uint32_t)((m->maxlen[il] + 63) / 64);
    /* workgroups past a head's length do nothing but write their (zero) sparsity block */
    (barrier ? ekv_vk_dispatch : ekv_vk_dispatch_nb)(g->vk, ekv_vk_attn_stats_pipe(s->k.type), &pc, sizeof pc,
                                                     c->sparsity ? m->nblk : gx, s->H, 1);
}

/* Records, into the open recording, the pass over the n_pend waiting rows
 * (summed into acc), and forgets them: the caller keeps n_pend_prev for an
 * aborted recording. */
static void pend_record(struct ekv_vk_mg *m) {
    if (m->n_pend <= 0) return;
    for (int32_t il = 0; il < m->s->n_layer; il++) {
        const struct stats_call c = {.q = pend_q(m, il, 0), .ml = pend_ml(m, il, 0),
                                     .meta = m->pmeta.addr + (uint64_t)il * m->meta_words * 4, .q_stride = q_width(m),
                                     .rows = (uint32_t)m->n_pend, .wrow = 0, .pos0 = (uint32_t)m->pend_pos0,
                                     .mode = MG_ACC_ADD, .n_slot = m->acc_nslot, .cap = m->acc_cap, .sl = m->acc_slot};
        stats_dispatch(m, il, &c, true);
    }
    m->n_pend = 0;
    m->pend_flushed = true;
}

enum ekv_status ekv_vk_mg_pend_sync(struct ekv_vk_mg *m) {
    if (!m || m->n_pend <= 0) return EKV_OK;
    if (m->in_fwd) return ekv_err(EKV_ERR_INVALID_ARG, "GPU cache statistics: a forward is open");
    enum ekv_status st = ekv_vk_begin(m->g->vk);
    if (st != EKV_OK) return st;
    const int32_t n = m->n_pend;
    pend_record(m);
    m->pend_flushed = false;
    if ((st = ekv_vk_submit(m->g->vk)) != EKV_OK) m->n_pend = n; /* the rows still wait */
    return st;
}

/* Whether this forward's decode row waits in the ring (or runs the pass over
 * the ring with it); rows waiting that cannot go on waiting are summed into
 * acc first. Called once acc_begin chose acc_mode; meta is this forward's. */
static void pend_begin(struct ekv_vk_mg *m) {
    m->pend_on = m->pend_pass = false;
    const bool summed = m->acc_mode == MG_ACC_ADD || (m->acc_mode == MG_ACC_FINAL && m->n_pend > 0);
    bool defer = summed && !m->no_defer && m->n_rows == 1 && m->wrow == 0 && !m->sparsity && !m->pend_flushed &&
                 m->acc_cap == (uint32_t)m->s->cap;
    if (defer && !m->pend.buffer) {
        const struct ekv_model_info *in = &m->seq->ctx->model->info;
        const size_t words = (size_t)m->s->n_layer * MG_PEND * (q_width(m) + 2 * (size_t)in->n_head);
        defer = ekv_vk_mg_buf_fit(m->g->vk, &m->pend, words * 4, false, "GPU cache deferred statistics") == EKV_OK;
    }
    if (!defer) {
        pend_record(m); /* none, or the waiting rows summed before this forward's own statistics */
        return;
    }
    if (m->n_pend == 0) { /* a new run: the heads' lengths before its first row */
        memcpy(m->pmeta.host, m->meta.host, (size_t)m->s->n_layer * m->meta_words * 4);
        m->pend_pos0 = m->step.pos0;
    }
    m->pend_on = true;
    m->pend_pass = m->acc_mode == MG_ACC_FINAL || m->n_pend + 1 == MG_PEND;
}

void ekv_vk_mg_set_defer(struct ekv_vk_mg *m, bool on) {
    if (m) m->no_defer = !on;
}

uint64_t ekv_vk_mg_deferred(const struct ekv_vk_mg *m) { return m ? m->n_deferred : 0; }

/* ---- a forward ---- */

static bool acc_same_slots(const struct ekv_vk_mg *m) {
    return m->acc_nslot == m->n_slot && memcmp(m->acc_slot, m->slot, sizeof m->slot) == 0;
}

/* Records, into the open recording, a copy of the pending sums to acc_host
 * and acc's zeroing; the sums are added to the host cache after the
 * forward (acc_fold_host). */
static enum ekv_status acc_sync_record(struct ekv_vk_mg *m) {
    pend_record(m); /* rows still waiting are part of the sums */
    const size_t bytes = (size_t)acc_words(m) * 4;
    enum ekv_status st = ekv_vk_mg_buf_fit(m->g->vk, &m->acc_host, bytes, true, "GPU cache statistics (sums)");
    if (st != EKV_OK) return st;
    ekv_vk_copy(m->g->vk, &m->acc, 0, &m->acc_host, 0, bytes);
    ekv_vk_fill(m->g->vk, &m->acc, 0, bytes, 0);
    return EKV_OK;
}

/* Adds one head's values of statistic sl (SL_*) from the device, src[0, n),
 * to the host cache's array (lastrow: replaces it); a statistic the host
 * no longer keeps is dropped. */
static void add_stat(struct ekv_kv_head *h, int sl, const float *src, int32_t n) {
    double *d = sl == SL_COLSUM ? h->colsum : sl == SL_SUMSQ ? h->sumsq : sl == SL_WIN ? h->winsum : NULL;
    if (d)
        for (int32_t j = 0; j < n; j++) d[j] += (double)src[j];
    else if (sl == SL_BIN && h->bincount)
        for (int32_t j = 0; j < n; j++) h->bincount[j] += src[j];
    else if (sl == SL_LAST && h->lastrow)
        memcpy(h->lastrow, src, (size_t)n * sizeof *src);
}

/* Adds layer il's sums copied by acc_sync_record to the host cache. */
static void acc_fold_host(struct ekv_vk_mg *m, struct ekv_kv *kv, int il) {
    const uint32_t H = m->s->H, cap = m->acc_cap;
    const float *a = (const float *)m->acc_host.host + (size_t)il * m->acc_nslot * H * cap;
    for (uint32_t hk = 0; hk < H; hk++) {
        struct ekv_kv_head *h = &kv->layers[il].heads[hk];
        for (int sl = 0; sl < SL_COUNT; sl++)
            if (m->acc_slot[sl] != MG_NONE)
                add_stat(h, sl, a + ((size_t)m->acc_slot[sl] * H + hk) * cap, EKV_MIN(h->len, (int32_t)cap));
    }
}

enum ekv_status ekv_vk_mg_stats_sync(struct ekv_vk_mg *m) {
    if (!m || !m->acc_pending) return EKV_OK;
    if (m->in_fwd) return ekv_err(EKV_ERR_INVALID_ARG, "GPU cache statistics: a forward is open");
    enum ekv_status st = ekv_vk_begin(m->g->vk);
    if (st != EKV_OK) return st;
    const int32_t n_pend = m->n_pend;
    st = acc_sync_record(m);
    m->pend_flushed = false;
    if (st != EKV_OK) {
        ekv_vk_abort(m->g->vk);
        m->n_pend = n_pend;
        return st;
    }
    if ((st = ekv_vk_submit(m->g->vk)) != EKV_OK) {
        m->n_pend = n_pend;
        return st;
    }
    for (int32_t il = 0; il < m->s->n_layer; il++) acc_fold_host(m, m->seq->kv, il);
    m->acc_pending = false;
    return EKV_OK;
}

uint64_t ekv_vk_mg_summed(const struct ekv_vk_mg *m) { return m ? m->n_summed : 0; }

/* Whether this forward's statistics are summed on the device (MG_ACC_*):
 * only sums without per-entry row counts (sumsq, winsum, bincount; not
 * colsum, lastrow or the sparsity counts), on decode steps, while the
 * policy does not read them. Sums pending under another layout (the cache
 * moved to other buffers, other statistics) are copied out first. */
static enum ekv_status acc_begin(struct ekv_vk_mg *m, struct ekv_kv *kv) {
    m->acc_pending_prev = m->acc_pending;
    m->acc_fold_old = false;
    m->acc_mode = MG_ACC_NONE;
    const bool eligible = m->any_stats && !m->step.is_prompt && !m->sparsity && m->slot[SL_COLSUM] == MG_NONE &&
                          m->slot[SL_LAST] == MG_NONE;
    const bool reads = ekv_kv_stats_read_after(kv, &m->step);
    if (m->acc_pending && !(eligible && m->acc_cap == (uint32_t)m->s->cap && acc_same_slots(m))) {
        enum ekv_status st = acc_sync_record(m);
        if (st != EKV_OK) return st;
        m->acc_fold_old = true;
        m->acc_pending = false;
        return EKV_OK; /* this forward's own statistics as increments */
    }
    if (!eligible || (!m->acc_pending && reads)) return EKV_OK;
    if (!m->acc_pending) { /* acc is all zero: (re)shape it */
        m->acc_cap = (uint32_t)m->s->cap;
        m->acc_nslot = m->n_slot;
        memcpy(m->acc_slot, m->slot, sizeof m->slot);
        const size_t bytes = (size_t)acc_words(m) * 4;
        if (!m->acc.buffer || m->acc.bytes < bytes) {
            enum ekv_status st = ekv_vk_mg_buf_fit(m->g->vk, &m->acc, bytes, false, "GPU cache statistics (sums)");
            if (st != EKV_OK) return st;
            ekv_vk_fill(m->g->vk, &m->acc, 0, m->acc.bytes & ~(size_t)3, 0);
            m->acc_new = true;
        }
    }
    m->acc_mode = reads ? MG_ACC_FINAL : MG_ACC_ADD;
    m->acc_pending = !reads;
    m->n_summed += !reads;
    return EKV_OK;
}

/* The statistics this forward collects (as attend.c's layer_prepare: the
 * arrays ekv_kv_begin ensured) and their buffer. */
static enum ekv_status stats_begin(struct ekv_vk_mg *m, struct ekv_kv *kv) {
    const struct ekv_kv_head *h0 = &kv->layers[0].heads[0];
    const unsigned f = kv->stats;
    const bool want[SL_COUNT] = {(f & EKV_STAT_COLSUM) && h0->colsum, (f & EKV_STAT_SUMSQ) && h0->sumsq,
                                 (f & EKV_STAT_LASTROW) && h0->lastrow, (f & EKV_STAT_WINSUM) && h0->winsum,
                                 (f & EKV_STAT_BINCOUNT) && h0->bincount};
    m->n_slot = 0;
    for (int i = 0; i < SL_COUNT; i++) m->slot[i] = want[i] ? m->n_slot++ : MG_NONE;
    const int64_t end = m->step.pos0 + m->n_rows;
    m->sparsity = (f & EKV_STAT_SPARSITY) && end > kv->win_start;
    m->any_stats = m->n_slot > 0 || m->sparsity;
    m->wrow = kv->win_start > m->step.pos0 ? (int32_t)EKV_MIN((int64_t)m->n_rows, kv->win_start - m->step.pos0) : 0;
    m->acc_new = false;
    enum ekv_status st = acc_begin(m, kv);
    if (st != EKV_OK || !m->any_stats) return st;
    int32_t cap = 1;
    for (int32_t il = 0; il < m->s->n_layer; il++) cap = EKV_MAX(cap, m->maxlen[il]);
    m->st_cap = m->acc_mode != MG_ACC_NONE ? m->acc_cap : (uint32_t)cap; /* summed: acc's layout */
    m->nblk = (m->st_cap + 63) / 64;
    const uint64_t LH = (uint64_t)m->s->n_layer * m->s->H;
    m->zeros_off = LH * m->n_slot * m->st_cap;
    const uint64_t words = m->zeros_off + (m->sparsity ? LH * m->nblk : 0);
    if (words > ((uint64_t)1 << 40)) return ekv_err(EKV_ERR_OVERFLOW, "GPU cache statistics of %llu words", (unsigned long long)words);
    if (m->acc_mode == MG_ACC_ADD) return EKV_OK; /* st is not written */
    return ekv_vk_mg_buf_fit(m->g->vk, &m->st, (size_t)words * 4, true, "GPU cache statistics");
}

static void meta_write(struct ekv_vk_mg *m, const struct ekv_kv *kv) {
    const uint32_t H = m->s->H;
    for (int32_t il = 0; il < m->s->n_layer; il++) {
        uint32_t *w = (uint32_t *)m->meta.host + (size_t)il * m->meta_words;
        for (uint32_t h = 0; h < H; h++) w[h] = (uint32_t)m->L0[(size_t)il * H + h];
        const uint64_t b = kv->logit_bias && m->bias ? m->bias[il].addr : 0;
        w[H] = b ? 1u : 0u;
        w[H + 1] = (uint32_t)b;
        w[H + 2] = (uint32_t)(b >> 32);
        const uint64_t p = m->posb ? m->posb[il].addr : 0;
        w[H + 3] = (uint32_t)p;
        w[H + 4] = (uint32_t)(p >> 32);
        /* compressed KIVI sides (kvq.glsl's kv_side_meta): quantised entries per head, the layout */
        for (uint32_t h = 0; h < H; h++) {
            const struct ekv_kv_head *hd = &kv->layers[il].heads[h];
            w[H + 5 + h] = m->s->k.managed ? (uint32_t)hd->ks.nq : 0;
            w[2 * H + 5 + h] = m->s->v.managed ? (uint32_t)hd->vs.nq : 0;
        }
        w[3 * H + 5] = m->s->G;
        w[3 * H + 6] = m->s->k.tc;
        w[3 * H + 7] = m->s->k.ngc;
        w[3 * H + 8] = m->s->v.tc;
        w[3 * H + 9] = (uint32_t)m->s->cap;
    }
}

/* Residual slots a compressed KIVI side needs for n more entries (0: none is compressed KIVI). */
static uint32_t tc_need(const struct ekv_vk_mg *m, const struct ekv_kv *kv, int32_t n) {
    if (!m->s->k.managed && !m->s->v.managed) return 0;
    int32_t mx = 0;
    for (int32_t il = 0; il < kv->n_layer; il++)
        for (int32_t hk = 0; hk < kv->n_head_kv; hk++) {
            const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            if (m->s->k.managed) mx = EKV_MAX(mx, h->len - h->ks.nq);
            if (m->s->v.managed) mx = EKV_MAX(mx, h->len - h->vs.nq);
        }
    return (uint32_t)EKV_MAX((int64_t)mx + n, (int64_t)ekv_vk_kivi_tc_min(m->s));
}

/* The residual slots of the cache (both KIVI sides have the same). */
static uint32_t tc_now(const struct ekv_vk_mg *m) { return m->s->k.managed ? m->s->k.tc : m->s->v.tc; }

enum ekv_status ekv_vk_mg_part_begin(struct ekv_context *ctx, struct ekv_fwd_part *part) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    struct ekv_vk_mg *m = part->seq->gpu->mg;
    struct ekv_kv *kv = part->seq->kv;
    const struct ekv_kv_step *step = &part->step;
    const int32_t n = part->n, H = (int32_t)m->s->H;
    if (m->in_fwd) return ekv_err(EKV_ERR_INVALID_ARG, "a sequence appears twice in one forward");
    m->n_pend_prev = m->n_pend; /* restored if this forward does not run */
    m->pend_on = m->pend_pass = m->pend_flushed = false;
    if (kv->logit_bias && !m->bias)
        return ekv_err(EKV_ERR_UNSUPPORTED, "the policy turned logit biases on after the GPU cache was made");
    for (int32_t il = 0; il < kv->n_layer; il++)
        for (int32_t hk = 0; hk < H; hk++) {
            const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
            if (h->len > 0 && step->pos0 <= h->pos[h->len - 1])
                return ekv_err(EKV_ERR_INVALID_ARG, "kv layer %d head %d: new position %lld is not after the cached %d",
                               il, hk, (long long)step->pos0, (int)h->pos[h->len - 1]);
            if ((int64_t)h->len + n > m->s->n_ctx)
                return ekv_err(EKV_ERR_CONTEXT_FULL, "layer %d head %d holds %d entries: %d more do not fit the GPU cache of %d",
                               il, hk, (int)h->len, (int)n, (int)m->s->n_ctx);
        }
    enum ekv_status st = ekv_vk_mg_grow((void **)&g->fwd_mg, &g->cap_fwd_mg, (size_t)g->n_fwd_mg + 1, sizeof *g->fwd_mg);
    const int64_t need = (int64_t)longest(kv) + n;
    const uint32_t need_tc = tc_need(m, kv, n);
    if (st == EKV_OK && (need > m->s->cap || need_tc > tc_now(m))) { /* room for the part's rows: a larger cache
                                                                       (copies recorded first) */
        lengths(kv, m->L0);
        /* a prompt grows by half (its chunks are long), a decode step by the slack */
        const int64_t grow = step->is_prompt ? (int64_t)m->s->cap + m->s->cap / 2 : need + mg_slack(m);
        const int64_t nc = need > m->s->cap ? EKV_MIN((int64_t)m->s->n_ctx, EKV_MAX(need, grow)) : m->s->cap;
        st = mg_resize(m, (int32_t)nc, EKV_MAX(need_tc, tc_now(m)), m->L0, true); /* on failure the cache is as it was */
        if (st == EKV_OK) m->moved = true; /* a recording that does not run now loses the rows */
    }
    if (st == EKV_OK) st = ekv_kv_begin(kv, step);
    if (st != EKV_OK) {
        if (m->moved) part->seq->broken = true; /* the forward will not run its copies */
        m->n_pend = m->n_pend_prev;
        return st;
    }
    m->step = *step;
    m->n_rows = n;
    for (int32_t il = 0; il < kv->n_layer; il++) {
        struct ekv_kv_layer *L = &kv->layers[il];
        for (int32_t hk = 0; hk < H; hk++) m->L0[(size_t)il * H + hk] = L->heads[hk].len;
        if ((st = ekv_kv_reserve(kv, il, n)) != EKV_OK) break;
        int32_t mx = 0;
        for (int32_t hk = 0; hk < H; hk++) {
            struct ekv_kv_head *h = &L->heads[hk];
            for (int32_t i = 0; i < n; i++) {
                int32_t buf[3];
                ekv_kv_head_append(kv, h, NULL, NULL, (int32_t)(step->pos0 + i),
                                   step->tags ? step->tags[i] : (uint8_t)EKV_TAG_GENERATED, ekv_kv_step_mpos(step, i, buf));
            }
            mx = EKV_MAX(mx, h->len);
        }
        m->maxlen[il] = mx;
    }
    if (st == EKV_OK) st = stats_begin(m, kv);
    if (st != EKV_OK) { /* take the appended entries back */
        if (m->moved) part->seq->broken = true;
        m->n_pend = m->n_pend_prev;
        for (int32_t il = 0; il < kv->n_layer; il++)
            for (int32_t hk = 0; hk < H; hk++) {
                struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                if (h->len > m->L0[(size_t)il * H + hk]) h->len = m->L0[(size_t)il * H + hk];
            }
        return st;
    }
    meta_write(m, kv);
    pend_begin(m);
    m->in_fwd = true;
    m->rc_il = -1;
    g->fwd_mg[g->n_fwd_mg++] = m;
    return EKV_OK;
}

void ekv_vk_mg_record_stats(struct ekv_context *ctx, const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part,
                            bool barrier) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    struct ekv_vk_mg *m = s->mg;
    if (!ekv_vk_mg_stats_now(m) || part->n <= 0) return;
    const struct ekv_model_info *in = &ctx->model->info;
    struct stats_call c = {
        .q = ekv_vk_act_addr(ctx, EKV_ACT_Q, part->row0),
        .ml = g->ml.addr + (uint64_t)part->row0 * (uint64_t)in->n_head * 2 * sizeof(float), .meta = ekv_vk_mg_meta(m, il),
        .q_stride = (uint32_t)ekv_act_width(in, EKV_ACT_Q), .rows = (uint32_t)part->n, .wrow = (uint32_t)m->wrow,
        .pos0 = (uint32_t)m->step.pos0, .mode = m->acc_mode, .n_slot = m->n_slot, .cap = m->st_cap, .sl = m->slot,
        .sparsity = m->sparsity};
    if (m->pend_on) { /* the pass over the ring: its waiting rows, then this forward's */
        c.q = pend_q(m, il, 0);
        c.ml = pend_ml(m, il, 0);
        c.meta = m->pmeta.addr + (uint64_t)il * m->meta_words * 4;
        c.rows = (uint32_t)m->n_pend + 1;
        c.pos0 = (uint32_t)m->pend_pos0;
    }
    stats_dispatch(m, il, &c, barrier);
}

/* Adds layer il's increments to the host cache's statistics (as
 * ekv_attn_accumulate does row by row on the CPU). */
static void stats_fold(struct ekv_vk_mg *m, struct ekv_kv *kv, int il) {
    if (!m->any_stats) return;
    const uint32_t H = m->s->H, cap = m->st_cap;
    const int32_t n = m->n_rows;
    const int R = kv->n_head / kv->n_head_kv;
    const float *st = (const float *)m->st.host + (size_t)il * m->n_slot * H * cap;
    const uint32_t *zeros = (const uint32_t *)m->st.host + m->zeros_off + (size_t)il * H * m->nblk;
    struct ekv_kv_layer *L = &kv->layers[il];
    const int64_t W = m->posb ? kv->swa_window : 0;
    for (uint32_t hk = 0; hk < H; hk++) {
        struct ekv_kv_head *h = &L->heads[hk];
        const int32_t L0 = m->L0[(size_t)il * H + hk];
        /* with a sliding window, row i sees entries [lo_i, L0 + i]: counts by difference array */
        int32_t *seen = NULL;
        if (W > 0 && (seen = calloc((size_t)h->len + 1, sizeof *seen)) != NULL) {
            for (int32_t i = 0; i < n; i++) {
                const int32_t lo = ekv_kv_head_first_at(h, L0 + i + 1, m->step.pos0 + i - W + 1);
                seen[lo]++;
                seen[L0 + i + 1]--;
            }
            for (int32_t j = 1; j <= h->len; j++) seen[j] += seen[j - 1];
        }
        for (int sl = 0; sl < SL_COUNT; sl++)
            if (m->slot[sl] != MG_NONE) add_stat(h, sl, st + ((size_t)m->slot[sl] * H + hk) * cap, h->len);
        if (m->slot[SL_COLSUM] != MG_NONE) /* the rows that saw each entry */
            for (int32_t j = 0; j < h->len; j++) h->count[j] += seen ? seen[j] : n - (j > L0 ? j - L0 : 0);
        if (m->sparsity) {
            double z = 0.0, tot = 0.0;
            for (uint32_t b = 0; b < m->nblk; b++) z += zeros[(size_t)hk * m->nblk + b];
            for (int32_t i = m->wrow; i < n; i++)
                tot += (double)R * (double)(L0 + i + 1 - (W > 0 ? ekv_kv_head_first_at(h, L0 + i + 1, m->step.pos0 + i - W + 1) : 0));
            L->sparse_zero += z;
            L->sparse_total += tot;
        }
        free(seen);
    }
}

/* One compressed part after its forward: statistics and the policy's hooks
 * (their plans wait for ekv_vk_mg_after's one submission). */
static enum ekv_status mg_hooks(struct ekv_vk_mg *m) {
    struct ekv_kv *kv = m->seq->kv;
    m->in_fwd = false;
    m->moved = false;
    if (m->pend_on) {
        m->n_pend = m->pend_pass ? 0 : m->n_pend + 1;
        m->n_deferred += !m->pend_pass;
    }
    m->pend_on = m->pend_pass = m->pend_flushed = false;
    enum ekv_status st = EKV_OK;
    struct ekv_kv_step step = m->step;
    step.defer = false;
    for (int32_t il = 0; il < kv->n_layer && st == EKV_OK; il++) {
        if (m->acc_fold_old) acc_fold_host(m, kv, il);
        if (m->acc_mode != MG_ACC_ADD) stats_fold(m, kv, il); /* summed on the device: the policy does not read them */
        st = ekv_kv_layer_policy(kv, il, &step);
    }
    m->acc_fold_old = false;
    if (st == EKV_OK) st = ekv_kv_end(kv, &step);
    return st;
}

/* After the plans ran: a cache with more than twice its slack of room moves
 * to buffers of its longest head + slack (a cache that keeps growing moves
 * every slack steps: a copy of what it holds, small against the steps). */
static enum ekv_status mg_shrink(struct ekv_vk_mg *m) {
    const int32_t mx = longest(m->seq->kv);
    const int64_t slack = mg_slack(m);
    /* a compressed KIVI side's residual after a prompt: back to what a decode step needs */
    const uint32_t tc = tc_now(m), tc1 = tc_need(m, m->seq->kv, 1);
    const bool tc_shrinks = tc > tc1 + 64;
    if ((int64_t)mx + 2 * slack < m->s->cap || tc_shrinks) {
        const int32_t nc = (int32_t)EKV_MIN((int64_t)m->s->cap, (int64_t)mx + slack);
        if (nc < m->s->cap || tc_shrinks) {
            lengths(m->seq->kv, m->L0);
            return mg_resize(m, nc, tc_shrinks ? tc1 : tc, m->L0, false);
        }
    }
    return EKV_OK;
}

/* Every compressed part of the forward: hooks, then all their plans in one
 * submission (not one per sequence), then shrinking. */
enum ekv_status ekv_vk_mg_after(struct ekv_context *ctx) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    for (int32_t i = 0; i < g->n_fwd_mg; i++) {
        struct ekv_vk_mg *m = g->fwd_mg[i];
        m->after_st = mg_hooks(m);
        /* a policy that moves entries while decode rows wait for their
         * statistics (none does today): the rows' pass runs first */
        if (m->after_st == EKV_OK && m->n_plans > 0) m->after_st = ekv_vk_mg_pend_sync(m);
    }
    const enum ekv_status sf = ekv_vk_mg_flush_all(g, g->fwd_mg, g->n_fwd_mg);
    enum ekv_status st = EKV_OK;
    for (int32_t i = 0; i < g->n_fwd_mg; i++) {
        struct ekv_vk_mg *m = g->fwd_mg[i];
        enum ekv_status si = m->after_st != EKV_OK ? m->after_st : sf != EKV_OK ? sf : mg_shrink(m);
        if (si != EKV_OK) {
            m->seq->broken = true; /* its host and device caches may disagree now */
            if (st == EKV_OK) st = si;
        }
    }
    g->n_fwd_mg = 0;
    return st;
}

void ekv_vk_mg_abort(struct ekv_context *ctx) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    for (int32_t i = 0; i < g->n_fwd_mg; i++) {
        struct ekv_vk_mg *m = g->fwd_mg[i];
        struct ekv_kv *kv = m->seq->kv;
        const int32_t H = (int32_t)m->s->H;
        for (int32_t il = 0; il < kv->n_layer; il++)
            for (int32_t hk = 0; hk < H; hk++) {
                struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                if (h->len > m->L0[(size_t)il * H + hk]) h->len = m->L0[(size_t)il * H + hk];
            }
        kv->n_seen = m->step.pos0;
        m->in_fwd = false;
        m->acc_pending = m->acc_pending_prev; /* its copy, sums or zeroing did not run */
        m->n_pend = m->n_pend_prev; /* nor did a pass over the ring, nor this row's slot */
        m->pend_on = m->pend_pass = m->pend_flushed = false;
        m->acc_fold_old = false;
        if (m->acc_new) ekv_vk_buf_free(g->vk, &m->acc); /* its zeroing did not run either */
        m->acc_new = false;
        if (m->moved) m->seq->broken = true; /* its rows were to be copied by the recording that did not run */
        m->moved = false;
    }
    g->n_fwd_mg = 0;
}
