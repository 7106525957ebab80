/*
 * backend_vk.c — the operations of the forward on a Vulkan GPU (backend.h).
 *
 * At context creation every tensor the forward reads is uploaded once:
 * matrices in the layout the shaders want (F32/F16/BF16 rows as stored;
 * Q8_0 and Q4_0 split into an fp16 scale array and a quant array, so the
 * shaders read 16-byte vectors), norms and biases as f32. The token
 * embeddings stay on the host: input rows (tokens or image embeddings) are
 * built there and copied in at the start of the forward, as are the RoPE
 * {cos, sin} rows, computed by the CPU's own ekv_rope_sincos_ext so every
 * scaling is exactly the CPU's.
 *
 * A forward is one command buffer: begin() opens it, each op records
 * dispatches, end() submits once and waits, then the logits (written by the
 * classifier straight into host-visible memory) are copied out. The KV
 * caches and the attention are backend_vk_kv.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend.h"
#include "engine/backend_vk.h"
#include "engine/engine.h"
#include "gpu/vk.h"
#include "gpu/vk_push.h"
#include "kernels/quant.h"

#define EKV_VK_MATVEC_NT 8    /* activation rows per workgroup in matvec.comp (NT) */

/* Floats per row of the gate/up activations: n_ff rounded up to 8 (the
 * down projection's rows are padded with zeros to match at upload). */
static int64_t ff_stride(const struct ekv_model_info *in) { return (in->n_ff + 7) & ~(int64_t)7; }

/* ---- tensors ---- */

