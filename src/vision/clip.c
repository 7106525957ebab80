/*
 * clip.c — the LLaVA vision tower: loads an mmproj GGUF written the way
 * llama.cpp's convert_image_encoder_to_gguf.py writes it, validates every
 * tensor against the clip.* metadata, and turns a preprocessed image into
 * projected patch embeddings with the kernels' matmuls.
 *
 * Tensor names and GGUF shapes (ne0 innermost), E = embedding_length,
 * F = feed_forward_length, P = patch_size, N = positions, M = projector width:
 *   v.patch_embd.weight [P,P,3,E] (+ optional v.patch_embd.bias [E], SigLIP)
 *   v.class_embd [E] (CLIP only), v.position_embd.weight [E,N]
 *   v.pre_ln.{weight,bias} [E] (optional: SigLIP has none)
 *   v.blk.i.ln1/ln2.{weight,bias} [E], v.blk.i.attn_{q,k,v,out}.weight [E,E] + .bias [E]
 *   v.blk.i.ffn_down.weight [E,F] + bias [F]  (the converter names CLIP's fc1 "ffn_down")
 *   v.blk.i.ffn_up.weight   [F,E] + bias [E]  (fc2); files with the names the
 *   other way round (newer converters) are recognised by shape.
 *   mm.0.weight [E,M] + bias [M], mm.2.weight [M,out] + bias [out]  (projector "mlp")
 *   v.post_ln.{weight,bias} [E], mm.model.fc.weight [E*s*s,out]  (projector
 *   "idefics3", SigLIP: s = clip.vision.projector.scale_factor)
 *   v.patch_embd.weight.1 [P,P,3,E] (no bias, class token nor positions),
 *   v.post_ln.{weight,bias} [E], mm.0.weight [4E,M] + bias, mm.2.weight
 *   [M,out] + bias  (projector "qwen2vl_merger"; ffn_up is fc1 there)
 * LLaVA does not use v.post_ln: it reads the second-to-last block's output;
 * Idefics3 runs every block, then v.post_ln, then the pixel shuffle; Qwen2-VL
 * every block, then v.post_ln and the 2 x 2 merger (qwen2vl.c).
 */
#include "vision/clip_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/gguf.h"

#define CLIP_MAX_IMAGE 4096
#define CLIP_MAX_EMBD (1 << 16)
#define CLIP_MAX_FF (1 << 18)
#define CLIP_MAX_LAYER 1024
#define CLIP_MAX_OUT (1 << 18)

/* ------------------------------------------------------------------ */
/* loading                                                              */
/* ------------------------------------------------------------------ */

static enum ekv_status own(struct ekv_clip *c, float *p) {
    if (c->n_owned == c->cap_owned) {
        size_t cap = c->cap_owned ? c->cap_owned * 2 : 64;
        float **n = realloc(c->owned, cap * sizeof *n);
        if (!n) return ekv_err(EKV_ERR_NOMEM, "%s: tensor table", c->path);
        c->owned = n;
        c->cap_owned = cap;
    }
    c->owned[c->n_owned++] = p;
    return EKV_OK;
}

/* Finds tensor `name` and checks its shape is exactly ne[0..n-1] (other
 * dims 1). Missing: EKV_ERR_NOT_FOUND if required, else *out = NULL. */
static enum ekv_status find(struct ekv_clip *c, const char *name, bool required, int n,
                            const int64_t *ne, const struct ekv_gguf_tensor **out) {
    *out = NULL;
    const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(c->f, name);
    if (!t) {
        if (!required) return EKV_OK;
        return ekv_err(EKV_ERR_NOT_FOUND, "%s: tensor %s is missing", c->path, name);
    }
    bool ok = true;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) ok = ok && t->ne[d] == (d < n ? ne[d] : 1);
    if (!ok) {
        char want[96] = "", got[96] = "";
        for (int d = 0; d < n; d++) {
            size_t l = strlen(want);
            snprintf(want + l, sizeof want - l, "%s%lld", d ? "," : "", (long long)ne[d]);
        }
        for (int d = 0; d < (int)t->n_dims && d < GGUF_MAX_DIMS; d++) {
            size_t l = strlen(got);
            snprintf(got + l, sizeof got - l, "%s%lld", d ? "," : "", (long long)t->ne[d]);
        }
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor %s has shape [%s], expected [%s] from the metadata",
                       c->path, name, got, want);
    }
    *out = t;
    return EKV_OK;
}

/* A float copy of a vector/matrix tensor of n0 x n1 elements. */
static enum ekv_status load_floats(struct ekv_clip *c, const char *name, bool required, int64_t n0,
                                   int64_t n1, float **out) {
    *out = NULL;
    const struct ekv_gguf_tensor *t;
    int64_t ne[2] = {n0, n1};
    enum ekv_status s = find(c, name, required, n1 == 1 ? 1 : 2, ne, &t);
    if (s != EKV_OK || !t) return s;
    size_t n, bytes;
    if (!ekv_mul_ok((size_t)n0, (size_t)n1, &n) || !ekv_mul_ok(n, sizeof(float), &bytes))
        return ekv_err(EKV_ERR_OVERFLOW, "%s: tensor %s is too large", c->path, name);
    float *p = malloc(bytes);
    if (!p) return ekv_err(EKV_ERR_NOMEM, "%s: tensor %s: %zu bytes", c->path, name, bytes);
    if ((s = own(c, p)) != EKV_OK) {
        free(p);
        return s;
    }
    size_t row_bytes;
    if (!ekv_dtype_row_bytes(t->type, n0, &row_bytes))
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor %s: %lld elements do not fit type %s", c->path,
                       name, (long long)n0, ekv_dtype_name(t->type));
    for (int64_t r = 0; r < n1; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * row_bytes;
        float *dst = p + (size_t)r * (size_t)n0;
        if (t->type == EKV_F32) {
            memcpy(dst, src, (size_t)n0 * sizeof(float));
        } else if (t->type == EKV_F16 || t->type == EKV_BF16) {
            for (int64_t i = 0; i < n0; i++) {
                uint16_t h;
                memcpy(&h, src + 2 * i, 2);
                dst[i] = t->type == EKV_F16 ? ekv_fp16_to_f32(h) : ekv_bf16_to_f32(h);
            }
        } else {
            s = ekv_dequantize_row(t->type, src, dst, n0);
            if (s != EKV_OK)
                return ekv_err_prefix(s, "%s: tensor %s (%s)", c->path, name,
                                      ekv_dtype_name(t->type));
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return ekv_err(EKV_ERR_FORMAT, "%s: tensor %s holds a non-finite value at %zu", c->path,
                           name, i);
    *out = p;
    return EKV_OK;
}

/* A weight matrix of `rows` rows of `cols` elements, given its GGUF shape. */
static enum ekv_status load_matrix(struct ekv_clip *c, const char *name, int n, const int64_t *ne,
                                   int64_t cols, int64_t rows, struct ekv_weight *w) {
    const struct ekv_gguf_tensor *t;
    enum ekv_status s = find(c, name, true, n, ne, &t);
    if (s != EKV_OK) return s;
    if (!ekv_dtype_can_compute(t->type))
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: tensor %s has type %s, which ekv cannot multiply",
                       c->path, name, ekv_dtype_name(t->type));
    w->type = t->type;
    w->ne0 = cols;
    w->ne1 = rows;
    w->data = t->data;
    if (!ekv_dtype_row_bytes(t->type, cols, &w->row_bytes))
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor %s: rows of %lld elements do not fit type %s",
                       c->path, name, (long long)cols, ekv_dtype_name(t->type));
    return EKV_OK;
}

