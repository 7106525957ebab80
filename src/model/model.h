/*
 * model.h — a loaded Llama-family model: hyper-parameters read from the
 * file, weight views into the mapped file, and the tokenizer. Loaders for
 * GGUF (model.c) and llama2.c checkpoints (llama2c.c) fill the same struct;
 * the forward pass (src/engine/forward.c) reads only this struct.
 */
#ifndef EKV_MODEL_H
#define EKV_MODEL_H

#include <stdint.h>

#include "ekv.h"
#include "kernels/kernels.h"

struct ekv_gguf_file;
struct ekv_vocab;

struct ekv_layer_weights {
    const float *attn_norm;  /* [n_embd] */
    struct ekv_weight wq;    /* ne0 = n_embd, ne1 = n_head * head_dim */
    struct ekv_weight wk;    /* ne0 = n_embd, ne1 = n_head_kv * head_dim */
    struct ekv_weight wv;    /* ne0 = n_embd, ne1 = n_head_kv * head_dim */
    struct ekv_weight wo;    /* ne0 = n_head * head_dim, ne1 = n_embd */
    const float *bq;         /* [n_head * head_dim] or NULL (qwen2 has biases) */
    const float *bk;         /* [n_head_kv * head_dim] or NULL */
    const float *bv;         /* [n_head_kv * head_dim] or NULL */
    const float *ffn_norm;   /* [n_embd] */
    struct ekv_weight w_gate;/* ne0 = n_embd, ne1 = n_ff */
    struct ekv_weight w_up;  /* ne0 = n_embd, ne1 = n_ff */
    /* Fused tensors (Phi-3's attn_qkv [n_embd, QD + 2 KVD], ffn_up
     * [n_embd, 2 n_ff]) are bound as row views: wq/wk/wv and w_gate/w_up
     * point into the one tensor, so the forward is the same for both. */
    struct ekv_weight w_down;/* ne0 = n_ff,   ne1 = n_embd */
};

struct ekv_model {
    struct ekv_model_info info;
    char arch[32];
    char name[128];
    char path[512];

    struct ekv_gguf_file *gguf;      /* GGUF source, or NULL */
    void *map;                   /* llama2.c source mapping, or NULL */
    size_t map_size;

    struct ekv_vocab *vocab;

    struct ekv_weight tok_embd;  /* ne0 = n_embd, ne1 = n_vocab */
    struct ekv_weight output;    /* ne0 = n_embd, ne1 = n_vocab (= tok_embd when tied) */
    const float *output_norm;    /* [n_embd] */
    struct ekv_layer_weights *layers; /* [n_layer] */
    const float *rope_freqs;     /* [rope_dim/2] Llama 3's per-dimension factors, or NULL */
    const float *rope_long;      /* [rope_dim/2] longrope factors past rope_orig_ctx, or NULL */
    const float *rope_short;     /* [rope_dim/2] longrope factors within it, or NULL */

    struct ekv_repack_arena repacked; /* Q8_0/Q4_0 matrices in the X16 layout (owned) */
    float *vecs;                 /* owned f32 copies of all 1-D tensors (norms, biases) */
    size_t vecs_len;
    size_t vecs_used;
    uint64_t fingerprint;        /* ekv_model_fingerprint: set by ekv_model_load */
};

/* Loaders; both leave *m fully initialised on success, and free what they
 * allocated on failure (the caller then frees the struct). */
enum ekv_status ekv_model_load_gguf(struct ekv_model *m, const char *path);
enum ekv_status ekv_model_load_llama2c(struct ekv_model *m, const char *path, const char *tok_path);

/* Releases a llama2.c mapping made by ekv_model_load_llama2c. */
void ekv_llama2c_unmap(void *map, size_t size);

/* Shared by the loaders: validate hyper-parameters, compute derived info. */
enum ekv_status ekv_model_finish(struct ekv_model *m);

/* The RoPE of this model for a context of n_ctx positions (which picks
 * longrope's long or short factors, as llama.cpp does): frequencies,
 * scaling and YaRN's attention factor as llama.cpp computes them
 * (llama_context's yarn_attn_factor, ggml_rope_ext). */
void ekv_model_rope_params(const struct ekv_model *m, int32_t n_ctx, struct ekv_rope_params *p);

/* Takes n floats from m->vecs (allocated by the loader). */
float *ekv_model_take_vec(struct ekv_model *m, size_t n);

#endif
