/*
 * test_vision.c — the vision path against plain double-precision references
 * written here: LLaVA-1.5 preprocessing of a real photo (pad to square with
 * the mean colour, bicubic resize, normalise), the ViT embeddings, one
 * encoder block and the whole tower + projector on a tiny-vlm mmproj made by
 * `ekv mkmodel`; shapes and image-token counts; and the errors for
 * unreadable, truncated, garbage and absurdly large images and for broken
 * mmproj files.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "ekv.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "testutil.h"
#include "vision_ref.h"
#include "vision/clip.h"
#include "vision/image.h"

static const float k_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
static const float k_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};

static char g_dir[] = "/tmp/ekv_test_vision_XXXXXX";

/* ------------------------------------------------------------------ */
/* preprocessing reference (double)                                     */
/* ------------------------------------------------------------------ */

/* pad (centre, colour (int)(mean*255)) + Pillow bicubic + normalise, in double. */
static void ref_preprocess(const uint8_t *rgb, int nx, int ny, int size, double *out) {
    int side = nx > ny ? nx : ny;
    uint8_t *sq = malloc((size_t)side * side * 3), *rs = malloc((size_t)size * size * 3);
    int col[3];
    for (int c = 0; c < 3; c++) col[c] = (int)(k_mean[c] * 255.0);
    for (int i = 0; i < side * side; i++)
        for (int c = 0; c < 3; c++) sq[i * 3 + c] = (uint8_t)col[c];
    int ox = (side - nx) / 2, oy = (side - ny) / 2;
    for (int y = 0; y < ny; y++)
        for (int x = 0; x < nx; x++)
            for (int c = 0; c < 3; c++)
                sq[((y + oy) * side + x + ox) * 3 + c] = rgb[(y * nx + x) * 3 + c];
    ref_resize(sq, side, side, rs, size, size);
    for (int i = 0; i < size * size; i++)
        for (int c = 0; c < 3; c++)
            out[(size_t)c * size * size + i] = (rs[(size_t)i * 3 + c] / 255.0 - (double)k_mean[c]) / (double)k_std[c];
    free(sq);
    free(rs);
}

/* A hand-computed case: one row 0, 100, 200, 255 halved. Scale 2 widens the
 * kernel to 4 pixels: output 0 has centre 1.0 and weights f(-0.25), f(0.25),
 * f(0.75), f(1.25) = 0.8671875, 0.8671875, 0.2265625, -0.0703125 (sum
 * 1.890625), so 100 * 0.4587 + 200 * 0.1198 - 255 * 0.0372 = 60.35 -> 60;
 * output 1 (centre 3.0) mirrors them: 220.68 -> 221. */