static enum ekv_status load_linear(struct ekv_clip *c, const char *wname, const char *bname,
                                   int64_t in, int64_t outn, struct ekv_weight *w, float **b) {
    int64_t ne[2] = {in, outn};
    enum ekv_status s = load_matrix(c, wname, 2, ne, in, outn, w);
    if (s == EKV_OK) s = load_floats(c, bname, true, outn, 1, b);
    return s;
}

static enum ekv_status get_u32_range(struct ekv_clip *c, const char *key, uint32_t lo, uint32_t hi,
                                     int *out) {
    uint32_t v;
    enum ekv_status s = ekv_gguf_get_u32(c->f, key, &v);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s", c->path);
    if (v < lo || v > hi)
        return ekv_err(EKV_ERR_FORMAT, "%s: %s = %u is outside [%u, %u]", c->path, key, v, lo, hi);
    *out = (int)v;
    return EKV_OK;
}

static enum ekv_status get_bool_opt(struct ekv_clip *c, const char *key, bool def, bool *out) {
    *out = def;
    if (!ekv_gguf_find_kv(c->f, key)) return EKV_OK;
    enum ekv_status s = ekv_gguf_get_bool(c->f, key, out);
    return s == EKV_OK ? s : ekv_err_prefix(s, "%s", c->path);
}

static enum ekv_status get_f32x3(struct ekv_clip *c, const char *key, float v[3]) {
    const struct ekv_gguf_value *a;
    enum ekv_status s = ekv_gguf_get_arr(c->f, key, GGUF_TYPE_FLOAT32, &a);
    if (s != EKV_OK) return ekv_err_prefix(s, "%s", c->path);
    if (a->v.arr.n != 3)
        return ekv_err(EKV_ERR_FORMAT, "%s: %s has %llu values, expected 3 (R, G, B)", c->path, key,
                       (unsigned long long)a->v.arr.n);
    memcpy(v, a->v.arr.data, 3 * sizeof(float));
    for (int i = 0; i < 3; i++)
        if (!isfinite(v[i]))
            return ekv_err(EKV_ERR_FORMAT, "%s: %s[%d] is not finite", c->path, key, i);
    return EKV_OK;
}

/* LLaVA-1.6's grid pinpoints (pairs of width, height, multiples of the
 * image size). A tower that says it unpads patches spatially (LLaVA-1.6's
 * mm_patch_merge_type) without pinpoints cannot be run right: refused with
 * the missing key named. */
static enum ekv_status load_pinpoints(struct ekv_clip *c) {
    struct ekv_clip_hparams *hp = &c->hp;
    enum ekv_status s;
    hp->n_pinpoints = 0;
    if (!ekv_gguf_find_kv(c->f, "clip.vision.image_grid_pinpoints")) {
        struct ekv_gguf_str mt;
        if (ekv_gguf_get_str(c->f, "clip.vision.mm_patch_merge_type", &mt) == EKV_OK &&
            ekv_gguf_str_eq(mt, "spatial_unpad"))
            return ekv_err(EKV_ERR_UNSUPPORTED,
                           "%s: clip.vision.mm_patch_merge_type is spatial_unpad (LLaVA-1.6 anyres) but "
                           "clip.vision.image_grid_pinpoints is missing, so the tiling grid is unknown",
                           c->path);
        return EKV_OK;
    }
    const struct ekv_gguf_value *a;
    if ((s = ekv_gguf_get_arr(c->f, "clip.vision.image_grid_pinpoints", GGUF_TYPE_COUNT, &a)) != EKV_OK)
        return ekv_err_prefix(s, "%s", c->path);
    if (a->v.arr.type != GGUF_TYPE_INT32 && a->v.arr.type != GGUF_TYPE_UINT32)
        return ekv_err(EKV_ERR_FORMAT, "%s: clip.vision.image_grid_pinpoints must hold 32-bit integers", c->path);
    if (a->v.arr.n == 0 || a->v.arr.n % 2 || a->v.arr.n > 2 * EKV_CLIP_MAX_PINPOINTS)
        return ekv_err(EKV_ERR_FORMAT, "%s: clip.vision.image_grid_pinpoints has %llu values (pairs, at most %d)",
                       c->path, (unsigned long long)a->v.arr.n, EKV_CLIP_MAX_PINPOINTS);
    for (uint64_t i = 0; i < a->v.arr.n; i++) {
        int32_t v;
        memcpy(&v, (const uint8_t *)a->v.arr.data + 4 * i, 4);
        if (v < hp->image_size || v > CLIP_MAX_IMAGE * 4 || v % hp->image_size)
            return ekv_err(EKV_ERR_FORMAT,
                           "%s: clip.vision.image_grid_pinpoints[%llu] = %d is not a multiple of the image size %d "
                           "(up to %d)",
                           c->path, (unsigned long long)i, (int)v, hp->image_size, CLIP_MAX_IMAGE * 4);
        hp->pinpoints[i / 2][i % 2] = v;
    }
    hp->n_pinpoints = (int)(a->v.arr.n / 2);
    return EKV_OK;
}

/* Qwen2-VL: the tower runs at each image's resolution (no fixed patch
 * count), every block, 2D RoPE over head_dim/2 pairs split between the
 * patch row and column (so head_dim must be a multiple of 4), and a merger
 * of 2 x 2 patches (the only size llama.cpp's graph builds). */
static enum ekv_status load_qwen2vl_hparams(struct ekv_clip *c) {
    struct ekv_clip_hparams *hp = &c->hp;
    enum ekv_status s;
    hp->n_patches = hp->n_pos = hp->n_tile_tokens = 0;
    hp->n_layer_run = hp->n_layer;
    if (hp->patch_size > 64)
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: clip.vision.patch_size = %d: at most 64 for dynamic resolution",
                       c->path, hp->patch_size);
    if ((hp->n_embd / hp->n_head) % 4)
        return ekv_err(EKV_ERR_FORMAT,
                       "%s: head size %d (embedding_length %d / head_count %d) is not a multiple of 4, which the "
                       "2D RoPE needs",
                       c->path, hp->n_embd / hp->n_head, hp->n_embd, hp->n_head);
    hp->merge = 2;
    if (ekv_gguf_find_kv(c->f, "clip.vision.spatial_merge_size") &&
        (s = get_u32_range(c, "clip.vision.spatial_merge_size", 1, 64, &hp->merge)) != EKV_OK)
        return s;
    if (hp->merge != 2)
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: clip.vision.spatial_merge_size = %d: only 2 is supported", c->path,
                       hp->merge);
    int wa = 0;
    if (ekv_gguf_find_kv(c->f, "clip.vision.n_wa_pattern") &&
        (s = get_u32_range(c, "clip.vision.n_wa_pattern", 0, 4096, &wa)) != EKV_OK)
        return s;
    if (!hp->rms_norm) {
        if (wa > 0)
            return ekv_err(EKV_ERR_FORMAT, "%s: clip.vision.n_wa_pattern = %d in a qwen2vl_merger (Qwen2-VL) tower, "
                                           "which has no window attention (qwen2.5vl_merger has)", c->path, wa);
        return EKV_OK;
    }
    /* Qwen2.5-VL: windows of 112 px (llama.cpp's default; the converter writes no size) */
    if (wa < 1)
        return ekv_err(EKV_ERR_FORMAT, "%s: a qwen2.5vl_merger tower needs clip.vision.n_wa_pattern >= 1", c->path);
    hp->wa_pattern = wa;
    hp->win_tokens = 112 / hp->patch_size / hp->merge;
    if (hp->win_tokens < 1)
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: clip.vision.patch_size = %d: windows of 112 px need patches of at "
                                            "most 56", c->path, hp->patch_size);
    return EKV_OK;
}

