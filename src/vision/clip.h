/*
 * clip.h — the vision tower of LLaVA-style and Idefics3/SmolVLM models,
 * loaded from an `mmproj` GGUF in llama.cpp's CLIP layout (clip.* metadata,
 * v.* encoder tensors, mm.* projector tensors): ViT patch embedding, class
 * token (absent in SigLIP-style towers), position embeddings, pre-layernorm,
 * transformer blocks up to the feature layer LLaVA reads (the second to last
 * unless clip.vision.feature_layer says otherwise), and the LLaVA-1.5
 * projector (Linear-GELU-Linear) into the language model's width; or, for
 * projector type "idefics3", every block, the post-layernorm, the pixel
 * shuffle and one linear map (idefics3.c holds its tiling); or, for
 * "qwen2vl_merger" (Qwen2-VL), a tower at the image's own resolution with
 * 2D RoPE and a 2 x 2 patch merger (qwen2vl.c).
 *
 * The engine calls ekv_clip_load once, then ekv_clip_encode_* per image to
 * get n_patches rows of n_embd_out floats to splice into the prompt. A
 * loaded tower is read-only: several threads may encode with it at once
 * (each with its own pool or none).
 */
#ifndef EKV_VISION_CLIP_H
#define EKV_VISION_CLIP_H

#include <stdbool.h>
#include <stdint.h>

#include "ekv.h"
#include "kernels/kernels.h"
#include "vision/image.h"

struct ekv_clip;

#define EKV_CLIP_MAX_PINPOINTS 64

/* The projector (clip.projector_type): LLaVA-1.5's Linear-GELU-Linear on
 * the second-to-last block ("mlp"), Idefics3/SmolVLM's pixel shuffle and
 * one linear map after every block and the post-layernorm ("idefics3"), or
 * Qwen2-VL's merger: LayerNorm, each 2 x 2 block of patches concatenated,
 * Linear-GELU-Linear ("qwen2vl_merger"). */
enum ekv_clip_proj { EKV_CLIP_PROJ_MLP, EKV_CLIP_PROJ_IDEFICS3, EKV_CLIP_PROJ_QWEN2VL };

struct ekv_clip_hparams {
    int image_size;      /* input side in pixels (336 for CLIP ViT-L/14-336; Qwen2-VL: metadata only) */
    int patch_size;      /* 14 */
    int n_patches;       /* (image_size / patch_size)^2; 0 for Qwen2-VL (it depends on the image) */
    int n_pos;           /* n_patches + 1 with a class token, else n_patches */
    int n_embd;          /* ViT width (1024) */
    int n_ff;            /* ViT MLP width (4096) */
    int n_head;          /* 16 */
    int n_layer;         /* blocks in the file (24) */
    int n_layer_run;     /* blocks run to reach the feature layer (23) */
    float eps;           /* LayerNorm epsilon */
    bool has_class;      /* class token present (CLIP) or not (SigLIP) */
    bool use_gelu;       /* encoder MLP: GELU (true) or quick-GELU x*sigmoid(1.702x) */
    bool use_silu;       /* encoder MLP: SiLU (clip.use_silu; never with use_gelu) */
    int n_mm;            /* projector hidden width (mm.0 rows) */
    int n_embd_out;      /* projector output = language model width */
    float image_mean[3];
    float image_std[3];
    /* LLaVA-1.6 "anyres": clip.vision.image_grid_pinpoints, the (width,
     * height) resolutions an image may be tiled at, each a multiple of
     * image_size; 0 pairs for a fixed-size tower */
    int n_pinpoints;
    int pinpoints[EKV_CLIP_MAX_PINPOINTS][2];
    enum ekv_clip_proj proj;
    /* Idefics3: each scale_factor x scale_factor block of patches becomes one
     * token (clip.vision.projector.scale_factor; 1 for mlp) */
    int scale_factor;
    int n_tile_tokens;   /* tokens one encoded image or tile becomes: n_patches / scale_factor^2 (0: Qwen2-VL) */
    /* Idefics3: the image is resized so that its longer side is this
     * (clip.vision.preproc_image_size), then cut into image_size tiles */
    int longest_edge;
    /* Qwen2-VL: each merge x merge block of patches becomes one token
     * (clip.vision.spatial_merge_size, 2); 0 for other projectors */
    int merge;
    /* Qwen2.5-VL (projector "qwen2.5vl_merger"): blocks il with (il + 1) %
     * wa_pattern != 0 attend within windows of win_tokens x win_tokens merged
     * tokens (112 px, llama.cpp's default), the others over the whole image
     * (clip.vision.n_wa_pattern); RMSNorm instead of LayerNorm; a SwiGLU MLP
     * (v.blk.N.ffn_gate). 0 / false for Qwen2-VL and the others. */
    int wa_pattern;
    int win_tokens;
    bool rms_norm;
};

