/*
 * test_idefics3.c — the SmolVLM / Idefics3 image path (projector type
 * "idefics3") on a tiny-smolvlm pair written by `ekv mkmodel`:
 *  - Pillow's Lanczos resize against the double reference (vision_ref.c);
 *  - the tiling grid on hand-computed cases;
 *  - the pixel shuffle against Hugging Face's view/permute chain, step by step;
 *  - the SigLIP tower, post-LayerNorm, shuffle and connector against the
 *    double reference, and a whole image (tiles, then the overview) against
 *    the same steps composed here;
 *  - agreement with llama.cpp's mtmd, recorded by the probes of
 *    docs/models.md on this exact file and image (tile norms, sampled
 *    embedding values and the greedy tokens);
 *  - the prompt: separator tokens between the tiles as mtmd splices them,
 *    positions, spans; a vocabulary without them; hostile mmproj files.
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

static char g_dir[] = "/tmp/ekv_test_idefics3_XXXXXX";
static char g_lm[256], g_mm[256];

/* ---- Lanczos ---- */

static void test_lanczos(void) {
    const int sizes[][4] = {{336, 336, 64, 64}, {320, 200, 64, 40}, {64, 40, 64, 64}, {64, 64, 32, 32},
                            {7, 5, 64, 33}, {500, 300, 2048, 1228}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        check_resize_vs_ref(true, sizes[k][0], sizes[k][1], sizes[k][2], sizes[k][3], 777u + (uint32_t)k);
    /* Lanczos is not bicubic: the same shrink differs somewhere */
    struct ekv_image a = {0}, l = {0}, c = {0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.png"), &a));
    CHECK_OK(ekv_image_resize(&a, 64, 40, EKV_RESAMPLE_LANCZOS, &l));
    CHECK_OK(ekv_image_resize(&a, 64, 40, EKV_RESAMPLE_BICUBIC, &c));
    CHECK(l.rgb && c.rgb && memcmp(l.rgb, c.rgb, 64 * 40 * 3) != 0);
    struct ekv_image crop = {0};
    CHECK(ekv_image_crop(&a, 300, 0, 32, 32, &crop) == EKV_ERR_INVALID_ARG); /* past the right edge */
    CHECK(ekv_image_crop(&a, -1, 0, 8, 8, &crop) == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_image_crop(&a, 288, 168, 32, 32, &crop));
    CHECK(crop.rgb && !memcmp(crop.rgb, a.rgb + ((size_t)168 * 320 + 288) * 3, 32 * 3));
    ekv_image_free(&a);
    ekv_image_free(&l);
    ekv_image_free(&c);
    ekv_image_free(&crop);
}

/* ---- pixel shuffle against HF's chain of views and permutes ---- */

/* x.view(h, w/s, e*s).permute(1, 0, 2).reshape(w/s, h/s, e*s*s).permute(1, 0, 2),
 * each permute materialised. in: [g*g][e] -> out [(g/s)^2][e*s*s]. */
static void hf_pixel_shuffle(const float *in, int g, int e, int s, float *out) {
    const int h = g, w = g, ws = w / s, hs = h / s, es = e * s, ess = e * s * s;
    float *b = malloc(sizeof(float) * (size_t)g * g * e); /* B [ws][h][es] */
    for (int j = 0; j < ws; j++)
        for (int i = 0; i < h; i++)
            for (int k = 0; k < es; k++) b[((size_t)j * h + i) * es + k] = in[((size_t)i * ws + j) * es + k];
    /* the reshape is a view of B's bytes, C [ws][hs][ess]; out = C permuted to [hs][ws][ess] */
    for (int i = 0; i < hs; i++)
        for (int j = 0; j < ws; j++)
            for (int m = 0; m < ess; m++) out[((size_t)i * ws + j) * ess + m] = b[((size_t)j * hs + i) * ess + m];
    free(b);
}

static void test_pixel_shuffle(void) {
    const int cases[][3] = {{8, 3, 2}, {8, 5, 4}, {4, 64, 2}, {32, 7, 4}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int g = cases[k][0], e = cases[k][1], s = cases[k][2];
        const size_t n = (size_t)g * g * e;
        float *in = malloc(n * sizeof *in), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) in[i] = (float)i;
        ekv_clip_pixel_shuffle(in, g, e, s, a);
        hf_pixel_shuffle(in, g, e, s, b);
        CHECK_MSG(!memcmp(a, b, n * sizeof *a), "pixel shuffle g %d e %d s %d differs from HF's chain", g, e, s);
        free(in), free(a), free(b);
    }
    /* a hand case: 4x4 patches of width 1 valued by position, s = 2: token 0 holds
     * patches (0,0) (0,1) (1,0) (1,1); token 1 (0,2) (0,3) (1,2) (1,3) */
    float in[16], out[16];
    for (int i = 0; i < 16; i++) in[i] = (float)i;
    ekv_clip_pixel_shuffle(in, 4, 1, 2, out);
    const float want[16] = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};
    CHECK(!memcmp(out, want, sizeof want));
}

