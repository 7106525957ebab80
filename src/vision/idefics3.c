/*
 * idefics3.c — the image side of Idefics3 and SmolVLM (projector type
 * "idefics3" in an mmproj): how an image is cut into tiles of the SigLIP
 * tower's size, and the pixel shuffle that folds each s x s block of patch
 * features into one token before the connector's linear map. Kept apart
 * from clip.c (loading and the transformer) because it is preprocessing
 * and layout, the part that differs between VLM families.
 *
 * Tiling follows llama.cpp's mtmd (mtmd_image_preprocessor_idefics3), which
 * follows the Hugging Face Idefics3 processor: resize with Lanczos keeping
 * the aspect ratio so that the longer side is clip.vision.preproc_image_size
 * (the shorter rounded down, then up to even), resize again without keeping
 * it up to whole tiles, cut the tiles row by row, and make the overview by
 * resizing that refined image to one tile.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "vision/clip.h"

/* The first resize's size (*rw x *rh: the longer side longest_edge, the
 * shorter scaled, truncated, at least 1 (an extreme strip), then rounded up
 * to even) and the tiles it is cut into (*gx x *gy). */
static void layout(const struct ekv_clip_hparams *hp, int nx, int ny, int *rw, int *rh, int *gx, int *gy) {
    const int L = hp->longest_edge, S = hp->image_size;
    const double aspect = (double)nx / (double)ny;
    if (nx >= ny) {
        *rw = L;
        *rh = EKV_MAX((int)(L / aspect), 1);
        *rh += *rh % 2;
    } else {
        *rh = L;
        *rw = EKV_MAX((int)(L * aspect), 1);
        *rw += *rw % 2;
    }
    *gx = (*rw + S - 1) / S;
    *gy = (*rh + S - 1) / S;
}

void ekv_clip_idefics3_grid(const struct ekv_clip *c, int nx, int ny, int *gx, int *gy) {
    *gx = *gy = 0;
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
    if (hp->proj != EKV_CLIP_PROJ_IDEFICS3 || nx <= 0 || ny <= 0) return;
    int rw, rh;
    layout(hp, nx, ny, &rw, &rh, gx, gy);
}

void ekv_clip_pixel_shuffle(const float *in, int g, int e, int s, float *out) {
    const int G = g / s;
    for (int Y = 0; Y < G; Y++)
        for (int X = 0; X < G; X++) {
            float *dst = out + ((size_t)Y * (size_t)G + (size_t)X) * (size_t)e * (size_t)s * (size_t)s;
            for (int dy = 0; dy < s; dy++)
                for (int dx = 0; dx < s; dx++, dst += e)
                    memcpy(dst, in + ((size_t)(Y * s + dy) * (size_t)g + (size_t)(X * s + dx)) * (size_t)e,
                           (size_t)e * sizeof(float));
        }
}

enum ekv_status ekv_clip_encode_idefics3(const struct ekv_clip *c, struct ekv_pool *pool, const struct ekv_image *img,
                                         const struct ekv_clip_exec *ex, float *pixels, float *out) {
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
    const int S = hp->image_size;
    if (hp->proj != EKV_CLIP_PROJ_IDEFICS3 || img->nx <= 0 || img->ny <= 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "idefics3: an image of %dx%d cannot be tiled", img->nx, img->ny);
    int gx, gy, rw, rh;
    layout(hp, img->nx, img->ny, &rw, &rh, &gx, &gy);
    const size_t rows = (size_t)hp->n_tile_tokens * (size_t)hp->n_embd_out;
    struct ekv_image resized = {0}, refined = {0}, part = {0};
    enum ekv_status s = ekv_image_resize(img, rw, rh, EKV_RESAMPLE_LANCZOS, &resized);
    if (s == EKV_OK) s = ekv_image_resize(&resized, gx * S, gy * S, EKV_RESAMPLE_LANCZOS, &refined);
    ekv_image_free(&resized);
    for (int ty = 0; s == EKV_OK && ty < gy; ty++)
        for (int tx = 0; s == EKV_OK && tx < gx; tx++) {
            s = ekv_image_crop(&refined, tx * S, ty * S, S, S, &part);
            if (s == EKV_OK) {
                ekv_image_normalize(&part, hp->image_mean, hp->image_std, pixels);
                s = ekv_clip_encode_tile(c, pool, ex, pixels, out + ((size_t)ty * (size_t)gx + (size_t)tx) * rows);
            }
            ekv_image_free(&part);
        }
    /* the overview last: the refined image squeezed into one tile */
    if (s == EKV_OK) s = ekv_image_resize(&refined, S, S, EKV_RESAMPLE_LANCZOS, &part);
    if (s == EKV_OK) {
        ekv_image_normalize(&part, hp->image_mean, hp->image_std, pixels);
        s = ekv_clip_encode_tile(c, pool, ex, pixels, out + (size_t)gx * (size_t)gy * rows);
    }
    ekv_image_free(&part);
    ekv_image_free(&refined);
    return s;
}
