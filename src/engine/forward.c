/*
 * forward.c — the Llama-family transformer forward (LLaMA, Mistral, SmolLM,
 * Qwen2, Phi-3, Gemma): RMSNorm, Q/K/V projections (optional biases; Phi-3's
 * fused tensors are bound as views by the loader), RoPE with its scalings
 * (one rotation per row for queries and keys), attention
 * through the KV cache (src/kv/attend.c, which also feeds the policy its
 * statistics and lets it compress the layer right away), output projection,
 * SwiGLU feed-forward (GeGLU for Gemma, whose token embeddings are also
 * scaled by sqrt(n_embd)). Rows of several sequences can share one forward
 * (batched decode): the weight products run over all rows at once, the
 * attention per sequence. One layer is one call (ekv_forward_layer), so a
 * prompt can also be read layer by layer in bounded pieces (prompt.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/engine.h"

/* Feed-forward rows per sub-batch: bounds the [rows][n_ff] scratch. */
#define EKV_FFN_ROWS 256

enum ekv_status ekv_forward_embed(const struct ekv_model *m, int32_t token, float *dst) {
    enum ekv_status s = ekv_weight_get_row(&m->tok_embd, token, dst);
    if (s != EKV_OK || m->info.embd_scale == 1.0f) return s;
    /* Gemma: token embeddings times sqrt(n_embd) (ggml_scale in float) */
    for (int64_t i = 0; i < m->info.n_embd; i++) dst[i] *= m->info.embd_scale;
    return EKV_OK;
}

static void add_bias(float *y, const float *b, int32_t rows, int64_t dim) {
    if (!b) return;
    for (int32_t r = 0; r < rows; r++) ekv_add(y + (size_t)r * dim, b, dim);
}

int64_t ekv_forward_rope0(const struct ekv_fwd_part *part) {
    /* the true position unless the policy moves it (Elastic Cache's
     * reference mode: the compressed cache length, POLICIES.md 0.6) */
    return ekv_kv_rope_pos(part->seq->kv, &part->step);
}

enum ekv_status ekv_forward_layer(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                                  int32_t n_rows, int il, const int64_t *rope0, struct ekv_kv_part *kvp) {
    const struct ekv_model *m = ctx->model;
    const struct ekv_model_info *in = &m->info;
    const int64_t D = in->n_embd, HD = in->head_dim;
    const int64_t QD = (int64_t)in->n_head * HD, KVD = (int64_t)in->n_head_kv * HD, FF = in->n_ff;
    struct ekv_pool *pool = ctx->pool;
    const struct ekv_layer_weights *L = &m->layers[il];
    enum ekv_status s;
    for (int32_t r = 0; r < n_rows; r++)
        ekv_rmsnorm(ctx->xb + (size_t)r * D, ctx->x + (size_t)r * D, L->attn_norm, D, in->norm_eps);
    /* Q, K and V: one quantisation of xb, one pool job */
    const struct ekv_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
    float *qkv_out[3] = {ctx->q, ctx->k, ctx->v};
    if ((s = ekv_matmul_multi(pool, qkv, 3, ctx->xb, n_rows, qkv_out))) return s;
    add_bias(ctx->q, L->bq, n_rows, QD);
    add_bias(ctx->k, L->bk, n_rows, KVD);
    add_bias(ctx->v, L->bv, n_rows, KVD);
    const int RD = in->rope_dim;
    for (int32_t p = 0; p < n_parts; p++) {
        for (int32_t i = 0; i < parts[p].n; i++) {
            int64_t r = parts[p].row0 + i;
            float *cs = ctx->rope_cs + (size_t)r * RD; /* the context's RoPE, scaling included */
            ekv_rope_sincos_ext(&ctx->rope, rope0[p] + i, cs);
            ekv_rope_apply(ctx->q + r * QD, in->n_head, (int)HD, RD, cs, in->rope_neox);
            ekv_rope_apply(ctx->k + r * KVD, in->n_head_kv, (int)HD, RD, cs, in->rope_neox);
        }
        size_t r0 = (size_t)parts[p].row0;
        kvp[p] = (struct ekv_kv_part){.kv = parts[p].seq->kv, .step = &parts[p].step, .q = ctx->q + r0 * QD,
                                      .k = ctx->k + r0 * KVD, .v = ctx->v + r0 * KVD, .out = ctx->att + r0 * QD};
    }
    /* one sequence: its KV heads split over the pool; several (batched
     * decode): all (sequence, KV head) pairs in one job */
    if (n_parts == 1)
        s = ekv_kv_layer_forward(kvp[0].kv, pool, il, kvp[0].step, kvp[0].q, kvp[0].k, kvp[0].v, kvp[0].out);
    else if (n_parts > 1)
        s = ekv_kv_layer_forward_batch(pool, il, kvp, n_parts);
    if (s != EKV_OK) return s;
    if ((s = ekv_matmul(pool, &L->wo, ctx->att, n_rows, ctx->proj))) return s;
    for (int32_t r = 0; r < n_rows; r++) {
        ekv_add(ctx->x + (size_t)r * D, ctx->proj + (size_t)r * D, D);
        ekv_rmsnorm(ctx->xb + (size_t)r * D, ctx->x + (size_t)r * D, L->ffn_norm, D, in->norm_eps);
    }
    for (int32_t r0 = 0; r0 < n_rows; r0 += EKV_FFN_ROWS) {
        int32_t nr = EKV_MIN(EKV_FFN_ROWS, n_rows - r0);
        const float *xb = ctx->xb + (size_t)r0 * D;
        const struct ekv_weight *gu[2] = {&L->w_gate, &L->w_up};
        float *gu_out[2] = {ctx->gate, ctx->up};
        if ((s = ekv_matmul_multi(pool, gu, 2, xb, nr, gu_out))) return s;
        if (in->ffn_gelu) { /* Gemma: GeGLU */
            ekv_gelu(ctx->gate, (int64_t)nr * FF);
            for (int64_t i = 0; i < (int64_t)nr * FF; i++) ctx->gate[i] *= ctx->up[i];
        } else {
            ekv_swiglu(ctx->gate, ctx->gate, ctx->up, (int64_t)nr * FF);
        }
        if ((s = ekv_matmul(pool, &L->w_down, ctx->gate, nr, ctx->proj))) return s;
        for (int32_t r = 0; r < nr; r++) ekv_add(ctx->x + (size_t)(r0 + r) * D, ctx->proj + (size_t)r * D, D);
    }
    return EKV_OK;
}