static int cmp_tensor(const void *a, const void *b) {
    const struct ekv_vk_tensor *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

const struct ekv_vk_tensor *ekv_vk_ttab_find(const struct ekv_vk_ttab *tt, const void *key) {
    struct ekv_vk_tensor k = {.key = key};
    if (tt->n == 0) return NULL;
    return bsearch(&k, tt->t, (size_t)tt->n, sizeof *tt->t, cmp_tensor);
}

/* A weight of the model. */
static const struct ekv_vk_tensor *find(const struct ekv_vk_ctx *g, const void *key) { return ekv_vk_ttab_find(&g->wt, key); }

/* matvec.comp's weight types, in the order of enum ekv_vk_mv_type */
static const enum ekv_dtype k_mv_types[EKV_VK_W_COUNT] = {EKV_F32,  EKV_F16,  EKV_BF16, EKV_Q8_0,
                                                          EKV_Q4_0, EKV_Q4_K, EKV_Q5_K, EKV_Q6_K};

/* matvec.comp's index of a weight type; EKV_VK_W_COUNT: no shader for it */
static enum ekv_vk_mv_type mv_type(enum ekv_dtype t) {
    int i = 0;
    while (i < EKV_VK_W_COUNT && k_mv_types[i] != t) i++;
    return (enum ekv_vk_mv_type)i;
}

bool ekv_vk_weight_type_ok(enum ekv_dtype t) { return mv_type(t) != EKV_VK_W_COUNT; }

/* The matrices of a layer the forward multiplies by. */
enum { EKV_VK_LAYER_MATS = 7 };
static void layer_mats(const struct ekv_layer_weights *L, const struct ekv_weight *ws[EKV_VK_LAYER_MATS]) {
    ws[0] = &L->wq, ws[1] = &L->wk, ws[2] = &L->wv, ws[3] = &L->wo;
    ws[4] = &L->w_gate, ws[5] = &L->w_up, ws[6] = &L->w_down;
}

/* Bytes of a K-quant block on the device: as stored, Q6_K padded to whole words. */
static size_t kquant_block_bytes(enum ekv_dtype t) { return t == EKV_Q4_K ? 144 : t == EKV_Q5_K ? 176 : 212; }
static size_t kquant_src_bytes(enum ekv_dtype t) { return t == EKV_Q6_K ? 210 : kquant_block_bytes(t); }

/* During upload the table is unsorted (find() needs it sorted: upload_model
 * sorts it once at the end); a tensor shared by two weights (tied output) is
 * uploaded once. */
static bool have_tensor(const struct ekv_vk_ttab *tt, const void *key) {
    for (int32_t i = 0; i < tt->n; i++)
        if (tt->t[i].key == key) return true;
    return false;
}

static struct ekv_vk_tensor *add_tensor(struct ekv_vk_ttab *tt, const void *key) {
    if (tt->n == tt->cap) {
        int32_t cap = tt->cap ? tt->cap * 2 : 64;
        struct ekv_vk_tensor *t = realloc(tt->t, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        tt->t = t;
        tt->cap = cap;
    }
    struct ekv_vk_tensor *t = &tt->t[tt->n++];
    memset(t, 0, sizeof *t);
    t->key = key;
    return t;
}

void ekv_vk_ttab_sort(struct ekv_vk_ttab *tt) {
    if (tt->n > 1) qsort(tt->t, (size_t)tt->n, sizeof *tt->t, cmp_tensor);
}

void ekv_vk_ttab_free(struct ekv_vk *vk, struct ekv_vk_ttab *tt) {
    for (int32_t i = 0; i < tt->n; i++) ekv_vk_buf_free(vk, &tt->t[i].buf);
    free(tt->t);
    memset(tt, 0, sizeof *tt);
}

enum ekv_status ekv_vk_ttab_vector(struct ekv_vk *vk, struct ekv_vk_ttab *tt, const float *v, int64_t n,
                                   const char *what) {
    if (!v || have_tensor(tt, v)) return EKV_OK;
    struct ekv_vk_tensor *t = add_tensor(tt, v);
    if (!t) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    t->type = EKV_F32;
    t->ne0 = n;
    t->ne1 = 1;
    enum ekv_status s = ekv_vk_buf_new(vk, (size_t)n * sizeof(float), false, what, &t->buf);
    if (s == EKV_OK) s = ekv_vk_upload(vk, &t->buf, 0, v, (size_t)n * sizeof(float));
    return s;
}

/* Q8_0/Q4_0 rows to [scales][quants] (see the file comment); dst: the whole buffer. */
static enum ekv_status split_quant(const struct ekv_weight *w, uint8_t *dst, size_t q_off) {
    const int64_t nb = w->ne0 / EKV_QK8_0;
    uint8_t *row = malloc(w->row_bytes);
    if (!row) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    uint16_t *sc = (uint16_t *)(void *)dst;
    for (int64_t r = 0; r < w->ne1; r++) {
        ekv_x16_unpack_row(w, r, row);
        for (int64_t b = 0; b < nb; b++) {
            if (w->type == EKV_Q8_0) {
                const struct ekv_block_q8_0 *blk = (const struct ekv_block_q8_0 *)(const void *)row + b;
                memcpy(&sc[r * nb + b], &blk->d, 2);
                memcpy(dst + q_off + (size_t)(r * w->ne0 + b * 32), blk->qs, 32);
            } else {
                const struct ekv_block_q4_0 *blk = (const struct ekv_block_q4_0 *)(const void *)row + b;
                memcpy(&sc[r * nb + b], &blk->d, 2);
                memcpy(dst + q_off + (size_t)(r * nb + b) * 16, blk->qs, 16);
            }
        }
    }
    free(row);
    return EKV_OK;
}

/* K-quant rows as blocks of kquant_block_bytes each (Q6_K: 2 bytes of padding). */
static enum ekv_status pad_kquant(const struct ekv_weight *w, uint8_t *dst) {
    const int64_t nb = w->ne0 / 256;
    const size_t sb = kquant_src_bytes(w->type), db = kquant_block_bytes(w->type);
    uint8_t *row = malloc(w->row_bytes);
    if (!row) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < w->ne1; r++) {
        ekv_x16_unpack_row(w, r, row);
        for (int64_t b = 0; b < nb; b++) memcpy(dst + (size_t)(r * nb + b) * db, row + (size_t)b * sb, sb);
    }
    free(row);
    return EKV_OK;
}

enum ekv_status ekv_vk_ttab_weight(struct ekv_vk *vk, struct ekv_vk_ttab *tt, const struct ekv_weight *w,
                                   const char *what) {
    if (have_tensor(tt, w->data)) return EKV_OK;
    if (!ekv_vk_weight_type_ok(w->type))
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: weight type %s has no GPU shader yet", what,
                       ekv_dtype_name(w->type));
    size_t el_row = 0, bytes = 0, q_off = 0;
    if (!ekv_dtype_row_bytes(w->type, w->ne0, &el_row) || !ekv_mul_ok(el_row, (size_t)w->ne1, &bytes))
        return ekv_err(EKV_ERR_OVERFLOW, "%s: %lld x %lld is too large", what, (long long)w->ne1, (long long)w->ne0);
    const bool quant = w->type == EKV_Q8_0 || w->type == EKV_Q4_0;
    const bool kquant = w->type == EKV_Q4_K || w->type == EKV_Q5_K || w->type == EKV_Q6_K;
    if (quant) {
        q_off = ((size_t)w->ne1 * (size_t)(w->ne0 / 32) * 2 + 15) & ~(size_t)15;
        bytes = q_off + (size_t)w->ne1 * (size_t)(w->ne0 / 32) * (w->type == EKV_Q8_0 ? 32 : 16);
    } else if (kquant && !ekv_mul_ok((size_t)w->ne1 * (size_t)(w->ne0 / 256), kquant_block_bytes(w->type), &bytes)) {
        return ekv_err(EKV_ERR_OVERFLOW, "%s: %lld x %lld is too large", what, (long long)w->ne1, (long long)w->ne0);
    }
    /* F32/F16/BF16 rows of a length not a multiple of 8 (the down
     * projection of a small model): padded with zeros to one */
    const int64_t ne0p = quant || kquant ? w->ne0 : (w->ne0 + 7) & ~(int64_t)7;
    size_t dst_row = el_row;
    if (ne0p != w->ne0 && (!ekv_dtype_row_bytes(w->type, ne0p, &dst_row) || !ekv_mul_ok(dst_row, (size_t)w->ne1, &bytes)))
        return ekv_err(EKV_ERR_OVERFLOW, "%s: %lld x %lld is too large", what, (long long)w->ne1, (long long)w->ne0);
    struct ekv_vk_tensor *t = add_tensor(tt, w->data);
    if (!t) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    t->type = w->type;
    t->ne0 = ne0p;
    t->ne1 = w->ne1;
    t->q_off = q_off;
    enum ekv_status s = ekv_vk_buf_new(vk, bytes, false, what, &t->buf);
    if (s == EKV_OK) {
        if (quant || kquant) {
            uint8_t *tmp = malloc(bytes);
            if (!tmp) s = ekv_err(EKV_ERR_NOMEM, "%s: out of host memory for %zu bytes", what, bytes);
            if (s == EKV_OK) s = quant ? split_quant(w, tmp, q_off) : pad_kquant(w, tmp);
            if (s == EKV_OK) s = ekv_vk_upload(vk, &t->buf, 0, tmp, bytes);
            free(tmp);
        } else if (w->row_bytes == el_row && dst_row == el_row) {
            s = ekv_vk_upload(vk, &t->buf, 0, w->data, bytes);
        } else {
            uint8_t *row = calloc(1, dst_row);
            if (!row) s = ekv_err(EKV_ERR_NOMEM, "out of memory");
            for (int64_t r = 0; r < w->ne1 && s == EKV_OK; r++) {
                memcpy(row, (const char *)w->data + (size_t)r * w->row_bytes, el_row);
                s = ekv_vk_upload(vk, &t->buf, (size_t)r * dst_row, row, dst_row);
            }
            free(row);
        }
    }
    return s;
}

