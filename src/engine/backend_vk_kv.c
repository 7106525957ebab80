/*
 * backend_vk_kv.c — a sequence's KV cache on the GPU and the attention that
 * reads it (the half of backend_vk.c that knows caches).
 *
 * Every storage type of the CPU's cache is kept on the device, keys and
 * values independently: f32, f16, q8_0, q4_0 rows, and KIVI 2/4-bit codes
 * with their full-precision residual (docs/policies.md "KIVI storage"). The layout of one
 * side of one layer is kvq.glsl's; the quantisers there give the CPU's codes
 * bit for bit, so a GPU cache holds exactly what the CPU's would, and the
 * attention differs from the CPU's only by the order of its sums.
 *
 * Per layer and part of a forward: rope_store rotates the part's queries
 * and keys and writes the new keys and values (row types: into the cache,
 * quantised; KIVI: into a scratch in fp16, as the CPU keeps them until the
 * forward ends), attn + attn_combine attend, then for KIVI
 * kivi.comp applies the residual rule (keys: whole blocks of max(R, G)
 * entries in groups of G; values: all but the newest R) and moves the rows
 * that stay in full precision into the side's ring. A full cache never
 * evicts, so the quantised prefix is the same in every layer and head and
 * the host tracks it with one counter per side.
 *
 * Compressing policies keep their cache here too (row types): the host
 * cache says how many entries each head holds, backend_vk_policy.c runs
 * the policy; ekv_vk_seq_supported says why a sequence cannot.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend_vk.h"
#include "engine/backend_vk_mg.h"
#include "gpu/vk_push.h"
#include "kv/kv.h"

static bool kivi(enum ekv_kv_type t) { return t == EKV_KV_KIVI2 || t == EKV_KV_KIVI4; }
static uint32_t kbits(enum ekv_kv_type t) { return t == EKV_KV_KIVI2 ? 2 : 4; }
static bool quantising(enum ekv_kv_type t) { return t != EKV_KV_F32 && t != EKV_KV_F16; }

uint32_t ekv_vk_row_words(enum ekv_kv_type t, uint32_t D) {
    switch (t) {
    case EKV_KV_F32: return D;
    case EKV_KV_F16: return D / 2;
    case EKV_KV_Q8_0: return D / 4;
    case EKV_KV_Q4_0: return D / 8;
    default: return D * kbits(t) / 32;
    }
}

/* KIVI keys: entries quantised together (max(R, G)). */
static uint32_t key_block(const struct ekv_vk_seq *s) { return s->R > s->G ? s->R : s->G; }

/* Sizes of a side (kvq.glsl: kv_p0, kv_param_words, kv_r0); false when a
 * layer's buffer would need indices past 2^31 words. */
bool ekv_vk_side_layout(struct ekv_vk_side *sd, const struct ekv_vk_seq *s) {
    const uint64_t H = s->H, C = (uint64_t)s->cap, D = s->D, G = s->G;
    const enum ekv_kv_type t = sd->type;
    uint64_t params = 0;
    const bool managed = sd->managed && kivi(t);
    /* a compressed side's key groups: adjacent ones hold more than G entries together (store.c) */
    sd->ngc = managed && !sd->is_v ? (uint32_t)(2 * ((C + G - 1) / G) + 2) : 0;
    if (t == EKV_KV_Q8_0 || t == EKV_KV_Q4_0) params = (H * C * (D / 32) + 1) / 2;
    else if (kivi(t)) params = sd->is_v ? H * C * (D / G) : managed ? H * sd->ngc * D : H * ((C + G - 1) / G) * D;
    if (!managed) sd->tc = kivi(t) ? (sd->is_v ? (s->R > 0 ? s->R : 1) : key_block(s)) : 0; /* (managed: the caller's) */
    sd->p0 = H * C * ekv_vk_row_words(t, (uint32_t)D);
    sd->r0 = sd->p0 + ((params + 1) & ~(uint64_t)1);
    sd->x0 = sd->r0 + H * sd->tc * D / 2;
    sd->words = sd->x0 + (managed && !sd->is_v ? H * C : 0);
    return C > 0 && sd->words < ((uint64_t)1 << 31);
}

