/*
 * backend_vk.h — internal to the Vulkan backend: the state a GPU context
 * holds (backend_vk.c: weights, activations, the forward's operations) and
 * what its KV-cache half (backend_vk_kv.c: sequences' caches in every
 * storage type, kv_store, attention, KIVI's residual rule) shares with it.
 */
#ifndef EKV_ENGINE_BACKEND_VK_H
#define EKV_ENGINE_BACKEND_VK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/engine.h"
#include "gpu/vk.h"

struct ekv_vk_tensor {
    const void *key;          /* the host pointer it came from (weight data or vector) */
    struct ekv_vk_buf buf;
    enum ekv_dtype type;
    int64_t ne0, ne1;
    size_t q_off;             /* Q8_0/Q4_0: byte offset of the quants after the scales */
};

struct ekv_vk_ctx {
    struct ekv_vk *vk;
    struct ekv_vk_tensor *t;  /* [n_t] sorted by key */
    int32_t n_t, cap_t;
    struct ekv_vk_buf act[EKV_ACT_COUNT];
    struct ekv_vk_buf gate, up; /* [rows][ff_stride], the columns past n_ff zero */
    struct ekv_vk_buf xin;      /* host-visible [rows][n_embd] input rows */
    struct ekv_vk_buf cs;       /* host-visible [rows][rope_dim] RoPE rows */
    struct ekv_vk_buf logits;   /* host-visible [rows][n_vocab] */
    struct ekv_vk_buf part;     /* attention partials */
    int32_t rows_cap;
    size_t part_cap;            /* floats */
    /* KIVI: the forward's keys and values in fp16 until its attention is
     * done, [2][n_head_kv][kv_scr_rows][head_dim] (keys, then values);
     * allocated while a sequence with a KIVI side exists */
    struct ekv_vk_buf kv_scr;
    int32_t kv_scr_rows;
    int32_t kivi_seqs;
    /* the forward being recorded */
    int32_t n_rows;
    bool cs_done;

    float *logits_dst;
    int32_t logits_rows;
};

static inline struct ekv_vk_ctx *ekv_vk_of(struct ekv_context *ctx) { return ctx->gpu; }

/* Device address of row row0 of an activation slot. */
static inline uint64_t ekv_vk_act_addr(struct ekv_context *ctx, enum ekv_act a, int32_t row0) {
    return ekv_vk_of(ctx)->act[a].addr + (uint64_t)row0 * ekv_act_width(&ctx->model->info, a) * sizeof(float);
}

/* ---- backend_vk_kv.c ---- */

/* Builds the pipelines a cache of these storage types uses. */
enum ekv_status ekv_vk_kv_prepare(struct ekv_vk_ctx *g, enum ekv_kv_type tk, enum ekv_kv_type tv);
/* Frees the attention and KIVI scratch. */
void ekv_vk_kv_free_scratch(struct ekv_vk_ctx *g);
/* The attention partials' buffer and the KIVI scratch sized for a forward of n_rows rows. */
enum ekv_status ekv_vk_kv_begin(struct ekv_context *ctx, int32_t n_rows);
/* Checks that a part's positions fit its cache. */
enum ekv_status ekv_vk_kv_part_begin(struct ekv_fwd_part *part);
/* The sequence's part of the forward is recorded: its cache's counters advance. */
void ekv_vk_kv_part_done(struct ekv_fwd_part *part);
/* Records, for each part: stores K and V, attends, applies KIVI's residual rule. */
enum ekv_status ekv_vk_kv_attention(struct ekv_context *ctx, int il, struct ekv_fwd_part *parts, int32_t n_parts);

#endif