/* ---- the tower against the double reference ---- */

static struct ekv_clip *load_tiny(struct ekv_gguf_file **f) {
    struct ekv_clip *c = NULL;
    CHECK_OK(ekv_clip_load(g_mm, &c));
    CHECK_OK(ekv_gguf_open(g_mm, f));
    return c;
}

/* Tower + post-LN + shuffle + connector, in double: out [n_tile_tokens][n_embd_out]. */
static void ref_tile(struct ekv_gguf_file *f, const struct ekv_clip_hparams *hp, const float *pix, double *out) {
    const int E = hp->n_embd, N = hp->n_pos, s = hp->scale_factor, g = hp->image_size / hp->patch_size;
    double *x = calloc((size_t)N * E, sizeof *x), *t = malloc(sizeof(double) * E);
    ref_embed(f, hp, pix, x);
    for (int il = 0; il < hp->n_layer_run; il++) ref_block(f, hp, il, x);
    const float *pw = T(f, "v.post_ln.weight"), *pb = T(f, "v.post_ln.bias"), *fc = T(f, "mm.model.fc.weight");
    float *xf = malloc(sizeof(float) * N * E), *sh = malloc(sizeof(float) * N * E);
    double *shd = malloc(sizeof(double) * N * E);
    for (int r = 0; r < N && pw && pb; r++) {
        ref_ln(t, x + (size_t)r * E, pw, pb, E, hp->eps);
        for (int e = 0; e < E; e++) xf[(size_t)r * E + e] = (float)t[e];
    }
    /* the shuffle only moves values: done on floats, widened back (exact) */
    hf_pixel_shuffle(xf, g, E, s, sh);
    for (size_t i = 0; i < (size_t)N * E; i++) shd[i] = sh[i];
    for (int r = 0; r < hp->n_tile_tokens && fc; r++)
        ref_linear(out + (size_t)r * hp->n_embd_out, fc, NULL, shd + (size_t)r * E * s * s, E * s * s, hp->n_embd_out);
    free(x), free(t), free(xf), free(sh), free(shd);
}

