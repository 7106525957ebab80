/*
 * test_qwen2vl.c — the Qwen2-VL image path (projector type "qwen2vl_merger")
 * on a tiny-qwen2vl mmproj written by `ekv mkmodel` (patch 8, merge 2, so
 * 16-pixel blocks; 64 wide, 4 heads of 16, 3 blocks):
 *  - the dynamic-resolution sizes ("smart resize") on hand-computed cases,
 *    the 4096-token cap and the 8-token floor among them;
 *  - the tower on generated pixels against a double-precision reference
 *    written here from the model's description (two convolutions, the 2 x 2
 *    reorder, LayerNorm blocks with full attention and the 2D RoPE, the
 *    merger), and a whole image against the resize-and-pad steps composed
 *    here;
 *  - agreement with llama.cpp's mtmd, recorded on this exact file and image;
 *  - hostile mmproj files refused with the tensor or key named;
 *  - the same tower and mtmd checks for tiny-qwen2.5vl (projector
 *    "qwen2.5vl_merger": RMSNorm, SwiGLU, blocks 0 and 2 attending within
 *    windows of 7 x 7 merged tokens), on images of several windows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "model/gguf.h"
#include "testutil.h"
#include "vision/clip.h"
#include "vision/image.h"
#include "vision_ref.h"

static char g_dir[] = "/tmp/ekv_test_qwen2vl_XXXXXX";
static char g_lm[256], g_mm[256], g_mm25[256];

/* ---- dynamic resolution ---- */

/* Sizes by hand from the rule (align a = 16, 8 * a^2 = 2048 to 4096 * a^2 =
 * 1048576 pixels): each side rounded to a multiple of a (at least a); above
 * the maximum both scaled by beta = sqrt(w h / max) and floored, below the
 * minimum scaled by beta = sqrt(min / (w h)) and ceiled. */
static void test_sizes(const struct ekv_clip *c) {
    const int cases[][4] = {
        {200, 150, 208, 144},   /* 12.5 -> 13 blocks (half away from zero), 9.375 -> 9 */
        {240, 400, 240, 400},   /* already whole blocks */
        {500, 300, 496, 304},   /* 31.25 -> 31, 18.75 -> 19 */
        {64, 48, 64, 48},       /* exact: 12 tokens */
        /* 16 x 16 = 256 < 2048: beta = sqrt(2048 / 400) = 2.263, 20 * beta / 16 = 2.83 -> 3 blocks */
        {20, 20, 48, 48},
        /* 2000 x 1504 > max: beta = sqrt(3e6 / 1048576) = 1.6914; 1500 / beta / 16 = 55.4 -> 55,
         * 2000 / beta / 16 = 73.9 -> 73: 73 x 55 = 4015 tokens */
        {2000, 1500, 1168, 880},
        /* 16384^2: beta = 16 exactly: 64 x 64 = 4096 tokens, the cap */
        {16384, 16384, 1024, 1024},
        {1, 1000, 16, 1008},    /* a thin strip: 0 blocks -> 1; 62.5 -> 63 */
        /* 30 x 10 -> 32 x 16 = 512 < 2048: beta = sqrt(2048 / 300) = 2.613: 4.9 -> 5, 1.63 -> 2 blocks */
        {30, 10, 80, 32},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int tw, th, gw, gh;
        ekv_clip_qwen2vl_size(c, cases[k][0], cases[k][1], &tw, &th);
        ekv_clip_qwen2vl_grid(c, cases[k][0], cases[k][1], &gw, &gh);
        CHECK_MSG(tw == cases[k][2] && th == cases[k][3], "%dx%d: %dx%d, expected %dx%d", cases[k][0], cases[k][1],
                  tw, th, cases[k][2], cases[k][3]);
        CHECK(gw == tw / 16 && gh == th / 16 && gw * gh >= 8 && gw * gh <= 4096);
        CHECK(ekv_clip_image_rows(c, cases[k][0], cases[k][1]) == (int64_t)gw * gh);
    }
    const int bad[][2] = {{0, 10}, {10, -1}, {EKV_IMAGE_MAX_SIDE + 1, 10}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int gw = -1, gh = -1;
        ekv_clip_qwen2vl_grid(c, bad[k][0], bad[k][1], &gw, &gh);
        CHECK(gw == 0 && gh == 0 && ekv_clip_image_rows(c, bad[k][0], bad[k][1]) == 0);
    }
}

/* ---- the tower against the double reference ---- */

/* LayerNorm, or RMSNorm (Qwen2.5-VL; b NULL) in double. */
static void ref_norm(bool rms, double *out, const double *x, const float *w, const float *b, int n, double eps) {
    if (!rms) {
        ref_ln(out, x, w, b, n, eps);
        return;
    }
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double sc = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * sc * w[i] + (b ? b[i] : 0.0);
}