static void test_resize_vector(void) {
    struct ekv_image a = {0}, h = {0}, same = {0};
    const uint8_t grey[3] = {0, 0, 0}, v[4] = {0, 100, 200, 255};
    CHECK_OK(ekv_image_new(4, 1, grey, &a));
    if (!a.rgb) return;
    for (int x = 0; x < 4; x++) memset(a.rgb + x * 3, v[x], 3);
    CHECK_OK(ekv_image_resize_bicubic(&a, 2, 1, &h));
    CHECK(h.rgb && h.rgb[0] == 60 && h.rgb[3] == 221 && h.rgb[5] == 221);
    /* growing and shrinking against the double reference, to the grey level */
    const int sizes[][4] = {{4, 1, 9, 3}, {97, 61, 336, 336}, {700, 500, 336, 240}, {31, 29, 31, 57}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        check_resize_vs_ref(false, sizes[k][0], sizes[k][1], sizes[k][2], sizes[k][3], 12345u + (uint32_t)k);
    /* no size change: a copy */
    CHECK_OK(ekv_image_resize_bicubic(&a, 4, 1, &same));
    CHECK(same.rgb && memcmp(same.rgb, a.rgb, 12) == 0);
    ekv_image_free(&a);
    ekv_image_free(&h);
    ekv_image_free(&same);
}

static void test_preprocess_photo(void) {
    struct ekv_image img = {0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.png"), &img));
    CHECK(img.nx == 320 && img.ny == 200);
    if (!img.rgb) return;
    const int S = 336;
    float *got = malloc(sizeof(float) * 3 * S * S);
    double *want = malloc(sizeof(double) * 3 * S * S);
    CHECK_OK(ekv_image_preprocess_llava(&img, S, k_mean, k_std, got));
    ref_preprocess(img.rgb, img.nx, img.ny, S, want);
    /* Fixed-point vs double weights can round a resized value to the
     * neighbouring grey level (one level = 1/(255*std) after normalisation);
     * nearly all values must agree to 1e-5. */
    double one_level = 1.0 / (255.0 * 0.26130258) + 1e-5, maxd = 0;
    size_t exact = 0, n = (size_t)3 * S * S;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        if (d > maxd) maxd = d;
        if (d <= 1e-5) exact++;
    }
    printf("preprocess: %zu of %zu values within 1e-5 of the double reference, max diff %.3g\n",
           exact, n, maxd);
    CHECK_MSG(maxd <= one_level, "max diff %g > one grey level %g", maxd, one_level);
    CHECK_MSG(exact >= n - n / 1000, "only %zu of %zu within 1e-5", exact, n);
    /* The top rows come from the padding only: exactly the mean colour. */
    for (int c = 0; c < 3; c++) {
        double pad = ((int)(k_mean[c] * 255.0) / 255.0 - k_mean[c]) / k_std[c];
        CHECK_NEAR(got[(size_t)c * S * S + 5 * S + 100], pad, 1e-5);
    }
    /* The photo is in the middle: a skin pixel is far from the pad colour. */
    CHECK(fabs(got[(size_t)S * S / 2 + S / 2] - got[5 * S + 100]) > 0.1);

    /* The JPEG twin decodes to the same picture up to JPEG loss. */
    struct ekv_image jpg = {0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.jpg"), &jpg));
    CHECK(jpg.nx == 320 && jpg.ny == 200);
    if (jpg.rgb && jpg.nx == img.nx && jpg.ny == img.ny) {
        double sum = 0;
        for (size_t i = 0; i < (size_t)320 * 200 * 3; i++) sum += abs((int)jpg.rgb[i] - (int)img.rgb[i]);
        double mad = sum / (320.0 * 200 * 3);
        printf("jpeg vs png: mean abs difference %.2f grey levels\n", mad);
        CHECK_MSG(mad < 4.0, "JPEG differs from PNG by %.2f levels on average", mad);
    }
    ekv_image_free(&jpg);
    free(got);
    free(want);
    ekv_image_free(&img);
}

static void test_pad_and_resize_small(void) {
    /* 3 x 1 image -> 3 x 3 square, image on the middle row. */
    struct ekv_image a = {0}, sq = {0}, same = {0};
    const uint8_t red[3] = {200, 10, 20}, pad[3] = {1, 2, 3};
    CHECK_OK(ekv_image_new(3, 1, red, &a));
    a.rgb[3] = 77; /* middle pixel's red */
    CHECK_OK(ekv_image_pad_square(&a, pad, &sq));
    CHECK(sq.nx == 3 && sq.ny == 3);
    if (sq.rgb) {
        CHECK(sq.rgb[0] == 1 && sq.rgb[1] == 2 && sq.rgb[2] == 3);             /* (0,0) pad */
        CHECK(sq.rgb[(1 * 3 + 0) * 3] == 200 && sq.rgb[(1 * 3 + 1) * 3] == 77); /* row 1 image */
        CHECK(sq.rgb[(2 * 3 + 2) * 3 + 2] == 3);                                /* (2,2) pad */
        /* Same-size bicubic is the identity (scale 1, fraction 0). */
        CHECK_OK(ekv_image_resize_bicubic(&sq, 3, 3, &same));
        CHECK(same.rgb && memcmp(same.rgb, sq.rgb, 27) == 0);
    }
    /* Mean colour as LLaVA computes it. */
    uint8_t mc[3];
    ekv_image_mean_color(k_mean, mc);
    CHECK(mc[0] == 122 && mc[1] == 116 && mc[2] == 104);
    ekv_image_free(&a);
    ekv_image_free(&sq);
    ekv_image_free(&same);
}

static void test_image_errors(void) {
    struct ekv_image img = {0};
    /* Missing file. */
    CHECK(ekv_image_load_file(tu_src("data/images/no-such-file.png"), &img) == EKV_ERR_IO);
    CHECK(strstr(ekv_last_error(), "no-such-file.png") != NULL);
    CHECK(img.rgb == NULL);
    /* A directory is not an image. */
    CHECK(ekv_image_load_file(tu_src("data/images"), &img) == EKV_ERR_IO);
    CHECK(strstr(ekv_last_error(), "not a regular file") != NULL);
    /* Garbage bytes. */
    const char junk[] = "this is not an image at all, just some text";
    CHECK(ekv_image_load_memory(junk, sizeof junk, "junk", &img) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "junk") != NULL);
    /* Truncated PNG: the header is fine, the pixels are cut off. */
    size_t n = 0;
    char *png = tu_read_file(tu_src("data/images/astronaut_crop.png"), &n);
    CHECK(png != NULL && n > 1000);
    if (png) {
        size_t cuts[] = {n / 2, 100, 40, 8};
        for (size_t i = 0; i < EKV_ARRAY_LEN(cuts); i++) {
            enum ekv_status s = ekv_image_load_memory(png, cuts[i], "cut.png", &img);
            CHECK_MSG(s == EKV_ERR_FORMAT, "cut at %zu: %s", cuts[i], ekv_status_str(s));
            CHECK(img.rgb == NULL);
        }
        /* Truncated JPEG. */
        size_t jn = 0;
        char *jpg = tu_read_file(tu_src("data/images/astronaut_crop.jpg"), &jn);
        if (jpg) {
            enum ekv_status s = ekv_image_load_memory(jpg, jn / 3, "cut.jpg", &img);
            /* stb_image fills a truncated baseline JPEG's missing blocks, as
             * libjpeg does; either a clean error or a full-size image. */
            CHECK(s == EKV_ERR_FORMAT || (s == EKV_OK && img.nx == 320 && img.ny == 200));
            ekv_image_free(&img);
            free(jpg);
        }
        free(png);
    }
    /* A PNG header claiming 100000 x 100000 pixels: refused before decoding. */
    static const uint8_t huge[] = {
        0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n',
        0, 0, 0, 13, 'I', 'H', 'D', 'R',
        0x00, 0x01, 0x86, 0xa0, 0x00, 0x01, 0x86, 0xa0, /* 100000 x 100000 */
        8, 2, 0, 0, 0,                                  /* 8-bit RGB */
        0, 0, 0, 0,                                     /* CRC (stb does not check) */
        0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    enum ekv_status s = ekv_image_load_memory(huge, sizeof huge, "huge.png", &img);
    CHECK(s == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "too large") != NULL && strstr(ekv_last_error(), "100000") != NULL);
    printf("huge image: %s\n", ekv_last_error());
    CHECK(img.rgb == NULL);
    /* A JPEG whose frame header claims 65535 x 65535. */
    static const uint8_t huge_jpg[] = {0xff, 0xd8, 0xff, 0xe0, 0x00, 0x04, 0x00, 0x00,
                                       0xff, 0xc0, 0x00, 0x11, 0x08, 0xff, 0xff, 0xff, 0xff, 0x03,
                                       0x01, 0x22, 0x00, 0x02, 0x11, 0x01, 0x03, 0x11, 0x01,
                                       0xff, 0xd9};
    s = ekv_image_load_memory(huge_jpg, sizeof huge_jpg, "huge.jpg", &img);
    CHECK(s == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "65535 x 65535") != NULL);
    CHECK(img.rgb == NULL);
    /* A grey 3 x 2 PNG whose first IDAT chunk is empty (stb_image would offset a NULL
     * pointer): refused, with its CRC and cut inside it (fuzz_image found both). */
    static const uint8_t empty_idat[] = {
        0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n',
        0, 0, 0, 13, 'I', 'H', 'D', 'R', 0, 0, 0, 3, 0, 0, 0, 2, 8, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 'I', 'D', 'A', 'T', 0x35, 0xaf, 0x06, 0x1e,
        0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    const size_t cuts_idat[] = {sizeof empty_idat, 45, 44, 41};
    for (size_t i = 0; i < EKV_ARRAY_LEN(cuts_idat); i++) {
        s = ekv_image_load_memory(empty_idat, cuts_idat[i], "idat.png", &img);
        CHECK_MSG(s == EKV_ERR_FORMAT && strstr(ekv_last_error(), "empty first IDAT") != NULL,
                  "cut at %zu: %s: %s", cuts_idat[i], ekv_status_str(s), ekv_last_error());
        CHECK(img.rgb == NULL);
    }
    /* A JPEG Huffman table of more than 256 codes (stb_image would write past its
     * 257-entry array), behind a start marker with a fill byte (FF FF D8): refused.
     * fuzz_image's input, corpus/image/crash_jpeg_huffman_fill_soi. */
    size_t hn = 0;
    char *huff = tu_read_file(tu_src("tests/fuzz/corpus/image/crash_jpeg_huffman_fill_soi"), &hn);
    CHECK(huff != NULL && hn > 40);
    if (huff) {
        s = ekv_image_load_memory(huff, hn, "huff.jpg", &img);
        CHECK_MSG(s == EKV_ERR_FORMAT && strstr(ekv_last_error(), "Huffman table of 488 codes") != NULL, "%s: %s",
                  ekv_status_str(s), ekv_last_error());
        CHECK(img.rgb == NULL);
        free(huff);
    }
    /* Same through a file. */
    char path[256];
    snprintf(path, sizeof path, "%s/huge.png", g_dir);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(huge, 1, sizeof huge, f);
        fclose(f);
        CHECK(ekv_image_load_file(path, &img) == EKV_ERR_INVALID_ARG);
    }
    /* Preprocessing with a bad std. */
    struct ekv_image one = {0};
    const uint8_t px[3] = {1, 2, 3};
    CHECK_OK(ekv_image_new(1, 1, px, &one));
    float out[3 * 4], bad_std[3] = {0.2f, 0.0f, 0.2f};
    CHECK(ekv_image_preprocess_llava(&one, 2, k_mean, bad_std, out) == EKV_ERR_INVALID_ARG);
    ekv_image_free(&one);
}

