/*
 * qwen2vl.c — the image side of Qwen2-VL (projector type "qwen2vl_merger"
 * in an mmproj): the tower runs at the image's own resolution instead of a
 * fixed square, so it needs its own preprocessing, patch layout and
 * positions; the weights and the transformer block are clip.c's. Kept apart
 * from clip.c for the same reason as idefics3.c: it is the part that
 * differs between VLM families.
 *
 * As llama.cpp's mtmd (and the Hugging Face Qwen2-VL processor) do it:
 *  - "smart resize": the image is scaled, aspect kept, to multiples of
 *    align = patch_size * merge holding 8 to 4096 merged tokens, resized
 *    (Pillow bicubic) into that size centred on black, then normalised;
 *  - the patch Conv3D over two identical frames = the sum of two 2D
 *    convolutions (v.patch_embd.weight and .weight.1), no bias;
 *  - the patches reordered so that each 2 x 2 block is contiguous (block
 *    rows, block columns, then dy, dx), the order everything after uses;
 *  - every block with full attention over the image and a 2D RoPE: in each
 *    head of size d, pairs k < d/4 turn by the patch row, pairs d/4 <= k <
 *    d/2 by the patch column, each at 10000^(-4j/d) for its index j inside
 *    its half (ggml's GGML_ROPE_TYPE_VISION), element k with k + d/2;
 *  - v.post_ln per patch, each 2 x 2 block concatenated (4E), then
 *    mm.0, GELU (tanh form), mm.2: one token per block, in raster order of
 *    the merged grid.
 * Qwen2.5-VL ("qwen2.5vl_merger") is the same with RMSNorm, a SwiGLU MLP
 * (clip.c's block) and window attention: blocks il with (il + 1) %
 * n_wa_pattern != 0 let a patch attend only to the patches whose merged
 * token lies in the same window of win_tokens x win_tokens (112 px,
 * windows cut from the top left, the last ones smaller). llama.cpp
 * reorders the patches window by window for the whole tower and back at
 * the end; attention does not depend on the order of its rows, so here the
 * order stays and a window id per patch masks the windowed blocks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "vision/clip_impl.h"

/* ---- dynamic resolution ---- */

/* mtmd's calc_size_preserved_ratio, in the same float arithmetic so that
 * sizes on a rounding edge come out the same. */
static int round_by(float x, int f) { return (int)roundf(x / (float)f) * f; }
static int ceil_by(float x, int f) { return (int)ceilf(x / (float)f) * f; }
static int floor_by(float x, int f) { return (int)floorf(x / (float)f) * f; }

void ekv_clip_qwen2vl_size(const struct ekv_clip *c, int nx, int ny, int *tw, int *th) {
    *tw = *th = 0;
    if (!c || c->hp.proj != EKV_CLIP_PROJ_QWEN2VL || nx <= 0 || ny <= 0 || nx > EKV_IMAGE_MAX_SIDE ||
        ny > EKV_IMAGE_MAX_SIDE)
        return;
    const int a = c->hp.patch_size * c->hp.merge;
    const int64_t min_px = (int64_t)8 * a * a, max_px = (int64_t)4096 * a * a;
    int w = EKV_MAX(a, round_by((float)nx, a)), h = EKV_MAX(a, round_by((float)ny, a));
    if ((int64_t)w * h > max_px) {
        const float beta = sqrtf((float)ny * (float)nx / (float)max_px);
        h = EKV_MAX(a, floor_by((float)ny / beta, a));
        w = EKV_MAX(a, floor_by((float)nx / beta, a));
    } else if ((int64_t)w * h < min_px) {
        const float beta = sqrtf((float)min_px / ((float)ny * (float)nx));
        h = ceil_by((float)ny * beta, a);
        w = ceil_by((float)nx * beta, a);
    }
    if (w < a || h < a || (int64_t)(w / a) * (h / a) > EKV_CLIP_QWEN2VL_MAX_TOKENS) return;
    *tw = w;
    *th = h;
}

void ekv_clip_qwen2vl_grid(const struct ekv_clip *c, int nx, int ny, int *gw, int *gh) {
    int tw, th;
    ekv_clip_qwen2vl_size(c, nx, ny, &tw, &th);
    *gw = tw ? tw / (c->hp.patch_size * c->hp.merge) : 0;
    *gh = th ? th / (c->hp.patch_size * c->hp.merge) : 0;
}

/* The image into tw x th: a copy when the size already fits, else resized
 * with the aspect kept (sides rounded up, at most the target) and pasted
 * in the middle of black (offsets rounded down); then normalised into
 * pixels [3][th][tw]. */