static void test_tower(void) {
    struct ekv_gguf_file *f = NULL;
    struct ekv_clip *c = load_tiny(&f);
    if (!c || !f) {
        ekv_clip_free(c);
        ekv_gguf_close(f);
        return;
    }
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(c);
    CHECK(hp->proj == EKV_CLIP_PROJ_IDEFICS3 && !hp->has_class && hp->use_gelu);
    CHECK(hp->image_size == 32 && hp->patch_size == 8 && hp->n_patches == 16 && hp->scale_factor == 2);
    CHECK(hp->n_tile_tokens == 4 && hp->longest_edge == 64 && hp->n_layer_run == hp->n_layer && hp->n_layer == 3);
    CHECK(ekv_clip_n_tile_tokens(c) == 4 && ekv_clip_n_embd_out(c) == 64);
    for (int i = 0; i < 3; i++) CHECK(hp->image_mean[i] == 0.5f && hp->image_std[i] == 0.5f);

    /* one tile: the overview of the photo, as the pipeline makes it */
    const int S = hp->image_size, no = hp->n_embd_out, nt = hp->n_tile_tokens;
    struct ekv_image img = {0}, ov = {0};
    CHECK_OK(ekv_image_load_file(tu_src("data/images/astronaut_crop.png"), &img));
    CHECK_OK(ekv_image_resize(&img, S, S, EKV_RESAMPLE_LANCZOS, &ov));
    float *pix = malloc(sizeof(float) * 3 * S * S), *out = malloc(sizeof(float) * nt * no);
    double *want = calloc((size_t)nt * no, sizeof *want);
    if (ov.rgb) ekv_image_normalize(&ov, hp->image_mean, hp->image_std, pix);
    CHECK_OK(ekv_clip_encode_pixels(c, NULL, pix, out));
    ref_tile(f, hp, pix, want);
    double mref, d = max_abs_diff_fd(out, want, (size_t)nt * no, &mref);
    printf("idefics3 tile embeddings [%d][%d]: max |diff| %.3g (max |ref| %.3g)\n", nt, no, d, mref);
    /* f32 against double through 3 blocks, a LayerNorm and a 256-wide map: as test_vision's tower */
    CHECK_MSG(d <= 1e-6 + 1e-5 * mref && mref > 0.1, "idefics3 tile embeddings differ by %g", d);

    /* a whole image: 320x200 -> 64x40 (Lanczos) -> 64x64 -> 2 x 2 tiles + the overview of
     * the refined image; the same steps composed here give the same rows in that order */
    int gx, gy;
    ekv_clip_idefics3_grid(c, img.nx, img.ny, &gx, &gy);
    CHECK(gx == 2 && gy == 2);
    CHECK(ekv_clip_image_rows(c, img.nx, img.ny) == 5 * nt);
    float *all = malloc(sizeof(float) * 5 * nt * no), *one = malloc(sizeof(float) * nt * no);
    struct ekv_pool *pool = NULL;
    CHECK_OK(ekv_pool_new(2, &pool));
    CHECK_OK(ekv_clip_encode_image(c, pool, &img, all));
    struct ekv_image r1 = {0}, r2 = {0}, part = {0};
    CHECK_OK(ekv_image_resize(&img, 64, 40, EKV_RESAMPLE_LANCZOS, &r1));
    CHECK_OK(ekv_image_resize(&r1, 64, 64, EKV_RESAMPLE_LANCZOS, &r2));
    for (int t = 0; t < 5 && r2.rgb; t++) {
        if (t < 4) CHECK_OK(ekv_image_crop(&r2, (t % 2) * S, (t / 2) * S, S, S, &part));
        else CHECK_OK(ekv_image_resize(&r2, S, S, EKV_RESAMPLE_LANCZOS, &part));
        if (!part.rgb) break;
        ekv_image_normalize(&part, hp->image_mean, hp->image_std, pix);
        CHECK_OK(ekv_clip_encode_pixels(c, NULL, pix, one));
        CHECK_MSG(!memcmp(one, all + (size_t)t * nt * no, sizeof(float) * nt * no), "tile %d differs", t);
        ekv_image_free(&part);
    }
    ekv_pool_free(pool);
    ekv_image_free(&r1), ekv_image_free(&r2), ekv_image_free(&img), ekv_image_free(&ov);
    free(pix), free(out), free(want), free(all), free(one);
    ekv_gguf_close(f);
    ekv_clip_free(c);
}