/* KIVI entries quantised after a forward ending at len entries. */
static int32_t nq_after(const struct ekv_vk_seq *s, const struct ekv_vk_side *sd, int64_t len) {
    if (!kivi(sd->type)) return (int32_t)len;
    if (!sd->is_v) return (int32_t)((len / key_block(s)) * key_block(s));
    const int64_t q = len - (int64_t)s->R;
    return q > sd->nq ? (int32_t)q : sd->nq;
}

/* A cache whose host side tracks entries: a compressing policy's, or one
 * whose attention is recorded (ekv_seq_kv_record_attention). */
static bool compressing(const struct ekv_seq *seq) {
    return strcmp(seq->kv->policy_name, "full") != 0 || seq->kv->extra_stats != 0;
}

bool ekv_vk_seq_supported(const struct ekv_seq *seq, const char **why) {
    const struct ekv_kv *kv = seq->kv;
    if (compressing(seq) && !ekv_vk_mg_supported(seq, why)) return false;
    const struct ekv_store_fmt *f[2] = {&kv->fk, &kv->fv};
    for (int i = 0; i < 2; i++) {
        if (quantising(f[i]->type) && !ekv_vk_has_f64(seq->ctx->gpu->vk)) {
            *why = "quantised cache types need shaderFloat64 on the device (to round as the CPU does)";
            return false;
        }
        if (!kivi(f[i]->type)) continue;
        const uint32_t rw = (uint32_t)f[i]->d * kbits(f[i]->type) / 32;
        if (((uint32_t)f[i]->d * kbits(f[i]->type)) % 32) {
            *why = "KIVI on the GPU needs head_dim * bits to be a multiple of 32";
            return false;
        }
        if (!f[i]->is_v && (uint64_t)f[i]->g * rw > 4096) {
            *why = "KIVI keys on the GPU need kv_group * head_dim * bits <= 131072";
            return false;
        }
    }
    return true;
}

enum ekv_status ekv_vk_kv_prepare(struct ekv_vk_ctx *g, enum ekv_kv_type tk, enum ekv_kv_type tv) {
    enum ekv_status s = ekv_vk_prepare(g->vk, ekv_vk_rope_store_pipe(tk, tv));
    if (s == EKV_OK) s = ekv_vk_prepare(g->vk, ekv_vk_attn_pipe(tk, tv));
    if (s == EKV_OK && kivi(tk))
        s = ekv_vk_prepare(g->vk, tk == EKV_KV_KIVI2 ? EKV_VK_KIVI_KEYS2 : EKV_VK_KIVI_KEYS4);
    if (s == EKV_OK && kivi(tv))
        s = ekv_vk_prepare(g->vk, tv == EKV_KV_KIVI2 ? EKV_VK_KIVI_VALUES2 : EKV_VK_KIVI_VALUES4);
    if (s == EKV_OK && (kivi(tk) || kivi(tv))) s = ekv_vk_prepare(g->vk, EKV_VK_KIVI_COPY);
    return s;
}

static enum ekv_status side_new(struct ekv_vk_ctx *g, struct ekv_vk_seq *s, struct ekv_vk_side *sd,
                                enum ekv_kv_type t, bool is_v) {
    sd->type = t;
    sd->is_v = is_v;
    if (!ekv_vk_side_layout(sd, s))
        return ekv_err(EKV_ERR_OVERFLOW, "a %s cache of %d positions is too large for one GPU buffer per layer",
                       ekv_kv_type_name(t), (int)s->cap);
    sd->buf = calloc((size_t)s->n_layer, sizeof *sd->buf);
    if (!sd->buf) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    enum ekv_status st = EKV_OK;
    for (int32_t l = 0; l < s->n_layer && st == EKV_OK; l++)
        st = ekv_vk_buf_new(g->vk, (size_t)sd->words * 4, false, "KV cache", &sd->buf[l]);
    return st;
}

static void side_free(struct ekv_vk_ctx *g, const struct ekv_vk_seq *s, struct ekv_vk_side *sd) {
    if (!sd->buf) return;
    for (int32_t l = 0; l < s->n_layer; l++) ekv_vk_buf_free(g->vk, &sd->buf[l]);
    free(sd->buf);
    sd->buf = NULL;
}

uint32_t ekv_vk_kivi_tc_min(const struct ekv_vk_seq *s) { return EKV_MAX(key_block(s), s->R + 1); }

