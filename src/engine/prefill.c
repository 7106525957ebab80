/*
 * prefill.c — a prompt read in bounded pieces (ekv_prefill_*, include/ekv.h),
 * so that a server can interleave the decode steps of running sequences
 * with the prefill of a new one without either waiting for the other.
 *
 * The prompt is read layer by layer: all its rows go through layer 0 in
 * pieces of `rows` rows (each piece appends its keys and values and attends
 * over everything before it, collecting the policy's statistics), then the
 * policy compresses layer 0, then layer 1, ... So the cache, the statistics
 * and the logits are those of one ekv_seq_eval of the whole prompt (as long
 * as the matmul kernels give each row the same result whatever the number of
 * rows), and the peak holds one layer at full length, as prefill must
 * (docs/policies.md "When a policy acts"). With the policy's block-wise
 * `chunk`, each block is read this way in turn, the policy acting at the end
 * of every block as ekv_seq_eval does.
 *
 * Between pieces the residual stream of the block's rows lives here
 * ([n][n_embd] floats), since the context's scratch belongs to whoever runs
 * the next forward.
 *
 * A sequence on the GPU reads its prompt in chunks of rows through all
 * layers instead (gpu_chunk): a unit there would be a submission and a
 * read-back of the rows per layer.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/engine.h"
#include "kernels/kvquant.h"
#include "kv/kv.h"

struct ekv_prefill {
    struct ekv_seq *seq;
    int32_t n;             /* positions of the prompt */
    int32_t rows;          /* rows per unit of work */
    int32_t block_len;     /* the policy's chunk, or n */
    float *x;              /* [n][n_embd] input embeddings, then each block's residual stream */
    uint8_t *tags;         /* [n] tags of the whole prompt */
    int32_t *mpos;         /* [n][3] M-RoPE positions of the prompt's rows, or NULL (ekv_input_mpos) */
    int64_t delta_end;     /* the sequence's rope_delta once the prompt is read */
    int64_t pos0;          /* position of the prompt's first row */
    int32_t b0, b1;        /* current block: prompt offsets [b0, b1) */
    int32_t layer;         /* layer being read in the current block */
    int32_t row;           /* next prompt offset to read through this layer */
    bool begun;            /* the policy's begin ran for the current block */
    bool done;
    bool gpu;              /* the sequence is on the GPU: chunks through all layers (gpu_chunk) */
    struct ekv_fwd_part part; /* the current block as one prompt step */
    int64_t rope0;         /* RoPE position of the block's first row */
};

enum ekv_status ekv_prefill_new(struct ekv_seq *seq, const struct ekv_input *in, int32_t rows,
                               struct ekv_prefill **out) {
    ekv_err_clear();
    if (!seq || !in || !out || rows < 1)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prefill_new: sequence, input, out and rows >= 1 are required");
    *out = NULL;
    int64_t total = 0;
    enum ekv_status s = ekv_seq_ready(seq, "ekv_prefill_new");
    if (s != EKV_OK) return s;
    if ((s = ekv_input_check(seq, in, &total)) != EKV_OK) return ekv_err_prefix(s, "ekv_prefill_new");
    const struct ekv_model_info *mi = &seq->ctx->model->info;
    struct ekv_prefill *p = calloc(1, sizeof *p);
    if (!p) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    p->seq = seq;
    p->n = (int32_t)total;
    p->rows = rows;
    p->block_len = ekv_kv_prompt_chunk(seq->kv) > 0 ? EKV_MIN(ekv_kv_prompt_chunk(seq->kv), p->n) : p->n;
    size_t nx;
    if (!ekv_mul_ok((size_t)p->n, (size_t)mi->n_embd * sizeof(float), &nx) || !(p->x = malloc(nx)) ||
        !(p->tags = malloc((size_t)p->n))) {
        ekv_prefill_free(p);
        return ekv_err(EKV_ERR_NOMEM, "out of memory for a prompt of %d positions", (int)total);
    }
    if ((s = ekv_input_rows(seq->ctx, in, 0, p->n, p->x, p->tags)) != EKV_OK ||
        (s = ekv_input_mpos(seq, in, p->n, &p->mpos, &p->delta_end)) != EKV_OK) {
        ekv_prefill_free(p);
        return s;
    }
    p->pos0 = seq->n_seen;
    p->b0 = 0;
    p->b1 = p->block_len;
    if (seq->gpu) { /* chunks of rows through all layers (gpu_chunk) */
        p->gpu = true;
        if (ekv_kv_type_is_kivi(seq->kv->fk.type) || ekv_kv_type_is_kivi(seq->kv->fv.type)) p->rows = p->n;
        /* a compressing policy acts after each forward: one forward per block, as ekv_seq_eval */
        if (ekv_vk_seq_compressed(seq->gpu)) p->rows = p->block_len;
    }
    seq->prefill = p;
    *out = p;
    return EKV_OK;
}