static enum ekv_status preprocess(const struct ekv_clip *c, const struct ekv_image *img, int tw, int th,
                                  float *pixels) {
    const struct ekv_clip_hparams *hp = &c->hp;
    if (img->nx == tw && img->ny == th) {
        ekv_image_normalize(img, hp->image_mean, hp->image_std, pixels);
        return EKV_OK;
    }
    static const uint8_t black[3] = {0, 0, 0};
    const float sw = (float)tw / (float)img->nx, sh = (float)th / (float)img->ny, sc = sw < sh ? sw : sh;
    const int fw = EKV_MAX(1, EKV_MIN((int)ceilf((float)img->nx * sc), tw));
    const int fh = EKV_MAX(1, EKV_MIN((int)ceilf((float)img->ny * sc), th));
    struct ekv_image fit = {0}, canvas = {0};
    enum ekv_status s = ekv_image_resize(img, fw, fh, EKV_RESAMPLE_BICUBIC, &fit);
    if (s == EKV_OK) s = ekv_image_new(tw, th, black, &canvas);
    if (s == EKV_OK) {
        const int ox = (tw - fw) / 2, oy = (th - fh) / 2;
        for (int y = 0; y < fh; y++)
            memcpy(canvas.rgb + ((size_t)(y + oy) * (size_t)tw + (size_t)ox) * 3, fit.rgb + (size_t)y * (size_t)fw * 3,
                   (size_t)fw * 3);
        ekv_image_normalize(&canvas, hp->image_mean, hp->image_std, pixels);
    }
    ekv_image_free(&fit);
    ekv_image_free(&canvas);
    return s;
}

/* ---- the tower ---- */

/* Patch row and column of token t in the merged order (2 x 2 blocks of a
 * px-wide patch grid, each block's patches row by row). */
static void token_patch(size_t t, size_t px, size_t *y, size_t *x) {
    const size_t blk = t / 4, in = t % 4, bw = px / 2;
    *y = (blk / bw) * 2 + in / 2;
    *x = (blk % bw) * 2 + in % 2;
}

/* cs [n][d/2][2]: {cos, sin} of the 2D RoPE, computed as ggml's vision
 * M-RoPE cache does (theta multiplied by 10000^(-4/d) per pair, restarting
 * at the patch position where the column half begins). */
static void rope_table(size_t n, size_t px, int d, float *cs) {
    const float scale = powf(10000.0f, -2.0f / (float)(d / 2));
    for (size_t t = 0; t < n; t++) {
        size_t y, x;
        token_patch(t, px, &y, &x);
        float *row = cs + t * (size_t)d;
        float theta = (float)y;
        for (int k = 0; k < d / 2; k++) {
            if (k == d / 4) theta = (float)x;
            row[2 * k] = cosf(theta);
            row[2 * k + 1] = sinf(theta);
            theta *= scale;
        }
    }
}

/* win [n]: the window of each patch (merged order) for a merged grid bw
 * tokens wide cut into windows of w x w tokens from the top left. */
static void window_ids(size_t n, size_t bw, size_t w, int32_t *win) {
    const size_t cols = (bw + w - 1) / w;
    for (size_t t = 0; t < n; t++) {
        const size_t blk = t / 4, by = blk / bw, bx = blk % bw;
        win[t] = (int32_t)((by / w) * cols + bx / w);
    }
}

void ekv_clip_qwen2vl_inputs(const struct ekv_clip *c, const float *pixels, int Wi, int Hi, float *cols, size_t kstride,
                             float *cs, int32_t *win) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const size_t W = (size_t)Wi, H = (size_t)Hi, P = (size_t)hp->patch_size, px = W / P, n = px * (H / P), K = 3 * P * P;
    /* im2col in the conv weight's (channel, ky, kx) order */
    for (size_t t = 0; cols && t < n; t++) {
        size_t py, pxx;
        token_patch(t, px, &py, &pxx);
        float *dst = cols + t * kstride;
        for (size_t ch = 0; ch < 3; ch++)
            for (size_t ky = 0; ky < P; ky++)
                memcpy(dst + (ch * P + ky) * P, pixels + ch * W * H + (py * P + ky) * W + pxx * P, P * sizeof(float));
        if (kstride > K) memset(dst + K, 0, (kstride - K) * sizeof(float));
    }
    if (cs) rope_table(n, px, hp->n_embd / hp->n_head, cs);
    if (win) window_ids(n, px / 2, (size_t)hp->win_tokens, win);
}

/* x [n][E] = conv(W0) + conv(W1) of each patch, rows in the merged order;
 * then v.pre_ln when the file has one. */
static enum ekv_status embed(const struct ekv_clip *c, struct ekv_pool *pool, const float *pixels, size_t W,
                             size_t H, float *x) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const size_t E = (size_t)hp->n_embd, P = (size_t)hp->patch_size, px = W / P, n = px * (H / P), K = 3 * P * P;
    float *cols = ekv_clip_alloc_floats(n, K), *x1 = ekv_clip_alloc_floats(n, E);
    enum ekv_status s = EKV_OK;
    if (!cols || !x1) {
        s = ekv_err(EKV_ERR_NOMEM, "qwen2vl: patch buffers for %zu patches", n);
        goto done;
    }
    ekv_clip_qwen2vl_inputs(c, pixels, (int)W, (int)H, cols, K, NULL, NULL);
    if ((s = ekv_clip_linear(pool, &c->patch, NULL, cols, n, x)) != EKV_OK ||
        (s = ekv_clip_linear(pool, &c->patch1, NULL, cols, n, x1)) != EKV_OK)
        goto done;
    ekv_add(x, x1, (int64_t)(n * E));
    for (size_t r = 0; c->pre_w && r < n; r++)
        ekv_layernorm(x + r * E, x + r * E, c->pre_w, c->pre_b, (int64_t)E, hp->eps);