/* A device cache for seq, of like's shape (its entries and residual slots
 * per head) or (NULL) the usual start. */
static enum ekv_status seq_make(struct ekv_vk_ctx *g, struct ekv_seq *seq, const struct ekv_vk_seq *like,
                                struct ekv_vk_seq **out) {
    *out = NULL;
    const struct ekv_model_info *in = &seq->ctx->model->info;
    const struct ekv_kv *kv = seq->kv;
    struct ekv_vk_seq *s = calloc(1, sizeof *s);
    if (!s) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    s->n_layer = in->n_layer;
    s->n_ctx = seq->ctx->params.n_ctx;
    /* a compressed cache starts small and follows what it keeps (backend_vk_policy.c) */
    s->cap = like ? like->cap : compressing(seq) ? EKV_MIN(s->n_ctx, 64) : s->n_ctx;
    s->H = (uint32_t)in->n_head_kv;
    s->D = (uint32_t)in->head_dim;
    s->G = (uint32_t)kv->fk.g;
    s->R = (uint32_t)kv->fk.r;
    /* a compressing policy's KIVI side: residual slots for the longest tail plus a step (grown by a prompt) */
    s->k.managed = compressing(seq) && kivi(kv->fk.type);
    s->v.managed = compressing(seq) && kivi(kv->fv.type);
    s->k.tc = like ? like->k.tc : ekv_vk_kivi_tc_min(s);
    s->v.tc = like ? like->v.tc : ekv_vk_kivi_tc_min(s);
    enum ekv_status st = side_new(g, s, &s->k, kv->fk.type, false);
    if (st == EKV_OK) st = side_new(g, s, &s->v, kv->fv.type, true);
    if (st == EKV_OK) st = ekv_vk_kv_prepare(g, s->k.type, s->v.type);
    if (st == EKV_OK && compressing(seq)) st = ekv_vk_mg_new(g, seq, s);
    if (st != EKV_OK) { /* the message before s is freed: it names s->n_ctx */
        st = ekv_err_prefix(st, "%s: a cache of %d positions", ekv_vk_name(g->vk), (int)s->n_ctx);
        ekv_vk_seq_free(g, s);
        return st;
    }
    if (!s->mg && (kivi(s->k.type) || kivi(s->v.type))) g->kivi_seqs++; /* (a compressed cache needs no scratch) */
    *out = s;
    return EKV_OK;
}

enum ekv_status ekv_vk_seq_new(struct ekv_vk_ctx *g, struct ekv_seq *seq, struct ekv_vk_seq **out) {
    return seq_make(g, seq, NULL, out);
}

enum ekv_status ekv_vk_seq_copy(struct ekv_vk_ctx *g, const struct ekv_vk_seq *src, struct ekv_seq *seq,
                                struct ekv_vk_seq **out) {
    struct ekv_vk_seq *s = NULL;
    enum ekv_status st = seq_make(g, seq, src, &s);
    if (st == EKV_OK && (!s->mg) != (!src->mg))
        st = ekv_err(EKV_ERR_INTERNAL, "the copy's cache is %scompressed, the original's is not", s->mg ? "" : "not ");
    if (st == EKV_OK && src->mg) st = ekv_vk_mg_flush(src->mg); /* plans not run yet would be lost */
    if (st == EKV_OK && src->mg) st = ekv_vk_mg_pend_sync(src->mg); /* so would statistics waiting in its ring */
    if (st == EKV_OK) st = ekv_vk_begin(g->vk);
    if (st != EKV_OK) {
        ekv_vk_seq_free(g, s);
        return st;
    }
    for (int side = 0; side < 2; side++) {
        const struct ekv_vk_side *from = side ? &src->v : &src->k;
        struct ekv_vk_side *to = side ? &s->v : &s->k;
        to->nq = from->nq; /* KIVI's quantised prefix */
        for (int32_t l = 0; l < s->n_layer; l++) ekv_vk_copy(g->vk, &from->buf[l], 0, &to->buf[l], 0, to->words * 4);
    }
    st = src->mg ? ekv_vk_mg_copy(g, src, s) : EKV_OK;
    if (st == EKV_OK) st = ekv_vk_submit(g->vk);
    else ekv_vk_abort(g->vk);
    if (st != EKV_OK) {
        ekv_vk_seq_free(g, s);
        return st;
    }
    *out = s;
    return EKV_OK;
}