static enum ekv_status load_hparams(struct ekv_clip *c) {
    struct ekv_clip_hparams *hp = &c->hp;
    enum ekv_status s;
    struct ekv_gguf_str arch;
    if (ekv_gguf_get_str(c->f, "general.architecture", &arch) == EKV_OK && !ekv_gguf_str_eq(arch, "clip")) {
        char a[64];
        ekv_gguf_str_copy(arch, a, sizeof a);
        return ekv_err(EKV_ERR_FORMAT,
                       "%s: general.architecture is '%s', not 'clip': is this an mmproj file?",
                       c->path, a);
    }
    bool has_vision, has_llava;
    if ((s = get_bool_opt(c, "clip.has_vision_encoder", true, &has_vision)) != EKV_OK) return s;
    if ((s = get_bool_opt(c, "clip.has_llava_projector", true, &has_llava)) != EKV_OK) return s;
    if (!has_vision)
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: clip.has_vision_encoder is false", c->path);
    struct ekv_gguf_str pt;
    hp->proj = EKV_CLIP_PROJ_MLP;
    if (ekv_gguf_get_str(c->f, "clip.projector_type", &pt) == EKV_OK && !ekv_gguf_str_eq(pt, "mlp")) {
        char p[64];
        ekv_gguf_str_copy(pt, p, sizeof p);
        if (ekv_gguf_str_eq(pt, "qwen2.5vl_merger")) { /* Qwen2-VL's layout with RMSNorm, SwiGLU, windows */
            hp->proj = EKV_CLIP_PROJ_QWEN2VL;
            hp->rms_norm = true;
        } else if (ekv_gguf_str_eq(pt, "idefics3"))
            hp->proj = EKV_CLIP_PROJ_IDEFICS3;
        else if (ekv_gguf_str_eq(pt, "qwen2vl_merger"))
            hp->proj = EKV_CLIP_PROJ_QWEN2VL;
        else
            return ekv_err(EKV_ERR_UNSUPPORTED,
                           "%s: clip.projector_type '%s' is not supported ('mlp': LLaVA-1.5/1.6; "
                           "'idefics3': SmolVLM, Idefics3; 'qwen2vl_merger': Qwen2-VL)",
                           c->path, p);
    }
    if (!has_llava && hp->proj == EKV_CLIP_PROJ_MLP)
        return ekv_err(EKV_ERR_UNSUPPORTED,
                       "%s: clip.has_llava_projector is false: ekv needs a LLaVA projector", c->path);
    if ((s = get_bool_opt(c, "clip.use_gelu", false, &hp->use_gelu)) != EKV_OK ||
        (s = get_bool_opt(c, "clip.use_silu", false, &hp->use_silu)) != EKV_OK)
        return s;
    if (hp->use_gelu && hp->use_silu)
        return ekv_err(EKV_ERR_FORMAT, "%s: clip.use_gelu and clip.use_silu are both true", c->path);

    if ((s = get_u32_range(c, "clip.vision.image_size", 1, CLIP_MAX_IMAGE, &hp->image_size)) ||
        (s = get_u32_range(c, "clip.vision.patch_size", 1, (uint32_t)hp->image_size,
                           &hp->patch_size)) ||
        (s = get_u32_range(c, "clip.vision.embedding_length", 1, CLIP_MAX_EMBD, &hp->n_embd)) ||
        (s = get_u32_range(c, "clip.vision.feed_forward_length", 1, CLIP_MAX_FF, &hp->n_ff)) ||
        (s = get_u32_range(c, "clip.vision.attention.head_count", 1, (uint32_t)hp->n_embd,
                           &hp->n_head)) ||
        (s = get_u32_range(c, "clip.vision.block_count", 1, CLIP_MAX_LAYER, &hp->n_layer)))
        return s;
    if (hp->proj != EKV_CLIP_PROJ_QWEN2VL && hp->image_size % hp->patch_size)
        return ekv_err(EKV_ERR_FORMAT, "%s: image_size %d is not a multiple of patch_size %d",
                       c->path, hp->image_size, hp->patch_size);
    if (hp->n_embd % hp->n_head)
        return ekv_err(EKV_ERR_FORMAT, "%s: embedding_length %d is not a multiple of head_count %d",
                       c->path, hp->n_embd, hp->n_head);
    if ((s = ekv_gguf_get_f32(c->f, "clip.vision.attention.layer_norm_epsilon", &hp->eps)) != EKV_OK)
        return ekv_err_prefix(s, "%s", c->path);
    if (!(hp->eps >= 0.0f && hp->eps < 1.0f))
        return ekv_err(EKV_ERR_FORMAT, "%s: clip.vision.attention.layer_norm_epsilon = %g", c->path,
                       (double)hp->eps);
    if ((s = get_f32x3(c, "clip.vision.image_mean", hp->image_mean)) ||
        (s = get_f32x3(c, "clip.vision.image_std", hp->image_std)))
        return s;
    for (int i = 0; i < 3; i++)
        if (!(hp->image_std[i] > 0.0f))
            return ekv_err(EKV_ERR_FORMAT, "%s: clip.vision.image_std[%d] = %g is not positive",
                           c->path, i, (double)hp->image_std[i]);

    int grid = hp->image_size / hp->patch_size;
    hp->n_patches = grid * grid;
    hp->scale_factor = 1;
    hp->n_tile_tokens = hp->n_patches;
    hp->longest_edge = 0;
    hp->merge = 0;
    if (hp->proj == EKV_CLIP_PROJ_QWEN2VL) return load_qwen2vl_hparams(c);
    if (hp->proj == EKV_CLIP_PROJ_IDEFICS3) {
        /* every block runs (llama.cpp's SigLIP graph ignores feature layers) */
        hp->n_layer_run = hp->n_layer;
        if ((s = get_u32_range(c, "clip.vision.projector.scale_factor", 1, (uint32_t)grid, &hp->scale_factor)))
            return s;
        if (grid % hp->scale_factor)
            return ekv_err(EKV_ERR_UNSUPPORTED,
                           "%s: the %dx%d patch grid is not a multiple of clip.vision.projector.scale_factor %d",
                           c->path, grid, grid, hp->scale_factor);
        hp->n_tile_tokens = hp->n_patches / (hp->scale_factor * hp->scale_factor);
        if (!ekv_gguf_find_kv(c->f, "clip.vision.preproc_image_size"))
            return ekv_err(EKV_ERR_UNSUPPORTED,
                           "%s: an idefics3 mmproj without clip.vision.preproc_image_size (the processor's "
                           "longest edge; written by current convert_hf_to_gguf.py): re-convert the model",
                           c->path);
        if ((s = get_u32_range(c, "clip.vision.preproc_image_size", 1, CLIP_MAX_IMAGE * 4, &hp->longest_edge)))
            return s;
        return EKV_OK;
    }

