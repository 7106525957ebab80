/*
 * backend_cpu.c — the operations of the forward on the CPU kernels (the
 * reference backend): activation slots are the context's scratch arrays,
 * attention runs through the KV cache with its policy (src/kv/attend.c).
 * Each op runs at once; begin/end have nothing to do.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend.h"
#include "engine/engine.h"

/* Feed-forward rows per sub-batch: bounds the [rows][n_ff] scratch. */
#define EKV_FFN_ROWS 256

/* From this many rows (a prompt), the row-wise ops (norms, RoPE, residual
 * adds, the SwiGLU) are split over the pool instead of running on the
 * calling thread while the workers wait; fewer rows (decode) run inline.
 * Each row gets the same calls either way, so the bits do not change. */
#define EKV_PAR_ROWS 32

struct rows_job {
    struct ekv_context *ctx;
    int32_t n;                                                 /* rows [0, n) */
    void (*fn)(const struct rows_job *j, int32_t r0, int32_t r1); /* rows [r0, r1) */
    float *y;
    const float *x, *w;
    int64_t width;
    struct ekv_fwd_part *parts; /* RoPE */
    int32_t n_parts;
    const int64_t *rope0;
};

static void rows_task(void *arg, int ith, int nth) {
    const struct rows_job *j = arg;
    const int32_t r0 = (int32_t)((int64_t)j->n * ith / nth), r1 = (int32_t)((int64_t)j->n * (ith + 1) / nth);
    if (r0 < r1) j->fn(j, r0, r1);
}

static void rows_run(struct rows_job *j) {
    if (j->n >= EKV_PAR_ROWS && ekv_pool_size(j->ctx->pool) > 1)
        ekv_pool_run(j->ctx->pool, rows_task, j);
    else if (j->n > 0)
        j->fn(j, 0, j->n);
}

/* y[r] += x[r], rows of width */
static void add_rows(const struct rows_job *j, int32_t r0, int32_t r1) {
    for (int32_t r = r0; r < r1; r++) ekv_add(j->y + (size_t)r * j->width, j->x + (size_t)r * j->width, j->width);
}

static float *act(struct ekv_context *ctx, enum ekv_act a) {
    switch (a) {
    case EKV_ACT_X: return ctx->x;
    case EKV_ACT_XB: return ctx->xb;
    case EKV_ACT_Q: return ctx->q;
    case EKV_ACT_K: return ctx->k;
    case EKV_ACT_V: return ctx->v;
    case EKV_ACT_ATT: return ctx->att;
    default: return NULL;
    }
}

static enum ekv_status cpu_begin(struct ekv_context *ctx, int32_t n_rows) { return EKV_OK; }

static enum ekv_status cpu_seq_begin(struct ekv_context *ctx, struct ekv_fwd_part *part) {
    return ekv_kv_begin(part->seq->kv, &part->step);
}

static enum ekv_status cpu_seq_end(struct ekv_context *ctx, struct ekv_fwd_part *part) {
    return ekv_kv_end(part->seq->kv, &part->step);
}

static void rmsnorm_rows(const struct rows_job *j, int32_t r0, int32_t r1) {
    const int64_t D = j->width;
    for (int32_t r = r0; r < r1; r++)
        ekv_rmsnorm(j->y + (size_t)r * D, j->x + (size_t)r * D, j->w, D, j->ctx->model->info.norm_eps);
}

static enum ekv_status cpu_rmsnorm(struct ekv_context *ctx, enum ekv_act dst, enum ekv_act src, int32_t src_row0,
                                   const float *w, int32_t n_rows) {
    const int64_t D = ctx->model->info.n_embd;
    struct rows_job j = {.ctx = ctx, .n = n_rows, .fn = rmsnorm_rows, .y = act(ctx, dst),
                         .x = act(ctx, src) + (size_t)src_row0 * D, .w = w, .width = D};
    rows_run(&j);
    return EKV_OK;
}