/* The whole tower in double on pixels [3][H][W]: out [(H/16) * (W/16)][n_embd_out]. */
static void ref_tower(struct ekv_gguf_file *f, const struct ekv_clip_hparams *hp, const float *pix, int W, int H,
                      double *out) {
    const int E = hp->n_embd, P = hp->patch_size, F = hp->n_ff, NH = hp->n_head, D = E / NH;
    const int px = W / P, py = H / P, N = px * py, M = hp->n_mm, O = hp->n_embd_out;
    const float *w0 = T(f, "v.patch_embd.weight"), *w1 = T(f, "v.patch_embd.weight.1");
    if (!w0 || !w1) return;
    double *raster = calloc((size_t)N * E, sizeof(double)), *x = calloc((size_t)N * E, sizeof(double));
    int *ry = malloc(sizeof(int) * N), *rx = malloc(sizeof(int) * N);
    /* two convolutions, stride P, no bias, in raster order of the patch grid */
    for (int y = 0; y < py; y++)
        for (int xx = 0; xx < px; xx++)
            for (int e = 0; e < E; e++) {
                double s = 0;
                for (int c = 0; c < 3; c++)
                    for (int ky = 0; ky < P; ky++)
                        for (int kx = 0; kx < P; kx++) {
                            const size_t wi = ((size_t)(e * 3 + c) * P + ky) * P + kx;
                            s += ((double)w0[wi] + (double)w1[wi]) *
                                 pix[(size_t)c * W * H + (size_t)(y * P + ky) * W + xx * P + kx];
                        }
                raster[((size_t)y * px + xx) * E + e] = s;
            }
    /* each 2 x 2 block contiguous: blocks row by row, inside a block dy then dx */
    int t = 0;
    for (int by = 0; by < py / 2; by++)
        for (int bx = 0; bx < px / 2; bx++)
            for (int dy = 0; dy < 2; dy++)
                for (int dx = 0; dx < 2; dx++, t++) {
                    ry[t] = 2 * by + dy;
                    rx[t] = 2 * bx + dx;
                    memcpy(x + (size_t)t * E, raster + ((size_t)ry[t] * px + rx[t]) * E, sizeof(double) * E);
                }
    double *h = malloc(sizeof(double) * N * E), *q = malloc(sizeof(double) * N * E);
    double *k = malloc(sizeof(double) * N * E), *v = malloc(sizeof(double) * N * E);
    double *a = malloc(sizeof(double) * N * E), *ff = malloc(sizeof(double) * N * F), *p = malloc(sizeof(double) * N);
    double *g = malloc(sizeof(double) * F);
    const bool v25 = hp->rms_norm;
    /* Qwen2.5-VL: the window of token r's merged token, w x w merged tokens from the top left */
    const int bw = px / 2, w = hp->win_tokens > 0 ? hp->win_tokens : 1, wcols = (bw + w - 1) / w;
#define WIN(r) ((((r) / 4) / bw / w) * wcols + ((r) / 4) % bw / w)
    for (int il = 0; il < hp->n_layer; il++) {
        const float *gw = v25 ? Tn(f, "v.blk.%d.ffn_gate.weight", il) : NULL;
        const float *gb = v25 ? Tn(f, "v.blk.%d.ffn_gate.bias", il) : NULL;
        const bool windowed = v25 && (il + 1) % hp->wa_pattern != 0;
        /* RMSNorm (Qwen2.5-VL) has no bias, LayerNorm no gate */
        const float *l1w = Tn(f, "v.blk.%d.ln1.weight", il), *l1b = v25 ? NULL : Tn(f, "v.blk.%d.ln1.bias", il);
        const float *l2w = Tn(f, "v.blk.%d.ln2.weight", il), *l2b = v25 ? NULL : Tn(f, "v.blk.%d.ln2.bias", il);
        const float *qw = Tn(f, "v.blk.%d.attn_q.weight", il), *qb = Tn(f, "v.blk.%d.attn_q.bias", il);
        const float *kw = Tn(f, "v.blk.%d.attn_k.weight", il), *kb = Tn(f, "v.blk.%d.attn_k.bias", il);
        const float *vw = Tn(f, "v.blk.%d.attn_v.weight", il), *vb = Tn(f, "v.blk.%d.attn_v.bias", il);
        const float *ow = Tn(f, "v.blk.%d.attn_out.weight", il), *ob = Tn(f, "v.blk.%d.attn_out.bias", il);
        const float *uw = Tn(f, "v.blk.%d.ffn_up.weight", il), *ub = Tn(f, "v.blk.%d.ffn_up.bias", il);
        const float *dw = Tn(f, "v.blk.%d.ffn_down.weight", il), *db = Tn(f, "v.blk.%d.ffn_down.bias", il);
        if (!l1w || (!l1b && !v25) || !l2w || (!l2b && !v25) || !qw || !qb || !kw || !kb || !vw || !vb || !ow || !ob ||
            !uw || !ub || !dw || !db || (v25 && (!gw || !gb)))
            break;
        for (int r = 0; r < N; r++) {
            ref_norm(v25, h + (size_t)r * E, x + (size_t)r * E, l1w, l1b, E, hp->eps);
            ref_linear(q + (size_t)r * E, qw, qb, h + (size_t)r * E, E, E);
            ref_linear(k + (size_t)r * E, kw, kb, h + (size_t)r * E, E, E);
            ref_linear(v + (size_t)r * E, vw, vb, h + (size_t)r * E, E, E);
            /* 2D RoPE: pair j < D/4 turns by the row, D/4 <= j < D/2 by the column, j with j + D/2 */
            for (int hh = 0; hh < NH; hh++)
                for (int j = 0; j < D / 2; j++) {
                    const double pos = j < D / 4 ? ry[r] : rx[r], i = j < D / 4 ? j : j - D / 4;
                    const double ang = pos * pow(10000.0, -4.0 * i / D), cs = cos(ang), sn = sin(ang);
                    double *vs[2] = {q + (size_t)r * E + hh * D, k + (size_t)r * E + hh * D};
                    for (int m = 0; m < 2; m++) {
                        const double a0 = vs[m][j], a1 = vs[m][j + D / 2];
                        vs[m][j] = a0 * cs - a1 * sn;
                        vs[m][j + D / 2] = a0 * sn + a1 * cs;
                    }
                }
        }
        for (int r = 0; r < N; r++) /* full attention over every patch */
            for (int hh = 0; hh < NH; hh++) {
                double mx = -1e300, sum = 0;
                for (int s = 0; s < N; s++) {
                    if (windowed && WIN(s) != WIN(r)) { /* outside the row's window */
                        p[s] = -INFINITY;
                        continue;
                    }
                    double d = 0;
                    for (int i = 0; i < D; i++) d += q[(size_t)r * E + hh * D + i] * k[(size_t)s * E + hh * D + i];
                    p[s] = d / sqrt((double)D);
                    mx = p[s] > mx ? p[s] : mx;
                }
                for (int s = 0; s < N; s++) sum += (p[s] = exp(p[s] - mx));
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int s = 0; s < N; s++) o += p[s] / sum * v[(size_t)s * E + hh * D + i];
                    a[(size_t)r * E + hh * D + i] = o;
                }
            }
        for (int r = 0; r < N; r++) {
            ref_linear(h + (size_t)r * E, ow, ob, a + (size_t)r * E, E, E);
            for (int e = 0; e < E; e++) x[(size_t)r * E + e] += h[(size_t)r * E + e];
            ref_norm(v25, h + (size_t)r * E, x + (size_t)r * E, l2w, l2b, E, hp->eps);
            ref_linear(ff + (size_t)r * F, uw, ub, h + (size_t)r * E, E, F);
            if (v25) { /* SwiGLU: silu(gate) * up */
                ref_linear(g, gw, gb, h + (size_t)r * E, E, F);
                for (int i = 0; i < F; i++) ff[(size_t)r * F + i] *= g[i] / (1.0 + exp(-g[i]));
            }
            for (int i = 0; i < F && !v25; i++) { /* quick GELU (clip.use_gelu false) */
                const double z = ff[(size_t)r * F + i];
                ff[(size_t)r * F + i] = z / (1.0 + exp(-1.702 * z));
            }
            ref_linear(h + (size_t)r * E, dw, db, ff + (size_t)r * F, F, E);
            for (int e = 0; e < E; e++) x[(size_t)r * E + e] += h[(size_t)r * E + e];
        }
    }
    /* merger: LayerNorm per patch, 4 patches side by side, Linear, GELU (tanh), Linear */
    const float *pw = T(f, "v.post_ln.weight"), *pb = hp->rms_norm ? NULL : T(f, "v.post_ln.bias");
    const float *m0 = T(f, "mm.0.weight"), *m0b = T(f, "mm.0.bias"), *m2 = T(f, "mm.2.weight"), *m2b = T(f, "mm.2.bias");
    double *mid = malloc(sizeof(double) * M);
    for (int r = 0; r < N && pw && (pb || v25); r++)
        ref_norm(v25, h + (size_t)r * E, x + (size_t)r * E, pw, pb, E, hp->eps);
