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

/* One side (keys or values) of a sequence's cache. */
struct ekv_vk_side {
    enum ekv_kv_type type;
    bool is_v;
    struct ekv_vk_buf *buf;     /* [n_layer], kvq.glsl's layout */
    uint32_t tc;                /* KIVI: ring entries per head (compressed: residual slots per head) */
    uint64_t p0, r0, words;     /* words: parameters from p0, ring from r0, in all */
    int32_t nq;                 /* KIVI: entries quantised, the same in every layer */
    /* a compressing policy's KIVI side (kvq.glsl's compressed layout; the
     * host cache's stores count its entries and groups: backend_vk_kivi.c) */
    bool managed;
    uint32_t ngc;               /* keys: groups of parameters per head */
    uint64_t x0;                /* keys: word of the group table [H][C] */
};

struct ekv_vk_mg;

struct ekv_vk_seq {
    int32_t n_layer, n_ctx;     /* n_ctx: the context's positions */
    int32_t cap;                /* entries per (layer, KV head) the buffers hold (kvq.glsl's C): n_ctx for a
                                   full cache; for a compressed one what it keeps, grown and shrunk
                                   (backend_vk_policy.c) */
    uint32_t H, D, G, R;        /* KV heads, head_dim, KIVI group and residual */
    struct ekv_vk_side k, v;
    struct ekv_vk_mg *mg;       /* a compressing policy's state (backend_vk_policy.c), NULL for full */
};

/* Tensors on the device, found by their host pointer (sorted by key once
 * filled). */
struct ekv_vk_ttab {
    struct ekv_vk_tensor *t;  /* [n] */
    int32_t n, cap;
};

/* The vision tower on a device (backend_vk_clip.c): a context's device, or
 * one opened for the tower alone (ekv_vision_set_device), and the weights of
 * one tower at a time, the one with clip_id (ekv_clip_id; 0 = none). */
struct ekv_vk_tower {
    struct ekv_vk *vk;
    bool own;                 /* vk was opened for the tower (closed with it) */
    struct ekv_vk_ttab ct;
    uint64_t clip_id;
};