static enum ekv_status check_types(const struct ekv_model *m) {
    const struct ekv_model_info *in = &m->info;
    if (in->head_dim > 256 || in->head_dim % 8)
        return ekv_err(EKV_ERR_UNSUPPORTED, "head_dim %d (not a multiple of 8 up to 256) has no GPU attention yet",
                       in->head_dim);
    if (in->n_head % in->n_head_kv) return ekv_err(EKV_ERR_UNSUPPORTED, "n_head not a multiple of n_head_kv");
    /* matvec.comp reads rows 16 bytes at a time (n_ff: padded, ff_stride) */
    const int64_t widths[3] = {in->n_embd, (int64_t)in->n_head * in->head_dim, (int64_t)in->n_head_kv * in->head_dim};
    for (int i = 0; i < 3; i++)
        if (widths[i] % 8)
            return ekv_err(EKV_ERR_UNSUPPORTED, "activation rows of %lld values (not a multiple of 8) have no GPU shader",
                           (long long)widths[i]);
    if (!ekv_vk_weight_type_ok(m->output.type))
        return ekv_err(EKV_ERR_UNSUPPORTED, "output: weight type %s has no GPU shader yet", ekv_dtype_name(m->output.type));
    for (int32_t l = 0; l < in->n_layer; l++) {
        const struct ekv_layer_weights *L = &m->layers[l];
        const struct ekv_weight *ws[EKV_VK_LAYER_MATS];
        layer_mats(L, ws);
        for (int i = 0; i < EKV_VK_LAYER_MATS; i++)
            if (!ekv_vk_weight_type_ok(ws[i]->type))
                return ekv_err(EKV_ERR_UNSUPPORTED, "layer %d: weight type %s has no GPU shader yet", (int)l,
                               ekv_dtype_name(ws[i]->type));
    }
    return EKV_OK;
}