#undef WIN
    for (int tk = 0; tk < N / 4 && m0 && m0b && m2 && m2b; tk++) {
        ref_linear(mid, m0, m0b, h + (size_t)tk * 4 * E, 4 * E, M);
        for (int i = 0; i < M; i++) {
            const double z = mid[i];
            mid[i] = 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
        }
        ref_linear(out + (size_t)tk * O, m2, m2b, mid, M, O);
    }
    free(raster), free(x), free(ry), free(rx), free(h), free(q), free(k), free(v), free(a), free(ff), free(p);
    free(mid), free(g);
}

static void random_pixels(float *pix, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        pix[i] = (float)((seed >> 8) & 0xffff) / 65535.0f * 4.0f - 2.0f;
    }
}

static void test_tower(struct ekv_clip *c, struct ekv_gguf_file *f, bool v25) {
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
    CHECK(hp->proj == EKV_CLIP_PROJ_QWEN2VL && hp->merge == 2 && !hp->has_class && !hp->use_gelu &&
          hp->use_silu == v25 && hp->rms_norm == v25 && hp->wa_pattern == (v25 ? 2 : 0) && hp->win_tokens == (v25 ? 7 : 0));
    CHECK(hp->patch_size == 8 && hp->n_embd == 64 && hp->n_head == 4 && hp->n_layer_run == hp->n_layer);
    CHECK(hp->n_patches == 0 && ekv_clip_n_tile_tokens(c) == 0 && ekv_clip_n_embd_out(c) == 64);
    struct ekv_pool *pool = NULL;
    CHECK_OK(ekv_pool_new(2, &pool));
    /* 64 x 48 (4 x 3 tokens) and a tall 32 x 80 (2 x 5): every patch row and column differs;
     * Qwen2.5-VL: 160 x 48 (10 x 3 tokens: windows of 7 and 3 columns) and 32 x 272 (2 x 17: three window rows) */
    const int sizes[][2] = {{64, 48}, {32, 80}, {160, 48}, {32, 272}};
    for (int k = v25 ? 2 : 0; k < (v25 ? 4 : 2); k++) {
        const int W = sizes[k][0], H = sizes[k][1], nt = (W / 16) * (H / 16), no = hp->n_embd_out;
        float *pix = malloc(sizeof(float) * 3 * W * H), *out = malloc(sizeof(float) * nt * no);
        float *out1 = malloc(sizeof(float) * nt * no);
        double *want = calloc((size_t)nt * no, sizeof(double));
        random_pixels(pix, (size_t)3 * W * H, 99u + (uint32_t)k);
        CHECK_OK(ekv_clip_encode_qwen2vl_pixels(c, pool, pix, W, H, out));
        CHECK_OK(ekv_clip_encode_qwen2vl_pixels(c, NULL, pix, W, H, out1));
        ref_tower(f, hp, pix, W, H, want);
        double mref, d = max_abs_diff_fd(out, want, (size_t)nt * no, &mref), d1 = max_abs_diff_fd(out1, want, (size_t)nt * no, NULL);
        printf("qwen2%svl %dx%d -> %d tokens: max |diff| %.3g, one thread %.3g (max |ref| %.3g)\n", v25 ? ".5" : "", W,
               H, nt, d, d1, mref);
        /* f32 against double through two convolutions, 3 blocks and the merger (4E = 256 wide):
         * the same bound as the other towers' */
        CHECK_MSG(d <= 1e-6 + 1e-5 * mref && d1 <= 1e-6 + 1e-5 * mref && mref > 0.05,
                  "qwen2vl %dx%d differs from the reference by %g", W, H, d);
        free(pix), free(out), free(out1), free(want);
    }
    /* sizes that are not whole 16-pixel blocks, and the fixed-size entry points */
    float px1[3 * 16 * 24], o1[64];
    CHECK(ekv_clip_encode_qwen2vl_pixels(c, NULL, px1, 16, 24, o1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_clip_encode_qwen2vl_pixels(c, NULL, px1, 0, 16, o1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_clip_encode_pixels(c, NULL, px1, o1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_clip_block(c, NULL, 0, px1) == EKV_ERR_INVALID_ARG);
    ekv_pool_free(pool);
}

/* A whole image: astronaut_crop 320x200 -> 320x208 (12.5 blocks -> 13): scale min(1, 1.04) = 1,
 * so the image itself pasted at (0, 4) on black; the same steps here give the same bytes. */
static void test_image(struct ekv_clip *c) {
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
    struct ekv_image img = {0}, canvas = {0}, fit = {0};
    const uint8_t black[3] = {0, 0, 0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.png"), &img));
    CHECK_OK(ekv_image_new(320, 208, black, &canvas));
    if (!img.rgb || !canvas.rgb) goto done;
    for (int y = 0; y < 200; y++) memcpy(canvas.rgb + ((size_t)(y + 4) * 320) * 3, img.rgb + (size_t)y * 320 * 3, 320 * 3);
    int gw, gh;
    ekv_clip_qwen2vl_grid(c, 320, 200, &gw, &gh);
    CHECK(gw == 20 && gh == 13);
    const size_t rows = 260 * 64;
    float *a = malloc(sizeof(float) * rows), *b = malloc(sizeof(float) * rows);
    float *pix = malloc(sizeof(float) * 3 * 320 * 208);
    CHECK_OK(ekv_clip_encode_image(c, NULL, &img, a));
    ekv_image_normalize(&canvas, hp->image_mean, hp->image_std, pix);
    CHECK_OK(ekv_clip_encode_qwen2vl_pixels(c, NULL, pix, 320, 208, b));
    CHECK_MSG(!memcmp(a, b, sizeof(float) * rows), "320x200 image differs from the pasted canvas");
    /* 200x150 -> 208x144: scale min(1.04, 0.96) = 0.96: bicubic to 192x144, pasted at (8, 0) */
    struct ekv_image small = {0};
    CHECK_OK(ekv_image_resize(&img, 200, 150, EKV_RESAMPLE_BICUBIC, &small));
    ekv_image_free(&canvas);
    CHECK_OK(ekv_image_new(208, 144, black, &canvas));
    CHECK_OK(ekv_image_resize(&small, 192, 144, EKV_RESAMPLE_BICUBIC, &fit));
    if (small.rgb && canvas.rgb && fit.rgb) {
        for (int y = 0; y < 144; y++) memcpy(canvas.rgb + ((size_t)y * 208 + 8) * 3, fit.rgb + (size_t)y * 192 * 3, 192 * 3);
        CHECK(ekv_clip_image_rows(c, 200, 150) == 13 * 9);
        CHECK_OK(ekv_clip_encode_image(c, NULL, &small, a));
        ekv_image_normalize(&canvas, hp->image_mean, hp->image_std, pix);
        CHECK_OK(ekv_clip_encode_qwen2vl_pixels(c, NULL, pix, 208, 144, b));
        CHECK_MSG(!memcmp(a, b, sizeof(float) * 13 * 9 * 64), "200x150 image differs from the resized, pasted canvas");
    }
    ekv_image_free(&small);
    free(a), free(b), free(pix);
done:
    ekv_image_free(&img);
    ekv_image_free(&canvas);
    ekv_image_free(&fit);
}

/* ---- agreement with llama.cpp's mtmd (recorded) ---- */

/* llama.cpp v0.5.0's mtmd (CPU) on this file pair (tiny-qwen2vl, --type f32 --seed 3) and
 * data/images/astronaut_crop.png: 260 embeddings (a 20 x 13 grid) of width 64; the L2 norm
 * of all, of rows 0, 19, 130 and 259, and the values at index i * 1031 (2026-11-27; ekv
 * then: max |diff| 9.9e-5 with max |value| 0.237, rms rel 4.2e-4). The difference is
 * ggml's: its conv_2d rounds the pixels and the patch kernels to f16 (im2col in f16),
 * and its GELU and quick GELU read f16 tables; emulating both in a probe brought ekv
 * to rms rel 1.5e-5. With the random weights' near-uniform attention the positions
 * hardly matter (ekv without its RoPE: rms rel 1.5e-3), so the second recording is of
 * the same file with attn_q and attn_k (weights and biases) times 12: there ekv agrees
 * at rms rel 4.1e-4 while without the RoPE it is 6.9e-2 off, with rows and columns
 * swapped in it 5.2e-2. */
static const struct mtmd_rec {
    float qk_scale;
    double norm;
    double row_norm[4];
    float v[16];
} k_mtmd[2] = {
    {1.0f, 7.514582, {0.482129, 0.473613, 0.495947, 0.393455},
     {-0.079428f, 0.041928f, 0.023426f, 0.000257f, 0.014419f, 0.026518f, -0.083299f, -0.094971f, 0.001515f,
      -0.009304f, -0.094797f, 0.046021f, -0.063970f, -0.045933f, 0.004786f, 0.000716f}},
    {12.0f, 7.581892, {0.476977, 0.475892, 0.510017, 0.398458},
     {-0.080050f, 0.047761f, 0.030642f, -0.002947f, 0.022243f, 0.026563f, -0.086359f, -0.096316f, 0.000568f,
      -0.006601f, -0.094014f, 0.045700f, -0.069674f, -0.044234f, 0.007304f, 0.000915f}},
};
/* The same for tiny-qwen2.5vl (f32, seed 3), 2026-11-27: as shipped rms rel 4.1e-4 (max
 * |diff| 1.0e-4); with q, k x 12 4.0e-4, while the same tower without its windows is 4.7e-2
 * off (max |diff| 2.0e-2). */
static const struct mtmd_rec k_mtmd25[2] = {
    {1.0f, 7.598530, {0.472739, 0.480758, 0.478665, 0.393814},
     {-0.082499f, 0.032532f, 0.025420f, -0.001298f, 0.014322f, 0.036217f, -0.072077f, -0.099920f, 0.005056f,
      -0.013239f, -0.112954f, 0.045003f, -0.064503f, -0.039747f, -0.010766f, 0.013180f}},
    {12.0f, 7.673613, {0.465726, 0.487359, 0.492009, 0.407792},
     {-0.084529f, 0.035988f, 0.029715f, 0.003188f, 0.015450f, 0.035560f, -0.073055f, -0.100922f, 0.001304f,
      -0.012291f, -0.114828f, 0.046628f, -0.063656f, -0.036438f, -0.009707f, 0.012468f}},
};
static const int k_rows[4] = {0, 19, 130, 259};

static double l2(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

/* A copy of the tiny mmproj src with the attention's q and k maps scaled. */
static void write_sharp(const char *src, float scale, const char *dst) {
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *w = NULL;
    float **owned = NULL;
    size_t n_owned = 0;
    CHECK_OK(ekv_gguf_open(src, &f));
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!f || !w) goto out;
    owned = calloc(ekv_gguf_n_tensors(f), sizeof *owned);
    for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) CHECK_OK(ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(f, i)));
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        const void *data = t->data;
        if ((strstr(t->name, "attn_q.") || strstr(t->name, "attn_k.")) && t->type == EKV_F32) {
            const size_t n = (size_t)t->ne[0] * (size_t)(t->n_dims > 1 ? t->ne[1] : 1);
            float *p = owned[n_owned++] = malloc(n * sizeof *p);
            for (size_t j = 0; j < n; j++) p[j] = ((const float *)t->data)[j] * scale;
            data = p;
        }
        CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, NULL, NULL));
    }
    CHECK_OK(ekv_gguf_writer_write(w, dst));