/* ------------------------------------------------------------------ */
/* ViT reference (double) on a tiny-vlm mmproj written by ekv mkmodel   */
/* ------------------------------------------------------------------ */

/* LLaVA-1.5 projector with tanh-GELU, on the patch rows. */
static void ref_project(struct ekv_gguf_file *f, const struct ekv_clip_hparams *hp, const double *feat,
                        double *out) {
    const float *w0 = T(f, "mm.0.weight"), *b0 = T(f, "mm.0.bias");
    const float *w2 = T(f, "mm.2.weight"), *b2 = T(f, "mm.2.bias");
    if (!w0 || !b0 || !w2 || !b2) return;
    double *mid = malloc(sizeof(double) * hp->n_mm);
    for (int r = 0; r < hp->n_patches; r++) {
        ref_linear(mid, w0, b0, feat + (size_t)r * hp->n_embd, hp->n_embd, hp->n_mm);
        for (int i = 0; i < hp->n_mm; i++) {
            double z = mid[i];
            mid[i] = 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
        }
        ref_linear(out + (size_t)r * hp->n_embd_out, w2, b2, mid, hp->n_mm, hp->n_embd_out);
    }
    free(mid);
}

static void test_vit(void) {
    char lm[256], mm[256], args[1024];
    snprintf(lm, sizeof lm, "%s/tiny.gguf", g_dir);
    snprintf(mm, sizeof mm, "%s/tiny-mmproj.gguf", g_dir);
    snprintf(args, sizeof args, "--preset tiny-vlm --type f32 --seed 7 -o '%s' --mmproj-out '%s'", lm, mm);
    int rc = tu_mkmodel(args);
    CHECK_MSG(rc == 0, "ekv mkmodel failed (%d); is %s/ekv built?", rc, EKV_BINARY_DIR);
    if (rc != 0) return;

    struct ekv_clip *c = NULL;
    CHECK_OK(ekv_clip_load(mm, &c));
    if (!c) return;
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
    CHECK(hp->image_size == 56 && hp->patch_size == 14 && hp->n_embd == 64 && hp->n_head == 4);
    CHECK(hp->n_ff == 128 && hp->n_layer == 3 && hp->n_layer_run == 2 && hp->has_class);
    CHECK(hp->n_pos == 17 && hp->n_mm == 64);
    CHECK(ekv_clip_n_patches(c) == 16); /* image tokens = (56/14)^2 */
    CHECK(ekv_clip_n_embd_out(c) == 64);
    CHECK(!hp->use_gelu);
    for (int i = 0; i < 3; i++) {
        CHECK(hp->image_mean[i] == k_mean[i]);
        CHECK(hp->image_std[i] == k_std[i]);
    }

    struct ekv_gguf_file *f = NULL;
    CHECK_OK(ekv_gguf_open(mm, &f));
    if (!f) {
        ekv_clip_free(c);
        return;
    }
    const int S = hp->image_size, E = hp->n_embd, N = hp->n_pos;
    float *pix = malloc(sizeof(float) * 3 * S * S);
    struct ekv_image img = {0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.png"), &img));
    CHECK_OK(ekv_clip_preprocess(c, &img, pix));

    /* Tolerances. Everything here is f32 weights and f32 activations
     * against double; a float32 sum of <= 588 products of O(1) terms is off
     * by ~1e-6 at worst. Embeddings (then LayerNorm, values O(1)): 2e-5
     * absolute. One block: 1e-5 absolute (its MLP and attention add only
     * ~1e-2..1e-1 to the residual at these weight scales, so a looser bound
     * would miss e.g. a wrong quick-GELU constant, which moves it by 1e-4).
     * Whole tower + projector (outputs ~0.07): 1e-6 + 1e-5 * max|ref|. */
    float *x = malloc(sizeof(float) * N * E);
    double *xr = calloc((size_t)N * E, sizeof(double));
    CHECK_OK(ekv_clip_embed(c, NULL, pix, x));
    ref_embed(f, hp, pix, xr);
    double mref, d = max_abs_diff_fd(x, xr, (size_t)N * E, &mref);
    printf("embeddings: max |diff| %.3g (max |ref| %.3g)\n", d, mref);
    CHECK_MSG(d <= 2e-5, "embeddings differ by %g", d);
    CHECK(mref > 0.5); /* not all zeros */

    /* One block from the same input. */
    for (size_t i = 0; i < (size_t)N * E; i++) xr[i] = x[i];
    float *x1 = malloc(sizeof(float) * N * E);
    memcpy(x1, x, sizeof(float) * N * E);
    CHECK_OK(ekv_clip_block(c, NULL, 0, x1));
    ref_block(f, hp, 0, xr);
    d = max_abs_diff_fd(x1, xr, (size_t)N * E, &mref);
    printf("block 0: max |diff| %.3g (max |ref| %.3g)\n", d, mref);
    CHECK_MSG(d <= 1e-5, "block 0 differs by %g", d);
    /* The block changed its input (a block that did nothing would pass
     * a reference that also did nothing). */
    double moved = 0;
    for (size_t i = 0; i < (size_t)N * E; i++) moved = fmax(moved, fabs((double)x1[i] - x[i]));
    CHECK(moved > 1e-3);

    /* The same block on a 2-thread pool. */
    struct ekv_pool *pool = NULL;
    CHECK_OK(ekv_pool_new(2, &pool));
    float *x2 = malloc(sizeof(float) * N * E);
    memcpy(x2, x, sizeof(float) * N * E);
    CHECK_OK(ekv_clip_block(c, pool, 0, x2));
    d = max_abs_diff_fd(x2, xr, (size_t)N * E, NULL);
    CHECK_MSG(d <= 1e-5, "block 0 on a pool differs by %g", d);

    /* Whole tower: embeddings, blocks 0..n_layer_run-1 (second to last),
     * projector. */
    int np = ekv_clip_n_patches(c), no = ekv_clip_n_embd_out(c);
    float *emb = malloc(sizeof(float) * np * no);
    double *embr = calloc((size_t)np * no, sizeof(double));
    CHECK_OK(ekv_clip_encode_pixels(c, pool, pix, emb));
    ref_embed(f, hp, pix, xr);
    for (int il = 0; il < hp->n_layer_run; il++) ref_block(f, hp, il, xr);
    ref_project(f, hp, xr + E /* skip the class token */, embr);
    d = max_abs_diff_fd(emb, embr, (size_t)np * no, &mref);
    printf("image embeddings [%d][%d]: max |diff| %.3g (max |ref| %.3g)\n", np, no, d, mref);
    const double tol_out = 1e-6 + 1e-5 * mref;
    CHECK_MSG(d <= tol_out, "image embeddings differ by %g (tolerance %g)", d, tol_out);
    CHECK(mref > 0.01);

    /* Encoding the file gives the same embeddings as encoding its pixels. */
    float *emb2 = malloc(sizeof(float) * np * no);
    CHECK_OK(ekv_clip_encode_file(c, NULL, tu_src("data/images/astronaut_crop.png"), emb2));
    d = max_abs_diff_fd(emb2, embr, (size_t)np * no, NULL);
    CHECK_MSG(d <= tol_out, "encode_file differs by %g", d);
    CHECK(ekv_clip_encode_file(c, NULL, tu_src("data/images/none.png"), emb2) == EKV_ERR_IO);
    CHECK(ekv_clip_block(c, NULL, 3, x2) == EKV_ERR_INVALID_ARG);

    free(emb2);
    free(emb);
    free(embr);
    free(x2);
    ekv_pool_free(pool);
    free(x1);
    free(x);
    free(xr);
    free(pix);
    ekv_image_free(&img);
    ekv_gguf_close(f);
    ekv_clip_free(c);

    /* The language model file is a loadable llama GGUF with stories-sized shapes. */
    struct ekv_gguf_file *lf = NULL;
    CHECK_OK(ekv_gguf_open(lm, &lf));
    if (lf) {
        struct ekv_gguf_str arch;
        CHECK_OK(ekv_gguf_get_str(lf, "general.architecture", &arch));
        CHECK(ekv_gguf_str_eq(arch, "llama"));
        uint32_t v = 0;
        CHECK_OK(ekv_gguf_get_u32(lf, "llama.embedding_length", &v));
        CHECK(v == 64);
        CHECK(ekv_gguf_n_tensors(lf) == 1 + 5 * 9 + 2);
        const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(lf, "blk.4.ffn_down.weight");
        CHECK(t && t->ne[0] == 172 && t->ne[1] == 64);
        ekv_gguf_close(lf);
    }
}

/* The same tower (same seed) with f16, q8_0 and q4_0 matrices: loads,
 * encodes, and lands near the f32 result. The bound is loose on purpose
 * (quantisation error, not arithmetic): relative RMS error of the image
 * embeddings below 0.2% (f16), 2% (q8_0), 20% (q4_0); measured 0.02%,
 * 0.6%, 6%. */
static void test_quantized_towers(void) {
    static const char *const types[] = {"f32", "f16", "q8_0", "q4_0"};
    static const double max_rel[] = {0.0, 0.002, 0.02, 0.20};
    float *ref = NULL;
    size_t n = 0;
    for (int ti = 0; ti < 4; ti++) {
        char lm[256], mm[256], args[1024];
        snprintf(lm, sizeof lm, "%s/q_%s.gguf", g_dir, types[ti]);
        snprintf(mm, sizeof mm, "%s/q_%s-mmproj.gguf", g_dir, types[ti]);
        snprintf(args, sizeof args, "--preset tiny-vlm --type %s --seed 11 -o '%s' --mmproj-out '%s'",
                 types[ti], lm, mm);
        int rc = tu_mkmodel(args);
        CHECK_MSG(rc == 0, "mkmodel --type %s failed", types[ti]);
        struct ekv_clip *c = NULL;
        if (rc != 0) continue;
        CHECK_OK(ekv_clip_load(mm, &c));
        if (!c) continue;
        n = (size_t)ekv_clip_n_patches(c) * (size_t)ekv_clip_n_embd_out(c);
        float *out = malloc(n * sizeof(float));
        CHECK_OK(ekv_clip_encode_file(c, NULL, tu_src("data/images/astronaut_crop.jpg"), out));
        if (ti == 0) {
            ref = out;
        } else if (ref) {
            double num = 0, den = 0;
            for (size_t i = 0; i < n; i++) {
                num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
                den += (double)ref[i] * ref[i];
            }
            double rel = sqrt(num / den);
            printf("tower with %s matrices: relative RMS difference to f32 %.4f\n", types[ti], rel);
            CHECK_MSG(rel > 0.0 && rel < max_rel[ti], "%s: relative error %g", types[ti], rel);
            free(out);
        } else {
            free(out);
        }
        ekv_clip_free(c);
    }
    free(ref);
}

/* A SigLIP-style tower derived from the tiny CLIP one: no class token,
 * 16 position rows, a patch bias, no pre-LayerNorm, tanh-GELU MLP. */
static void test_siglip_layout(void) {
    char src[256], dst[256];
    snprintf(src, sizeof src, "%s/tiny-mmproj.gguf", g_dir);
    snprintf(dst, sizeof dst, "%s/siglip-mmproj.gguf", g_dir);
    struct ekv_gguf_file *f = NULL;
    CHECK_OK(ekv_gguf_open(src, &f));
    if (!f) return;
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_writer_new(&w));
    for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) CHECK_OK(ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(f, i)));
    CHECK_OK(ekv_gguf_writer_set_bool(w, "clip.use_gelu", true));
    float bias[64];
    for (int i = 0; i < 64; i++) bias[i] = 0.05f * (float)((i * 37) % 11 - 5);
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        if (!strcmp(t->name, "v.class_embd") || !strncmp(t->name, "v.pre_ln.", 9)) continue;
        if (!strcmp(t->name, "v.position_embd.weight")) {
            int64_t ne[2] = {t->ne[0], t->ne[1] - 1};
            CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, t->type, 2, ne,
                                            (const float *)t->data + t->ne[0], NULL, NULL));
            continue;
        }
        CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
    }
    int64_t ne1 = 64;
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "v.patch_embd.bias", EKV_F32, 1, &ne1, bias, NULL, NULL));
    CHECK_OK(ekv_gguf_writer_write(w, dst));
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);

    struct ekv_clip *c = NULL;
    CHECK_OK(ekv_clip_load(dst, &c));
    CHECK_OK(ekv_gguf_open(dst, &f));
    if (!c || !f) {
        ekv_clip_free(c);
        ekv_gguf_close(f);
        return;
    }
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
    CHECK(!hp->has_class && hp->n_pos == 16 && hp->use_gelu);
    CHECK(ekv_clip_n_patches(c) == 16);
    const int S = hp->image_size, E = hp->n_embd, np = hp->n_patches, no = hp->n_embd_out;
    float *pix = malloc(sizeof(float) * 3 * S * S), *out = malloc(sizeof(float) * np * no);
    float *x = malloc(sizeof(float) * np * E);
    double *xr = calloc((size_t)np * E, sizeof(double)), *outr = calloc((size_t)np * no, sizeof(double));
    struct ekv_image img = {0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.png"), &img));
    CHECK_OK(ekv_clip_preprocess(c, &img, pix));
    CHECK_OK(ekv_clip_embed(c, NULL, pix, x));
    ref_embed(f, hp, pix, xr);
    double mref, d = max_abs_diff_fd(x, xr, (size_t)np * E, &mref);
    printf("siglip embeddings: max |diff| %.3g (max |ref| %.3g)\n", d, mref);
    CHECK_MSG(d <= 2e-5 && mref > 0.05, "siglip embeddings differ by %g", d);
    CHECK_OK(ekv_clip_encode_pixels(c, NULL, pix, out));
    for (int il = 0; il < hp->n_layer_run; il++) ref_block(f, hp, il, xr);
    ref_project(f, hp, xr, outr);
    d = max_abs_diff_fd(out, outr, (size_t)np * no, &mref);
    printf("siglip image embeddings: max |diff| %.3g (max |ref| %.3g)\n", d, mref);
    CHECK_MSG(d <= 1e-6 + 1e-5 * mref, "siglip image embeddings differ by %g", d);
    free(pix); free(out); free(x); free(xr); free(outr);
    ekv_image_free(&img);
    ekv_gguf_close(f);
    ekv_clip_free(c);
}