void ekv_vk_seq_free(struct ekv_vk_ctx *g, struct ekv_vk_seq *s) {
    if (!s) return;
    if (s->k.buf && s->v.buf && !s->mg && (kivi(s->k.type) || kivi(s->v.type))) g->kivi_seqs--;
    ekv_vk_mg_free(g, s);
    side_free(g, s, &s->k);
    side_free(g, s, &s->v);
    free(s);
}

bool ekv_vk_seq_compressed(const struct ekv_vk_seq *s) { return s && s->mg; }

/* Bytes a side holds for n entries (codes, parameters, residual). */
static uint64_t side_bytes(const struct ekv_vk_seq *s, const struct ekv_vk_side *sd, int64_t n) {
    const uint64_t H = s->H, D = s->D;
    if (!kivi(sd->type)) {
        const uint64_t scales = quantising(sd->type) ? D / 32 * 2 : 0;
        return H * (uint64_t)n * (ekv_vk_row_words(sd->type, (uint32_t)D) * 4 + scales);
    }
    struct ekv_vk_side fresh = *sd;
    fresh.nq = 0;
    const uint64_t nq = (uint64_t)nq_after(s, &fresh, n);
    const uint64_t params = sd->is_v ? nq * (D / s->G) * 4 : nq / s->G * D * 4;
    return H * (nq * ekv_vk_row_words(sd->type, (uint32_t)D) * 4 + params + ((uint64_t)n - nq) * D * 2);
}

uint64_t ekv_vk_seq_bytes(const struct ekv_vk_seq *s, int64_t n_seen, uint64_t *alloc) {
    if (alloc) *alloc = (s->k.words + s->v.words) * 4 * (uint64_t)s->n_layer;
    return (side_bytes(s, &s->k, n_seen) + side_bytes(s, &s->v, n_seen)) * (uint64_t)s->n_layer;
}

/* ---- scratch ---- */

/* Keys per split of the decode attention. Fixed, so that a row's keys are
 * split and combined the same way whatever rows share its forward (batch
 * invariance: alone == batched, a prompt in pieces == one piece). */
#define EKV_VK_SPLIT 128
/* Bytes of attention partials a forward may hold; longer prompts are
 * attended in blocks of rows that fit. */
#define EKV_VK_PART_BYTES ((size_t)64 << 20)

static uint32_t n_splits(int64_t kv_end) { return (uint32_t)((kv_end + EKV_VK_SPLIT - 1) / EKV_VK_SPLIT); }

/* Rows attended per block so that the partials of a block fit the buffer. */
static int32_t attn_block_rows(const struct ekv_vk_ctx *g, const struct ekv_model_info *in, int64_t kv_end) {
    size_t per_row = (size_t)in->n_head * n_splits(kv_end) * (size_t)(in->head_dim + 2);
    size_t rows = g->part_cap / (per_row ? per_row : 1);
    return rows < 1 ? 1 : rows > 65535 ? 65535 : (int32_t)rows;
}

/* Makes the KIVI scratch hold n_rows rows (no-op without KIVI sequences). */
static enum ekv_status kv_reserve(struct ekv_vk_ctx *g, const struct ekv_model_info *in, int32_t n_rows) {
    if (g->kivi_seqs <= 0 || n_rows <= g->kv_scr_rows) return EKV_OK;
    ekv_vk_buf_free(g->vk, &g->kv_scr);
    g->kv_scr_rows = 0;
    const size_t bytes = 2 * (size_t)in->n_head_kv * (size_t)n_rows * (size_t)in->head_dim * 2;
    enum ekv_status s = ekv_vk_buf_new(g->vk, bytes, false, "KIVI scratch", &g->kv_scr);
    if (s == EKV_OK) g->kv_scr_rows = n_rows;
    return s;
}

void ekv_vk_kv_free_scratch(struct ekv_vk_ctx *g) {
    ekv_vk_buf_free(g->vk, &g->part);
    g->part_cap = 0;
    ekv_vk_buf_free(g->vk, &g->kv_scr);
    g->kv_scr_rows = 0;
    ekv_vk_buf_free(g->vk, &g->ml);
    g->ml_rows = 0;
    ekv_vk_buf_free(g->vk, &g->plan);
    ekv_vk_buf_free(g->vk, &g->stage);
    ekv_vk_buf_free(g->vk, &g->cscr);
    free(g->fwd_mg);
    g->fwd_mg = NULL;
    ekv_vk_mg_release(g);
    free(g->old);
    g->old = NULL;
    g->cap_old = 0;
    g->n_fwd_mg = 0;
    g->cap_fwd_mg = 0;
}