    /* Feature layer: hidden state k is the output of k blocks (0 = embeddings).
     * LLaVA-1.5 reads the second to last, which is the default. */
    hp->n_layer_run = hp->n_layer - 1;
    if (ekv_gguf_find_kv(c->f, "clip.vision.feature_layer")) {
        const struct ekv_gguf_value *a;
        if ((s = ekv_gguf_get_arr(c->f, "clip.vision.feature_layer", GGUF_TYPE_COUNT, &a)) != EKV_OK)
            return ekv_err_prefix(s, "%s", c->path);
        if (a->v.arr.n != 1 ||
            (a->v.arr.type != GGUF_TYPE_INT32 && a->v.arr.type != GGUF_TYPE_UINT32))
            return ekv_err(EKV_ERR_UNSUPPORTED,
                           "%s: clip.vision.feature_layer must hold one 32-bit integer (several "
                           "feature layers are not supported)",
                           c->path);
        int32_t fl;
        memcpy(&fl, a->v.arr.data, 4);
        if (fl < 0 || fl > hp->n_layer)
            return ekv_err(EKV_ERR_FORMAT, "%s: clip.vision.feature_layer = %d is outside [0, %d]",
                           c->path, (int)fl, hp->n_layer);
        hp->n_layer_run = fl;
    }
    return load_pinpoints(c);
}

/* Idefics3: v.post_ln and the connector's one linear map (no bias), whose
 * input is the pixel-shuffled width E*s*s. */
static enum ekv_status load_idefics3(struct ekv_clip *c) {
    struct ekv_clip_hparams *hp = &c->hp;
    const int64_t E = hp->n_embd, in = E * hp->scale_factor * hp->scale_factor;
    enum ekv_status s;
    if ((s = load_floats(c, "v.post_ln.weight", true, E, 1, &c->post_w)) != EKV_OK ||
        (s = load_floats(c, "v.post_ln.bias", true, E, 1, &c->post_b)) != EKV_OK)
        return s;
    const struct ekv_gguf_tensor *fc = ekv_gguf_find_tensor(c->f, "mm.model.fc.weight");
    if (!fc) return ekv_err(EKV_ERR_NOT_FOUND, "%s: tensor mm.model.fc.weight is missing", c->path);
    if (fc->ne[1] < 1 || fc->ne[1] > CLIP_MAX_OUT)
        return ekv_err(EKV_ERR_FORMAT, "%s: mm.model.fc.weight's output width %lld is out of range", c->path,
                       (long long)fc->ne[1]);
    hp->n_mm = 0;
    hp->n_embd_out = (int)fc->ne[1];
    int64_t ne[2] = {in, hp->n_embd_out};
    return load_matrix(c, "mm.model.fc.weight", 2, ne, in, hp->n_embd_out, &c->fc);
}

/* Qwen2-VL: v.post_ln (the merger's LayerNorm) and the merger's MLP,
 * whose input is 4 patches (4E) and whose output is the language model's
 * width (clip.vision.projection_dim when the file has it). */
static enum ekv_status load_qwen2vl(struct ekv_clip *c) {
    struct ekv_clip_hparams *hp = &c->hp;
    const int64_t E = hp->n_embd, in = E * hp->merge * hp->merge;
    enum ekv_status s;
    if ((s = load_floats(c, "v.post_ln.weight", true, E, 1, &c->post_w)) != EKV_OK ||
        (s = load_floats(c, "v.post_ln.bias", !hp->rms_norm, E, 1, &c->post_b)) != EKV_OK)
        return s;
    const struct ekv_gguf_tensor *m0 = ekv_gguf_find_tensor(c->f, "mm.0.weight");
    const struct ekv_gguf_tensor *m2 = ekv_gguf_find_tensor(c->f, "mm.2.weight");
    if (!m0) return ekv_err(EKV_ERR_NOT_FOUND, "%s: tensor mm.0.weight is missing", c->path);
    if (!m2) return ekv_err(EKV_ERR_NOT_FOUND, "%s: tensor mm.2.weight is missing", c->path);
    if (m0->ne[1] < 1 || m0->ne[1] > CLIP_MAX_OUT || m2->ne[1] < 1 || m2->ne[1] > CLIP_MAX_OUT)
        return ekv_err(EKV_ERR_FORMAT, "%s: merger widths %lld (mm.0.weight), %lld (mm.2.weight) are out of range",
                       c->path, (long long)m0->ne[1], (long long)m2->ne[1]);
    hp->n_mm = (int)m0->ne[1];
    hp->n_embd_out = (int)m2->ne[1];
    if (ekv_gguf_find_kv(c->f, "clip.vision.projection_dim")) {
        int pd;
        if ((s = get_u32_range(c, "clip.vision.projection_dim", 1, CLIP_MAX_OUT, &pd)) != EKV_OK) return s;
        if (pd != hp->n_embd_out)
            return ekv_err(EKV_ERR_FORMAT, "%s: tensor mm.2.weight maps to width %d but clip.vision.projection_dim is %d",
                           c->path, hp->n_embd_out, pd);
    }
    if ((s = load_linear(c, "mm.0.weight", "mm.0.bias", in, hp->n_mm, &c->mm0, &c->mm0_b)) ||
        (s = load_linear(c, "mm.2.weight", "mm.2.bias", hp->n_mm, hp->n_embd_out, &c->mm2, &c->mm2_b)))
        return s;
    return EKV_OK;
}

static enum ekv_status load_tensors(struct ekv_clip *c) {
    struct ekv_clip_hparams *hp = &c->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff, P = hp->patch_size;
    enum ekv_status s;
    char name[96];

    /* Class token decides CLIP vs SigLIP layout; positions must agree. */
    const struct ekv_gguf_tensor *t;
    int64_t ne1[1] = {E};
    if ((s = find(c, "v.class_embd", false, 1, ne1, &t)) != EKV_OK) return s;
    hp->has_class = t != NULL;
    if (hp->has_class && hp->proj != EKV_CLIP_PROJ_MLP)
        return ekv_err(EKV_ERR_FORMAT, "%s: tensor v.class_embd in an %s tower, which has no class token", c->path,
                       hp->proj == EKV_CLIP_PROJ_IDEFICS3 ? "idefics3 (SigLIP)" : "qwen2vl_merger");
    hp->n_pos = hp->n_patches + (hp->has_class ? 1 : 0);
    if (hp->has_class && (s = load_floats(c, "v.class_embd", true, E, 1, &c->cls)) != EKV_OK)
        return s;