out:
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
}

static void test_mtmd(const char *mm, const struct mtmd_rec *recs) {
    struct ekv_image img = {0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.png"), &img));
    const size_t n = 260 * 64;
    float *e = malloc(sizeof(float) * n);
    struct ekv_pool *pool = NULL;
    CHECK_OK(ekv_pool_new(2, &pool));
    for (int k = 0; k < 2 && img.rgb; k++) {
        const struct mtmd_rec *rec = &recs[k];
        char path[300];
        snprintf(path, sizeof path, "%s/sharp.mmproj.gguf", g_dir);
        if (rec->qk_scale != 1.0f) write_sharp(mm, rec->qk_scale, path);
        struct ekv_clip *c = NULL;
        CHECK_OK(ekv_clip_load(rec->qk_scale != 1.0f ? path : mm, &c));
        if (!c) continue;
        CHECK(ekv_clip_image_rows(c, img.nx, img.ny) == 260);
        CHECK_OK(ekv_clip_encode_image(c, pool, &img, e));
        ekv_clip_free(c);
        const double nrm = l2(e, n);
        CHECK_MSG(fabs(nrm / rec->norm - 1) < 1e-3, "q,k x%g: norm %.6f, llama.cpp %.6f", rec->qk_scale, nrm, rec->norm);
        for (int r = 0; r < 4; r++) {
            const double rn = l2(e + (size_t)k_rows[r] * 64, 64);
            CHECK_MSG(fabs(rn / rec->row_norm[r] - 1) < 2e-3, "q,k x%g: row %d norm %.6f, llama.cpp %.6f",
                      rec->qk_scale, k_rows[r], rn, rec->row_norm[r]);
        }
        /* measured: 1e-4 at most over every value; a wrong RoPE moves the sharp ones by up to 7e-3 */
        double dmax = 0;
        for (int i = 0; i < 16; i++) dmax = fmax(dmax, fabs((double)e[(size_t)i * 1031] - rec->v[i]));
        printf("%s, astronaut_crop, q,k x%g: norm %.6f (llama.cpp %.6f), sampled values max |diff| %.2g\n",
               recs == k_mtmd ? "qwen2vl" : "qwen2.5vl", rec->qk_scale, nrm, rec->norm, dmax);
        CHECK_MSG(dmax < 5e-4, "q,k x%g: sampled values differ from llama.cpp's by %g", rec->qk_scale, dmax);
    }
    ekv_pool_free(pool);
    free(e);
    ekv_image_free(&img);
}

/* ---- hostile qwen2vl mmproj files ---- */

/* A copy of the tiny mmproj with one change: a u32, bool or string key set,
 * a tensor dropped, one added (zeros), or mm.0.weight reshaped. */
struct mutation {
    const char *key;
    uint32_t u32;
    const char *str;
    bool set_bool;
    const char *drop, *add;
    int64_t add_ne[2];
    bool bad_mm0;
    enum ekv_status want;
    const char *needle;
};

static const char *g_mut_src = g_mm; /* the file mutate() copies */

static void mutate(const struct mutation *mu, const char *dst) {
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *w = NULL;
    static float zeros[64 * 1024];
    CHECK_OK(ekv_gguf_open(g_mut_src, &f));
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!f || !w) goto out;
    for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) CHECK_OK(ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(f, i)));
    if (mu->key && mu->str) CHECK_OK(ekv_gguf_writer_set_str(w, mu->key, mu->str));
    if (mu->key && mu->u32) CHECK_OK(ekv_gguf_writer_set_u32(w, mu->key, mu->u32));
    if (mu->key && mu->set_bool) CHECK_OK(ekv_gguf_writer_set_bool(w, mu->key, true));
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        if (mu->drop && !strcmp(t->name, mu->drop)) continue;
        if (mu->bad_mm0 && !strcmp(t->name, "mm.0.weight")) { /* input 2E instead of 4E */
            int64_t ne[2] = {t->ne[0] / 2, t->ne[1]};
            CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, EKV_F32, 2, ne, zeros, NULL, NULL));
            continue;
        }
        CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
    }
    if (mu->add)
        CHECK_OK(ekv_gguf_writer_add_tensor(w, mu->add, EKV_F32, mu->add_ne[1] ? 2 : 1, mu->add_ne, zeros, NULL, NULL));
    CHECK_OK(ekv_gguf_writer_write(w, dst));