enum ekv_status ekv_vk_kv_begin(struct ekv_context *ctx, int32_t n_rows) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    const struct ekv_model_info *in = &ctx->model->info;
    /* partials of one row at full depth, or of all rows if fewer, up to EKV_VK_PART_BYTES */
    const size_t per_row = (size_t)in->n_head * n_splits(ctx->params.n_ctx) * (size_t)(in->head_dim + 2);
    size_t need = per_row * (size_t)n_rows;
    if (need * sizeof(float) > EKV_VK_PART_BYTES) need = EKV_MAX(per_row, EKV_VK_PART_BYTES / sizeof(float));
    if (need > g->part_cap) {
        ekv_vk_buf_free(g->vk, &g->part);
        g->part_cap = 0;
        enum ekv_status s = ekv_vk_buf_new(g->vk, need * sizeof(float), false, "attention scratch", &g->part);
        if (s != EKV_OK) return s;
        g->part_cap = need;
    }
    if (n_rows > g->ml_rows) { /* softmax max and sum per (row, query head), for compressed caches' statistics */
        ekv_vk_buf_free(g->vk, &g->ml);
        g->ml_rows = 0;
        enum ekv_status s = ekv_vk_buf_new(g->vk, (size_t)n_rows * (size_t)in->n_head * 2 * sizeof(float), false,
                                           "attention row sums", &g->ml);
        if (s != EKV_OK) return s;
        g->ml_rows = n_rows;
    }
    g->n_fwd_mg = 0;
    return kv_reserve(g, in, n_rows);
}

enum ekv_status ekv_vk_kv_part_begin(struct ekv_context *ctx, struct ekv_fwd_part *part) {
    const struct ekv_vk_seq *s = part->seq->gpu;
    if (s->mg) return ekv_vk_mg_part_begin(ctx, part);
    if (part->step.pos0 < 0 || part->step.pos0 + part->n > s->n_ctx)
        return ekv_err(EKV_ERR_CONTEXT_FULL, "positions %lld..%lld beyond the GPU cache of %d",
                       (long long)part->step.pos0, (long long)(part->step.pos0 + part->n), (int)s->n_ctx);
    return EKV_OK;
}

void ekv_vk_kv_part_done(struct ekv_fwd_part *part) {
    struct ekv_vk_seq *s = part->seq->gpu;
    if (s->mg) return; /* the policy runs once the forward ran (ekv_vk_mg_after) */
    const int64_t len = part->step.pos0 + part->n;
    if (kivi(s->k.type)) s->k.nq = nq_after(s, &s->k, len);
    if (kivi(s->v.type)) s->v.nq = nq_after(s, &s->v, len);
}

/* ---- recording ---- */

/* The part's rows of a side in the KIVI scratch (keys, then values). */
static uint64_t scr_addr(const struct ekv_vk_ctx *g, const struct ekv_vk_seq *s, bool is_v, int32_t row0) {
    const uint64_t side = is_v ? (uint64_t)s->H * (uint64_t)g->kv_scr_rows * s->D * 2 : 0;
    return g->kv_scr.addr + side + (uint64_t)row0 * s->D * 2;
}

/* Where a side's rows of a part go: the cache, or (KIVI) the scratch. */
static void store_dst(const struct ekv_vk_ctx *g, const struct ekv_vk_seq *s, const struct ekv_vk_side *sd, int il,
                      const struct ekv_fwd_part *part, uint64_t *dst, uint32_t *hstride, uint32_t *e0) {
    if (sd->managed) { /* a compressed KIVI side: into each head's residual (rope_store's e0 from meta) */
        *dst = sd->buf[il].addr + sd->r0 * 4;
        *hstride = sd->tc;
        *e0 = 0;
    } else if (kivi(sd->type)) { /* the whole scratch, rows from the part's first */
        *dst = scr_addr(g, s, sd->is_v, 0);
        *hstride = (uint32_t)g->kv_scr_rows;
        *e0 = (uint32_t)part->row0;
    } else {
        *dst = sd->buf[il].addr;
        *hstride = (uint32_t)s->cap;
        *e0 = (uint32_t)part->step.pos0;
    }
}