/* The grid on hand-computed sizes (longest edge 64, tiles of 32; then 200). */
static void test_grid(void) {
    struct ekv_gguf_file *f = NULL;
    struct ekv_clip *c = load_tiny(&f);
    ekv_gguf_close(f);
    if (!c) return;
    /* 336x336 -> 64x64: 2x2. 500x300 -> 64 x (int)(64/1.667) = 38: 2x2. 1000x100 -> 64x6: 2x1.
     * 100x1000 -> 6x64: 1x2. 3000x1 -> 64 x max(0, 1) = 1, made even = 2: 2x1. 20x20 -> 64x64. */
    const int cases[][4] = {{336, 336, 2, 2}, {500, 300, 2, 2}, {1000, 100, 2, 1},
                            {100, 1000, 1, 2}, {3000, 1, 2, 1}, {20, 20, 2, 2}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int gx, gy;
        ekv_clip_idefics3_grid(c, cases[k][0], cases[k][1], &gx, &gy);
        CHECK_MSG(gx == cases[k][2] && gy == cases[k][3], "%dx%d: grid %dx%d", cases[k][0], cases[k][1], gx, gy);
    }
    int gx = -1, gy = -1;
    ekv_clip_idefics3_grid(c, 0, 10, &gx, &gy);
    CHECK(gx == 0 && gy == 0);
    ekv_clip_free(c);

    /* the same tower with a longest edge of 200: 500x300 -> 200x120: 7x4 tiles */
    char dst[300];
    snprintf(dst, sizeof dst, "%s/edge200.mmproj.gguf", g_dir);
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_open(g_mm, &f));
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!f || !w) {
        ekv_gguf_close(f);
        ekv_gguf_writer_free(w);
        return;
    }
    for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) CHECK_OK(ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(f, i)));
    CHECK_OK(ekv_gguf_writer_set_u32(w, "clip.vision.preproc_image_size", 200));
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
    }
    CHECK_OK(ekv_gguf_writer_write(w, dst));
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
    c = NULL;
    CHECK_OK(ekv_clip_load(dst, &c));
    if (!c) return;
    ekv_clip_idefics3_grid(c, 500, 300, &gx, &gy);
    CHECK(gx == 7 && gy == 4);
    CHECK(ekv_clip_image_rows(c, 500, 300) == (7 * 4 + 1) * 4);
    ekv_clip_free(c);
}

/* ---- agreement with llama.cpp's mtmd (recorded) ---- */

/* llama.cpp v0.5.0's mtmd on this file pair (tiny-smolvlm, --type f32 --seed 3) and
 * data/images/astronaut_crop.png, in splice order (4 tiles, then the overview):
 * the L2 norm of each tile's 4 x 64 embeddings and 16 of its values (index i * 81
 * mod 256); and the first 8 greedy tokens after the prompt below (probes of
 * docs/models.md, 2026-11-27; ekv then: rms rel 2.7e-4, greedy 16 of 16). */
static const struct {
    double norm;
    float v[16];
} k_mtmd[5] = {
    {5.295490, {-0.584785f, -0.006691f, 0.271314f, -0.304205f, -0.005810f, -0.019776f, 0.299637f, 0.171872f,
                0.094976f, -0.496636f, 0.216427f, 0.292761f, 0.012162f, -0.155134f, 0.392599f, -0.325101f}},
    {5.208791, {0.178709f, -0.011690f, 0.216483f, -0.271168f, -0.225055f, 0.293400f, 0.219195f, -0.032587f,
                -0.480543f, -0.188759f, -0.278080f, 0.065603f, -0.216775f, -0.395965f, 0.017473f, 0.075844f}},
    {5.136625, {-0.412270f, 0.559438f, 0.150166f, 0.515325f, 0.181233f, -0.006632f, -0.030507f, 0.510507f,
                -0.028305f, 0.440331f, 0.324088f, 0.525707f, 0.055423f, -0.041181f, -0.234192f, 0.025302f}},
    {5.274332, {-0.699937f, 0.018927f, -0.267805f, -0.324622f, -0.392334f, 0.270946f, 0.072988f, -0.605621f,
                -0.278306f, -0.343486f, 0.084921f, -0.156546f, -0.079593f, 0.058850f, 0.247650f, 0.190102f}},
    {5.084990, {-0.164669f, 0.512157f, 0.127602f, -0.358649f, -0.544546f, 0.262375f, -0.171443f, -0.340523f,
                0.369918f, -0.397502f, -0.390720f, -0.194856f, -0.083522f, -0.251315f, 0.617222f, -0.432278f}},
};
static const int32_t k_mtmd_greedy[8] = {441, 322, 308, 466, 231, 231, 231, 231};
static const char k_prompt[] = "<|im_start|>User: <image>\nDescribe the image.<end_of_utterance>\nAssistant:";