/* Byte-patches a copy of the mmproj and checks the load error names the problem. */
static void expect_load_error(const char *src, const char *find, size_t off, const void *bytes,
                              size_t nb, enum ekv_status want, const char *needle) {
    size_t n = 0;
    char *buf = tu_read_file(src, &n);
    if (!buf) {
        CHECK(buf != NULL);
        return;
    }
    char *at = memmem(buf, n, find, strlen(find));
    CHECK_MSG(at != NULL, "'%s' not in the file", find);
    if (at) {
        memcpy(at + off, bytes, nb);
        char path[256];
        snprintf(path, sizeof path, "%s/broken.gguf", g_dir);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(buf, 1, n, f);
            fclose(f);
        }
        struct ekv_clip *c = NULL;
        enum ekv_status s = ekv_clip_load(path, &c);
        CHECK_MSG(s == want, "patched '%s': got %s (%s)", find, ekv_status_str(s), ekv_last_error());
        CHECK_MSG(strstr(ekv_last_error(), needle) != NULL, "message '%s' lacks '%s'", ekv_last_error(),
                  needle);
        CHECK(c == NULL);
        ekv_clip_free(c);
    }
    free(buf);
}

static void test_clip_errors(void) {
    char mm[256];
    snprintf(mm, sizeof mm, "%s/tiny-mmproj.gguf", g_dir);
    struct ekv_clip *c = NULL;
    CHECK(ekv_clip_load(tu_src("data/images/none.gguf"), &c) == EKV_ERR_IO);
    CHECK(ekv_clip_load(tu_src("data/images/astronaut_crop.png"), &c) == EKV_ERR_FORMAT);
    if (access(mm, R_OK) != 0) return;
    /* Key "clip.vision.image_size": after the name come the type (u32) and value. */
    const char *k = "clip.vision.image_size";
    uint32_t v70 = 70; /* 5 x 5 patches: 26 positions, the file has 17 */
    expect_load_error(mm, k, strlen(k) + 4, &v70, 4, EKV_ERR_FORMAT, "v.position_embd.weight");
    uint32_t v50 = 50; /* not a multiple of 14 */
    expect_load_error(mm, k, strlen(k) + 4, &v50, 4, EKV_ERR_FORMAT, "patch_size");
    const char *e = "clip.vision.embedding_length";
    uint32_t v32 = 32;
    expect_load_error(mm, e, strlen(e) + 4, &v32, 4, EKV_ERR_FORMAT, "v.class_embd");
    /* A renamed tensor: the loader names the one that is missing. */
    expect_load_error(mm, "v.blk.1.ffn_up.weight", 12, "q", 1, EKV_ERR_NOT_FOUND,
                      "v.blk.1.ffn_up.weight");
    expect_load_error(mm, "mm.2.bias", 0, "mx", 2, EKV_ERR_NOT_FOUND, "mm.2.bias");
    /* Projector type other than mlp. */
    expect_load_error(mm, "mlp", 0, "ldp", 3, EKV_ERR_UNSUPPORTED, "ldp");
    /* A language model is not an mmproj. */
    char lm[256];
    snprintf(lm, sizeof lm, "%s/tiny.gguf", g_dir);
    CHECK(ekv_clip_load(lm, &c) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "mmproj") != NULL);
}

