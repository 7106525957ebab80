/*
 * vision_api.c — the public vision API (ekv_vision_*): a thin owner of the
 * CLIP/SigLIP tower in src/vision/clip.c that encodes image files with a
 * context's worker threads, so front ends never touch internal headers.
 */
#include <stdlib.h>

#include "core/util.h"
#include "engine/engine.h"
#include "vision/clip.h"

struct ekv_vision {
    struct ekv_clip *clip;
};

enum ekv_status ekv_vision_load(const char *path, struct ekv_vision **out) {
    ekv_err_clear();
    if (!path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vision_load: path and out are required");
    *out = NULL;
    struct ekv_vision *v = calloc(1, sizeof *v);
    if (!v) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    enum ekv_status s = ekv_clip_load(path, &v->clip);
    if (s != EKV_OK) {
        free(v);
        return s;
    }
    *out = v;
    return EKV_OK;
}

void ekv_vision_free(struct ekv_vision *v) {
    if (!v) return;
    ekv_clip_free(v->clip);
    free(v);
}

int32_t ekv_vision_n_tokens(const struct ekv_vision *v) { return v ? ekv_clip_n_patches(v->clip) : 0; }
int32_t ekv_vision_n_embd(const struct ekv_vision *v) { return v ? ekv_clip_n_embd_out(v->clip) : 0; }

enum ekv_status ekv_vision_encode_file(const struct ekv_vision *v, struct ekv_context *ctx, const char *path,
                                       float *out) {
    ekv_err_clear();
    if (!v || !path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vision_encode_file: vision, path and out are required");
    if (ctx && ekv_clip_n_embd_out(v->clip) != ctx->model->info.n_embd)
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "the mmproj projects images to width %d but the language model's width is %d",
                       ekv_clip_n_embd_out(v->clip), ctx->model->info.n_embd);
    return ekv_clip_encode_file(v->clip, ctx ? ctx->pool : NULL, path, out);
}