static int32_t special_token(const struct ekv_model *m, const char *text) {
    int32_t t[4];
    size_t n = 0;
    CHECK_OK(ekv_tokenize(m, text, strlen(text), false, true, t, 4, &n));
    CHECK_MSG(n == 1, "'%s' is %zu tokens", text, n);
    return n == 1 ? t[0] : -1;
}

static void test_prompt_and_mtmd(void) {
    struct ekv_model *m = NULL;
    struct ekv_model_params mp = ekv_model_default_params();
    CHECK_OK(ekv_model_load(g_lm, &mp, &m));
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    struct ekv_context *ctx = NULL;
    if (m) CHECK_OK(ekv_context_new(m, &cp, &ctx));
    struct ekv_vision *v = NULL;
    CHECK_OK(ekv_vision_load(g_mm, &v));
    struct ekv_prompt *p = NULL;
    if (m) CHECK_OK(ekv_prompt_new(m, k_prompt, strlen(k_prompt), true, &p));
    if (!m || !ctx || !v || !p) goto done;
    CHECK(ekv_vision_n_tokens(v) == 4);
    struct ekv_image_input img = {.path = tu_src("data/images/astronaut_crop.png")};
    int32_t npos = 0;
    CHECK_OK(ekv_vision_image_tokens(v, &img, &npos));
    CHECK(npos == 5 * 4 + (2 * 4 + 1 + 4)); /* rows + separators */
    /* a tiling tower's embeddings do not fit ekv_vision_encode_file's buffer */
    float tmp[4 * 64];
    CHECK(ekv_vision_encode_file(v, ctx, img.path, tmp) == EKV_ERR_UNSUPPORTED);
    CHECK_OK(ekv_prompt_set_images(p, v, ctx, &img, 1));
    int64_t pos0 = 0;
    int32_t span = 0;
    CHECK_OK(ekv_prompt_image_span(p, 0, &pos0, &span));
    CHECK(span == npos && ekv_prompt_n_positions(p) == ekv_prompt_n_tokens(p) + npos);

    /* the layout: <fake><row_1_col_1> rows <fake><row_1_col_2> rows \n <fake><row_2_col_1> rows
     * <fake><row_2_col_2> rows \n\n <fake><global-img> rows <fake> */
    const int32_t fake = special_token(m, "<fake_token_around_image>"), glob = special_token(m, "<global-img>");
    const int32_t rc[4] = {special_token(m, "<row_1_col_1>"), special_token(m, "<row_1_col_2>"),
                           special_token(m, "<row_2_col_1>"), special_token(m, "<row_2_col_2>")};
    const struct ekv_segment *segs = NULL;
    int32_t ns = 0;
    CHECK_OK(ekv_prompt_segments(p, &segs, &ns));
    CHECK(ns == 2 + 2 * 4 + 3); /* text before, 4 tiles x (separators, rows), overview x 2 + closing, text after */
    if (ns != 13) goto done;
    int64_t pos = segs[0].n;
    CHECK(segs[0].tokens && pos == pos0);
    for (int t = 0; t < 5; t++) {
        const struct ekv_segment *sep = &segs[1 + 2 * t], *rows = &segs[2 + 2 * t];
        CHECK(sep->tokens && sep->tag == EKV_TAG_TEXT && rows->embd && rows->n == 4 && rows->tag == EKV_TAG_IMAGE);
        if (!sep->tokens) continue;
        if (t == 4) {
            CHECK(sep->n == 3 && sep->tokens[1] == fake && sep->tokens[2] == glob && sep->tokens[0] != fake);
        } else {
            const int lead = t == 2 ? 1 : 0; /* the row end before row 2 */
            CHECK(sep->n == 2 + lead && sep->tokens[lead] == fake && sep->tokens[lead + 1] == rc[t]);
        }
        pos += sep->n + rows->n;
    }
    CHECK(segs[11].n == 1 && segs[11].tokens && segs[11].tokens[0] == fake);
    CHECK(pos + 1 == pos0 + span);

    /* the recorded llama.cpp embeddings: each tile's norm within 0.1 %, values within 2e-3
     * (measured differences: 3e-4 at most, from ggml's GELU table and summation order) */
    for (int t = 0; t < 5; t++) {
        const float *e = segs[2 + 2 * t].embd;
        double nrm = 0, dmax = 0;
        for (int i = 0; i < 256; i++) nrm += (double)e[i] * e[i];
        nrm = sqrt(nrm);
        for (int i = 0; i < 16; i++) dmax = fmax(dmax, fabs((double)e[(i * 81) % 256] - k_mtmd[t].v[i]));
        printf("tile %d: norm %.6f (llama.cpp %.6f), sampled values max |diff| %.2g\n", t, nrm, k_mtmd[t].norm, dmax);
        CHECK_MSG(fabs(nrm / k_mtmd[t].norm - 1) < 1e-3 && dmax < 2e-3, "tile %d disagrees with llama.cpp", t);
    }
    /* and the greedy continuation */
    struct ekv_kv_params kv = ekv_kv_default_params();
    kv.type_k = kv.type_v = EKV_KV_F32;
    struct ekv_seq *q = NULL;
    CHECK_OK(ekv_seq_new(ctx, &kv, &q));
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    float *L = malloc(sizeof(float) * (size_t)mi.n_vocab);
    if (q && L) {
        CHECK_OK(ekv_seq_eval_prompt(q, p, L));
        for (int i = 0; i < 8; i++) {
            int32_t b = 0;
            for (int32_t j = 1; j < mi.n_vocab; j++) b = L[j] > L[b] ? j : b;
            CHECK_MSG(b == k_mtmd_greedy[i], "greedy step %d: %d, llama.cpp %d", i, b, k_mtmd_greedy[i]);
            CHECK_OK(ekv_seq_decode(q, b, L));
        }
    }
    free(L);
    ekv_seq_free(q);
done:
    ekv_prompt_free(p);
    ekv_vision_free(v);
    ekv_context_free(ctx);
    ekv_model_free(m);
}

