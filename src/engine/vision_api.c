/*
 * vision_api.c — the public vision API (ekv_vision_*): a thin owner of the
 * CLIP/SigLIP tower in src/vision/clip.c that decodes images from files or
 * from bytes in memory and encodes them with a context's worker threads,
 * so front ends never touch internal headers. The prompt object
 * (prompt.c) calls ekv_vision_encode_input for each of its image slots.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "engine/backend_vk.h"
#include "engine/engine.h"
#include "vision/clip.h"

struct ekv_vision {
    struct ekv_clip *clip;
    /* a device of its own (ekv_vision_set_device), or NULL; encodings on
     * it take turns under mu */
    struct ekv_vk_tower *tower;
    pthread_mutex_t mu;
};

enum ekv_status ekv_vision_load(const char *path, struct ekv_vision **out) {
    ekv_err_clear();
    if (!path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vision_load: path and out are required");
    *out = NULL;
    struct ekv_vision *v = calloc(1, sizeof *v);
    if (!v) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    enum ekv_status s = ekv_clip_load(path, &v->clip);
    if (s == EKV_OK && pthread_mutex_init(&v->mu, NULL) != 0) {
        ekv_clip_free(v->clip);
        s = ekv_err(EKV_ERR_NOMEM, "%s: cannot create a lock", path);
    }
    if (s != EKV_OK) {
        free(v);
        return s;
    }
    *out = v;
    return EKV_OK;
}

void ekv_vision_free(struct ekv_vision *v) {
    if (!v) return;
    ekv_vk_tower_free(v->tower);
    pthread_mutex_destroy(&v->mu);
    ekv_clip_free(v->clip);
    free(v);
}

enum ekv_status ekv_vision_set_device(struct ekv_vision *v, const char *device) {
    ekv_err_clear();
    if (!v) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vision_set_device: no vision tower");
    const char *spec = device && *device ? device : "cpu";
    if (strcmp(spec, "cpu") && strcmp(spec, "auto") && strncmp(spec, "vulkan", 6))
        return ekv_err(EKV_ERR_INVALID_ARG, "vision device '%s': auto, cpu, vulkan or vulkan:N", spec);
    struct ekv_vk_tower *t = NULL;
    const char *why = strcmp(spec, "cpu") ? ekv_vk_tower_unsupported(v->clip) : NULL;
    if (why && strcmp(spec, "auto") != 0) return ekv_err(EKV_ERR_UNSUPPORTED, "vision device %s: %s", spec, why);
    if (strcmp(spec, "cpu") && !why) { /* (auto with a tower the GPU cannot run: the CPU) */
        enum ekv_status s = ekv_vk_tower_open(spec, &t);
        if (s != EKV_OK) return ekv_err_prefix(s, "vision device %s", spec);
    }
    pthread_mutex_lock(&v->mu);
    struct ekv_vk_tower *old = v->tower;
    v->tower = t;
    pthread_mutex_unlock(&v->mu);
    ekv_vk_tower_free(old);
    return EKV_OK;
}

const char *ekv_vision_device(const struct ekv_vision *v) {
    return v && v->tower ? ekv_vk_name(v->tower->vk) : "cpu";
}

/* The device that encodes for ctx: the tower's own, else the context's
 * GPU when the tower runs there, else none (the CPU). Read under v->mu for
 * the tower's own. */
static struct ekv_vk_tower *tower_for(const struct ekv_vision *v, struct ekv_context *ctx) {
    if (v->tower) return v->tower;
    return ctx && ctx->gpu && !ekv_vk_tower_unsupported(v->clip) ? &ctx->gpu->tower : NULL;
}

const char *ekv_vision_encodes_on(const struct ekv_vision *v, const struct ekv_context *ctx) {
    const struct ekv_vk_tower *t = v ? tower_for(v, (struct ekv_context *)ctx) : NULL;
    return t ? ekv_vk_name(t->vk) : "cpu";
}

int32_t ekv_vision_n_tokens(const struct ekv_vision *v) { return v ? ekv_clip_n_tile_tokens(v->clip) : 0; }
int32_t ekv_vision_n_embd(const struct ekv_vision *v) { return v ? ekv_clip_n_embd_out(v->clip) : 0; }

static enum ekv_status check_width(const struct ekv_vision *v, const struct ekv_context *ctx) {
    if (ctx && ekv_clip_n_embd_out(v->clip) != ctx->model->info.n_embd)
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "the mmproj projects images to width %d but the language model's width is %d",
                       ekv_clip_n_embd_out(v->clip), ctx->model->info.n_embd);
    return EKV_OK;
}

/* The tower on its own device (ekv_vision_set_device; one caller at a
 * time), else on the context's GPU when the tower runs there
 * (backend_vk_clip.c), else on the context's worker threads. */
static enum ekv_status encode(const struct ekv_vision *cv, struct ekv_context *ctx, const struct ekv_image *img,
                              float *out) {
    struct ekv_vision *v = (struct ekv_vision *)cv; /* the lock only */
    pthread_mutex_lock(&v->mu);
    struct ekv_vk_tower *t = tower_for(v, ctx);
    const bool own = t && t == v->tower; /* held while it encodes; a context's device is its owner's to serialise */
    if (!own) pthread_mutex_unlock(&v->mu);
    const struct ekv_clip_exec ex = {.pixels = ekv_vk_tower_pixels, .user = t};
    const enum ekv_status s = ekv_clip_encode_image_with(v->clip, ctx ? ctx->pool : NULL, img, t ? &ex : NULL, out);
    if (own) pthread_mutex_unlock(&v->mu);
    return s;
}