    int64_t pne[4] = {P, P, 3, E};
    if ((s = load_matrix(c, "v.patch_embd.weight", 4, pne, 3 * P * P, E, &c->patch)) != EKV_OK)
        return s;
    if ((s = load_floats(c, "v.patch_embd.bias", false, E, 1, &c->patch_b)) != EKV_OK) return s;
    if (hp->proj == EKV_CLIP_PROJ_QWEN2VL) {
        /* the Conv3D's two temporal halves, no bias; positions come from the RoPE */
        static const char *const extra[2] = {"v.patch_embd.bias", "v.position_embd.weight"};
        for (int i = 0; i < 2; i++)
            if (ekv_gguf_find_tensor(c->f, extra[i]))
                return ekv_err(EKV_ERR_FORMAT, "%s: tensor %s in a qwen2vl_merger tower, which has none", c->path,
                               extra[i]);
        if ((s = load_matrix(c, "v.patch_embd.weight.1", 4, pne, 3 * P * P, E, &c->patch1)) != EKV_OK) return s;
    } else if ((s = load_floats(c, "v.position_embd.weight", true, E, hp->n_pos, &c->pos)) != EKV_OK) {
        return s;
    }
    if ((s = load_floats(c, "v.pre_ln.weight", false, E, 1, &c->pre_w)) != EKV_OK ||
        (s = load_floats(c, "v.pre_ln.bias", false, E, 1, &c->pre_b)) != EKV_OK)
        return s;
    if ((c->pre_w == NULL) != (c->pre_b == NULL))
        return ekv_err(EKV_ERR_FORMAT, "%s: v.pre_ln has a weight or a bias but not both", c->path);

    c->layers = calloc((size_t)hp->n_layer, sizeof *c->layers);
    if (!c->layers) return ekv_err(EKV_ERR_NOMEM, "%s: layer table", c->path);
    for (int il = 0; il < hp->n_layer; il++) {
        struct clip_layer *L = &c->layers[il];
        struct {
            const char *part;
            float **w, **b;
        } norms[2] = {{"ln1", &L->ln1_w, &L->ln1_b}, {"ln2", &L->ln2_w, &L->ln2_b}};
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "v.blk.%d.%s.weight", il, norms[k].part);
            if ((s = load_floats(c, name, true, E, 1, norms[k].w)) != EKV_OK) return s;
            snprintf(name, sizeof name, "v.blk.%d.%s.bias", il, norms[k].part);
            if ((s = load_floats(c, name, !hp->rms_norm, E, 1, norms[k].b)) != EKV_OK) return s; /* RMSNorm: none */
        }
        struct {
            const char *part;
            struct ekv_weight *w;
            float **b;
        } att[4] = {{"attn_q", &L->q, &L->q_b},
                    {"attn_k", &L->k, &L->k_b},
                    {"attn_v", &L->v, &L->v_b},
                    {"attn_out", &L->o, &L->o_b}};
        for (int k = 0; k < 4; k++) {
            char bname[96];
            snprintf(name, sizeof name, "v.blk.%d.%s.weight", il, att[k].part);
            snprintf(bname, sizeof bname, "v.blk.%d.%s.bias", il, att[k].part);
            if ((s = load_linear(c, name, bname, E, E, att[k].w, att[k].b)) != EKV_OK) return s;
        }
        /* fc1 (E -> F) is "ffn_down" in llama.cpp's LLaVA converter; accept the
         * swapped naming too, told apart by shape when E != F. */
        char dn[96], up[96];
        snprintf(dn, sizeof dn, "v.blk.%d.ffn_down.weight", il);
        snprintf(up, sizeof up, "v.blk.%d.ffn_up.weight", il);
        const struct ekv_gguf_tensor *td = ekv_gguf_find_tensor(c->f, dn);
        bool swapped = E != F && td && td->ne[0] == F && td->ne[1] == E;
        if (hp->proj == EKV_CLIP_PROJ_QWEN2VL) /* written by the current converter: ffn_up is fc1 */
            swapped = !(E != F && td && td->ne[0] == E && td->ne[1] == F);
        const char *first = swapped ? "ffn_up" : "ffn_down", *second = swapped ? "ffn_down" : "ffn_up";
        char wn[96], bn[96];
        snprintf(wn, sizeof wn, "v.blk.%d.%s.weight", il, first);
        snprintf(bn, sizeof bn, "v.blk.%d.%s.bias", il, first);
        if ((s = load_linear(c, wn, bn, E, F, &L->ff1, &L->ff1_b)) != EKV_OK) return s;
        snprintf(wn, sizeof wn, "v.blk.%d.%s.weight", il, second);
        snprintf(bn, sizeof bn, "v.blk.%d.%s.bias", il, second);
        if ((s = load_linear(c, wn, bn, F, E, &L->ff2, &L->ff2_b)) != EKV_OK) return s;
        snprintf(wn, sizeof wn, "v.blk.%d.ffn_gate.weight", il);
        snprintf(bn, sizeof bn, "v.blk.%d.ffn_gate.bias", il);
        if (hp->rms_norm != (ekv_gguf_find_tensor(c->f, wn) != NULL))
            return ekv_err(EKV_ERR_FORMAT, "%s: tensor %s %s", c->path, wn,
                           hp->rms_norm ? "is missing (Qwen2.5-VL's SwiGLU)" : "in a tower without a gated MLP");
        if (hp->rms_norm && (s = load_linear(c, wn, bn, E, F, &L->ffg, &L->ffg_b)) != EKV_OK) return s;
    }

    if (hp->proj == EKV_CLIP_PROJ_IDEFICS3) return load_idefics3(c);
    if (hp->proj == EKV_CLIP_PROJ_QWEN2VL) return load_qwen2vl(c);

    /* Projector: widths come from the tensors, checked against each other. */
    if (ekv_gguf_find_tensor(c->f, "mm.3.weight"))
        return ekv_err(EKV_ERR_UNSUPPORTED,
                       "%s: tensor mm.3.weight found: the mlp_norm projector is not supported", c->path);
    const struct ekv_gguf_tensor *m0 = ekv_gguf_find_tensor(c->f, "mm.0.weight");
    const struct ekv_gguf_tensor *m2 = ekv_gguf_find_tensor(c->f, "mm.2.weight");
    if (!m0) return ekv_err(EKV_ERR_NOT_FOUND, "%s: tensor mm.0.weight is missing", c->path);
    if (!m2) return ekv_err(EKV_ERR_NOT_FOUND, "%s: tensor mm.2.weight is missing", c->path);
    if (m0->ne[1] < 1 || m0->ne[1] > CLIP_MAX_OUT || m2->ne[1] < 1 || m2->ne[1] > CLIP_MAX_OUT)
        return ekv_err(EKV_ERR_FORMAT, "%s: projector widths %lld, %lld are out of range", c->path,
                       (long long)m0->ne[1], (long long)m2->ne[1]);
    hp->n_mm = (int)m0->ne[1];
    hp->n_embd_out = (int)m2->ne[1];
    if ((s = load_linear(c, "mm.0.weight", "mm.0.bias", E, hp->n_mm, &c->mm0, &c->mm0_b)) ||
        (s = load_linear(c, "mm.2.weight", "mm.2.bias", hp->n_mm, hp->n_embd_out, &c->mm2,
                         &c->mm2_b)))
        return s;
    return EKV_OK;
}

enum ekv_status ekv_clip_load(const char *path, struct ekv_clip **out) {
    if (!path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_clip_load: NULL argument");
    *out = NULL;
    struct ekv_clip *c = calloc(1, sizeof *c);
    if (!c) return ekv_err(EKV_ERR_NOMEM, "%s: clip context", path);
    c->path = path;
    enum ekv_status s = ekv_gguf_open(path, &c->f);
    if (s == EKV_OK) s = load_hparams(c);
    if (s == EKV_OK) s = load_tensors(c);
    c->path = "mmproj";
    if (s != EKV_OK) {
        ekv_clip_free(c);
        return s;
    }
    static atomic_uint_fast64_t next_id;
    c->id = (uint64_t)atomic_fetch_add(&next_id, 1) + 1;
    *out = c;
    return EKV_OK;
}

void ekv_clip_free(struct ekv_clip *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_owned; i++) free(c->owned[i]);
    free(c->owned);
    free(c->layers);
    ekv_gguf_close(c->f);
    free(c);
}

