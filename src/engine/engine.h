/*
 * engine.h — contexts (threads + scratch), sequences (one KV cache with its
 * policy each) and the transformer forward that runs rows of one or more
 * sequences through the model layer by layer.
 */
#ifndef EKV_ENGINE_H
#define EKV_ENGINE_H

#include <stdint.h>

#include "ekv.h"
#include "kernels/kernels.h"
#include "kv/kv.h"
#include "model/model.h"

struct ekv_context {
    const struct ekv_model *model;
    struct ekv_context_params params;
    struct ekv_pool *pool;
    /* scratch, grown on demand (rows = positions in one forward) */
    size_t scratch_rows;
    float *x;      /* [rows][n_embd] residual stream */
    float *xb;     /* [rows][n_embd] normalised input */
    float *q;      /* [rows][n_head * head_dim] */
    float *k;      /* [rows][n_head_kv * head_dim] */
    float *v;      /* [rows][n_head_kv * head_dim] */
    float *att;    /* [rows][n_head * head_dim] */
    float *proj;   /* [rows][n_embd] */
    float *gate;   /* [ffn_rows][n_ff] */
    float *up;     /* [ffn_rows][n_ff] */
};

struct ekv_seq {
    struct ekv_context *ctx;
    struct ekv_kv *kv;
    int64_t n_seen;  /* positions fed so far */
};

/* One sequence's share of the rows of a forward: rows [row0, row0 + n). */
struct ekv_fwd_part {
    struct ekv_seq *seq;
    int32_t row0;
    int32_t n;
    struct ekv_kv_step step;
};

/* Runs the model over ctx->x (already holding the input embeddings of all
 * rows) for the given parts, writing logits for rows [out_row0, n_rows) into
 * logits ([n_rows - out_row0][n_vocab], in row order) when it is not NULL. */
enum ekv_status ekv_forward(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                            int32_t n_rows, int32_t out_row0, float *logits);

/* Decodes and encodes one image with the tower (vision_api.c): *out is a
 * malloc'd [*n_rows][n_embd_out] array owned by the caller. `index` names
 * an in-memory image in messages. ctx may be NULL. */
enum ekv_status ekv_vision_encode_input(const struct ekv_vision *v, struct ekv_context *ctx,
                                        const struct ekv_image_input *in, int32_t index, float **out,
                                        int32_t *n_rows);

/* Makes the scratch hold at least `rows` positions. */
enum ekv_status ekv_context_reserve(struct ekv_context *ctx, int32_t rows);

#endif