done:
    free(cols);
    free(x1);
    return s;
}

/* v.post_ln per patch, then mm.0 / GELU / mm.2 over rows of 4 patches. */
static enum ekv_status merge(const struct ekv_clip *c, struct ekv_pool *pool, float *x, size_t n, float *out) {
    const struct ekv_clip_hparams *hp = &c->hp;
    const size_t E = (size_t)hp->n_embd, m = n / 4;
    for (size_t r = 0; r < n; r++) ekv_clip_norm(c, x + r * E, x + r * E, c->post_w, c->post_b);
    float *mid = ekv_clip_alloc_floats(m, (size_t)hp->n_mm);
    if (!mid) return ekv_err(EKV_ERR_NOMEM, "qwen2vl: merger buffer for %zu tokens", m);
    enum ekv_status s = ekv_clip_linear(pool, &c->mm0, c->mm0_b, x, m, mid);
    if (s == EKV_OK) {
        ekv_gelu(mid, (int64_t)(m * (size_t)hp->n_mm));
        s = ekv_clip_linear(pool, &c->mm2, c->mm2_b, mid, m, out);
    }
    free(mid);
    return s;
}

enum ekv_status ekv_clip_encode_qwen2vl_pixels(const struct ekv_clip *c, struct ekv_pool *pool, const float *pixels,
                                               int W, int H, float *out) {
    if (!c || !pixels || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_clip_encode_qwen2vl_pixels: NULL argument");
    const struct ekv_clip_hparams *hp = &c->hp;
    if (hp->proj != EKV_CLIP_PROJ_QWEN2VL)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_clip_encode_qwen2vl_pixels: not a qwen2vl_merger tower");
    const int a = hp->patch_size * hp->merge;
    if (W <= 0 || H <= 0 || W % a || H % a || (int64_t)(W / a) * (H / a) > EKV_CLIP_QWEN2VL_MAX_TOKENS)
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "qwen2vl: a %dx%d input is not a grid of %d-pixel blocks of at most %d tokens", W, H, a,
                       EKV_CLIP_QWEN2VL_MAX_TOKENS);
    const size_t px = (size_t)(W / hp->patch_size), n = px * (size_t)(H / hp->patch_size);
    const size_t E = (size_t)hp->n_embd, d = E / (size_t)hp->n_head;
    float *x = ekv_clip_alloc_floats(n, E), *cs = ekv_clip_alloc_floats(n, d);
    int32_t *win = NULL;
    enum ekv_status s = EKV_OK;
    if (!x || !cs) {
        s = ekv_err(EKV_ERR_NOMEM, "qwen2vl: hidden states of %zu patches", n);
        goto done;
    }
    if (hp->wa_pattern > 0 && !(win = malloc(n * sizeof *win))) {
        s = ekv_err(EKV_ERR_NOMEM, "qwen2vl: window ids of %zu patches", n);
        goto done;
    }
    ekv_clip_qwen2vl_inputs(c, pixels, W, H, NULL, 0, cs, win);
    s = embed(c, pool, pixels, (size_t)W, (size_t)H, x);
    for (int il = 0; s == EKV_OK && il < hp->n_layer_run; il++) {
        const bool windowed = hp->wa_pattern > 0 && (il + 1) % hp->wa_pattern != 0;
        s = ekv_clip_block_rows(c, pool, il, x, n, cs, windowed ? win : NULL);
    }
    if (s == EKV_OK) s = merge(c, pool, x, n, out);
done:
    free(x);
    free(cs);
    free(win);
    return s;
}

enum ekv_status ekv_clip_encode_qwen2vl(const struct ekv_clip *c, struct ekv_pool *pool, const struct ekv_image *img,
                                        const struct ekv_clip_exec *ex, float *out) {
    int tw, th;
    ekv_clip_qwen2vl_size(c, img->nx, img->ny, &tw, &th);
    if (!tw)
        return ekv_err(EKV_ERR_INVALID_ARG, "qwen2vl: an image of %dx%d cannot be sized for the tower", img->nx,
                       img->ny);
    float *pixels = ekv_clip_alloc_floats((size_t)3 * (size_t)tw, (size_t)th);
    if (!pixels) return ekv_err(EKV_ERR_NOMEM, "qwen2vl: pixel buffer of %dx%d", tw, th);
    enum ekv_status s = preprocess(c, img, tw, th, pixels);
    if (s == EKV_OK && ex && ex->pixels) s = ex->pixels(ex->user, c, pixels, tw, th, out);
    else if (s == EKV_OK) s = ekv_clip_encode_qwen2vl_pixels(c, pool, pixels, tw, th, out);
    free(pixels);
    return s;
}