static enum ekv_status upload_model(struct ekv_vk_ctx *g, const struct ekv_model *m) {
    const struct ekv_model_info *in = &m->info;
    const int64_t D = in->n_embd, QD = (int64_t)in->n_head * in->head_dim, KVD = (int64_t)in->n_head_kv * in->head_dim;
    enum ekv_status s = EKV_OK;
    char what[64];
    for (int32_t l = 0; l < in->n_layer && s == EKV_OK; l++) {
        const struct ekv_layer_weights *L = &m->layers[l];
        snprintf(what, sizeof what, "layer %d weights", (int)l);
        const struct ekv_weight *ws[EKV_VK_LAYER_MATS];
        layer_mats(L, ws);
        for (int i = 0; i < EKV_VK_LAYER_MATS && s == EKV_OK; i++) s = ekv_vk_ttab_weight(g->vk, &g->wt, ws[i], what);
        if (s == EKV_OK) s = ekv_vk_ttab_vector(g->vk, &g->wt, L->attn_norm, D, what);
        if (s == EKV_OK) s = ekv_vk_ttab_vector(g->vk, &g->wt, L->ffn_norm, D, what);
        if (s == EKV_OK) s = ekv_vk_ttab_vector(g->vk, &g->wt, L->bq, QD, what);
        if (s == EKV_OK) s = ekv_vk_ttab_vector(g->vk, &g->wt, L->bk, KVD, what);
        if (s == EKV_OK) s = ekv_vk_ttab_vector(g->vk, &g->wt, L->bv, KVD, what);
    }
    if (s == EKV_OK) s = ekv_vk_ttab_vector(g->vk, &g->wt, m->output_norm, D, "output norm");
    if (s == EKV_OK) s = ekv_vk_ttab_weight(g->vk, &g->wt, &m->output, "output (classifier)");
    ekv_vk_ttab_sort(&g->wt);
    return s;
}

/* ---- context ---- */

/* Builds the pipelines the model's forward uses (else built on first use). */
static enum ekv_status prepare_pipelines(struct ekv_vk_ctx *g, const struct ekv_model *m) {
    bool used[EKV_VK_W_COUNT + 1] = {false}; /* + 1: a type without a shader (refused earlier) */
    used[mv_type(m->output.type)] = true;
    for (int32_t l = 0; l < m->info.n_layer; l++) {
        const struct ekv_layer_weights *L = &m->layers[l];
        const struct ekv_weight *ws[EKV_VK_LAYER_MATS];
        layer_mats(L, ws);
        for (int i = 0; i < EKV_VK_LAYER_MATS; i++) used[mv_type(ws[i]->type)] = true;
    }
    const uint32_t mm = ekv_vk_matvec_m(g->vk);
    if (mm == 0)
        return ekv_err(EKV_ERR_UNSUPPORTED, "subgroups of %u invocations (the matvec shader needs 8 or more)",
                       ekv_vk_subgroup_size(g->vk));
    enum ekv_status s = EKV_OK;
    for (int t = 0; t < EKV_VK_W_COUNT && s == EKV_OK; t++)
        for (int shape = EKV_VK_MV_DECODE; shape <= EKV_VK_MV_ONE && used[t] && s == EKV_OK; shape++)
            s = ekv_vk_prepare(g->vk, ekv_vk_matvec_pipe((enum ekv_vk_mv_type)t, mm, (enum ekv_vk_mv_shape)shape));
    const enum ekv_vk_pipe rest[3] = {EKV_VK_RMSNORM, EKV_VK_ATTN_COMBINE, EKV_VK_GLU};
    for (int i = 0; i < 3 && s == EKV_OK; i++) s = ekv_vk_prepare(g->vk, rest[i]);
    /* the default cache (f16); other storage types when a sequence asks */
    if (s == EKV_OK) s = ekv_vk_kv_prepare(g, EKV_KV_F16, EKV_KV_F16);
    return s;
}

static void free_scratch(struct ekv_vk_ctx *g) {
    for (int a = 0; a < EKV_ACT_COUNT; a++) ekv_vk_buf_free(g->vk, &g->act[a]);
    ekv_vk_buf_free(g->vk, &g->gate);
    ekv_vk_buf_free(g->vk, &g->up);
    ekv_vk_buf_free(g->vk, &g->xin);
    ekv_vk_buf_free(g->vk, &g->cs);
    g->rows_cap = 0;
}