/* Copy of the tiny mmproj with clip.vision.feature_layer set to `vals`. */
static enum ekv_status load_with_feature_layer(const int32_t *vals, int n, struct ekv_clip **out) {
    char src[256], dst[256];
    snprintf(src, sizeof src, "%s/tiny-mmproj.gguf", g_dir);
    snprintf(dst, sizeof dst, "%s/feature-mmproj.gguf", g_dir);
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *w = NULL;
    enum ekv_status s = ekv_gguf_open(src, &f);
    if (s == EKV_OK) s = ekv_gguf_writer_new(&w);
    for (size_t i = 0; s == EKV_OK && i < ekv_gguf_n_kv(f); i++) s = ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(f, i));
    if (s == EKV_OK) s = ekv_gguf_writer_set_arr(w, "clip.vision.feature_layer", GGUF_TYPE_INT32, vals, (uint64_t)n);
    for (size_t i = 0; s == EKV_OK && i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        s = ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL);
    }
    if (s == EKV_OK) s = ekv_gguf_writer_write(w, dst);
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
    CHECK_OK(s);
    return s == EKV_OK ? ekv_clip_load(dst, out) : s;
}

/* clip.vision.feature_layer k = the output of k blocks (0 = embeddings). */
static void test_feature_layer(void) {
    struct ekv_clip *c = NULL;
    int32_t all = 3, first = 1, too_deep = 4, two[2] = {1, 2};
    CHECK_OK(load_with_feature_layer(&all, 1, &c));
    CHECK(c && ekv_clip_hparams(c)->n_layer_run == 3);
    ekv_clip_free(c);
    c = NULL;
    CHECK_OK(load_with_feature_layer(&first, 1, &c));
    CHECK(c && ekv_clip_hparams(c)->n_layer_run == 1);
    ekv_clip_free(c);
    c = NULL;
    CHECK(load_with_feature_layer(&too_deep, 1, &c) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "feature_layer") != NULL);
    CHECK(load_with_feature_layer(two, 2, &c) == EKV_ERR_UNSUPPORTED);
    CHECK(c == NULL);
}