enum ekv_status ekv_forward_output(struct ekv_context *ctx, int32_t n_rows, int32_t out_row0, float *logits) {
    const struct ekv_model *m = ctx->model;
    const int64_t D = m->info.n_embd;
    /* final norm of the rows that want logits, packed, then the classifier */
    if (!logits || out_row0 < 0 || out_row0 >= n_rows) return EKV_OK;
    const int32_t n_out = n_rows - out_row0;
    for (int32_t r = 0; r < n_out; r++)
        ekv_rmsnorm(ctx->xb + (size_t)r * D, ctx->x + (size_t)(out_row0 + r) * D, m->output_norm, D, m->info.norm_eps);
    return ekv_matmul(ctx->pool, &m->output, ctx->xb, n_out, logits);
}

enum ekv_status ekv_forward(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                            int32_t n_rows, int32_t out_row0, float *logits) {
    const int32_t np = n_parts > 0 ? n_parts : 1;
    enum ekv_status s = EKV_OK;
    int64_t *rope0 = malloc((size_t)np * sizeof *rope0);
    struct ekv_kv_part *kvp = malloc((size_t)np * sizeof *kvp);
    if (!rope0 || !kvp) {
        free(rope0);
        free(kvp);
        return ekv_err(EKV_ERR_NOMEM, "out of memory for %d sequences of a forward", (int)n_parts);
    }
    for (int32_t p = 0; p < n_parts && s == EKV_OK; p++) {
        rope0[p] = ekv_forward_rope0(&parts[p]);
        s = ekv_kv_begin(parts[p].seq->kv, &parts[p].step);
    }
    for (int32_t il = 0; il < ctx->model->info.n_layer && s == EKV_OK; il++)
        s = ekv_forward_layer(ctx, parts, n_parts, n_rows, il, rope0, kvp);
    free(kvp);
    free(rope0);
    for (int32_t p = 0; p < n_parts && s == EKV_OK; p++) s = ekv_kv_end(parts[p].seq->kv, &parts[p].step);
    if (s != EKV_OK) return s;
    return ekv_forward_output(ctx, n_rows, out_row0, logits);
}