/* Loads and validates an mmproj GGUF; every shape is checked against the
 * metadata and a mismatch names the tensor. *out owned by the caller. */
enum ekv_status ekv_clip_load(const char *path, struct ekv_clip **out);
void ekv_clip_free(struct ekv_clip *c);

const struct ekv_clip_hparams *ekv_clip_hparams(const struct ekv_clip *c);
/* Patches the tower sees in one image or tile ((image_size/patch_size)^2),
 * the tokens each image or tile becomes (n_patches, or n_patches /
 * scale_factor^2 for Idefics3), and the width of each token. */
int ekv_clip_n_patches(const struct ekv_clip *c);
int ekv_clip_n_tile_tokens(const struct ekv_clip *c);
int ekv_clip_n_embd_out(const struct ekv_clip *c);

/* Embedding rows an image of nx x ny pixels becomes: n_patches for a
 * fixed-size tower; with anyres grid pinpoints, the overview image plus
 * one tile per grid cell, n_patches each; Qwen2-VL: gw * gh of
 * ekv_clip_qwen2vl_grid. 0 for a non-positive size. */
int64_t ekv_clip_image_rows(const struct ekv_clip *c, int nx, int ny);

/* Anyres tiling as llama.cpp's LLaVA-1.6 path does it (mtmd's llava_uhd
 * preprocessor with pinpoints): an image no larger than image_size on both
 * sides is the overview alone; otherwise the pinpoint that keeps the most
 * of the image at the least wasted area (LLaVA-NeXT's
 * select_best_resolution) gives the grid. *w, *h: the chosen resolution
 * (0 when the overview is alone). */
void ekv_clip_anyres_grid(const struct ekv_clip *c, int nx, int ny, int *w, int *h);

/* Idefics3/SmolVLM tiling as llama.cpp's mtmd and the Hugging Face
 * processor do it: the image resized (Lanczos, aspect kept) so its longer
 * side is longest_edge and the shorter even, then up to whole tiles of
 * image_size; *gx x *gy tiles (0 x 0 for other projectors or a bad size). */
void ekv_clip_idefics3_grid(const struct ekv_clip *c, int nx, int ny, int *gx, int *gy);

/* Qwen2-VL's dynamic resolution as llama.cpp's mtmd computes it (the
 * Hugging Face processor's smart_resize with align = patch_size * merge,
 * 8 to 4096 tokens): the image is resized (aspect kept, centred on black)
 * to *tw x *th pixels, multiples of align. 0 x 0 for other projectors or
 * a bad size. */
void ekv_clip_qwen2vl_size(const struct ekv_clip *c, int nx, int ny, int *tw, int *th);
/* The merged token grid of an nx x ny image: *gw = tw / align columns,
 * *gh = th / align rows; 0 x 0 for other projectors or a bad size. */
void ekv_clip_qwen2vl_grid(const struct ekv_clip *c, int nx, int ny, int *gw, int *gh);

/* LLaVA-1.5 preprocessing with this tower's size, mean and std.
 * pixels: [3][image_size][image_size]. */
enum ekv_status ekv_clip_preprocess(const struct ekv_clip *c, const struct ekv_image *img,
                                    float *pixels);

/* Image embeddings: out [n_tile_tokens][n_embd_out], row-major order.
 * pool may be NULL (single-threaded). */
enum ekv_status ekv_clip_encode_pixels(const struct ekv_clip *c, struct ekv_pool *pool,
                                       const float *pixels, float *out);
/* A whole image: out [ekv_clip_image_rows(img)][n_embd_out]; LLaVA-1.6:
 * overview then tiles; Idefics3: the tiles row by row, then the overview
 * (the order they are spliced in); Qwen2-VL: the merged grid row by row. */
enum ekv_status ekv_clip_encode_image(const struct ekv_clip *c, struct ekv_pool *pool,
                                      const struct ekv_image *img, float *out);