struct ekv_vk_ctx {
    struct ekv_vk *vk;
    struct ekv_vk_ttab wt;    /* the language model's weights */
    struct ekv_vk_tower tower; /* images encoded with this context (vk: the context's) */
    struct ekv_vk_buf act[EKV_ACT_COUNT];
    struct ekv_vk_buf gate, up; /* [rows][ff_stride], the columns past n_ff zero */
    struct ekv_vk_buf xin;      /* host-visible [rows][n_embd] input rows */
    struct ekv_vk_buf cs;       /* host-visible [rows][rope_dim] RoPE rows */
    struct ekv_vk_buf logits;   /* host-visible [logits_cap][n_vocab]: the rows a forward gives logits for */
    int32_t logits_cap;
    struct ekv_vk_buf part;     /* attention partials */
    int32_t rows_cap;
    size_t part_cap;            /* floats */
    /* KIVI: the forward's keys and values in fp16 until its attention is
     * done, [2][n_head_kv][kv_scr_rows][head_dim] (keys, then values);
     * allocated while a sequence with a KIVI side exists */
    struct ekv_vk_buf kv_scr;
    int32_t kv_scr_rows;
    int32_t kivi_seqs;
    /* compressed caches: each (row, query head)'s softmax max and sum of the
     * layer being attended, [rows][n_head][2] (attn_stats.comp reads them);
     * the plans and staged rows of their policies (host-visible); the
     * compressed parts of the forward being recorded */
    struct ekv_vk_buf ml;
    int32_t ml_rows;
    struct ekv_vk_buf plan, stage, cscr; /* cscr: kv_compact.comp's scratch (device) */
    struct ekv_vk_mg **fwd_mg;
    int32_t n_fwd_mg;
    size_t cap_fwd_mg;
    /* buffers the recording still reads (a compressed cache moved to a
     * larger one in this forward): freed once it ran */
    struct ekv_vk_buf *old;
    int32_t n_old;
    size_t cap_old;
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

/* ---- backend_vk.c: tensors and products, for backend_vk_clip.c ---- */

/* Uploads a weight (in the layout matvec.comp reads: F32/F16/BF16 rows
 * padded with zeros to a multiple of 8, Q8_0/Q4_0 split, K-quants padded)
 * or an f32 vector of n into table tt, once per host pointer; the table
 * needs ekv_vk_ttab_sort before lookups. */
enum ekv_status ekv_vk_ttab_weight(struct ekv_vk *vk, struct ekv_vk_ttab *tt, const struct ekv_weight *w,
                                   const char *what);
enum ekv_status ekv_vk_ttab_vector(struct ekv_vk *vk, struct ekv_vk_ttab *tt, const float *v, int64_t n,
                                   const char *what);
void ekv_vk_ttab_sort(struct ekv_vk_ttab *tt);
/* The tensor uploaded from host pointer key (a sorted table), or NULL. */
const struct ekv_vk_tensor *ekv_vk_ttab_find(const struct ekv_vk_ttab *tt, const void *key);
/* Frees every tensor of tt and its array (tt empty after). */
void ekv_vk_ttab_free(struct ekv_vk *vk, struct ekv_vk_ttab *tt);
/* Whether matvec.comp has a variant for weights of type t. */
bool ekv_vk_weight_type_ok(enum ekv_dtype t);
/* Records y[r] (+)= W x[r] (+ b) for n_rows rows of weight t (and bias b,
 * or NULL) on vk (strides in floats, x 16-byte aligned); with_barrier: the
 * next dispatch waits for it. */
enum ekv_status ekv_vk_matvec_rec(struct ekv_vk *vk, const struct ekv_vk_tensor *t, const struct ekv_vk_tensor *b,
                                  uint64_t x, uint32_t x_stride, uint64_t y, uint32_t y_stride, bool acc,
                                  int32_t n_rows, bool with_barrier);

/* ---- backend_vk_clip.c: the vision tower on the device ---- */

struct ekv_clip;
/* Why tower c cannot run on a device in this version (NULL: it can). */
const char *ekv_vk_tower_unsupported(const struct ekv_clip *c);
/* ekv_clip_encode_pixels (W = H = image_size) or, for a Qwen2-VL tower,
 * ekv_clip_encode_qwen2vl_pixels (W x H) on a device (user: a struct
 * ekv_vk_tower; struct ekv_clip_exec's signature). The tower's weights are
 * uploaded on first use and stay until another tower is used or the tower
 * state is released. One caller at a time per device (a context's: its
 * owner; one of its own: ekv_vision's lock). */
enum ekv_status ekv_vk_tower_pixels(void *user, const struct ekv_clip *c, const float *pixels, int W, int H,
                                    float *out);
/* A device of its own for a vision tower: spec as ekv_vk_open ("auto":
 * *out NULL and EKV_OK when there is no GPU). Freed by ekv_vk_tower_free. */
enum ekv_status ekv_vk_tower_open(const char *spec, struct ekv_vk_tower **out);
void ekv_vk_tower_free(struct ekv_vk_tower *t);
/* Frees the tower's weights on the device (a context's tower state). */
void ekv_vk_tower_release(struct ekv_vk_tower *t);

/* ---- backend_vk_kv.c ---- */

/* Words of one entry's quantised row in the device's layout (kvq.glsl
 * kv_row_words): f32 D, f16 D/2, q8_0 D/4, q4_0 D/8 (scales apart), KIVI's
 * codes D x bits / 32 (parameters apart). The one place this is counted. */
uint32_t ekv_vk_row_words(enum ekv_kv_type t, uint32_t D);

/* Sizes of a side for s->cap entries per head (kvq.glsl: p0, r0, words);
 * false when a layer's buffer would need indices past 2^31 words. */
bool ekv_vk_side_layout(struct ekv_vk_side *sd, const struct ekv_vk_seq *s);
/* A compressed KIVI side's fewest residual slots per head: the longest tail
 * the residual rule leaves (max(R, G) - 1 keys, R values) and one more. */
uint32_t ekv_vk_kivi_tc_min(const struct ekv_vk_seq *s);

/* Builds the pipelines a cache of these storage types uses. */
enum ekv_status ekv_vk_kv_prepare(struct ekv_vk_ctx *g, enum ekv_kv_type tk, enum ekv_kv_type tv);
/* Frees the attention and KIVI scratch. */
void ekv_vk_kv_free_scratch(struct ekv_vk_ctx *g);
/* The attention partials' buffer and the KIVI scratch sized for a forward of n_rows rows. */
enum ekv_status ekv_vk_kv_begin(struct ekv_context *ctx, int32_t n_rows);
/* Checks that a part's positions fit its cache. */
enum ekv_status ekv_vk_kv_part_begin(struct ekv_context *ctx, struct ekv_fwd_part *part);
/* The sequence's part of the forward is recorded: its cache's counters advance. */
void ekv_vk_kv_part_done(struct ekv_fwd_part *part);
/* Records, for each part: stores K and V, attends, applies KIVI's residual rule. */
enum ekv_status ekv_vk_kv_attention(struct ekv_context *ctx, int il, struct ekv_fwd_part *parts, int32_t n_parts);

/* ---- backend_vk_policy.c: compressed caches (every policy but full) ---- */

/* Whether a compressing policy's cache can be on the device; if not, why. */
bool ekv_vk_mg_supported(const struct ekv_seq *seq, const char **why);
/* The host side of a sequence's compressed device cache: seq->kv keeps
 * positions, tags, weights and statistics and reaches the rows through
 * kv->dev. */
enum ekv_status ekv_vk_mg_new(struct ekv_vk_ctx *g, struct ekv_seq *seq, struct ekv_vk_seq *s);
void ekv_vk_mg_free(struct ekv_vk_ctx *g, struct ekv_vk_seq *s);
/* Records, into the open recording, copies of src's logit biases, entry
 * positions and statistics summed on the device into dst's (a new cache of
 * src's capacity). */
enum ekv_status ekv_vk_mg_copy(struct ekv_vk_ctx *g, const struct ekv_vk_seq *src, struct ekv_vk_seq *dst);
/* A compressed part of the forward starts: the policy's begin, the part's
 * entries appended to seq->kv, the lengths each head had (meta) written
 * for the shaders, the statistics' buffer sized. */
enum ekv_status ekv_vk_mg_part_begin(struct ekv_context *ctx, struct ekv_fwd_part *part);
/* Device address of layer il's meta (lengths before the part, logit biases). */
uint64_t ekv_vk_mg_meta(const struct ekv_vk_mg *m, int il);
/* Tests: layer il's logit biases as the device holds them, [H][cap] floats
 * (EKV_ERR_INVALID_ARG without biases). */
enum ekv_status ekv_vk_mg_read_bias(const struct ekv_vk_mg *m, int il, float *out);
/* Heads read back to the host so far (a policy that reads rows itself). */
uint64_t ekv_vk_mg_read_backs(const struct ekv_vk_mg *m);
/* Adds the statistics summed on the device since the policy last read them
 * (SnapKV, PyramidKV and VL-Cache between re-selection points) to the host
 * cache, outside a forward (one submission; nothing to do when none wait). */
enum ekv_status ekv_vk_mg_stats_sync(struct ekv_vk_mg *m);
/* Forwards whose statistics stayed on the device (summed, not read back). */
uint64_t ekv_vk_mg_summed(const struct ekv_vk_mg *m);
/* Device address of layer il's entry positions (sliding window), 0 without. */
uint64_t ekv_vk_mg_posb(const struct ekv_vk_mg *m, int il);
/* The longest head of layer il once the part's rows are in. */
int32_t ekv_vk_mg_max_len(const struct ekv_vk_mg *m, int il);
/* Whether this forward computes statistics (then attn_combine writes ml). */
bool ekv_vk_mg_wants_stats(const struct ekv_vk_mg *m);
/* Whether ekv_vk_mg_record_stats dispatches in this forward (not while a decode
 * row's statistics wait in the ring). */
bool ekv_vk_mg_stats_now(const struct ekv_vk_mg *m);
/* Where this forward's rope_store also writes the rotated query row of layer
 * il (0: nowhere), and where attn_combine writes its row sums (dflt: the
 * forward's own array). */
uint64_t ekv_vk_mg_qdst(const struct ekv_vk_mg *m, int il);
uint64_t ekv_vk_mg_ml(const struct ekv_vk_mg *m, int il, uint64_t dflt);
/* Runs the statistics of decode rows still waiting (one submission; none if
 * none wait). No forward may be open. */
enum ekv_status ekv_vk_mg_pend_sync(struct ekv_vk_mg *m);
/* Tests: deferred statistics on (the default) or off (every decode step runs
 * its own statistics pass, as before the ring), and the rows that waited. */
void ekv_vk_mg_set_defer(struct ekv_vk_mg *m, bool on);
uint64_t ekv_vk_mg_deferred(const struct ekv_vk_mg *m);
/* Tests: the words of planned rows one compaction dispatch pair takes at most
 * (its scratch; 0: the default, 16M), so that small caches run in several. */
void ekv_vk_mg_set_chunk(size_t words);
/* Records attn_stats for layer il of the part (after its attention); without
 * barrier the next dispatch does not wait for it (a group of parts). */
void ekv_vk_mg_record_stats(struct ekv_context *ctx, const struct ekv_vk_seq *s, int il, const struct ekv_fwd_part *part,
                            bool barrier);
/* After the forward ran on the device: for every compressed part, its
 * statistics added to the cache, the policy's layer and end hooks, and
 * the keep / merge plans they made run on the device (kv_compact.comp). */
enum ekv_status ekv_vk_mg_after(struct ekv_context *ctx);
/* The forward failed before it ran: the parts' appended entries are taken back. */
void ekv_vk_mg_abort(struct ekv_context *ctx);
/* Frees the buffers the finished (or abandoned) recording read. */
void ekv_vk_mg_release(struct ekv_vk_ctx *g);

#endif