static enum ekv_status cpu_matmul(struct ekv_context *ctx, const struct ekv_weight *const *w,
                                  const float *const *bias, int n_w, enum ekv_act src, const enum ekv_act *dst,
                                  int32_t n_rows) {
    float *out[4];
    if (n_w < 1 || n_w > 4) return ekv_err(EKV_ERR_INTERNAL, "cpu matmul: %d products", n_w);
    for (int i = 0; i < n_w; i++) out[i] = act(ctx, dst[i]);
    enum ekv_status s = ekv_matmul_multi(ctx->pool, w, n_w, act(ctx, src), n_rows, out);
    if (s != EKV_OK) return s;
    for (int i = 0; i < n_w; i++) {
        if (!bias || !bias[i]) continue;
        const int64_t W = (int64_t)ekv_act_width(&ctx->model->info, dst[i]);
        for (int32_t r = 0; r < n_rows; r++) ekv_add(out[i] + (size_t)r * W, bias[i], W);
    }
    return EKV_OK;
}

static enum ekv_status cpu_matmul_add(struct ekv_context *ctx, const struct ekv_weight *w, enum ekv_act src,
                                      enum ekv_act dst, int32_t n_rows) {
    enum ekv_status s = ekv_matmul(ctx->pool, w, act(ctx, src), n_rows, ctx->proj);
    if (s != EKV_OK) return s;
    struct rows_job j = {.ctx = ctx, .n = n_rows, .fn = add_rows, .y = act(ctx, dst), .x = ctx->proj,
                         .width = (int64_t)ekv_act_width(&ctx->model->info, dst)};
    rows_run(&j);
    return EKV_OK;
}

/* Rows [r0, r1) counted over the parts in order (part p's rows follow
 * part p - 1's). */
static void rope_rows(const struct rows_job *j, int32_t r0, int32_t r1) {
    struct ekv_context *ctx = j->ctx;
    const struct ekv_model_info *in = &ctx->model->info;
    const int64_t HD = in->head_dim, QD = (int64_t)in->n_head * HD, KVD = (int64_t)in->n_head_kv * HD;
    const int RD = in->rope_dim;
    const struct ekv_fwd_part *parts = j->parts;
    int32_t k = 0; /* rows of the parts before p */
    for (int32_t p = 0; p < j->n_parts && k < r1; k += parts[p].n, p++)
        for (int32_t i = EKV_MAX(0, r0 - k); i < parts[p].n && k + i < r1; i++) {
            int64_t r = parts[p].row0 + i;
            float *cs = ctx->rope_cs + (size_t)r * RD; /* the context's RoPE, scaling included */
            const int32_t *mp = parts[p].step.mpos;
            /* M-RoPE: (time, height, width) of an image row, or text past an image */
            const struct ekv_rope_key key = mp ? (struct ekv_rope_key){2, {mp[3 * i], mp[3 * i + 1], mp[3 * i + 2]}}
                                               : (struct ekv_rope_key){1, {j->rope0[p] + i, 0, 0}};
            struct ekv_rope_key *have = &ctx->rope_key[r];
            if (memcmp(have, &key, sizeof key) != 0) { /* else computed by an earlier layer of this forward */
                if (mp) {
                    const int64_t pos[4] = {key.p[0], key.p[1], key.p[2], 0};
                    ekv_rope_sincos_multi(&ctx->rope, pos, cs);
                } else {
                    ekv_rope_sincos_ext(&ctx->rope, key.p[0], cs);
                }
                *have = key;
            }
            ekv_rope_apply(ctx->q + r * QD, in->n_head, (int)HD, RD, cs, in->rope_neox);
            ekv_rope_apply(ctx->k + r * KVD, in->n_head_kv, (int)HD, RD, cs, in->rope_neox);
        }
}

static enum ekv_status cpu_rope(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                                const int64_t *rope0) {
    int32_t n = 0;
    for (int32_t p = 0; p < n_parts; p++) n += parts[p].n;
    struct rows_job j = {.ctx = ctx, .n = n, .fn = rope_rows, .parts = parts, .n_parts = n_parts, .rope0 = rope0};
    rows_run(&j);
    return EKV_OK;
}