out:
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
}

static void test_hostile(void) {
    const struct mutation cases[] = {
        {.drop = "v.patch_embd.weight.1", .want = EKV_ERR_NOT_FOUND, .needle = "v.patch_embd.weight.1"},
        {.bad_mm0 = true, .want = EKV_ERR_FORMAT, .needle = "mm.0.weight"},
        {.key = "clip.projector_type", .str = "qwen2.5vl_merger", .want = EKV_ERR_FORMAT,
         .needle = "a qwen2.5vl_merger tower needs clip.vision.n_wa_pattern >= 1"},
        {.add = "v.class_embd", .add_ne = {64}, .want = EKV_ERR_FORMAT, .needle = "v.class_embd"},
        {.add = "v.position_embd.weight", .add_ne = {64, 16}, .want = EKV_ERR_FORMAT, .needle = "v.position_embd.weight"},
        {.add = "v.patch_embd.bias", .add_ne = {64}, .want = EKV_ERR_FORMAT, .needle = "v.patch_embd.bias"},
        {.drop = "v.post_ln.weight", .want = EKV_ERR_NOT_FOUND, .needle = "v.post_ln.weight"},
        {.drop = "mm.2.bias", .want = EKV_ERR_NOT_FOUND, .needle = "mm.2.bias"},
        {.drop = "mm.0.weight", .want = EKV_ERR_NOT_FOUND, .needle = "mm.0.weight"},
        {.key = "clip.vision.projection_dim", .u32 = 96, .want = EKV_ERR_FORMAT, .needle = "projection_dim is 96"},
        {.key = "clip.vision.spatial_merge_size", .u32 = 3, .want = EKV_ERR_UNSUPPORTED, .needle = "spatial_merge_size = 3"},
        {.key = "clip.vision.n_wa_pattern", .u32 = 8, .want = EKV_ERR_FORMAT, .needle = "which has no window attention"},
        /* 64 / 32 = head size 2: the RoPE needs a multiple of 4; 64 / 3 is not whole */
        {.key = "clip.vision.attention.head_count", .u32 = 32, .want = EKV_ERR_FORMAT, .needle = "multiple of 4"},
        {.key = "clip.vision.attention.head_count", .u32 = 3, .want = EKV_ERR_FORMAT, .needle = "head_count 3"},
        {.key = "clip.use_silu", .set_bool = true, .want = EKV_OK, .needle = ""},
        {.key = "clip.vision.patch_size", .u32 = 16, .want = EKV_ERR_FORMAT, .needle = "v.patch_embd.weight"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dst[300];
        snprintf(dst, sizeof dst, "%s/bad%zu.mmproj.gguf", g_dir, k);
        mutate(&cases[k], dst);
        struct ekv_clip *c = NULL;
        ekv_error_clear();
        enum ekv_status s = ekv_clip_load(dst, &c);
        CHECK_MSG(s == cases[k].want && strstr(ekv_last_error(), cases[k].needle), "case %zu: status %d, '%s'", k,
                  (int)s, ekv_last_error());
        CHECK((c != NULL) == (cases[k].want == EKV_OK));
        if (c) CHECK(ekv_clip_hparams(c)->use_silu);
        ekv_clip_free(c);
    }
    /* clip.use_gelu and clip.use_silu both true: refused (llama.cpp refuses it too) */
    char src[300], dst[300];
    snprintf(src, sizeof src, "%s/bad%zu.mmproj.gguf", g_dir, (size_t)14); /* the use_silu copy */
    snprintf(dst, sizeof dst, "%s/both.mmproj.gguf", g_dir);
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_open(src, &f));
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (f && w) {
        for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) CHECK_OK(ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(f, i)));
        CHECK_OK(ekv_gguf_writer_set_bool(w, "clip.use_gelu", true));
        for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
            const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
            CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
        }
        CHECK_OK(ekv_gguf_writer_write(w, dst));
        struct ekv_clip *c = NULL;
        CHECK(ekv_clip_load(dst, &c) == EKV_ERR_FORMAT && strstr(ekv_last_error(), "use_silu") && !c);
    }
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
}