static enum ekv_status reserve_rows(struct ekv_vk_ctx *g, const struct ekv_model_info *in, int32_t rows) {
    if (rows <= g->rows_cap) return EKV_OK;
    free_scratch(g);
    int32_t want = rows < 8 ? 8 : rows;
    const size_t R = (size_t)want, F = sizeof(float);
    enum ekv_status s = EKV_OK;
    for (int a = 0; a < EKV_ACT_COUNT && s == EKV_OK; a++)
        s = ekv_vk_buf_new(g->vk, R * ekv_act_width(in, a) * F, false, "activations", &g->act[a]);
    const size_t FS = (size_t)ff_stride(in);
    if (s == EKV_OK) s = ekv_vk_buf_new(g->vk, R * FS * F, false, "activations", &g->gate);
    if (s == EKV_OK) s = ekv_vk_buf_new(g->vk, R * FS * F, false, "activations", &g->up);
    if (s == EKV_OK && FS != (size_t)in->n_ff) { /* the pad columns are never written: zero them once */
        float *zero = calloc(R * FS, F);
        if (!zero) s = ekv_err(EKV_ERR_NOMEM, "out of memory");
        if (s == EKV_OK) s = ekv_vk_upload(g->vk, &g->gate, 0, zero, R * FS * F);
        if (s == EKV_OK) s = ekv_vk_upload(g->vk, &g->up, 0, zero, R * FS * F);
        free(zero);
    }
    if (s == EKV_OK) s = ekv_vk_buf_new(g->vk, R * (size_t)in->n_embd * F, true, "input rows", &g->xin);
    if (s == EKV_OK) s = ekv_vk_buf_new(g->vk, R * (size_t)in->rope_dim * F, true, "rope rows", &g->cs);
    if (s != EKV_OK) {
        free_scratch(g);
        return ekv_err_prefix(s, "GPU scratch for %d rows", (int)rows);
    }
    g->rows_cap = want;
    return EKV_OK;
}

enum ekv_status ekv_vk_ctx_new(struct ekv_context *ctx, const char *spec, struct ekv_vk_ctx **out) {
    *out = NULL;
    const bool required = strcmp(spec, "auto") != 0;
    struct ekv_vk *vk = NULL;
    enum ekv_status s = ekv_vk_open(spec, &vk);
    if (s != EKV_OK) return s;
    if (!vk) return EKV_OK; /* auto and no GPU: the CPU */
    if ((s = check_types(ctx->model)) != EKV_OK) {
        ekv_vk_close(vk);
        if (!required) {
            ekv_err_clear();
            return EKV_OK;
        }
        return ekv_err_prefix(s, "device %s", spec);
    }
    struct ekv_vk_ctx *g = calloc(1, sizeof *g);
    if (!g) {
        ekv_vk_close(vk);
        return ekv_err(EKV_ERR_NOMEM, "out of memory");
    }
    g->vk = vk;
    g->tower.vk = vk; /* the vision tower on the context's device (backend_vk_clip.c) */
    s = prepare_pipelines(g, ctx->model);
    if (s == EKV_OK) s = upload_model(g, ctx->model);
    if (s == EKV_OK) s = reserve_rows(g, &ctx->model->info, 8);
    if (s != EKV_OK) { /* the message first: freeing the context closes vk, whose name it names */
        s = ekv_err_prefix(s, "%s: the model's weights", ekv_vk_name(vk));
        ekv_vk_ctx_free(g);
        return s;
    }
    *out = g;
    return EKV_OK;
}

void ekv_vk_ctx_free(struct ekv_vk_ctx *g) {
    if (!g) return;
    free_scratch(g);
    ekv_vk_buf_free(g->vk, &g->logits);
    ekv_vk_kv_free_scratch(g);
    ekv_vk_ttab_free(g->vk, &g->wt);
    ekv_vk_tower_release(&g->tower);
    ekv_vk_close(g->vk);
    free(g);
}

const char *ekv_vk_ctx_name(const struct ekv_vk_ctx *g) { return ekv_vk_name(g->vk); }
uint64_t ekv_vk_ctx_bytes(const struct ekv_vk_ctx *g, bool peak) {
    if (!g) return 0;
    return peak ? ekv_vk_peak_bytes(g->vk) : ekv_vk_bytes(g->vk);
}
uint64_t ekv_vk_ctx_last_ns(const struct ekv_vk_ctx *g) { return g ? ekv_vk_last_submit_ns(g->vk) : 0; }
enum ekv_status ekv_vk_ctx_profile(const struct ekv_vk_ctx *g, char *buf, size_t cap) {
    uint64_t ns[EKV_VK_PIPE_COUNT], calls[EKV_VK_PIPE_COUNT], total = 0;
    if (!g || !buf || cap == 0 || !ekv_vk_profile(g->vk, ns, calls))
        return ekv_err(EKV_ERR_UNSUPPORTED, "no device profile (a GPU context made with EKV_VK_PROFILE=1)");
    for (int p = 0; p < EKV_VK_PIPE_COUNT; p++) total += ns[p];
    size_t used = (size_t)snprintf(buf, cap, "%-20s %10s %12s %10s %6s\n", "shader", "dispatches", "total ms",
                                   "mean us", "share");
    bool done[EKV_VK_PIPE_COUNT] = {false};
    for (int k = 0; k < EKV_VK_PIPE_COUNT && used < cap; k++) { /* largest first */
        int best = -1;
        for (int p = 0; p < EKV_VK_PIPE_COUNT; p++)
            if (!done[p] && calls[p] && (best < 0 || ns[p] > ns[best])) best = p;
        if (best < 0) break;
        done[best] = true;
        used += (size_t)snprintf(buf + used, cap - used, "%-20s %10llu %12.3f %10.2f %5.1f%%\n",
                                 ekv_vk_pipe_name((enum ekv_vk_pipe)best), (unsigned long long)calls[best],
                                 ns[best] / 1e6, ns[best] / 1e3 / (double)calls[best],
                                 total ? 100.0 * (double)ns[best] / (double)total : 0.0);
    }
    return EKV_OK;
}

