/*
 * test_prompt.c — prompts with several images (ekv_prompt_*), on the
 * tiny-vlm preset written by `ekv mkmodel` and the public-domain photos in
 * data/images/: markers split the text (BOS only before the first piece),
 * images from a file and from bytes in memory give the same embeddings,
 * spans and segments sit where the markers are, feeding the prompt equals
 * feeding the same segments by hand bit for bit, policies see the image
 * tags, and wrong counts, unset slots and unreadable bytes give errors that
 * name the image. Then `ekv run` with two --image flags, and LLaVA-1.6's
 * anyres tiling (tiny-llava16: pinpoints 112x56, 56x112, 112x112 over a
 * 56-pixel tower): grids chosen as worked out by hand, the overview and a
 * tile equal to encoding those pictures alone, and a tower that asks for
 * anyres without its pinpoints refused with the key named.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "ekv.h"
#include "model/gguf.h"
#include "testutil.h"
#include "vision/clip.h"
#include "vision/image.h"

static int run(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void api_checks(const char *lm, const char *mm, const char *jpg, const char *png) {
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    struct ekv_vision *v = NULL;
    struct ekv_prompt *p = NULL, *q = NULL;
    struct ekv_seq *s1 = NULL, *s2 = NULL;
    CHECK_OK(ekv_model_load(lm, NULL, &m));
    CHECK_OK(ekv_vision_load(mm, &v));
    if (!m || !v) goto out;
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    const int32_t NI = ekv_vision_n_tokens(v), D = ekv_vision_n_embd(v);
    CHECK(NI == 16 && D == 64);

    /* tokens: the pieces tokenized on their own, BOS before the first only */
    const char *text = "Compare <image> with <image>: which is brighter?";
    CHECK_OK(ekv_prompt_new(m, text, strlen(text), true, &p));
    if (!p) goto out;
    CHECK(ekv_prompt_n_images(p) == 2);
    int32_t a[64], b[64], cc[64], all[256];
    size_t na = 0, nb = 0, nc = 0;
    CHECK_OK(ekv_tokenize(m, "Compare ", 8, true, true, a, 64, &na));
    CHECK_OK(ekv_tokenize(m, " with ", 6, false, true, b, 64, &nb));
    CHECK_OK(ekv_tokenize(m, ": which is brighter?", 20, false, true, cc, 64, &nc));
    CHECK(a[0] == ekv_token_bos(m) && b[0] != ekv_token_bos(m));
    CHECK(ekv_prompt_n_tokens(p) == (int32_t)(na + nb + nc));
    ekv_prompt_tokens(p, all);
    CHECK(!memcmp(all, a, na * 4) && !memcmp(all + na, b, nb * 4) && !memcmp(all + na + nb, cc, nc * 4));
    CHECK(ekv_prompt_n_positions(p) == (int64_t)(na + nb + nc)); /* images unset */

    /* unset slots: no segments, no evaluation */
    const struct ekv_segment *segs = NULL;
    int32_t ns = 0;
    CHECK(ekv_prompt_segments(p, &segs, &ns) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "image 0"));
    CHECK_OK(ekv_seq_new(c, NULL, &s1));
    CHECK(ekv_seq_eval_prompt(s1, p, NULL) == EKV_ERR_INVALID_ARG);
    ekv_seq_free(s1);
    s1 = NULL;

    /* wrong counts */
    struct ekv_image_input one[1] = {{.path = jpg}};
    CHECK(ekv_prompt_set_images(p, v, c, one, 1) == EKV_ERR_INVALID_ARG &&
          strstr(ekv_last_error(), "2 <image> markers but 1 image was given"));

    /* a file and the same bytes in memory */
    size_t png_len = 0;
    char *png_bytes = tu_read_file(png, &png_len);
    CHECK(png_bytes && png_len > 100);
    struct ekv_image_input two[2] = {{.path = jpg}, {.data = png_bytes, .size = png_len}};
    CHECK_OK(ekv_prompt_set_images(p, v, c, two, 2));
    int32_t n_img = 0;
    CHECK_OK(ekv_vision_image_tokens(v, &two[1], &n_img));
    CHECK(n_img == NI);
    int64_t p0 = -1, p1 = -1;
    int32_t r0 = 0, r1 = 0;
    CHECK_OK(ekv_prompt_image_span(p, 0, &p0, &r0));
    CHECK_OK(ekv_prompt_image_span(p, 1, &p1, &r1));
    CHECK(p0 == (int64_t)na && r0 == NI && p1 == (int64_t)(na + NI + nb) && r1 == NI);
    CHECK(ekv_prompt_n_positions(p) == (int64_t)(na + nb + nc) + 2 * NI);
    CHECK(ekv_prompt_image_span(p, 2, &p0, &r0) == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_prompt_segments(p, &segs, &ns));
    CHECK(ns == 5 && segs[1].tag == EKV_TAG_IMAGE && segs[3].tag == EKV_TAG_IMAGE && segs[4].tag == EKV_TAG_TEXT &&
          segs[0].n == (int32_t)na && segs[2].n == (int32_t)nb && segs[4].n == (int32_t)nc);

    /* the PNG from memory equals the PNG from its file */
    float *e_mem = malloc((size_t)NI * D * sizeof(float)), *e_file = malloc((size_t)NI * D * sizeof(float));
    CHECK_OK(ekv_vision_encode_file(v, c, png, e_file));
    if (ns == 5) memcpy(e_mem, segs[3].embd, (size_t)NI * D * sizeof(float));
    CHECK(!memcmp(e_mem, e_file, (size_t)NI * D * sizeof(float)));

    /* feeding the prompt == feeding its segments by hand (bit for bit) */
    const int32_t V = 512;
    float *l1 = malloc(V * sizeof(float)), *l2 = malloc(V * sizeof(float));
    struct ekv_kv_params kp = ekv_kv_default_params();
    kp.policy = "vlcache";
    kp.budget = 0.5;
    CHECK_OK(ekv_seq_new(c, &kp, &s1));
    CHECK_OK(ekv_seq_new(c, &kp, &s2));
    CHECK_OK(ekv_seq_eval_prompt(s1, p, l1));
    float *e_jpg = malloc((size_t)NI * D * sizeof(float));
    CHECK_OK(ekv_vision_encode_file(v, c, jpg, e_jpg));
    struct ekv_segment hand[5] = {
        {.tokens = a, .n = (int32_t)na, .tag = EKV_TAG_TEXT}, {.embd = e_jpg, .n = NI, .tag = EKV_TAG_IMAGE},
        {.tokens = b, .n = (int32_t)nb, .tag = EKV_TAG_TEXT}, {.embd = e_file, .n = NI, .tag = EKV_TAG_IMAGE},
        {.tokens = cc, .n = (int32_t)nc, .tag = EKV_TAG_TEXT}};
    struct ekv_input in = {.segs = hand, .n_segs = 5, .is_prompt = true};
    CHECK_OK(ekv_seq_eval(s2, &in, l2));
    CHECK(!memcmp(l1, l2, V * sizeof(float)));
    CHECK(ekv_seq_n_seen(s1) == ekv_prompt_n_positions(p));
    /* VL-Cache's window is the text after the last image */
    CHECK(ekv_seq_kv_window_start(s1) == p1 + NI);
    /* tags in the cache: image positions tagged image */
    int32_t len = ekv_seq_kv_layer_len(s1, 0, 0);
    int32_t pos[512];
    uint8_t tags[512];
    CHECK(len > 0 && len < 512);
    CHECK_OK(ekv_seq_kv_entries(s1, 0, 0, pos, NULL, tags));
    int bad = 0;
    for (int32_t i = 0; i < len; i++) {
        bool img = (pos[i] >= p0 && pos[i] < p0 + NI) || (pos[i] >= p1 && pos[i] < p1 + NI);
        bad += tags[i] != (img ? EKV_TAG_IMAGE : EKV_TAG_TEXT);
    }
    CHECK_MSG(bad == 0, "%d cache entries carry the wrong tag", bad);

    /* given embeddings instead of the tower */
    CHECK_OK(ekv_prompt_new(m, text, strlen(text), true, &q));
    CHECK(ekv_prompt_set_image_embd(q, 2, e_jpg, NI) == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_prompt_set_image_embd(q, 0, e_jpg, NI));
    CHECK_OK(ekv_prompt_set_image_embd(q, 1, e_file, 3)); /* any row count */
    CHECK(ekv_prompt_n_positions(q) == (int64_t)(na + nb + nc) + NI + 3);

    /* unreadable bytes: the error names the image in memory; the slots are cleared */
    char junk[64] = "not an image at all";
    struct ekv_image_input badimg[2] = {{.path = jpg}, {.data = junk, .size = sizeof junk}};
    CHECK(ekv_prompt_set_images(p, v, c, badimg, 2) == EKV_ERR_FORMAT &&
          strstr(ekv_last_error(), "image 1 (64 bytes in memory)"));
    CHECK(ekv_prompt_segments(p, &segs, &ns) == EKV_ERR_INVALID_ARG);
    struct ekv_image_input missing[2] = {{.path = jpg}, {.path = "/nonexistent/x.png"}};
    CHECK(ekv_prompt_set_images(p, v, c, missing, 2) == EKV_ERR_IO && strstr(ekv_last_error(), "/nonexistent/x.png"));
    struct ekv_image_input empty[2] = {{.path = jpg}, {.data = NULL, .size = 0}};
    CHECK(ekv_prompt_set_images(p, v, c, empty, 2) == EKV_ERR_INVALID_ARG);

    /* no marker, no BOS: a later turn of a conversation */
    ekv_prompt_free(q);
    q = NULL;
    CHECK_OK(ekv_prompt_new(m, "and then?", 9, false, &q));
    CHECK(ekv_prompt_n_images(q) == 0 && ekv_prompt_n_tokens(q) > 0);
    ekv_prompt_tokens(q, all);
    CHECK(all[0] != ekv_token_bos(m));
    CHECK_OK(ekv_seq_eval_prompt(s1, q, l1)); /* continues the sequence */

    free(png_bytes);
    free(e_mem);
    free(e_file);
    free(e_jpg);
    free(l1);
    free(l2);
