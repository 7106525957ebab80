/*
 * clip_impl.h — the vision tower's internals, shared by clip.c (loading, the
 * fixed-size ViT and its projectors) and the files for towers whose layout
 * differs enough to live apart (qwen2vl.c: dynamic resolution, 2D RoPE and
 * the 2 x 2 merger), so that those files reuse the loaded weights and the
 * transformer block instead of copying them. Not a public header.
 */
#ifndef EKV_VISION_CLIP_IMPL_H
#define EKV_VISION_CLIP_IMPL_H

#include "vision/clip.h"

struct clip_layer {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;   /* [E] */
    struct ekv_weight q, k, v, o;           /* E rows of E */
    float *q_b, *k_b, *v_b, *o_b;           /* [E] */
    struct ekv_weight ff1;                  /* F rows of E */
    float *ff1_b;                           /* [F] */
    struct ekv_weight ff2;                  /* E rows of F */
    float *ff2_b;                           /* [E] */
    struct ekv_weight ffg;                  /* Qwen2.5-VL: the SwiGLU gate, F rows of E (absent: no gate) */
    float *ffg_b;                           /* [F] or NULL */
};

struct ekv_clip {
    struct ekv_gguf_file *f;
    struct ekv_clip_hparams hp;
    struct ekv_weight patch;     /* E rows of 3*P*P, columns in (channel, y, x) order */
    struct ekv_weight patch1;    /* Qwen2-VL: the second temporal half of the patch Conv3D */
    float *patch_b;              /* [E] or NULL */
    float *cls;                  /* [E] or NULL (SigLIP) */
    float *pos;                  /* [N][E] (NULL for Qwen2-VL) */
    float *pre_w, *pre_b;        /* [E] or NULL */
    struct clip_layer *layers;   /* [n_layer] */
    struct ekv_weight mm0;       /* M rows of E (Qwen2-VL: of 4E) */
    float *mm0_b;                /* [M] */
    struct ekv_weight mm2;       /* out rows of M */
    float *mm2_b;                /* [out] */
    float *post_w, *post_b;      /* [E], Idefics3 and Qwen2-VL */
    struct ekv_weight fc;        /* Idefics3: out rows of E*s*s */
    float **owned;               /* float arrays to free */
    size_t n_owned, cap_owned;
    const char *path;            /* for messages, borrowed during load only */
    uint64_t id;                 /* ekv_clip_id */
};

/* a * b floats, NULL when the size overflows or malloc fails */
float *ekv_clip_alloc_floats(size_t a, size_t b);
/* y = x W^T + b over `rows` rows (b may be NULL). */
enum ekv_status ekv_clip_linear(struct ekv_pool *pool, const struct ekv_weight *w, const float *b, const float *x,
                                size_t rows, float *y);
/* One encoder block il in place on x [n][n_embd] (ekv_clip_block with the
 * row count given). rope: NULL, or [n][head_dim/2][2] {cos, sin} turning
 * every head of q and k after their biases, element i with i + head_dim/2
 * (NeoX halves), as the 2D RoPE of Qwen2-VL's tower. win: NULL (every row
 * sees every row), or [n] window ids: a row sees the rows of its window
 * only (Qwen2.5-VL's windowed blocks). */
enum ekv_status ekv_clip_block_rows(const struct ekv_clip *c, struct ekv_pool *pool, int il, float *x, size_t n,
                                    const float *rope, const int32_t *win);
/* A fixed-size tower's patch rows of pixels [3][S][S]: row (py, px) holds
 * the channel-major P x P block (the conv weight's layout), kstride floats
 * a row, zeros past 3 P P. Shared by the CPU tower and the GPU's. */
void ekv_clip_patch_rows(const struct ekv_clip *c, const float *pixels, float *cols, size_t kstride);
/* A Qwen2-VL tower's inputs for W x H pixels [3][H][W] (n = (W/P) (H/P)
 * patches in the merged order): cols [n][kstride] the patches in the conv
 * weight's (channel, ky, kx) order, zeros past 3 P P; cs [n][d] (d the head
 * size) the 2D RoPE's {cos, sin} pairs, or NULL; win [n] each patch's
 * window (Qwen2.5-VL), or NULL. Shared by the CPU tower and the GPU's. */
void ekv_clip_qwen2vl_inputs(const struct ekv_clip *c, const float *pixels, int W, int H, float *cols, size_t kstride,
                             float *cs, int32_t *win);
/* LayerNorm, or RMSNorm for a Qwen2.5-VL tower (b may be NULL there). */
void ekv_clip_norm(const struct ekv_clip *c, float *out, const float *x, const float *w, const float *b);

#endif
