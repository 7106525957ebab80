/*
 * backend.h — the seam between the transformer forward (forward.c, one
 * readable sequence of operations) and where the operations run: the CPU
 * kernels (backend_cpu.c, the reference) or a Vulkan GPU (backend_vk.c,
 * which records the operations into one command buffer and submits it at
 * end()). docs/architecture.md "Backends".
 *
 * Operations name activations by slot (enum ekv_act) rather than by
 * pointer: on the CPU a slot is the context's scratch array, on the GPU a
 * device buffer of the same shape. Each op may return a failure at once
 * (CPU) or record and report at end() (GPU); end() is always called once
 * begin() succeeded, also after a failure, so a recording is never left
 * open.
 */
#ifndef EKV_ENGINE_BACKEND_H
#define EKV_ENGINE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ekv.h"

struct ekv_context;
struct ekv_seq;
struct ekv_fwd_part;
struct ekv_kv_part;
struct ekv_weight;
struct ekv_layer_weights;

/* Activation slots, [rows][width] each (widths in engine.h's scratch). */
enum ekv_act {
    EKV_ACT_X = 0, /* [rows][n_embd] residual stream (input rows at begin) */
    EKV_ACT_XB,    /* [rows][n_embd] normalised */
    EKV_ACT_Q,     /* [rows][n_head * head_dim] */
    EKV_ACT_K,     /* [rows][n_head_kv * head_dim] */
    EKV_ACT_V,     /* [rows][n_head_kv * head_dim] */
    EKV_ACT_ATT,   /* [rows][n_head * head_dim] attention output */
    EKV_ACT_COUNT
};

struct ekv_model_info;
/* Floats per row of an activation slot (n_embd, n_head * head_dim or n_head_kv * head_dim). */
size_t ekv_act_width(const struct ekv_model_info *in, enum ekv_act a);

struct ekv_backend_ops {
    const char *name;
    /* A forward of n_rows rows whose input embeddings are in ctx->x (host). */
    enum ekv_status (*begin)(struct ekv_context *ctx, int32_t n_rows);
    /* A sequence's part of the forward starts / ends (its cache's policy hooks). */
    enum ekv_status (*seq_begin)(struct ekv_context *ctx, struct ekv_fwd_part *part);
    enum ekv_status (*seq_end)(struct ekv_context *ctx, struct ekv_fwd_part *part);
    /* dst rows [0, n) = rmsnorm(src rows [src_row0, src_row0 + n)) * w */
    enum ekv_status (*rmsnorm)(struct ekv_context *ctx, enum ekv_act dst, enum ekv_act src, int32_t src_row0,
                               const float *w, int32_t n_rows);
    /* dst[i] = src W_i^T (+ bias[i] when not NULL), i < n_w, rows [0, n) */
    enum ekv_status (*matmul)(struct ekv_context *ctx, const struct ekv_weight *const *w, const float *const *bias,
                              int n_w, enum ekv_act src, const enum ekv_act *dst, int32_t n_rows);
    /* dst += src W^T, rows [0, n) (output projection onto the residual stream) */
    enum ekv_status (*matmul_add)(struct ekv_context *ctx, const struct ekv_weight *w, enum ekv_act src,
                                  enum ekv_act dst, int32_t n_rows);
    /* RoPE on the Q and K rows of every part (rope0[p]: position of its first row) */
    enum ekv_status (*rope)(struct ekv_context *ctx, struct ekv_fwd_part *parts, int32_t n_parts,
                            const int64_t *rope0);
    /* Appends K and V to each part's cache and attends: ATT rows. kvp: n_parts scratch. */
    enum ekv_status (*attention)(struct ekv_context *ctx, int il, struct ekv_fwd_part *parts, int32_t n_parts,
                                 struct ekv_kv_part *kvp);
    /* X += W_down (act(W_gate XB) * W_up XB), rows [0, n) */
    enum ekv_status (*ffn)(struct ekv_context *ctx, const struct ekv_layer_weights *L, int32_t n_rows);
    /* logits rows [0, n) = XB rows W_out^T, delivered to `logits` by end() at the latest */
    enum ekv_status (*classify)(struct ekv_context *ctx, int32_t n_rows, float *logits);
    /* Ends the forward: runs what was recorded. status: how the forward went so far. */
    enum ekv_status (*end)(struct ekv_context *ctx, enum ekv_status status);
};

extern const struct ekv_backend_ops ekv_backend_cpu;
extern const struct ekv_backend_ops ekv_backend_vk;

/* The backend a sequence runs on. */
const struct ekv_backend_ops *ekv_seq_backend(const struct ekv_seq *seq);

/* ---- GPU state (backend_vk.c), NULL/no-ops when a context is on the CPU ---- */
struct ekv_vk_ctx;
struct ekv_vk_seq;
/* Opens the device the spec names and uploads the model's weights. *out =
 * NULL (and EKV_OK) when spec is "auto" and there is no usable GPU or the
 * model has a weight type the shaders lack. */
enum ekv_status ekv_vk_ctx_new(struct ekv_context *ctx, const char *spec, struct ekv_vk_ctx **out);
void ekv_vk_ctx_free(struct ekv_vk_ctx *g);
const char *ekv_vk_ctx_name(const struct ekv_vk_ctx *g);
uint64_t ekv_vk_ctx_bytes(const struct ekv_vk_ctx *g, bool peak);
/* Device time of the last forward (ns), 0 when unknown or g is NULL. */
uint64_t ekv_vk_ctx_last_ns(const struct ekv_vk_ctx *g);
/* The per-shader profile as text (ekv_context_device_profile). */
enum ekv_status ekv_vk_ctx_profile(const struct ekv_vk_ctx *g, char *buf, size_t cap);
void ekv_vk_ctx_profile_reset(struct ekv_vk_ctx *g);
/* Validation-layer messages so far (tests fail on any). */
uint64_t ekv_vk_ctx_validation(const struct ekv_vk_ctx *g, const char **first);
/* Whether a sequence with these cache parameters can run on the GPU; if
 * not, why (static string). */
bool ekv_vk_seq_supported(const struct ekv_seq *seq, const char **why);
/* The sequence's device cache ([n_layer] K and V of [n_head_kv][n_ctx][head_dim]). */
enum ekv_status ekv_vk_seq_new(struct ekv_vk_ctx *g, struct ekv_seq *seq, struct ekv_vk_seq **out);
void ekv_vk_seq_free(struct ekv_vk_ctx *g, struct ekv_vk_seq *s);
/* *out gets a copy of src's device cache for seq, whose host cache
 * (seq->kv) is already a copy of src's owner's (ekv_kv_clone): the same
 * capacity, rows, logit biases and positions, copied on the device. */
enum ekv_status ekv_vk_seq_copy(struct ekv_vk_ctx *g, const struct ekv_vk_seq *src, struct ekv_seq *seq,
                                struct ekv_vk_seq **out);
uint64_t ekv_vk_seq_bytes(const struct ekv_vk_seq *s, int64_t n_seen, uint64_t *alloc);
/* Whether the device cache is a compressing policy's (then the sequence's
 * host cache, seq->kv, holds every entry's position, weight, tag and
 * statistics, and its lengths are the device's). */
bool ekv_vk_seq_compressed(const struct ekv_vk_seq *s);

#endif