void ekv_prefill_free(struct ekv_prefill *p) {
    if (!p) return;
    if (p->seq && p->seq->prefill == p) {
        p->seq->prefill = NULL;
        if (!p->done) p->seq->broken = true; /* layers hold different lengths now */
    }
    free(p->x);
    free(p->tags);
    free(p->mpos);
    free(p);
}

void ekv_prefill_detach(struct ekv_prefill *p) { p->seq = NULL; }

int64_t ekv_prefill_units_left(const struct ekv_prefill *p) {
    if (!p || p->done || !p->seq) return 0;
    const int64_t L = p->seq->ctx->model->info.n_layer;
    if (p->gpu) return L * ((p->n - p->row + p->rows - 1) / p->rows);
    int64_t units = 0;
    /* current block: rest of this layer, then whole layers */
    int64_t per_layer = (p->b1 - p->b0 + p->rows - 1) / p->rows;
    units += (p->b1 - p->row + p->rows - 1) / p->rows + (L - p->layer - 1) * per_layer;
    for (int64_t b0 = p->b1; b0 < p->n; b0 += p->block_len) {
        int64_t len = EKV_MIN((int64_t)p->block_len, (int64_t)p->n - b0);
        units += L * ((len + p->rows - 1) / p->rows);
    }
    return units;
}

/* Starts the current block: its prompt step, the policy's begin. */
static enum ekv_status block_begin(struct ekv_prefill *p) {
    struct ekv_seq *seq = p->seq;
    memset(&p->part, 0, sizeof p->part);
    p->part.seq = seq;
    p->part.n = p->b1 - p->b0;
    struct ekv_kv_step *st = &p->part.step;
    st->is_prompt = true;
    st->last_chunk = p->b1 == p->n;
    st->pos0 = seq->n_seen;
    st->n_new = p->b1 - p->b0;
    st->prompt_pos0 = p->pos0;
    st->prompt_len = p->n;
    st->prompt_tags = p->tags;
    st->tags = p->tags + p->b0;
    st->mpos = p->mpos ? p->mpos + 3 * (size_t)p->b0 : NULL;
    st->rope_delta = seq->rope_delta;
    p->rope0 = ekv_forward_rope0(&p->part);
    enum ekv_status s = ekv_kv_begin(seq->kv, st);
    if (s != EKV_OK) return s;
    p->begun = true;
    p->layer = 0;
    p->row = p->b0;
    return EKV_OK;
}

/* One unit: up to p->rows rows of the current block through the current layer. */
static enum ekv_status read_unit(struct ekv_prefill *p) {
    struct ekv_context *ctx = p->seq->ctx;
    const size_t D = (size_t)ctx->model->info.n_embd;
    const int32_t n = EKV_MIN(p->rows, p->b1 - p->row);
    enum ekv_status s = ekv_context_reserve(ctx, n);
    if (s != EKV_OK) return s;
    memcpy(ctx->x, p->x + (size_t)p->row * D, (size_t)n * D * sizeof(float));
    struct ekv_fwd_part sub = p->part;
    sub.row0 = 0;
    sub.n = n;
    sub.step.pos0 = p->part.step.pos0 + (p->row - p->b0);
    sub.step.n_new = n;
    sub.step.tags = p->tags + p->row;
    sub.step.mpos = p->mpos ? p->mpos + 3 * (size_t)p->row : NULL;
    sub.step.defer = true; /* the policy acts once the whole block went through the layer */
    int64_t rope0 = p->rope0 + (p->row - p->b0);
    struct ekv_kv_part kvp;
    if ((s = ekv_forward_layer(ctx, &sub, 1, n, p->layer, &rope0, &kvp)) != EKV_OK) return s;
    memcpy(p->x + (size_t)p->row * D, ctx->x, (size_t)n * D * sizeof(float));
    p->row += n;
    return EKV_OK;
}

/* After a layer of the block: the policy's layer hook; after the block's
 * last layer: its end hook, and on to the next block (or the logits). */