void ekv_vk_ctx_profile_reset(struct ekv_vk_ctx *g) {
    if (g) ekv_vk_profile_reset(g->vk);
}

uint64_t ekv_vk_ctx_validation(const struct ekv_vk_ctx *g, const char **first) {
    if (first) *first = g ? ekv_vk_validation_first(g->vk) : "";
    return g ? ekv_vk_validation_errors(g->vk) : 0;
}

/* ---- operations ---- */

static struct ekv_vk_ctx *G(struct ekv_context *ctx) { return ekv_vk_of(ctx); }

static uint64_t act_addr(struct ekv_context *ctx, enum ekv_act a, int32_t row0) { return ekv_vk_act_addr(ctx, a, row0); }

static uint32_t grid_rows(int64_t n) { return (uint32_t)(n < 32768 ? (n < 1 ? 1 : n) : 32768); }

/* Sizes the scratch for the forward's rows (the attention partials too:
 * they must be large enough before recording starts), copies the input rows
 * in and opens the recording. */
static enum ekv_status vk_begin(struct ekv_context *ctx, int32_t n_rows) {
    struct ekv_vk_ctx *g = G(ctx);
    const struct ekv_model_info *in = &ctx->model->info;
    enum ekv_status s = reserve_rows(g, in, n_rows);
    if (s != EKV_OK) return s;
    if ((s = ekv_vk_kv_begin(ctx, n_rows)) != EKV_OK) return s;
    memcpy(g->xin.host, ctx->x, (size_t)n_rows * (size_t)in->n_embd * sizeof(float));
    if ((s = ekv_vk_begin(g->vk)) != EKV_OK) return s;
    g->n_rows = n_rows;
    g->cs_done = false;
    g->logits_dst = NULL;
    g->logits_rows = 0;

    ekv_vk_copy(g->vk, &g->xin, 0, &g->act[EKV_ACT_X], 0, (size_t)n_rows * (size_t)in->n_embd * sizeof(float));
    return EKV_OK;
}

static enum ekv_status vk_seq_begin(struct ekv_context *ctx, struct ekv_fwd_part *part) {
    return ekv_vk_kv_part_begin(ctx, part);
}

static enum ekv_status vk_seq_end(struct ekv_context *ctx, struct ekv_fwd_part *part) {
    (void)ctx;
    ekv_vk_kv_part_done(part);
    return EKV_OK;
}

static enum ekv_status vk_rmsnorm(struct ekv_context *ctx, enum ekv_act dst, enum ekv_act src, int32_t src_row0,
                                  const float *w, int32_t n_rows) {
    const struct ekv_vk_tensor *t = find(G(ctx), w);
    if (!t) return ekv_err(EKV_ERR_INTERNAL, "norm weight not on the device");
    const uint32_t D = (uint32_t)ctx->model->info.n_embd;
    struct ekv_vk_pc_rmsnorm pc = {.x = act_addr(ctx, src, src_row0), .w = t->buf.addr, .y = act_addr(ctx, dst, 0), .n = D,
                            .rows = (uint32_t)n_rows, .x_stride = D, .y_stride = D, .eps = ctx->model->info.norm_eps};
    ekv_vk_dispatch(G(ctx)->vk, EKV_VK_RMSNORM, &pc, sizeof pc, grid_rows(n_rows), 1, 1);
    return EKV_OK;
}

/* y (rows [0, n), stride y_stride) (+)= W x (+ b) */
static enum ekv_status matvec(struct ekv_context *ctx, const struct ekv_weight *w, uint64_t x, uint32_t x_stride,
                              uint64_t y, uint32_t y_stride, const float *bias, bool acc, int32_t n_rows,
                              bool with_barrier) {
    struct ekv_vk_ctx *g = G(ctx);
    const struct ekv_vk_tensor *t = find(g, w->data);
    if (!t) return ekv_err(EKV_ERR_INTERNAL, "weight not on the device");
    const struct ekv_vk_tensor *b = bias ? find(g, bias) : NULL;
    if (bias && !b) return ekv_err(EKV_ERR_INTERNAL, "bias not on the device");
    return ekv_vk_matvec_rec(g->vk, t, b, x, x_stride, y, y_stride, acc, n_rows, with_barrier);
}