const struct ekv_clip_hparams *ekv_clip_hparams(const struct ekv_clip *c) { return &c->hp; }
uint64_t ekv_clip_id(const struct ekv_clip *c) { return c->id; }
int ekv_clip_n_patches(const struct ekv_clip *c) { return c->hp.n_patches; }
int ekv_clip_n_tile_tokens(const struct ekv_clip *c) { return c->hp.n_tile_tokens; }
int ekv_clip_n_embd_out(const struct ekv_clip *c) { return c->hp.n_embd_out; }

void ekv_clip_anyres_grid(const struct ekv_clip *c, int nx, int ny, int *w, int *h) {
    const struct ekv_clip_hparams *hp = &c->hp;
    *w = *h = 0;
    if (hp->n_pinpoints == 0 || nx <= 0 || ny <= 0 || (nx <= hp->image_size && ny <= hp->image_size)) return;
    int64_t best_eff = -1, best_waste = 0;
    for (int i = 0; i < hp->n_pinpoints; i++) {
        const int cw = hp->pinpoints[i][0], ch = hp->pinpoints[i][1];
        /* the image scaled to fit the candidate, aspect kept (float, truncated, as llama.cpp) */
        float sw = (float)cw / (float)nx, sh = (float)ch / (float)ny, sc = sw < sh ? sw : sh;
        int64_t tw = (int64_t)((float)nx * sc), th = (int64_t)((float)ny * sc);
        int64_t eff = tw * th, orig = (int64_t)nx * ny;
        if (eff > orig) eff = orig;
        int64_t waste = (int64_t)cw * ch - eff;
        if (eff > best_eff || (eff == best_eff && waste < best_waste)) {
            best_eff = eff;
            best_waste = waste;
            *w = cw;
            *h = ch;
        }
    }
}

int64_t ekv_clip_image_rows(const struct ekv_clip *c, int nx, int ny) {
    if (!c || nx <= 0 || ny <= 0) return 0;
    if (c->hp.proj == EKV_CLIP_PROJ_QWEN2VL) {
        int gw, gh;
        ekv_clip_qwen2vl_grid(c, nx, ny, &gw, &gh);
        return (int64_t)gw * gh;
    }
    if (c->hp.proj == EKV_CLIP_PROJ_IDEFICS3) {
        int gx, gy;
        ekv_clip_idefics3_grid(c, nx, ny, &gx, &gy);
        return gx ? ((int64_t)gx * gy + 1) * c->hp.n_tile_tokens : 0;
    }
    int w, h;
    ekv_clip_anyres_grid(c, nx, ny, &w, &h);
    const int64_t tiles = w ? (int64_t)(w / c->hp.image_size) * (h / c->hp.image_size) : 0;
    return (1 + tiles) * c->hp.n_patches;
}

/* ------------------------------------------------------------------ */
/* compute                                                              */
/* ------------------------------------------------------------------ */

float *ekv_clip_alloc_floats(size_t a, size_t b) {
    size_t n, bytes;
    if (!ekv_mul_ok(a, b, &n) || !ekv_mul_ok(n, sizeof(float), &bytes)) return NULL;
    return malloc(bytes ? bytes : 1);
}

static void add_bias_rows(float *y, const float *b, size_t rows, size_t n) {
    if (!b) return;
    for (size_t r = 0; r < rows; r++) ekv_add(y + r * n, b, (int64_t)n);
}

/* y = x W^T + b over `rows` rows. */
enum ekv_status ekv_clip_linear(struct ekv_pool *pool, const struct ekv_weight *w, const float *b,
                                const float *x, size_t rows, float *y) {
    enum ekv_status s = ekv_matmul(pool, w, x, (int64_t)rows, y);
    if (s == EKV_OK) add_bias_rows(y, b, rows, (size_t)w->ne1);
    return s;
}

static void quick_gelu(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
}

enum ekv_status ekv_clip_preprocess(const struct ekv_clip *c, const struct ekv_image *img,
                                    float *pixels) {
    return ekv_image_preprocess_llava(img, c->hp.image_size, c->hp.image_mean, c->hp.image_std,
                                      pixels);
}

/* The fixed-size stages have no meaning for a tower whose length depends on the image. */
static enum ekv_status not_fixed(const char *fn) {
    return ekv_err(EKV_ERR_INVALID_ARG, "%s: a qwen2vl_merger tower runs at each image's size: use "
                   "ekv_clip_encode_image", fn);
}

void ekv_clip_patch_rows(const struct ekv_clip *c, const float *pixels, float *cols, size_t kstride) {
    const size_t P = (size_t)c->hp.patch_size, S = (size_t)c->hp.image_size, grid = S / P, K = 3 * P * P;
    /* im2col: patch (py, px) row holds channel-major P x P blocks, the
     * layout of the convolution weight [E][3][P][P]. */
    for (size_t py = 0; py < grid; py++)
        for (size_t px = 0; px < grid; px++) {
            float *dst = cols + (py * grid + px) * kstride;
            for (size_t ch = 0; ch < 3; ch++)
                for (size_t ky = 0; ky < P; ky++)
                    memcpy(dst + (ch * P + ky) * P, pixels + ch * S * S + (py * P + ky) * S + px * P,
                           P * sizeof(float));
            if (kstride > K) memset(dst + K, 0, (kstride - K) * sizeof(float));
        }
}

enum ekv_status ekv_clip_embed(const struct ekv_clip *c, struct ekv_pool *pool, const float *pixels,
                               float *x) {
    const struct ekv_clip_hparams *hp = &c->hp;
    if (hp->proj == EKV_CLIP_PROJ_QWEN2VL) return not_fixed("ekv_clip_embed");
    const size_t E = (size_t)hp->n_embd, P = (size_t)hp->patch_size, np = (size_t)hp->n_patches, K = 3 * P * P;
    float *cols = ekv_clip_alloc_floats(np, K);
    if (!cols) return ekv_err(EKV_ERR_NOMEM, "clip: patch buffer");
    ekv_clip_patch_rows(c, pixels, cols, K);
    float *patches = x + (hp->has_class ? E : 0);
    enum ekv_status s = ekv_clip_linear(pool, &c->patch, c->patch_b, cols, np, patches);
    free(cols);
    if (s != EKV_OK) return s;
    if (hp->has_class) memcpy(x, c->cls, E * sizeof(float));
    for (size_t r = 0; r < (size_t)hp->n_pos; r++) ekv_add(x + r * E, c->pos + r * E, (int64_t)E);
    if (c->pre_w)
        for (size_t r = 0; r < (size_t)hp->n_pos; r++)
            ekv_layernorm(x + r * E, x + r * E, c->pre_w, c->pre_b, (int64_t)E, hp->eps);
    return EKV_OK;
}

/* Bidirectional multi-head attention over all positions, rows split
 * across the pool's threads. */