enum ekv_status ekv_vision_encode_file(const struct ekv_vision *v, struct ekv_context *ctx, const char *path,
                                       float *out) {
    ekv_err_clear();
    if (!v || !path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vision_encode_file: vision, path and out are required");
    enum ekv_status s = check_width(v, ctx);
    if (s != EKV_OK) return s;
    struct ekv_image img = {0};
    s = ekv_image_load_file(path, &img);
    if (s == EKV_OK && ekv_clip_image_rows(v->clip, img.nx, img.ny) != ekv_clip_n_tile_tokens(v->clip))
        s = ekv_err(EKV_ERR_UNSUPPORTED, "%s: this tower's rows depend on the image (anyres or idefics3 tiles, Qwen2-VL's "
                    "own resolution): they do not fit a buffer of ekv_vision_n_tokens rows; use ekv_prompt_set_images",
                    path);
    if (s == EKV_OK) s = encode(v, ctx, &img, out);
    ekv_image_free(&img);
    return s;
}

/* "path" or "image i (N bytes in memory)" for messages. */
static const char *image_name(const struct ekv_image_input *img, int32_t index, char *buf, size_t n) {
    if (img->path) return img->path;
    snprintf(buf, n, "image %d (%zu bytes in memory)", (int)index, img->size);
    return buf;
}

enum ekv_status ekv_vision_image_tokens(const struct ekv_vision *v, const struct ekv_image_input *img,
                                        int32_t *n_tokens) {
    ekv_err_clear();
    if (!v || !img || !n_tokens)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vision_image_tokens: vision, image and n_tokens are required");
    *n_tokens = 0;
    char nb[64];
    int nx = 0, ny = 0;
    enum ekv_status s = img->path ? ekv_image_probe_file(img->path, &nx, &ny)
                                  : ekv_image_probe_memory(img->data, img->size, image_name(img, 0, nb, sizeof nb),
                                                           &nx, &ny);
    if (s != EKV_OK) return s;
    int64_t rows = ekv_clip_image_rows(v->clip, nx, ny);
    int gx, gy, gw, gh;
    ekv_clip_idefics3_grid(v->clip, nx, ny, &gx, &gy);
    rows += ekv_idefics3_n_sep(gx, gy);
    ekv_clip_qwen2vl_grid(v->clip, nx, ny, &gw, &gh);
    if (gw > 0) rows += 2; /* <|vision_start|>, <|vision_end|> */
    if (rows <= 0 || rows > INT32_MAX)
        return ekv_err(EKV_ERR_INVALID_ARG, "image of %dx%d gives %lld embeddings", nx, ny, (long long)rows);
    *n_tokens = (int32_t)rows;
    return EKV_OK;
}

enum ekv_status ekv_vision_encode_input(const struct ekv_vision *v, struct ekv_context *ctx,
                                        const struct ekv_image_input *in, int32_t index, float **out,
                                        int32_t *n_rows, int *gx, int *gy, int32_t *tile_rows, int *grid_w,
                                        int *grid_h) {
    *out = NULL;
    *n_rows = 0;
    *gx = *gy = *grid_w = *grid_h = 0;
    *tile_rows = ekv_clip_n_tile_tokens(v->clip);
    char nb[64];
    const char *name = image_name(in, index, nb, sizeof nb);
    if (!in->path && (!in->data || in->size == 0))
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: neither a path nor image bytes given", name);
    enum ekv_status s = check_width(v, ctx);
    if (s != EKV_OK) return s;
    struct ekv_image img = {0};
    s = in->path ? ekv_image_load_file(in->path, &img) : ekv_image_load_memory(in->data, in->size, name, &img);
    if (s != EKV_OK) return s;
    const int64_t rows = ekv_clip_image_rows(v->clip, img.nx, img.ny);
    ekv_clip_idefics3_grid(v->clip, img.nx, img.ny, gx, gy);
    ekv_clip_qwen2vl_grid(v->clip, img.nx, img.ny, grid_w, grid_h);
    size_t cells = 0;
    float *e = NULL;
    if (rows <= 0 || rows > INT32_MAX ||
        !ekv_mul_ok((size_t)rows, (size_t)ekv_clip_n_embd_out(v->clip), &cells) ||
        !ekv_mul_ok(cells, sizeof(float), &cells))
        s = ekv_err(EKV_ERR_OVERFLOW, "%s: %lld embeddings of width %d", name, (long long)rows,
                    ekv_clip_n_embd_out(v->clip));
    else if (!(e = malloc(cells)))
        s = ekv_err(EKV_ERR_NOMEM, "%s: out of memory for %lld image embeddings", name, (long long)rows);
    if (s == EKV_OK) s = encode(v, ctx, &img, e);
    ekv_image_free(&img);
    if (s != EKV_OK) {
        free(e);
        return in->path ? s : ekv_err_prefix(s, "%s", name);
    }
    *out = e;
    *n_rows = (int32_t)rows;
    return EKV_OK;
}