enum ekv_status ekv_vk_matvec_rec(struct ekv_vk *vk, const struct ekv_vk_tensor *t, const struct ekv_vk_tensor *b,
                                  uint64_t x, uint32_t x_stride, uint64_t y, uint32_t y_stride, bool acc,
                                  int32_t n_rows, bool with_barrier) {
    struct ekv_vk_pc_matvec pc = {.w = t->buf.addr + t->q_off, .s = t->buf.addr, .x = x, .y = y, .b = b ? b->buf.addr : 0,
                           .ne0 = (uint32_t)t->ne0, .ne1 = (uint32_t)t->ne1, .n = (uint32_t)n_rows,
                           .x_stride = x_stride, .y_stride = y_stride,
                           .flags = (acc ? EKV_VK_MV_ACC : 0u) | (b ? EKV_VK_MV_BIAS : 0u)};
    if (t->ne0 % 8 != 0 || x_stride % 4 != 0 || (x & 15) != 0)
        return ekv_err(EKV_ERR_INTERNAL, "GPU matvec: rows of %lld (stride %u) are not in 16-byte pieces",
                       (long long)t->ne0, x_stride);
    /* one row (decode of one sequence): the shape for one row (fewer
     * registers); more than one workgroup of activation rows: the prompt shape,
     * which reuses each activation chunk over 4 weight rows (the same sums
     * in every shape) */
    const enum ekv_vk_mv_shape shape = n_rows == 1                   ? EKV_VK_MV_ONE
                                       : n_rows > EKV_VK_MATVEC_NT ? EKV_VK_MV_PROMPT
                                                                   : EKV_VK_MV_DECODE;
    const uint32_t gy = (uint32_t)((n_rows + EKV_VK_MATVEC_NT - 1) / EKV_VK_MATVEC_NT);
    /* rows per workgroup: (128 / (32 / M)) groups of RM (1, or 4 in the prompt shape) */
    const uint32_t m = ekv_vk_matvec_m(vk);
    const int64_t per_wg = (int64_t)(128 / (32 / m)) * (shape == EKV_VK_MV_PROMPT && m == 1 ? 4 : 1);
    (with_barrier ? ekv_vk_dispatch : ekv_vk_dispatch_nb)(vk, ekv_vk_matvec_pipe(mv_type(t->type), m, shape), &pc,
                                                           sizeof pc, grid_rows((t->ne1 + per_wg - 1) / per_wg), gy, 1);
    return EKV_OK;
}

static enum ekv_status vk_matmul(struct ekv_context *ctx, const struct ekv_weight *const *w, const float *const *bias,
                                 int n_w, enum ekv_act src, const enum ekv_act *dst, int32_t n_rows) {
    const struct ekv_model_info *in = &ctx->model->info;
    for (int i = 0; i < n_w; i++) {
        enum ekv_status s = matvec(ctx, w[i], act_addr(ctx, src, 0), (uint32_t)ekv_act_width(in, src),
                                   act_addr(ctx, dst[i], 0), (uint32_t)ekv_act_width(in, dst[i]), bias ? bias[i] : NULL,
                                   false, n_rows, i == n_w - 1); /* independent products: one barrier after all */
        if (s != EKV_OK) return s;
    }
    return EKV_OK;
}

static enum ekv_status vk_matmul_add(struct ekv_context *ctx, const struct ekv_weight *w, enum ekv_act src,
                                     enum ekv_act dst, int32_t n_rows) {
    const struct ekv_model_info *in = &ctx->model->info;
    return matvec(ctx, w, act_addr(ctx, src, 0), (uint32_t)ekv_act_width(in, src), act_addr(ctx, dst, 0),
                  (uint32_t)ekv_act_width(in, dst), NULL, true, n_rows, true);
}

/* The {cos, sin} rows of the forward, computed here for every row (the same
 * for every layer: once per forward); the rotation itself is recorded with
 * each part's cache store (ekv_vk_kv_attention: rope_store.comp). */
static enum ekv_status vk_rope(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                               const int64_t *rope0) {
    struct ekv_vk_ctx *g = G(ctx);
    const int RD = ctx->model->info.rope_dim;
    if (!g->cs_done && RD > 0) {
        float *cs = g->cs.host;
        for (int32_t p = 0; p < n_parts; p++)
            for (int32_t i = 0; i < parts[p].n; i++) {
                float *row = cs + (size_t)(parts[p].row0 + i) * RD;
                const int32_t *mp = parts[p].step.mpos;
                if (mp) { /* M-RoPE: an image row's (time, height, width), or text past an image */
                    const int64_t pos[4] = {mp[3 * i], mp[3 * i + 1], mp[3 * i + 2], 0};
                    ekv_rope_sincos_multi(&ctx->rope, pos, row);
                } else {
                    ekv_rope_sincos_ext(&ctx->rope, rope0[p] + i, row);
                }
            }
    }
    g->cs_done = true;
    return EKV_OK;
}