out:
    ekv_seq_free(s1);
    ekv_seq_free(s2);
    ekv_prompt_free(p);
    ekv_prompt_free(q);
    ekv_prompt_free(NULL);
    ekv_vision_free(v);
    ekv_context_free(c);
    ekv_model_free(m);
}

/* Encodes a picture alone through the tower's stages: out [16][64]. */
static void encode_alone(const struct ekv_clip *clip, const struct ekv_image *img, float *out) {
    float px[3 * 56 * 56];
    const struct ekv_clip_hparams *hp = ekv_clip_hparams(clip);
    ekv_image_normalize(img, hp->image_mean, hp->image_std, px);
    CHECK_OK(ekv_clip_encode_pixels(clip, NULL, px, out));
}

static void anyres_checks(const char *dir, const char *jpg) {
    char lm[512], mm[512], cmd[2048];
    snprintf(lm, sizeof lm, "%s/l16.gguf", dir);
    snprintf(mm, sizeof mm, "%s/l16-mmproj.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-llava16 --seed 3 -o %s --mmproj-out %s >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm);
    CHECK(run(cmd) == 0);
    struct ekv_clip *clip = NULL;
    CHECK_OK(ekv_clip_load(mm, &clip));
    if (!clip) return;
    /* 320x200: 112x56 keeps 89x56, 56x112 keeps 56x35, 112x112 keeps 112x70: 2x2 tiles + overview */
    int w, h;
    ekv_clip_anyres_grid(clip, 320, 200, &w, &h);
    CHECK(w == 112 && h == 112 && ekv_clip_image_rows(clip, 320, 200) == 5 * 16);
    /* 300x100: 112x56 and 112x112 both keep 112x37; 112x56 wastes less: 2 tiles + overview */
    ekv_clip_anyres_grid(clip, 300, 100, &w, &h);
    CHECK(w == 112 && h == 56 && ekv_clip_image_rows(clip, 300, 100) == 3 * 16);
    /* 100x300 the other way round */
    ekv_clip_anyres_grid(clip, 100, 300, &w, &h);
    CHECK(w == 56 && h == 112);
    /* no side above 56: the overview alone */
    ekv_clip_anyres_grid(clip, 50, 40, &w, &h);
    CHECK(w == 0 && ekv_clip_image_rows(clip, 50, 40) == 16);

    /* the photo (320x200) through the public calls: 80 rows, laid out overview, tile (0,0), (1,0), (0,1), (1,1) */
    struct ekv_vision *v = NULL;
    struct ekv_model *m = NULL;
    struct ekv_prompt *p = NULL;
    CHECK_OK(ekv_vision_load(mm, &v));
    CHECK_OK(ekv_model_load(lm, NULL, &m));
    struct ekv_image_input in = {.path = jpg};
    int32_t n = 0;
    if (v) CHECK_OK(ekv_vision_image_tokens(v, &in, &n));
    CHECK(n == 80);
    float buf[16 * 64];
    if (v) CHECK(ekv_vision_encode_file(v, NULL, jpg, buf) == EKV_ERR_UNSUPPORTED); /* 80 rows do not fit 16 */
    if (m && v) {
        CHECK_OK(ekv_prompt_new(m, "<image>\nWhat?", 14, true, &p));
        CHECK_OK(ekv_prompt_set_images(p, v, NULL, &in, 1));
        const struct ekv_segment *segs = NULL;
        int32_t ns = 0;
        CHECK_OK(ekv_prompt_segments(p, &segs, &ns));
        const struct ekv_segment *img = NULL;
        for (int32_t i = 0; i < ns; i++)
            if (segs[i].tag == EKV_TAG_IMAGE) img = &segs[i];
        CHECK(img && img->n == 80);
        struct ekv_image photo = {0}, ov = {0}, fit = {0}, tile = {0};
        CHECK_OK(ekv_image_load_file(jpg, &photo));
        /* overview: the photo squeezed to 56x56 */
        CHECK_OK(ekv_image_resize_bicubic(&photo, 56, 56, &ov));
        encode_alone(clip, &ov, buf);
        CHECK(img && !memcmp(img->embd, buf, sizeof buf));
        /* tile (1,1): the photo at 112x70 (scale 0.35) centred 21 rows down on black; rows 56..111, columns 56..111 */
        CHECK_OK(ekv_image_resize_bicubic(&photo, 112, 70, &fit));
        const uint8_t black[3] = {0, 0, 0};
        CHECK_OK(ekv_image_new(56, 56, black, &tile));
        for (int y = 0; y < 56; y++) {
            int fy = 56 + y - 21; /* row of the resized photo, when inside it */
            if (fy >= 0 && fy < 70) memcpy(tile.rgb + (size_t)y * 56 * 3, fit.rgb + ((size_t)fy * 112 + 56) * 3, 56 * 3);
        }
        encode_alone(clip, &tile, buf);
        CHECK(img && !memcmp(img->embd + (size_t)4 * 16 * 64, buf, sizeof buf));
        ekv_image_free(&photo);
        ekv_image_free(&ov);
        ekv_image_free(&fit);
        ekv_image_free(&tile);
    }
    ekv_prompt_free(p);
    ekv_model_free(m);
    ekv_vision_free(v);
    ekv_clip_free(clip);

    /* anyres asked for (spatial_unpad) without the pinpoints: the missing key is named */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/nopins.gguf", dir);
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *wr = NULL;
    CHECK_OK(ekv_gguf_open(mm, &f));
    CHECK_OK(ekv_gguf_writer_new(&wr));
    for (size_t i = 0; f && wr && i < ekv_gguf_n_kv(f); i++) {
        const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(f, i);
        if (kv->key.len == 32 && !memcmp(kv->key.ptr, "clip.vision.image_grid_pinpoints", 32)) continue;
        CHECK_OK(ekv_gguf_writer_copy_kv(wr, kv));
    }
    for (size_t i = 0; f && wr && i < ekv_gguf_n_tensors(f); i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        CHECK_OK(ekv_gguf_writer_add_tensor(wr, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL));
    }
    if (wr) CHECK_OK(ekv_gguf_writer_write(wr, bad));
    ekv_gguf_writer_free(wr);
    ekv_gguf_close(f);
    struct ekv_vision *bv = NULL;
    CHECK(ekv_vision_load(bad, &bv) == EKV_ERR_UNSUPPORTED && strstr(ekv_last_error(), "image_grid_pinpoints") &&
          bv == NULL);
}

int main(void) {
    char dir[] = "/tmp/ekv_prompt_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char lm[256], mm[256], trace[256], cmd[4096];
    snprintf(lm, sizeof lm, "%s/tiny.gguf", dir);
    snprintf(mm, sizeof mm, "%s/tiny-mmproj.gguf", dir);
    snprintf(trace, sizeof trace, "%s/trace.json", dir);
    char jpg[1024], png[1024];
    snprintf(jpg, sizeof jpg, "%s", tu_src("data/images/astronaut_crop.jpg"));
    snprintf(png, sizeof png, "%s", tu_src("data/images/astronaut_crop.png"));
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-vlm --seed 7 -o %s --mmproj-out %s >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm);
    CHECK(run(cmd) == 0);
    api_checks(lm, mm, jpg, png);
    anyres_checks(dir, jpg);

    /* the CLI: two images, markers filled in order; images without markers go first */
    snprintf(cmd, sizeof cmd,
             "%s/ekv run -m %s --mmproj %s --image %s --image %s -p 'Left <image> right <image> same?' -n 3 "
             "--temp 0 -t 2 --kv-trace %s >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm, jpg, png, trace);
    CHECK(run(cmd) == 0);
    char *txt = tu_read_file(trace, NULL);
    cJSON *root = txt ? cJSON_Parse(txt) : NULL;
    CHECK(root != NULL);
    if (root) {
        cJSON *imgs = cJSON_GetObjectItem(root, "images");
        CHECK(cJSON_GetArraySize(imgs) == 2);
        int s0 = cJSON_GetObjectItem(cJSON_GetArrayItem(imgs, 0), "start")->valueint;
        int s1 = cJSON_GetObjectItem(cJSON_GetArrayItem(imgs, 1), "start")->valueint;
        CHECK(s0 > 0 && s1 > s0 + 16);
        CHECK(cJSON_GetObjectItem(root, "image_tokens")->valueint == 32);
        cJSON_Delete(root);
    }
    free(txt);
    snprintf(cmd, sizeof cmd, "%s/ekv run -m %s --mmproj %s --image %s --image %s -p 'Same?' -n 1 -t 2 --json "
             "2>/dev/null | grep -q '\"image_tokens\":[[:space:]]*32'", EKV_BINARY_DIR, lm, mm, jpg, png);
    CHECK(run(cmd) == 0);
    /* more markers than images, and the other way round */
    snprintf(cmd, sizeof cmd, "%s/ekv run -m %s --mmproj %s --image %s -p '<image> and <image>' -n 1 >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm, jpg);
    CHECK(run(cmd) == 1);
    snprintf(cmd, sizeof cmd, "%s/ekv run -m %s --mmproj %s --image %s --image %s -p 'one <image>' -n 1 >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm, jpg, jpg);
    CHECK(run(cmd) == 1);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(run(cmd) == 0);
    return test_finish("test_prompt");
}