/* Rotates the part's Q and K rows and writes K and V into the cache. */
static void rope_store(struct ekv_context *ctx, const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part,
                       bool barrier) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    const struct ekv_model_info *in = &ctx->model->info;
    const int32_t r0 = part->row0;
    const uint32_t RD = (uint32_t)(in->rope_dim > 0 ? in->rope_dim : 0);
    struct ekv_vk_pc_rope_store pc = {
        .q = ekv_vk_act_addr(ctx, EKV_ACT_Q, r0), .k = ekv_vk_act_addr(ctx, EKV_ACT_K, r0),
        .v = ekv_vk_act_addr(ctx, EKV_ACT_V, r0), .cs = g->cs.addr + (uint64_t)r0 * RD * sizeof(float),
        .n_head = (uint32_t)in->n_head, .H = s->H, .D = s->D,
        .rope_dim = RD > s->D ? s->D : RD, .neox = in->rope_neox, .rows = (uint32_t)part->n,
        .q_stride = (uint32_t)ekv_act_width(in, EKV_ACT_Q), .kv_stride = (uint32_t)ekv_act_width(in, EKV_ACT_K),
        .meta = s->mg ? ekv_vk_mg_meta(s->mg, il) : 0, .posb = ekv_vk_mg_posb(s->mg, il),
        .qdst = ekv_vk_mg_qdst(s->mg, il), .pos0 = (uint32_t)part->step.pos0};
    store_dst(g, s, &s->k, il, part, &pc.kdst, &pc.k_hstride, &pc.k_e0);
    store_dst(g, s, &s->v, il, part, &pc.vdst, &pc.v_hstride, &pc.v_e0);
    (barrier ? ekv_vk_dispatch : ekv_vk_dispatch_nb)(g->vk, ekv_vk_rope_store_pipe(s->k.type, s->v.type), &pc, sizeof pc,
                                                     (uint32_t)part->n, (uint32_t)in->n_head + s->H, 1);
}

/* KIVI's residual rule for one side after the layer's attention. */
static void flush_side(struct ekv_vk_ctx *g, const struct ekv_vk_seq *s, const struct ekv_vk_side *sd, int il,
                       const struct ekv_fwd_part *part) {
    const int64_t pos0 = part->step.pos0, len = pos0 + part->n;
    const int32_t nq1 = nq_after(s, sd, len);
    struct ekv_vk_pc_kivi pc = {.base = sd->buf[il].addr, .scr = scr_addr(g, s, sd->is_v, part->row0), .H = s->H,
                                .C = (uint32_t)s->cap, .D = s->D, .G = s->G, .TC = sd->tc,
                                .pos0 = (uint32_t)pos0, .scr_stride = (uint32_t)g->kv_scr_rows};
    const uint32_t unit = sd->is_v ? 1 : s->G; /* entries per workgroup */
    const enum ekv_vk_pipe qp = sd->is_v ? (sd->type == EKV_KV_KIVI2 ? EKV_VK_KIVI_VALUES2 : EKV_VK_KIVI_VALUES4)
                                         : (sd->type == EKV_KV_KIVI2 ? EKV_VK_KIVI_KEYS2 : EKV_VK_KIVI_KEYS4);
    for (int64_t j = sd->nq; j < nq1;) { /* workgroups of at most 65535 units per dispatch */
        const int64_t n = EKV_MIN((int64_t)65535 * unit, nq1 - j);
        pc.j0 = (uint32_t)j;
        pc.n = (uint32_t)(n / unit);
        ekv_vk_dispatch(g->vk, qp, &pc, sizeof pc, pc.n, s->H, 1);
        j += n;
    }
    /* the rows that stay in full precision move into the ring (after the
     * quantiser read the ring slots they may take) */
    pc.base = sd->buf[il].addr + sd->r0 * 4;
    for (int64_t j = EKV_MAX((int64_t)nq1, pos0); j < len;) {
        const int64_t n = EKV_MIN((int64_t)65535, len - j);
        pc.j0 = (uint32_t)j;
        pc.n = (uint32_t)n;
        ekv_vk_dispatch(g->vk, EKV_VK_KIVI_COPY, &pc, sizeof pc, pc.n, s->H, 1);
        j += n;
    }
}