static enum ekv_status layer_done(struct ekv_prefill *p, float *logits) {
    struct ekv_seq *seq = p->seq;
    enum ekv_status s = ekv_kv_layer_policy(seq->kv, p->layer, &p->part.step);
    if (s != EKV_OK) return s;
    p->row = p->b0;
    if (++p->layer < seq->ctx->model->info.n_layer) return EKV_OK;
    if ((s = ekv_kv_end(seq->kv, &p->part.step)) != EKV_OK) return s;
    seq->n_seen += p->b1 - p->b0;
    p->begun = false;
    if (p->b1 < p->n) {
        p->b0 = p->b1;
        p->b1 = EKV_MIN(p->b0 + p->block_len, p->n);
        p->layer = 0;
        p->row = p->b0;
        return EKV_OK;
    }
    p->done = true;
    seq->prefill = NULL;
    seq->rope_delta = p->delta_end;
    if (!logits) return EKV_OK;
    struct ekv_context *ctx = seq->ctx;
    const size_t D = (size_t)ctx->model->info.n_embd;
    memcpy(ctx->x, p->x + (size_t)(p->n - 1) * D, D * sizeof(float));
    return ekv_forward_output(ctx, &ekv_backend_cpu, 1, 0, logits);
}

/* The GPU reads a prompt in chunks of p->rows rows, each a forward through
 * all layers (one submission; a layer at a time would cost a submission
 * and a read-back per unit). With policy full this equals the CPU's
 * layer-major order: chunk c's rows attend to the rows before them, all
 * already cached in every layer. KIVI storage quantises after every
 * forward, so there the prompt is one chunk (as if read in one piece); a
 * compressing policy acts after every forward, so there a chunk is the
 * policy's block (the whole prompt unless it reads in blocks). */
static enum ekv_status gpu_chunk(struct ekv_prefill *p, float *logits) {
    struct ekv_seq *seq = p->seq;
    struct ekv_context *ctx = seq->ctx;
    const size_t D = (size_t)ctx->model->info.n_embd;
    const int32_t n = EKV_MIN(p->rows, p->n - p->row);
    const bool last = p->row + n == p->n;
    enum ekv_status s = ekv_context_reserve(ctx, n);
    if (s != EKV_OK) return s;
    memcpy(ctx->x, p->x + (size_t)p->row * D, (size_t)n * D * sizeof(float));
    struct ekv_fwd_part part = {.seq = seq, .row0 = 0, .n = n};
    part.step.is_prompt = true;
    part.step.last_chunk = last;
    part.step.pos0 = seq->n_seen;
    part.step.n_new = n;
    part.step.prompt_pos0 = p->pos0;
    part.step.prompt_len = p->n;
    part.step.prompt_tags = p->tags;
    part.step.tags = p->tags + p->row;
    part.step.mpos = p->mpos ? p->mpos + 3 * (size_t)p->row : NULL;
    part.step.rope_delta = seq->rope_delta;
    if ((s = ekv_forward(ctx, &part, 1, n, n - 1, last ? logits : NULL)) != EKV_OK) return s;
    seq->n_seen += n;
    p->row += n;
    if (last) {
        p->done = true;
        seq->prefill = NULL;
        seq->rope_delta = p->delta_end;
    }
    return EKV_OK;
}

enum ekv_status ekv_prefill_step(struct ekv_prefill *p, int32_t max_units, float *logits, bool *done) {
    ekv_err_clear();
    if (!p || max_units < 1)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prefill_step: prompt and max_units >= 1 are required");
    if (!p->seq) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prefill_step: the sequence was freed");
    if (p->seq->prefill != p && !p->done)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_prefill_step: the prompt failed before and cannot go on");
    enum ekv_status s = EKV_OK;
    if (p->gpu) { /* whole forwards of n_layer units each; at least one */
        const int32_t L = p->seq->ctx->model->info.n_layer;
        for (int32_t u = 0; (u == 0 || u + L <= max_units) && !p->done && s == EKV_OK; u += L)
            s = gpu_chunk(p, logits);
    }
    for (int32_t u = 0; u < max_units && !p->gpu && !p->done && s == EKV_OK; u++) {
        if (!p->begun && (s = block_begin(p)) != EKV_OK) break;
        if ((s = read_unit(p)) != EKV_OK) break;
        if (p->row == p->b1) s = layer_done(p, logits);
    }
    if (s != EKV_OK && p->seq->prefill == p) { /* the sequence cannot go on from a half-read layer */
        p->seq->prefill = NULL;
        p->seq->broken = true;
    }
    if (done) *done = p->done;
    return s;
}
