/*
 * vision_ref.h — double-precision references shared by the vision tests
 * (vision_ref.c).
 */
#ifndef EKV_TESTS_VISION_REF_H
#define EKV_TESTS_VISION_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "vision/clip.h"

/* Pillow's Image.resize: src nx x ny RGB -> dst ox x oy (bicubic, or Lanczos). */
void ref_resize(const uint8_t *src, int nx, int ny, uint8_t *dst, int ox, int oy);
void ref_resize_filter(bool lanczos, const uint8_t *src, int nx, int ny, uint8_t *dst, int ox, int oy);
/* ekv_image_resize of a pseudo-random nx x ny image (LCG from seed) against
 * the reference: at most one grey level apart, at least 99 % equal (CHECKs). */
void check_resize_vs_ref(bool lanczos, int nx, int ny, int ox, int oy, uint32_t seed);

/* An f32 tensor of the mmproj by name (a failed CHECK and NULL otherwise);
 * Tn formats the name with a block index. */
const float *T(struct ekv_gguf_file *f, const char *name);
const float *Tn(struct ekv_gguf_file *f, const char *fmt, int il);
void ref_ln(double *out, const double *x, const float *w, const float *b, int n, double eps);
/* y[o] = b[o] + sum_i W[o][i] x[i]; W stored with ne = [in, out]; b may be NULL. */
void ref_linear(double *y, const float *W, const float *b, const double *x, int in, int out);
/* Patch embedding (+bias), class token, positions, pre-LN when present: x [n_pos][E]. */
void ref_embed(struct ekv_gguf_file *f, const struct ekv_clip_hparams *hp, const float *pix, double *x);
/* One pre-LN block il in place on x [n_pos][E]. */
void ref_block(struct ekv_gguf_file *f, const struct ekv_clip_hparams *hp, int il, double *x);
/* max |a - b| (NaN propagates); *maxref gets max |b| when not NULL. */
double max_abs_diff_fd(const float *a, const double *b, size_t n, double *maxref);

#endif