/* tiny-vlm's language model (same width) has none of the separator tokens */
static void test_vocab_without_separators(void) {
    char lm[300], mm[300], args[1024];
    snprintf(lm, sizeof lm, "%s/plain.gguf", g_dir);
    snprintf(mm, sizeof mm, "%s/plain.mmproj.gguf", g_dir);
    snprintf(args, sizeof args, "--preset tiny-vlm --type f32 --seed 3 -o '%s' --mmproj-out '%s'", lm, mm);
    CHECK(tu_mkmodel(args) == 0);
    struct ekv_model *m = NULL;
    struct ekv_model_params mp = ekv_model_default_params();
    CHECK_OK(ekv_model_load(lm, &mp, &m));
    struct ekv_vision *v = NULL;
    CHECK_OK(ekv_vision_load(g_mm, &v));
    struct ekv_prompt *p = NULL;
    if (m) CHECK_OK(ekv_prompt_new(m, "<image> hi", 10, true, &p));
    if (p && v) {
        struct ekv_image_input img = {.path = tu_src("data/images/astronaut_crop.jpg")};
        CHECK(ekv_prompt_set_images(p, v, NULL, &img, 1) == EKV_ERR_UNSUPPORTED);
        CHECK(strstr(ekv_last_error(), "<fake_token_around_image>") != NULL);
        const struct ekv_segment *segs;
        int32_t ns;
        CHECK(ekv_prompt_segments(p, &segs, &ns) == EKV_ERR_INVALID_ARG); /* the slot stays empty */
    }
    ekv_prompt_free(p);
    ekv_vision_free(v);
    ekv_model_free(m);
}

/* ---- hostile idefics3 mmproj files ---- */

/* A copy of the tiny mmproj with one change: a key set (u32 or string), a
 * tensor dropped, one added, or one replaced by a wrongly shaped one. */
struct mutation {
    const char *key;
    uint32_t u32;
    const char *str;
    const char *drop;
    bool add_class, bad_fc;
    enum ekv_status want;
    const char *needle;
};