static enum ekv_status vk_attention(struct ekv_context *ctx, int il, struct ekv_fwd_part *parts, int32_t n_parts,
                                    struct ekv_kv_part *kvp) {
    (void)kvp;
    return ekv_vk_kv_attention(ctx, il, parts, n_parts);
}

static enum ekv_status vk_ffn(struct ekv_context *ctx, const struct ekv_layer_weights *L, int32_t n_rows) {
    struct ekv_vk_ctx *g = G(ctx);
    const struct ekv_model_info *in = &ctx->model->info;
    const uint32_t D = (uint32_t)in->n_embd, FF = (uint32_t)ff_stride(in);
    const uint64_t xb = act_addr(ctx, EKV_ACT_XB, 0);
    enum ekv_status s = matvec(ctx, &L->w_gate, xb, D, g->gate.addr, FF, NULL, false, n_rows, false);
    if (s == EKV_OK) s = matvec(ctx, &L->w_up, xb, D, g->up.addr, FF, NULL, false, n_rows, true);
    if (s != EKV_OK) return s;
    /* the pad columns of gate and up are zero and stay zero: act(0) * 0 */
    const uint64_t n = (uint64_t)n_rows * FF;
    struct ekv_vk_pc_glu pc = {.g = g->gate.addr, .u = g->up.addr, .n = (uint32_t)n, .gelu = in->ffn_gelu};
    ekv_vk_dispatch(g->vk, EKV_VK_GLU, &pc, sizeof pc, grid_rows((int64_t)((n + 255) / 256)), 1, 1);
    return matvec(ctx, &L->w_down, g->gate.addr, FF, act_addr(ctx, EKV_ACT_X, 0), D, NULL, true, n_rows, true);
}

static enum ekv_status vk_classify(struct ekv_context *ctx, int32_t n_rows, float *logits) {
    struct ekv_vk_ctx *g = G(ctx);
    const struct ekv_model_info *in = &ctx->model->info;
    if (n_rows > g->logits_cap) { /* rows that give logits (a prompt's last, or all for eval), not all rows: a long
                                     prompt read in one forward would need n_vocab floats for each of its rows */
        ekv_vk_buf_free(g->vk, &g->logits); /* not read by the open recording: only this writes it */
        g->logits_cap = 0;
        const int32_t want = EKV_MAX(n_rows, 8);
        enum ekv_status s = ekv_vk_buf_new(g->vk, (size_t)want * (size_t)in->n_vocab * sizeof(float), true, "logits",
                                           &g->logits);
        if (s != EKV_OK) return s;
        g->logits_cap = want;
    }
    g->logits_dst = logits;
    g->logits_rows = n_rows;
    return matvec(ctx, &ctx->model->output, act_addr(ctx, EKV_ACT_XB, 0), (uint32_t)in->n_embd, g->logits.addr,
                  (uint32_t)in->n_vocab, NULL, false, n_rows, true);
}

static enum ekv_status vk_end(struct ekv_context *ctx, enum ekv_status status) {
    struct ekv_vk_ctx *g = G(ctx);
    if (status != EKV_OK) {
        ekv_vk_abort(g->vk);
        ekv_vk_mg_abort(ctx);
        ekv_vk_mg_release(g);
        return status;
    }
    enum ekv_status s = ekv_vk_submit(g->vk);
    ekv_vk_mg_release(g);
    if (s != EKV_OK) {
        ekv_vk_mg_abort(ctx);
        return s;
    }
    if (g->logits_dst)
        memcpy(g->logits_dst, g->logits.host, (size_t)g->logits_rows * (size_t)ctx->model->info.n_vocab * sizeof(float));
    /* compressed caches: statistics, the policies, their plans */
    return ekv_vk_mg_after(ctx);
}

const struct ekv_backend_ops ekv_backend_vk = {
    .name = "vulkan",
    .begin = vk_begin,
    .seq_begin = vk_seq_begin,
    .seq_end = vk_seq_end,
    .rmsnorm = vk_rmsnorm,
    .matmul = vk_matmul,
    .matmul_add = vk_matmul_add,
    .rope = vk_rope,
    .attention = vk_attention,
    .ffn = vk_ffn,
    .classify = vk_classify,
    .end = vk_end,
};