/* Seeded random byte mutations of the tiny mmproj's header, metadata and
 * tensor table: every load either succeeds or fails with a message; none
 * crashes (run under ASan/UBSan in the sanitizer build). A load that
 * succeeds must also encode without error. */
static void test_clip_mutations(void) {
    char src[256], dst[256];
    snprintf(src, sizeof src, "%s/tiny-mmproj.gguf", g_dir);
    snprintf(dst, sizeof dst, "%s/mutant.gguf", g_dir);
    size_t n = 0;
    char *orig = tu_read_file(src, &n);
    if (!orig) return;
    struct ekv_gguf_file *f = NULL;
    size_t meta_end = 4096;
    if (ekv_gguf_open(src, &f) == EKV_OK) {
        meta_end = ekv_gguf_data_offset(f);
        ekv_gguf_close(f);
    }
    char *buf = malloc(n);
    uint64_t st = 12345;
    int loaded = 0, failed = 0, silent = 0;
    float *out = malloc(sizeof(float) * 16 * 64);
    for (int it = 0; it < 300; it++) {
        memcpy(buf, orig, n);
        int nmut = 1 + (int)(st % 4);
        for (int m = 0; m < nmut; m++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(st >> 33) % meta_end;
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            buf[pos] = (char)(st >> 56);
        }
        FILE *fo = fopen(dst, "wb");
        if (!fo) break;
        fwrite(buf, 1, n, fo);
        fclose(fo);
        struct ekv_clip *c = NULL;
        ekv_err_clear();
        enum ekv_status s = ekv_clip_load(dst, &c);
        if (s == EKV_OK) {
            loaded++;
            const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
            if (hp->n_patches * hp->n_embd_out <= 16 * 64)
                CHECK_OK(ekv_clip_encode_file(c, NULL, tu_src("data/images/astronaut_crop.png"), out));
            ekv_clip_free(c);
        } else {
            failed++;
            if (ekv_last_error()[0] == 0) silent++;
            CHECK(c == NULL);
        }
    }
    printf("mmproj mutations: %d loaded, %d refused, %d refused without a message\n", loaded, failed,
           silent);
    CHECK(silent == 0);
    CHECK(failed > 0);
    free(out);
    free(buf);
    free(orig);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_pad_and_resize_small();
    test_resize_vector();
    test_preprocess_photo();
    test_image_errors();
    test_vit();
    test_clip_errors();
    test_siglip_layout();
    test_feature_layer();
    test_clip_mutations();
    test_quantized_towers();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_vision");
}