static enum ekv_status cpu_attention(struct ekv_context *ctx, int il, struct ekv_fwd_part *parts, int32_t n_parts,
                                     struct ekv_kv_part *kvp) {
    const struct ekv_model_info *in = &ctx->model->info;
    const int64_t QD = (int64_t)in->n_head * in->head_dim, KVD = (int64_t)in->n_head_kv * in->head_dim;
    for (int32_t p = 0; p < n_parts; p++) {
        size_t r0 = (size_t)parts[p].row0;
        kvp[p] = (struct ekv_kv_part){.kv = parts[p].seq->kv, .step = &parts[p].step, .q = ctx->q + r0 * QD,
                                      .k = ctx->k + r0 * KVD, .v = ctx->v + r0 * KVD, .out = ctx->att + r0 * QD};
    }
    /* one sequence: its KV heads split over the pool; several (batched
     * decode): all (sequence, KV head) pairs in one job */
    if (n_parts == 1)
        return ekv_kv_layer_forward(kvp[0].kv, ctx->pool, il, kvp[0].step, kvp[0].q, kvp[0].k, kvp[0].v,
                                    kvp[0].out);
    if (n_parts > 1) return ekv_kv_layer_forward_batch(ctx->pool, il, kvp, n_parts);
    return EKV_OK;
}

/* The SwiGLU of rows [r0, r1) of [n][width] gate and up, in place in
 * gate (element-wise: the AVX2 kernel's masked tail computes a lane as
 * its full steps do, so where a range starts does not change a bit). */
static void swiglu_rows(const struct rows_job *j, int32_t r0, int32_t r1) {
    const size_t a = (size_t)r0 * (size_t)j->width, b = (size_t)r1 * (size_t)j->width;
    ekv_swiglu(j->y + a, j->y + a, j->x + a, (int64_t)(b - a));
}

static enum ekv_status cpu_ffn(struct ekv_context *ctx, const struct ekv_layer_weights *L, int32_t n_rows) {
    const struct ekv_model_info *in = &ctx->model->info;
    const int64_t D = in->n_embd, FF = in->n_ff;
    for (int32_t r0 = 0; r0 < n_rows; r0 += EKV_FFN_ROWS) {
        int32_t nr = EKV_MIN(EKV_FFN_ROWS, n_rows - r0);
        const float *xb = ctx->xb + (size_t)r0 * D;
        const struct ekv_weight *gu[2] = {&L->w_gate, &L->w_up};
        float *gu_out[2] = {ctx->gate, ctx->up};
        enum ekv_status s = ekv_matmul_multi(ctx->pool, gu, 2, xb, nr, gu_out);
        if (s != EKV_OK) return s;
        if (in->ffn_gelu) { /* Gemma: GeGLU */
            ekv_gelu(ctx->gate, (int64_t)nr * FF);
            for (int64_t i = 0; i < (int64_t)nr * FF; i++) ctx->gate[i] *= ctx->up[i];
        } else {
            struct rows_job j = {.ctx = ctx, .n = nr, .fn = swiglu_rows, .y = ctx->gate, .x = ctx->up, .width = FF};
            rows_run(&j);
        }
        if ((s = ekv_matmul(ctx->pool, &L->w_down, ctx->gate, nr, ctx->proj))) return s;
        struct rows_job j = {.ctx = ctx, .n = nr, .fn = add_rows, .y = ctx->x + (size_t)r0 * D, .x = ctx->proj,
                             .width = D};
        rows_run(&j);
    }
    return EKV_OK;
}

static enum ekv_status cpu_classify(struct ekv_context *ctx, int32_t n_rows, float *logits) {
    return ekv_matmul(ctx->pool, &ctx->model->output, ctx->xb, n_rows, logits);
}

static enum ekv_status cpu_end(struct ekv_context *ctx, enum ekv_status status) { return status; }

const struct ekv_backend_ops ekv_backend_cpu = {
    .name = "cpu",
    .begin = cpu_begin,
    .seq_begin = cpu_seq_begin,
    .seq_end = cpu_seq_end,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .matmul_add = cpu_matmul_add,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .ffn = cpu_ffn,
    .classify = cpu_classify,
    .end = cpu_end,
};