/* Qwen2.5-VL files without their gate, with a bias its RMSNorm lacks, with windows of 0 tokens. */
static void test_hostile25(void) {
    const struct mutation cases[] = {
        {.drop = "v.blk.1.ffn_gate.weight", .want = EKV_ERR_FORMAT, .needle = "ffn_gate.weight is missing"},
        {.drop = "v.blk.0.ffn_gate.bias", .want = EKV_ERR_NOT_FOUND, .needle = "v.blk.0.ffn_gate.bias"},
        {.key = "clip.vision.n_wa_pattern", .u32 = 5000, .want = EKV_ERR_FORMAT, .needle = "n_wa_pattern = 5000 is outside"},
        {.key = "clip.projector_type", .str = "qwen2vl_merger", .want = EKV_ERR_FORMAT, .needle = "no window attention"},
    };
    g_mut_src = g_mm25;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dst[300];
        snprintf(dst, sizeof dst, "%s/bad25_%zu.mmproj.gguf", g_dir, k);
        mutate(&cases[k], dst);
        struct ekv_clip *c = NULL;
        enum ekv_status s = ekv_clip_load(dst, &c);
        CHECK_MSG(s == cases[k].want && !c && strstr(ekv_last_error(), cases[k].needle), "2.5 case %zu: status %d, '%s'",
                  k, (int)s, ekv_last_error());
        ekv_clip_free(c);
    }
    g_mut_src = g_mm;
}