struct attn_task {
    const float *q, *k, *v; /* [n][E] */
    float *out;             /* [n][E] */
    float *scratch;         /* [nth][n] */
    const int32_t *win;     /* [n] window ids (a row sees its window only), or NULL */
    int n, E, n_head, dh;
    float scale;
};

static void attn_rows(void *ctx, int ith, int nth) {
    struct attn_task *a = ctx;
    const size_t E = (size_t)a->E, n = (size_t)a->n, dh = (size_t)a->dh;
    float *sc = a->scratch + (size_t)ith * n;
    size_t per = (n + (size_t)nth - 1) / (size_t)nth;
    size_t t0 = per * (size_t)ith, t1 = EKV_MIN(n, t0 + per);
    for (size_t t = t0; t < t1; t++)
        for (int h = 0; h < a->n_head; h++) {
            const float *qv = a->q + t * E + (size_t)h * dh;
            for (size_t s = 0; s < n; s++)
                sc[s] = a->win && a->win[s] != a->win[t] ? -INFINITY
                                                         : ekv_dot_f32(qv, a->k + s * E + (size_t)h * dh, (int64_t)dh) *
                                                               a->scale;
            ekv_softmax(sc, (int64_t)n);
            float *o = a->out + t * E + (size_t)h * dh;
            memset(o, 0, dh * sizeof(float));
            for (size_t s = 0; s < n; s++)
                if (sc[s] != 0.0f) ekv_axpy_f32(o, sc[s], a->v + s * E + (size_t)h * dh, (int64_t)dh);
        }
}

enum ekv_status ekv_clip_block(const struct ekv_clip *c, struct ekv_pool *pool, int il, float *x) {
    if (c->hp.proj == EKV_CLIP_PROJ_QWEN2VL) return not_fixed("ekv_clip_block");
    return ekv_clip_block_rows(c, pool, il, x, (size_t)c->hp.n_pos, NULL, NULL);
}

void ekv_clip_norm(const struct ekv_clip *c, float *out, const float *x, const float *w, const float *b) {
    const int64_t E = c->hp.n_embd;
    if (!c->hp.rms_norm) {
        ekv_layernorm(out, x, w, b, E, c->hp.eps);
        return;
    }
    ekv_rmsnorm(out, x, w, E, c->hp.eps);
    if (b) ekv_add(out, b, E);
}

static void silu(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

enum ekv_status ekv_clip_block_rows(const struct ekv_clip *c, struct ekv_pool *pool, int il, float *x, size_t n,
                                    const float *rope, const int32_t *win) {
    const struct ekv_clip_hparams *hp = &c->hp;
    if (il < 0 || il >= hp->n_layer)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_clip_block: layer %d outside [0, %d)", il,
                       hp->n_layer);
    const struct clip_layer *L = &c->layers[il];
    const size_t E = (size_t)hp->n_embd, F = (size_t)hp->n_ff, dh = E / (size_t)hp->n_head;
    const int nth = ekv_pool_size(pool);
    float *h = ekv_clip_alloc_floats(n, E), *q = ekv_clip_alloc_floats(n, E), *k = ekv_clip_alloc_floats(n, E);
    float *v = ekv_clip_alloc_floats(n, E), *att = ekv_clip_alloc_floats(n, E), *ff = ekv_clip_alloc_floats(n, F);
    float *scratch = ekv_clip_alloc_floats((size_t)nth, n);
    enum ekv_status s = EKV_OK;
    if (!h || !q || !k || !v || !att || !ff || !scratch) {
        s = ekv_err(EKV_ERR_NOMEM, "clip: block %d buffers", il);
        goto done;
    }
    for (size_t r = 0; r < n; r++) ekv_clip_norm(c, h + r * E, x + r * E, L->ln1_w, L->ln1_b);
    if ((s = ekv_clip_linear(pool, &L->q, L->q_b, h, n, q)) || (s = ekv_clip_linear(pool, &L->k, L->k_b, h, n, k)) ||
        (s = ekv_clip_linear(pool, &L->v, L->v_b, h, n, v)))
        goto done;
    for (size_t r = 0; rope && r < n; r++) {
        ekv_rope_apply(q + r * E, hp->n_head, (int)dh, (int)dh, rope + r * dh, true);
        ekv_rope_apply(k + r * E, hp->n_head, (int)dh, (int)dh, rope + r * dh, true);
    }
    struct attn_task at = {q, k, v, att, scratch, win, (int)n, (int)E, hp->n_head, (int)dh, 1.0f / sqrtf((float)dh)};
    if (nth > 1)
        ekv_pool_run(pool, attn_rows, &at);
    else
        attn_rows(&at, 0, 1);
    if ((s = ekv_clip_linear(pool, &L->o, L->o_b, att, n, h))) goto done;
    ekv_add(x, h, (int64_t)(n * E));
    for (size_t r = 0; r < n; r++) ekv_clip_norm(c, h + r * E, x + r * E, L->ln2_w, L->ln2_b);
    if (L->ffg.data) { /* SwiGLU: act(gate) * up, the activation on the gate (up into att, free now) */
        if ((s = ekv_clip_linear(pool, &L->ffg, L->ffg_b, h, n, ff))) goto done;
    } else if ((s = ekv_clip_linear(pool, &L->ff1, L->ff1_b, h, n, ff))) {
        goto done;
    }
    if (hp->use_gelu)
        ekv_gelu(ff, (int64_t)(n * F));
    else if (hp->use_silu)
        silu(ff, n * F);
    else
        quick_gelu(ff, n * F);
    if (L->ffg.data) {
        float *up = ekv_clip_alloc_floats(n, F);
        if (!up) {
            s = ekv_err(EKV_ERR_NOMEM, "clip: block %d buffers", il);
            goto done;
        }
        s = ekv_clip_linear(pool, &L->ff1, L->ff1_b, h, n, up);
        for (size_t i = 0; s == EKV_OK && i < n * F; i++) ff[i] *= up[i];
        free(up);
        if (s != EKV_OK) goto done;
    }
    if ((s = ekv_clip_linear(pool, &L->ff2, L->ff2_b, ff, n, h))) goto done;
    ekv_add(x, h, (int64_t)(n * E));
done:
    free(h);
    free(q);
    free(k);
    free(v);
    free(att);
    free(ff);
    free(scratch);
    return s;
}

enum ekv_status ekv_clip_project(const struct ekv_clip *c, struct ekv_pool *pool, const float *feat,
                                 float *out) {
    const size_t np = (size_t)c->hp.n_patches;
    if (c->hp.proj == EKV_CLIP_PROJ_QWEN2VL) return not_fixed("ekv_clip_project");
    if (c->hp.proj == EKV_CLIP_PROJ_IDEFICS3) {
        float *sh = ekv_clip_alloc_floats(np, (size_t)c->hp.n_embd);
        if (!sh) return ekv_err(EKV_ERR_NOMEM, "clip: pixel shuffle buffer");
        ekv_clip_pixel_shuffle(feat, c->hp.image_size / c->hp.patch_size, c->hp.n_embd, c->hp.scale_factor, sh);
        enum ekv_status s = ekv_clip_linear(pool, &c->fc, NULL, sh, (size_t)c->hp.n_tile_tokens, out);
        free(sh);
        return s;
    }
    float *mid = ekv_clip_alloc_floats(np, (size_t)c->hp.n_mm);
    if (!mid) return ekv_err(EKV_ERR_NOMEM, "clip: projector buffer");
    enum ekv_status s = ekv_clip_linear(pool, &c->mm0, c->mm0_b, feat, np, mid);
    if (s == EKV_OK) {
        ekv_gelu(mid, (int64_t)(np * (size_t)c->hp.n_mm));
        s = ekv_clip_linear(pool, &c->mm2, c->mm2_b, mid, np, out);
    }
    free(mid);
    return s;
}