/* Entries the part's rows attend over: a compressed cache splits over the
 * longest head of the layer, a full one over the positions. */
static int64_t kv_end_of(const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part) {
    return s->mg ? ekv_vk_mg_max_len(s->mg, il) : part->step.pos0 + part->n;
}

/* Records attention of rows [b0, b0 + nb) of a part: attn then (phase 1)
 * attn_combine, with its partials at word `off` of the scratch. Without
 * `barrier` the dispatch does not wait for the ones before it (parts of a
 * group: ekv_vk_kv_attention). */
static void attend_rows(struct ekv_context *ctx, const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part,
                        int32_t b0, int32_t nb, size_t off, int phase, bool barrier) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    const struct ekv_model_info *in = &ctx->model->info;
    const uint32_t HD = (uint32_t)in->head_dim, QD = (uint32_t)ekv_act_width(in, EKV_ACT_Q);
    const int32_t r0 = part->row0;
    const uint32_t pos0 = (uint32_t)part->step.pos0;
    const uint32_t n_split = n_splits(kv_end_of(s, il, part));
    void (*disp)(struct ekv_vk *, enum ekv_vk_pipe, const void *, uint32_t, uint32_t, uint32_t, uint32_t) =
        barrier ? ekv_vk_dispatch : ekv_vk_dispatch_nb;
    if (phase == 0) {
        const bool any_kivi = !s->mg && (kivi(s->k.type) || kivi(s->v.type));
        struct ekv_vk_pc_attn at = {
            .q = ekv_vk_act_addr(ctx, EKV_ACT_Q, r0 + b0), .kc = s->k.buf[il].addr, .vc = s->v.buf[il].addr,
            .part = g->part.addr + off * sizeof(float), .kscr = any_kivi ? scr_addr(g, s, false, r0) : 0,
            .vscr = any_kivi ? scr_addr(g, s, true, r0) : 0, .n_head = (uint32_t)in->n_head, .n_head_kv = s->H,
            .head_dim = HD, .n_ctx = (uint32_t)s->cap, .pos0 = pos0 + (uint32_t)b0, .rows = (uint32_t)nb,
            .q_stride = QD, .n_split = n_split, .split_len = EKV_VK_SPLIT,
            .window = (uint32_t)(in->sliding_window > 0 ? in->sliding_window : 0), .scale = 1.0f / sqrtf((float)HD),
            .g = s->G, .tc_k = s->k.tc, .tc_v = s->v.tc, .nq_k = (uint32_t)s->k.nq, .nq_v = (uint32_t)s->v.nq,
            .scr_stride = (uint32_t)g->kv_scr_rows, .kv_pos0 = pos0, .meta = s->mg ? ekv_vk_mg_meta(s->mg, il) : 0};
        disp(g->vk, ekv_vk_attn_pipe(s->k.type, s->v.type), &at, sizeof at, ekv_vk_attn_groups((uint32_t)in->n_head, s->H),
             (uint32_t)nb, n_split);
        return;
    }
    const bool stats = ekv_vk_mg_wants_stats(s->mg);
    struct ekv_vk_pc_combine cb = {.part = g->part.addr + off * sizeof(float),
                                   .out = ekv_vk_act_addr(ctx, EKV_ACT_ATT, r0 + b0), .n_head = (uint32_t)in->n_head,
                                   .head_dim = HD, .rows = (uint32_t)nb, .n_split = n_split, .out_stride = QD,
                                   .ml = stats ? ekv_vk_mg_ml(s->mg, il, g->ml.addr + (uint64_t)(r0 + b0) * in->n_head * 2 * sizeof(float)) : 0};
    disp(g->vk, EKV_VK_ATTN_COMBINE, &cb, sizeof cb, (uint32_t)in->n_head, (uint32_t)nb, 1);
}

/* Scratch words of a part's attention partials (all its rows at once). */
static size_t part_words(const struct ekv_context *ctx, const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part) {
    const struct ekv_model_info *in = &ctx->model->info;
    return (size_t)in->n_head * n_splits(kv_end_of(s, il, part)) * (size_t)(in->head_dim + 2) * (size_t)part->n;
}