static void mutate(const struct mutation *mu, const char *dst) {
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_open(g_mm, &f));
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!f || !w) goto out;
    for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) {
        const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(f, i);
        if (mu->key && !mu->str && !mu->u32 && ekv_gguf_str_eq(kv->key, mu->key)) continue; /* key dropped */
        CHECK_OK(ekv_gguf_writer_copy_kv(w, kv));
    }
    if (mu->key && mu->str) CHECK_OK(ekv_gguf_writer_set_str(w, mu->key, mu->str));
    if (mu->key && mu->u32) CHECK_OK(ekv_gguf_writer_set_u32(w, mu->key, mu->u32));
    static float zeros[64 * 300];
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        if (mu->drop && !strcmp(t->name, mu->drop)) continue;
        if (mu->bad_fc && !strcmp(t->name, "mm.model.fc.weight")) {
            int64_t ne[2] = {t->ne[0] / 2, t->ne[1]};
            CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, EKV_F32, 2, ne, zeros, NULL, NULL));
            continue;
        }
        CHECK_OK(ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
    }
    if (mu->add_class) {
        int64_t ne = 64;
        CHECK_OK(ekv_gguf_writer_add_tensor(w, "v.class_embd", EKV_F32, 1, &ne, zeros, NULL, NULL));
    }
    CHECK_OK(ekv_gguf_writer_write(w, dst));
out:
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
}

static void test_hostile(void) {
    const struct mutation cases[] = {
        {.key = "clip.projector_type", .str = "qwen2vl", .want = EKV_ERR_UNSUPPORTED, .needle = "qwen2vl"},
        {.key = "clip.vision.projector.scale_factor", .want = EKV_ERR_NOT_FOUND, .needle = "scale_factor"},
        {.key = "clip.vision.projector.scale_factor", .u32 = 3, .want = EKV_ERR_UNSUPPORTED, .needle = "scale_factor 3"},
        {.key = "clip.vision.projector.scale_factor", .u32 = 9, .want = EKV_ERR_FORMAT, .needle = "scale_factor"},
        {.key = "clip.vision.preproc_image_size", .want = EKV_ERR_UNSUPPORTED, .needle = "preproc_image_size"},
        {.key = "clip.vision.preproc_image_size", .u32 = 1u << 30, .want = EKV_ERR_FORMAT, .needle = "preproc_image_size"},
        {.drop = "v.post_ln.weight", .want = EKV_ERR_NOT_FOUND, .needle = "v.post_ln.weight"},
        {.drop = "mm.model.fc.weight", .want = EKV_ERR_NOT_FOUND, .needle = "mm.model.fc.weight"},
        {.bad_fc = true, .want = EKV_ERR_FORMAT, .needle = "mm.model.fc.weight"},
        {.add_class = true, .want = EKV_ERR_FORMAT, .needle = "v.class_embd"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dst[300];
        snprintf(dst, sizeof dst, "%s/bad%zu.mmproj.gguf", g_dir, k);
        mutate(&cases[k], dst);
        struct ekv_clip *c = NULL;
        enum ekv_status s = ekv_clip_load(dst, &c);
        CHECK_MSG(s == cases[k].want && strstr(ekv_last_error(), cases[k].needle), "case %zu: status %d, '%s'", k,
                  (int)s, ekv_last_error());
        CHECK(c == NULL);
        ekv_clip_free(c);
    }
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(g_lm, sizeof g_lm, "%s/tiny.gguf", g_dir);
    snprintf(g_mm, sizeof g_mm, "%s/tiny.mmproj.gguf", g_dir);
    char args[1024];
    snprintf(args, sizeof args, "--preset tiny-smolvlm --type f32 --seed 3 -o '%s' --mmproj-out '%s'", g_lm, g_mm);
    int rc = tu_mkmodel(args);
    CHECK_MSG(rc == 0, "ekv mkmodel failed (%d); is %s/ekv built?", rc, EKV_BINARY_DIR);
    test_lanczos();
    test_pixel_shuffle();
    if (rc == 0) {
        test_grid();
        test_tower();
        test_prompt_and_mtmd();
        test_vocab_without_separators();
        test_hostile();
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_idefics3");
}
