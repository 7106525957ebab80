/*
 * forward.c — the Llama-family transformer forward (LLaMA, Mistral, SmolLM,
 * Qwen2, Phi-3, Gemma): RMSNorm, Q/K/V projections (optional biases; Phi-3's
 * fused tensors are bound as views by the loader), RoPE with its scalings
 * (one rotation per row for queries and keys), attention through the KV
 * cache (on the CPU src/kv/attend.c, which also feeds the policy its
 * statistics and lets it compress the layer right away), output projection,
 * SwiGLU feed-forward (GeGLU for Gemma, whose token embeddings are also
 * scaled by sqrt(n_embd)). Rows of several sequences can share one forward
 * (batched decode): the weight products run over all rows at once, the
 * attention per sequence. One layer is one call (ekv_forward_layer), so a
 * prompt can also be read layer by layer in bounded pieces (prefill.c).
 *
 * Every operation goes through the sequence's backend (backend.h): the CPU
 * kernels, or a Vulkan GPU that records the whole forward and submits it
 * once. This file is the same sequence of operations for both.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend.h"
#include "engine/engine.h"

enum ekv_status ekv_forward_embed(const struct ekv_model *m, int32_t token, float *dst) {
    enum ekv_status s = ekv_weight_get_row(&m->tok_embd, token, dst);
    if (s != EKV_OK || m->info.embd_scale == 1.0f) return s;
    /* Gemma: token embeddings times sqrt(n_embd) (ggml_scale in float) */
    for (int64_t i = 0; i < m->info.n_embd; i++) dst[i] *= m->info.embd_scale;
    return EKV_OK;
}

size_t ekv_act_width(const struct ekv_model_info *in, enum ekv_act a) {
    if (a == EKV_ACT_Q || a == EKV_ACT_ATT) return (size_t)in->n_head * (size_t)in->head_dim;
    if (a == EKV_ACT_K || a == EKV_ACT_V) return (size_t)in->n_head_kv * (size_t)in->head_dim;
    return (size_t)in->n_embd;
}

int64_t ekv_forward_rope0(const struct ekv_fwd_part *part) {
    /* the true position unless the policy moves it (Elastic Cache's
     * reference mode: the compressed cache length, docs/policies.md "Positions and the reference mode") */
    return ekv_kv_rope_pos(part->seq->kv, &part->step) + part->step.rope_delta;
}

enum ekv_status ekv_forward_layer(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                                  int32_t n_rows, int il, const int64_t *rope0, struct ekv_kv_part *kvp) {
    const struct ekv_backend_ops *be = n_parts > 0 ? ekv_seq_backend(parts[0].seq) : &ekv_backend_cpu;
    const struct ekv_layer_weights *L = &ctx->model->layers[il];
    enum ekv_status s;
    if ((s = be->rmsnorm(ctx, EKV_ACT_XB, EKV_ACT_X, 0, L->attn_norm, n_rows))) return s;
    /* Q, K and V of the same normalised rows (one quantisation on the CPU) */
    const struct ekv_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
    const float *bias[3] = {L->bq, L->bk, L->bv};
    const enum ekv_act qkv_out[3] = {EKV_ACT_Q, EKV_ACT_K, EKV_ACT_V};
    if ((s = be->matmul(ctx, qkv, bias, 3, EKV_ACT_XB, qkv_out, n_rows))) return s;
    if ((s = be->rope(ctx, parts, n_parts, rope0))) return s;
    if ((s = be->attention(ctx, il, parts, n_parts, kvp))) return s;
    if ((s = be->matmul_add(ctx, &L->wo, EKV_ACT_ATT, EKV_ACT_X, n_rows))) return s;
    if ((s = be->rmsnorm(ctx, EKV_ACT_XB, EKV_ACT_X, 0, L->ffn_norm, n_rows))) return s;
    return be->ffn(ctx, L, n_rows);
}

enum ekv_status ekv_forward_output(struct ekv_context *ctx, const struct ekv_backend_ops *be, int32_t n_rows,
                                   int32_t out_row0, float *logits) {
    const struct ekv_model *m = ctx->model;
    /* final norm of the rows that want logits, packed, then the classifier */
    if (!logits || out_row0 < 0 || out_row0 >= n_rows) return EKV_OK;
    const int32_t n_out = n_rows - out_row0;
    enum ekv_status s = be->rmsnorm(ctx, EKV_ACT_XB, EKV_ACT_X, out_row0, m->output_norm, n_out);
    return s != EKV_OK ? s : be->classify(ctx, n_out, logits);
}

enum ekv_status ekv_forward(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                            int32_t n_rows, int32_t out_row0, float *logits) {
    const int32_t np = n_parts > 0 ? n_parts : 1;
    const struct ekv_backend_ops *be = n_parts > 0 ? ekv_seq_backend(parts[0].seq) : &ekv_backend_cpu;
    for (int32_t p = 1; p < n_parts; p++)
        if (ekv_seq_backend(parts[p].seq) != be)
            return ekv_err(EKV_ERR_INTERNAL, "ekv_forward: sequences of one forward on different devices");
    int64_t *rope0 = malloc((size_t)np * sizeof *rope0);
    struct ekv_kv_part *kvp = malloc((size_t)np * sizeof *kvp);
    if (!rope0 || !kvp) {
        free(rope0);
        free(kvp);
        return ekv_err(EKV_ERR_NOMEM, "out of memory for %d sequences of a forward", (int)n_parts);
    }
    enum ekv_status s = be->begin(ctx, n_rows);
    if (s == EKV_OK) {
        for (int32_t p = 0; p < n_parts && s == EKV_OK; p++) {
            rope0[p] = ekv_forward_rope0(&parts[p]);
            s = be->seq_begin(ctx, &parts[p]);
        }
        for (int32_t il = 0; il < ctx->model->info.n_layer && s == EKV_OK; il++)
            s = ekv_forward_layer(ctx, parts, n_parts, n_rows, il, rope0, kvp);
        for (int32_t p = 0; p < n_parts && s == EKV_OK; p++) s = be->seq_end(ctx, &parts[p]);
        if (s == EKV_OK) s = ekv_forward_output(ctx, be, n_rows, out_row0, logits);
        s = be->end(ctx, s);
    }
    free(kvp);
    free(rope0);
    return s;
}