/* Another projector has no Qwen2-VL grid. */
static void test_other_projector(void) {
    char lm[300], mm[300], args[1024];
    snprintf(lm, sizeof lm, "%s/vlm.gguf", g_dir);
    snprintf(mm, sizeof mm, "%s/vlm.mmproj.gguf", g_dir);
    snprintf(args, sizeof args, "--preset tiny-vlm --type f32 --seed 3 -o '%s' --mmproj-out '%s'", lm, mm);
    CHECK(tu_mkmodel(args) == 0);
    struct ekv_clip *c = NULL;
    CHECK_OK(ekv_clip_load(mm, &c));
    if (!c) return;
    int gw = -1, gh = -1;
    ekv_clip_qwen2vl_grid(c, 320, 200, &gw, &gh);
    CHECK(gw == 0 && gh == 0 && ekv_clip_hparams(c)->merge == 0);
    CHECK(ekv_clip_image_rows(c, 320, 200) == ekv_clip_n_patches(c));
    float px[3 * 16 * 16], o[64];
    CHECK(ekv_clip_encode_qwen2vl_pixels(c, NULL, px, 16, 16, o) == EKV_ERR_INVALID_ARG);
    ekv_clip_free(c);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(g_lm, sizeof g_lm, "%s/tiny.gguf", g_dir);
    snprintf(g_mm, sizeof g_mm, "%s/tiny.mmproj.gguf", g_dir);
    char args[1024];
    snprintf(args, sizeof args, "--preset tiny-qwen2vl --type f32 --seed 3 -o '%s' --mmproj-out '%s'", g_lm, g_mm);
    int rc = tu_mkmodel(args);
    CHECK_MSG(rc == 0, "ekv mkmodel failed (%d); is %s/ekv built?", rc, EKV_BINARY_DIR);
    struct ekv_clip *c = NULL;
    struct ekv_gguf_file *f = NULL;
    if (rc == 0) {
        CHECK_OK(ekv_clip_load(g_mm, &c));
        CHECK_OK(ekv_gguf_open(g_mm, &f));
    }
    if (c && f) {
        test_sizes(c);
        test_tower(c, f, false);
        test_image(c);
        test_mtmd(g_mm, k_mtmd);
        test_hostile();
        test_other_projector();
    }
    ekv_gguf_close(f);
    ekv_clip_free(c);
    /* Qwen2.5-VL */
    char lm25[300];
    snprintf(lm25, sizeof lm25, "%s/tiny25.gguf", g_dir);
    snprintf(g_mm25, sizeof g_mm25, "%s/tiny25.mmproj.gguf", g_dir);
    snprintf(args, sizeof args, "--preset tiny-qwen2.5vl --type f32 --seed 3 -o '%s' --mmproj-out '%s'", lm25, g_mm25);
    rc = tu_mkmodel(args);
    CHECK_MSG(rc == 0, "ekv mkmodel tiny-qwen2.5vl failed (%d)", rc);
    c = NULL;
    f = NULL;
    if (rc == 0) {
        CHECK_OK(ekv_clip_load(g_mm25, &c));
        CHECK_OK(ekv_gguf_open(g_mm25, &f));
    }
    if (c && f) {
        test_tower(c, f, true);
        test_mtmd(g_mm25, k_mtmd25);
        test_hostile25();
    }
    ekv_gguf_close(f);
    ekv_clip_free(c);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_qwen2vl");
}
