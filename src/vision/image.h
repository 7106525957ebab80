/*
 * image.h — decoding photos (JPEG, PNG through stb_image) into 8-bit RGB and
 * the LLaVA-1.5 preprocessing that turns them into the vision tower's input:
 * pad to a square with the mean colour, bicubic resize to the encoder's
 * size, normalise each channel with the model's mean and std.
 *
 * Hostile input is expected: the header is read first and images claiming
 * more than EKV_IMAGE_MAX_SIDE pixels per side or EKV_IMAGE_MAX_PIXELS in all
 * are refused before any pixel is decoded; a truncated or corrupt file gives
 * EKV_ERR_FORMAT with the file named.
 */
#ifndef EKV_VISION_IMAGE_H
#define EKV_VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "ekv.h"

#define EKV_IMAGE_MAX_SIDE 16384
#define EKV_IMAGE_MAX_PIXELS (64u * 1024u * 1024u)
#define EKV_IMAGE_MAX_FILE_BYTES ((size_t)256 << 20)

/* An 8-bit RGB image, rows top to bottom. */
struct ekv_image {
    int nx;       /* width  */
    int ny;       /* height */
    uint8_t *rgb; /* [ny][nx][3], owned (free with ekv_image_free) */
};

/* Decodes a JPEG or PNG file (grey and alpha are converted to RGB, alpha
 * dropped). EKV_ERR_IO when the file cannot be read, EKV_ERR_FORMAT when it
 * is not a decodable image, EKV_ERR_INVALID_ARG when it is too large. */
enum ekv_status ekv_image_load_file(const char *path, struct ekv_image *out);
/* Same from bytes in memory; `name` is used in error messages. */
enum ekv_status ekv_image_load_memory(const void *data, size_t n, const char *name,
                                      struct ekv_image *out);
/* The size an image's header claims, with the same checks as the loaders,
 * without decoding the pixels. */
enum ekv_status ekv_image_probe_memory(const void *data, size_t n, const char *name, int *nx, int *ny);
enum ekv_status ekv_image_probe_file(const char *path, int *nx, int *ny);
/* A blank image of nx x ny filled with `color` (nx, ny >= 1). */
enum ekv_status ekv_image_new(int nx, int ny, const uint8_t color[3], struct ekv_image *out);
void ekv_image_free(struct ekv_image *img);

/* LLaVA's expand-to-square: a max(nx,ny)-sided square filled with `color`
 * with the image pasted in the middle (offset (side-n)/2, rounded down).
 * A square input is copied. */
enum ekv_status ekv_image_pad_square(const struct ekv_image *src, const uint8_t color[3],
                                     struct ekv_image *out);

/* Bicubic resize as Pillow's Image.resize(BICUBIC) computes it (the
 * resampling behind the Hugging Face LLaVA processors, and llama.cpp's mtmd):
 * a cubic kernel (a = -0.5) over the input pixels around each output
 * pixel's centre, widened by the scale when shrinking, weights normalised
 * and in 22-bit fixed point; along x, then along y, each pass rounded to
 * 8 bits; a pass whose size does not change is skipped. */
enum ekv_status ekv_image_resize_bicubic(const struct ekv_image *src, int nx, int ny,
                                         struct ekv_image *out);

/* The same resampling with Pillow's BICUBIC or LANCZOS (sinc(x) sinc(x/3),
 * support 3) filter; Idefics3/SmolVLM resize with LANCZOS. */
enum ekv_resample { EKV_RESAMPLE_BICUBIC, EKV_RESAMPLE_LANCZOS };
enum ekv_status ekv_image_resize(const struct ekv_image *src, int nx, int ny, enum ekv_resample f,
                                 struct ekv_image *out);

/* The nx x ny rectangle at (x0, y0), which must lie inside src. */
enum ekv_status ekv_image_crop(const struct ekv_image *src, int x0, int y0, int nx, int ny, struct ekv_image *out);

/* (v / 255 - mean[c]) / std[c] into planar channels: out[c][y][x],
 * out has 3 * nx * ny floats. */
void ekv_image_normalize(const struct ekv_image *src, const float mean[3], const float std[3],
                         float *out);

/* The padding colour LLaVA uses: (int)(mean[c] * 255), clamped to 0..255. */
void ekv_image_mean_color(const float mean[3], uint8_t color[3]);

/* The whole LLaVA-1.5 pipeline: pad to square with the mean colour, bicubic
 * resize to size x size, normalise. out: [3][size][size]. */
enum ekv_status ekv_image_preprocess_llava(const struct ekv_image *src, int size,
                                           const float mean[3], const float std[3], float *out);

#endif
