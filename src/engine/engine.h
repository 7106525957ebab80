/*
 * engine.h — contexts (threads + scratch), sequences (one KV cache with its
 * policy each) and the transformer forward that runs rows of one or more
 * sequences through the model layer by layer.
 */
#ifndef EKV_ENGINE_H
#define EKV_ENGINE_H

#include <stdint.h>

#include "ekv.h"
#include "engine/backend.h"
#include "kernels/kernels.h"
#include "kv/kv.h"
#include "model/model.h"

/* What a row of ekv_context.rope_cs holds: kind 0 nothing, 1 the position
 * p[0] (ekv_rope_sincos_ext), 2 the M-RoPE positions p[0..2]. The
 * context's RoPE parameters never change, so equal keys give equal rows. */
struct ekv_rope_key {
    int64_t kind, p[3];
};

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
    float *rope_cs;/* [rows][rope_dim] {cos, sin} pairs of each row's position */
    struct ekv_rope_key *rope_key; /* [rows] the position rope_cs row r was computed for: the layers of a
                                      forward reuse it (backend_cpu.c) */
    struct ekv_rope_params rope; /* the model's RoPE for this context's n_ctx */
    struct ekv_vk_ctx *gpu;      /* the Vulkan device with the model's weights, or NULL (CPU) */
    bool gpu_required;           /* the device was named (vulkan[:N]), not chosen by auto */
    char device_name[320];       /* "cpu" or "vulkan:N (name)" */
};

struct ekv_seq {
    struct ekv_context *ctx;
    struct ekv_kv *kv;
    int64_t n_seen;  /* positions fed so far */
    int64_t rope_delta; /* M-RoPE models: the next text row's RoPE position minus its position (<= 0:
                           an image of n rows in a w x h grid takes max(w, h) positions) */
    struct ekv_prefill *prefill; /* a prompt being read in pieces (prefill.c), or NULL */
    bool broken;     /* a prompt was abandoned half read: layers hold different lengths */
    struct ekv_vk_seq *gpu; /* the device cache when the sequence runs on the context's GPU, else NULL */
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

/* The pieces of ekv_forward, for callers that interleave them (prefill.c):
 * the RoPE position of a part's first row (the true position, or the
 * compressed length in Elastic's reference mode; read before ekv_kv_begin);
 * one layer over rows [0, n_rows) of ctx->x (the parts' caches begun;
 * rope0[n_parts], kvp[n_parts] scratch); the final norm and classifier of
 * rows [out_row0, n_rows). */
int64_t ekv_forward_rope0(const struct ekv_fwd_part *part);
enum ekv_status ekv_forward_layer(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                                  int32_t n_rows, int il, const int64_t *rope0, struct ekv_kv_part *kvp);
enum ekv_status ekv_forward_output(struct ekv_context *ctx, const struct ekv_backend_ops *be, int32_t n_rows,
                                   int32_t out_row0, float *logits);

/* Checks an input against a sequence (segments, tags, context room);
 * *total gets its positions. */
enum ekv_status ekv_input_check(const struct ekv_seq *seq, const struct ekv_input *in, int64_t *total);
/* Input embeddings of positions [skip, skip + n) of an input into x
 * ([n][n_embd]) and their tags into tags (may be NULL). */
enum ekv_status ekv_input_rows(const struct ekv_context *ctx, const struct ekv_input *in, int32_t skip, int32_t n,
                               float *x, uint8_t *tags);

/* M-RoPE models (rope sections set) and an input with an image grid
 * (struct ekv_segment's grid_w/grid_h): *mpos gets a malloc'd [n][3]
 * array of every row's RoPE positions (time, height, width), owned by the
 * caller, and *delta_end the sequence's rope_delta after the input.
 * Otherwise *mpos = NULL and *delta_end = seq->rope_delta (rows are text).
 * A grid that does not match its segment's rows is an error. */
enum ekv_status ekv_input_mpos(const struct ekv_seq *seq, const struct ekv_input *in, int32_t n, int32_t **mpos,
                               int64_t *delta_end);

/* A sequence that can take a forward now (no prompt being read in pieces,
 * none abandoned); an error naming the function otherwise. */
enum ekv_status ekv_seq_ready(const struct ekv_seq *seq, const char *fn);
/* Cuts a prompt reader off its sequence (the sequence is being freed). */
void ekv_prefill_detach(struct ekv_prefill *p);

/* Decodes and encodes one image with the tower (vision_api.c): *out is a
 * malloc'd [*n_rows][n_embd_out] array owned by the caller. `index` names
 * an in-memory image in messages. ctx may be NULL. An Idefics3 (SmolVLM)
 * tower tiles the image: *gx x *gy tiles then the overview, *tile_rows rows
 * each, to be spliced with separator tokens (EKV_IDEFICS3_*); *gx = *gy =
 * 0 for a tower whose rows are spliced as one block. A Qwen2-VL tower's
 * rows are a *grid_w x *grid_h grid (M-RoPE positions, struct
 * ekv_segment), spliced between <|vision_start|> and <|vision_end|>;
 * *grid_w = *grid_h = 0 for other towers. */
enum ekv_status ekv_vision_encode_input(const struct ekv_vision *v, struct ekv_context *ctx,
                                        const struct ekv_image_input *in, int32_t index, float **out,
                                        int32_t *n_rows, int *gx, int *gy, int32_t *tile_rows, int *grid_w,
                                        int *grid_h);

/* Separator tokens an Idefics3 image of gx x gy tiles adds around its
 * embeddings: "<fake_token_around_image><row_Y_col_X>" before each tile,
 * "\n" after each row but the last, "\n\n<fake_token_around_image><global-img>"
 * before the overview and "<fake_token_around_image>" after it (llama.cpp
 * mtmd's layout, each a single token of the vocabulary). */
static inline int64_t ekv_idefics3_n_sep(int gx, int gy) { return gx > 0 ? 2 * (int64_t)gx * gy + (gy - 1) + 4 : 0; }

/* The input row of a token: its embedding, times the model's embd_scale
 * (Gemma). Image embeddings are used as given. */
enum ekv_status ekv_forward_embed(const struct ekv_model *m, int32_t token, float *dst);

/* Makes the scratch hold at least `rows` positions. */
enum ekv_status ekv_context_reserve(struct ekv_context *ctx, int32_t rows);

#endif