/* One part alone, its rows in blocks whose partials fit the scratch. */
static void attend_part(struct ekv_context *ctx, const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    const int32_t block = attn_block_rows(g, &ctx->model->info, kv_end_of(s, il, part));
    for (int32_t b0 = 0; b0 < part->n; b0 += block) {
        const int32_t nb = EKV_MIN(block, part->n - b0);
        attend_rows(ctx, s, il, part, b0, nb, 0, 0, true);
        attend_rows(ctx, s, il, part, b0, nb, 0, 1, true);
    }
}

/* After a part's attention: its statistics and KIVI's residual rule. */
static void part_after(struct ekv_context *ctx, const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part,
                       bool barrier) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    if (s->mg) {
        ekv_vk_mg_record_stats(ctx, s, il, part, barrier);
        return; /* a compressed KIVI side: the residual rule runs with the policy (ekv_kv_flush) */
    }
    if (kivi(s->k.type)) flush_side(g, s, &s->k, il, part);
    if (kivi(s->v.type)) flush_side(g, s, &s->v, il, part);
}

/* A layer's attention for every part of the forward. Parts whose partials
 * fit the scratch together form a group, and each step of a group (store,
 * attend, combine, statistics) is one barrier for all its parts: the
 * sequences of a batch run side by side on the device, not one after the
 * other. Every part's arithmetic is what it is alone. */
enum ekv_status ekv_vk_kv_attention(struct ekv_context *ctx, int il, struct ekv_fwd_part *parts, int32_t n_parts) {
    struct ekv_vk_ctx *g = ekv_vk_of(ctx);
    for (int32_t p = 0; p < n_parts; p++) {
        const struct ekv_vk_seq *s = parts[p].seq->gpu;
        if (parts[p].n > 0 && !s->mg && (kivi(s->k.type) || kivi(s->v.type)) && parts[p].row0 + parts[p].n > g->kv_scr_rows)
            return ekv_err(EKV_ERR_INTERNAL, "KIVI scratch of %d rows for rows up to %d", (int)g->kv_scr_rows,
                           (int)(parts[p].row0 + parts[p].n));
    }
    for (int32_t p0 = 0, p1; p0 < n_parts; p0 = p1) {
        size_t used = 0;
        for (p1 = p0; p1 < n_parts; p1++) { /* the group [p0, p1) */
            const size_t w = parts[p1].n > 0 ? part_words(ctx, parts[p1].seq->gpu, il, &parts[p1]) : 0;
            if (used + w > g->part_cap || parts[p1].n > 65535) break; /* rows: a dispatch's y count */
            used += w;
        }
        if (p1 == p0) { /* a part too long to attend at once: alone, in blocks */
            const struct ekv_vk_seq *s = parts[p0].seq->gpu;
            p1 = p0 + 1;
            if (parts[p0].n <= 0) continue;
            rope_store(ctx, s, il, &parts[p0], true);
            attend_part(ctx, s, il, &parts[p0]);
            part_after(ctx, s, il, &parts[p0], true);
            continue;
        }
        int32_t last = -1; /* the group's last part with rows: its dispatches carry the barrier */
        for (int32_t p = p0; p < p1; p++)
            if (parts[p].n > 0) last = p;
        if (last < 0) continue;
        for (int32_t p = p0; p < p1; p++)
            if (parts[p].n > 0) rope_store(ctx, parts[p].seq->gpu, il, &parts[p], p == last);
        for (int phase = 0; phase < 2; phase++) {
            size_t off = 0;
            for (int32_t p = p0; p < p1; p++) {
                if (parts[p].n <= 0) continue;
                const struct ekv_vk_seq *s = parts[p].seq->gpu;
                attend_rows(ctx, s, il, &parts[p], 0, parts[p].n, off, phase, p == last);
                off += part_words(ctx, s, il, &parts[p]);
            }
        }
        int32_t last_st = -1; /* statistics of a group: side by side too */
        for (int32_t p = p0; p < p1; p++)
            if (parts[p].n > 0 && ekv_vk_mg_stats_now(((const struct ekv_vk_seq *)parts[p].seq->gpu)->mg)) last_st = p;
        for (int32_t p = p0; p < p1; p++)
            if (parts[p].n > 0) part_after(ctx, parts[p].seq->gpu, il, &parts[p], p == last_st);
    }
    return EKV_OK;
}