/* Who encodes the pixels of one image or tile in
 * ekv_clip_encode_image_with: pixels(user, c, pixels, W, H, out) does what
 * ekv_clip_encode_pixels does for a fixed-size tower (the mlp projector:
 * LLaVA-1.5, each tile and overview of LLaVA-1.6; W = H = image_size) and
 * ekv_clip_encode_qwen2vl_pixels for a Qwen2-VL tower (W x H its smart-resized
 * size; Idefics3's tiles and overview: W = H = image_size) — a GPU backend;
 * NULL = those functions. */
struct ekv_clip_exec {
    enum ekv_status (*pixels)(void *user, const struct ekv_clip *c, const float *pixels, int W, int H, float *out);
    void *user;
};
enum ekv_status ekv_clip_encode_image_with(const struct ekv_clip *c, struct ekv_pool *pool,
                                           const struct ekv_image *img, const struct ekv_clip_exec *ex, float *out);
/* A number no other tower loaded in this process has (never 0): what a
 * device's copy of the weights is kept under. */
uint64_t ekv_clip_id(const struct ekv_clip *c);
enum ekv_status ekv_clip_encode_file(const struct ekv_clip *c, struct ekv_pool *pool,
                                     const char *path, float *out);

/* The stages, exposed for tests and tools.
 * Embeddings: patch projection (+bias), class token, position embeddings,
 * pre-layernorm when present. pixels: [3][S][S] -> x: [n_pos][n_embd]. */
enum ekv_status ekv_clip_embed(const struct ekv_clip *c, struct ekv_pool *pool,
                               const float *pixels, float *x);
/* One encoder block il (0-based) in place on x: [n_pos][n_embd]:
 * x += attn(LN1(x)); x += MLP(LN2(x)). */
enum ekv_status ekv_clip_block(const struct ekv_clip *c, struct ekv_pool *pool, int il, float *x);
/* Projector on the patch rows: feat [n_patches][n_embd] -> out
 * [n_tile_tokens][n_embd_out] (Idefics3: feat is after the post-layernorm). */
enum ekv_status ekv_clip_project(const struct ekv_clip *c, struct ekv_pool *pool,
                                 const float *feat, float *out);

/* Idefics3's pixel shuffle: in [g*g][e] (a g x g grid of patches, row-major)
 * -> out [(g/s)^2][e*s*s]: token (Y, X) holds patches (Y*s+dy, X*s+dx) for
 * dy, then dx, in order. g must be a multiple of s. */
void ekv_clip_pixel_shuffle(const float *in, int g, int e, int s, float *out);

/* Idefics3 whole image into out (see ekv_clip_encode_image); pixels is a
 * [3][image_size][image_size] scratch buffer; each tile through ex (NULL:
 * ekv_clip_encode_pixels). In idefics3.c. */
enum ekv_status ekv_clip_encode_idefics3(const struct ekv_clip *c, struct ekv_pool *pool, const struct ekv_image *img,
                                         const struct ekv_clip_exec *ex, float *pixels, float *out);
/* One image_size x image_size input (a LLaVA image or tile, an Idefics3
 * tile) through ex, or ekv_clip_encode_pixels without one. */
enum ekv_status ekv_clip_encode_tile(const struct ekv_clip *c, struct ekv_pool *pool, const struct ekv_clip_exec *ex,
                                     const float *pixels, float *out);

/* Qwen2-VL whole image into out [gw * gh][n_embd_out] (see
 * ekv_clip_encode_image). In qwen2vl.c. */
enum ekv_status ekv_clip_encode_qwen2vl(const struct ekv_clip *c, struct ekv_pool *pool, const struct ekv_image *img,
                                        const struct ekv_clip_exec *ex, float *out);
/* Qwen2-VL's tower on preprocessed pixels [3][H][W]: W and H multiples of
 * align = patch_size * merge, at most EKV_CLIP_QWEN2VL_MAX_TOKENS merged
 * tokens (else EKV_ERR_INVALID_ARG); out [(H/align) * (W/align)][n_embd_out],
 * the merged grid row by row. */
#define EKV_CLIP_QWEN2VL_MAX_TOKENS 16384
enum ekv_status ekv_clip_encode_qwen2vl_pixels(const struct ekv_clip *c, struct ekv_pool *pool, const float *pixels,
                                               int W, int H, float *out);

#endif