enum ekv_status ekv_clip_encode_pixels(const struct ekv_clip *c, struct ekv_pool *pool,
                                       const float *pixels, float *out) {
    if (!c || !pixels || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_clip_encode: NULL argument");
    const struct ekv_clip_hparams *hp = &c->hp;
    if (hp->proj == EKV_CLIP_PROJ_QWEN2VL) return not_fixed("ekv_clip_encode_pixels");
    float *x = ekv_clip_alloc_floats((size_t)hp->n_pos, (size_t)hp->n_embd);
    if (!x) return ekv_err(EKV_ERR_NOMEM, "clip: hidden states");
    enum ekv_status s = ekv_clip_embed(c, pool, pixels, x);
    for (int il = 0; s == EKV_OK && il < hp->n_layer_run; il++) s = ekv_clip_block(c, pool, il, x);
    if (s == EKV_OK && c->post_w)
        for (size_t r = 0; r < (size_t)hp->n_pos; r++)
            ekv_layernorm(x + r * (size_t)hp->n_embd, x + r * (size_t)hp->n_embd, c->post_w, c->post_b,
                          (int64_t)hp->n_embd, hp->eps);
    if (s == EKV_OK) s = ekv_clip_project(c, pool, x + (hp->has_class ? hp->n_embd : 0), out);
    free(x);
    return s;
}

enum ekv_status ekv_clip_encode_tile(const struct ekv_clip *c, struct ekv_pool *pool, const struct ekv_clip_exec *ex,
                                     const float *pixels, float *out) {
    if (ex && ex->pixels) return ex->pixels(ex->user, c, pixels, c->hp.image_size, c->hp.image_size, out);
    return ekv_clip_encode_pixels(c, pool, pixels, out);
}

/* LLaVA-1.6 tiling: the overview (the image resized to S x S, aspect not
 * kept), then the image resized into the chosen resolution (aspect kept,
 * centred on black, sizes rounded up) cut into S x S tiles, row by row;
 * each encoded on its own, n_patches rows each. */
static enum ekv_status encode_anyres(const struct ekv_clip *c, struct ekv_pool *pool, const struct ekv_clip_exec *ex,
                                     const struct ekv_image *img, int W, int H, float *pixels, float *out) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const int S = hp->image_size;
    const size_t rows = (size_t)hp->n_patches * (size_t)hp->n_embd_out;
    struct ekv_image ov = {0}, fit = {0}, canvas = {0}, tile = {0};
    static const uint8_t black[3] = {0, 0, 0};
    enum ekv_status s = ekv_image_resize_bicubic(img, S, S, &ov);
    if (s == EKV_OK) {
        ekv_image_normalize(&ov, hp->image_mean, hp->image_std, pixels);
        s = ekv_clip_encode_tile(c, pool, ex, pixels, out);
    }
    const float sw = (float)W / (float)img->nx, sh = (float)H / (float)img->ny, sc = sw < sh ? sw : sh;
    int fw = (int)ceilf((float)img->nx * sc), fh = (int)ceilf((float)img->ny * sc);
    fw = fw > W ? W : fw < 1 ? 1 : fw;
    fh = fh > H ? H : fh < 1 ? 1 : fh;
    if (s == EKV_OK) s = ekv_image_resize_bicubic(img, fw, fh, &fit);
    if (s == EKV_OK) s = ekv_image_new(W, H, black, &canvas);
    if (s == EKV_OK) {
        const int ox = (W - fw) / 2, oy = (H - fh) / 2;
        for (int y = 0; y < fh; y++)
            memcpy(canvas.rgb + ((size_t)(y + oy) * W + ox) * 3, fit.rgb + (size_t)y * fw * 3, (size_t)fw * 3);
    }
    if (s == EKV_OK) s = ekv_image_new(S, S, black, &tile);
    size_t k = 1;
    for (int ty = 0; s == EKV_OK && ty < H / S; ty++)
        for (int tx = 0; s == EKV_OK && tx < W / S; tx++, k++) {
            for (int y = 0; y < S; y++)
                memcpy(tile.rgb + (size_t)y * S * 3, canvas.rgb + ((size_t)(ty * S + y) * W + (size_t)tx * S) * 3,
                       (size_t)S * 3);
            ekv_image_normalize(&tile, hp->image_mean, hp->image_std, pixels);
            s = ekv_clip_encode_tile(c, pool, ex, pixels, out + k * rows);
        }
    ekv_image_free(&ov);
    ekv_image_free(&fit);
    ekv_image_free(&canvas);
    ekv_image_free(&tile);
    return s;
}

enum ekv_status ekv_clip_encode_image(const struct ekv_clip *c, struct ekv_pool *pool,
                                      const struct ekv_image *img, float *out) {
    return ekv_clip_encode_image_with(c, pool, img, NULL, out);
}

enum ekv_status ekv_clip_encode_image_with(const struct ekv_clip *c, struct ekv_pool *pool,
                                           const struct ekv_image *img, const struct ekv_clip_exec *ex, float *out) {
    if (!c || !img || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_clip_encode_image: NULL argument");
    if (c->hp.proj == EKV_CLIP_PROJ_QWEN2VL) return ekv_clip_encode_qwen2vl(c, pool, img, ex, out);
    size_t S = (size_t)c->hp.image_size;
    float *pixels = ekv_clip_alloc_floats(3 * S, S);
    if (!pixels) return ekv_err(EKV_ERR_NOMEM, "clip: pixel buffer");
    int W, H;
    ekv_clip_anyres_grid(c, img->nx, img->ny, &W, &H);
    enum ekv_status s;
    if (c->hp.proj == EKV_CLIP_PROJ_IDEFICS3) {
        s = ekv_clip_encode_idefics3(c, pool, img, ex, pixels, out);
    } else if (W) {
        s = encode_anyres(c, pool, ex, img, W, H, pixels, out);
    } else if (c->hp.n_pinpoints) { /* small image: the overview alone, resized as the tiles' overview */
        struct ekv_image ov = {0};
        s = ekv_image_resize_bicubic(img, (int)S, (int)S, &ov);
        if (s == EKV_OK) {
            ekv_image_normalize(&ov, c->hp.image_mean, c->hp.image_std, pixels);
            s = ekv_clip_encode_tile(c, pool, ex, pixels, out);
        }
        ekv_image_free(&ov);
    } else {
        s = ekv_clip_preprocess(c, img, pixels);
        if (s == EKV_OK) s = ekv_clip_encode_tile(c, pool, ex, pixels, out);
    }
    free(pixels);
    return s;
}

enum ekv_status ekv_clip_encode_file(const struct ekv_clip *c, struct ekv_pool *pool,
                                     const char *path, float *out) {
    struct ekv_image img = {0};
    enum ekv_status s = ekv_image_load_file(path, &img);
    if (s == EKV_OK) s = ekv_clip_encode_image(c, pool, &img, out);
    ekv_image_free(&img);
    return s;
}
