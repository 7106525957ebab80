/*
 * test_vlm.c — the vision-language path end to end: `ekv mkmodel` writes
 * the tiny-vlm preset (decoder + ViT mmproj), `ekv run --mmproj --image`
 * runs it on a real public-domain photo (data/images/) with VL-Cache and
 * writes --kv-trace; the test checks the number of image tokens, the tags
 * in the trace, and that VL-Cache's observation window is the text after
 * the image. The same is checked through the C API (ekv_seq_eval with an
 * image segment), plus errors for a missing image and a width mismatch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ekv.h"
#include "testutil.h"

static int run(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int main(void) {
    char dir[] = "/tmp/ekv_vlm_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char lm[256], mm[256], trace[256], cmd[4096];
    snprintf(lm, sizeof lm, "%s/tiny.gguf", dir);
    snprintf(mm, sizeof mm, "%s/tiny-mmproj.gguf", dir);
    snprintf(trace, sizeof trace, "%s/trace.json", dir);
    const char *photo = tu_src("data/images/astronaut_crop.jpg");

    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-vlm --seed 7 -o %s --mmproj-out %s >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm);
    CHECK(run(cmd) == 0);
    snprintf(cmd, sizeof cmd,
             "%s/ekv run -m %s --mmproj %s --image %s -p 'What is in the picture?' -n 6 --temp 0 -t 2 "
             "--kv-policy vlcache --kv-budget 0.5 --kv-trace %s >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm, photo, trace);
    CHECK(run(cmd) == 0);

    /* --kv-trace: image tokens, tags, window */
    size_t len = 0;
    char *txt = tu_read_file(trace, &len);
    CHECK(txt != NULL);
    cJSON *root = txt ? cJSON_Parse(txt) : NULL;
    CHECK(root != NULL);
    if (root) {
        int n_img = cJSON_GetObjectItem(root, "image_tokens")->valueint;
        int img0 = cJSON_GetObjectItem(root, "image_start")->valueint;
        int win = cJSON_GetObjectItem(root, "window_start")->valueint;
        int n_prompt = cJSON_GetObjectItem(root, "prompt_tokens")->valueint;
        CHECK_MSG(n_img == 16, "tiny-vlm (56 px, patch 14) gives 16 image tokens, got %d", n_img);
        CHECK(img0 > 0 && img0 + n_img < n_prompt);
        CHECK_MSG(win == img0 + n_img, "VL-Cache window starts at %d, the text after the image starts at %d", win,
                  img0 + n_img);
        cJSON *snap = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "snapshots"), 0);
        cJSON *layers = cJSON_GetObjectItem(snap, "layers");
        int checked = 0;
        cJSON *layer;
        cJSON_ArrayForEach(layer, layers) {
            cJSON *head;
            cJSON_ArrayForEach(head, cJSON_GetObjectItem(layer, "heads")) {
                cJSON *pos = cJSON_GetObjectItem(head, "positions"), *tags = cJSON_GetObjectItem(head, "tags");
                int n = cJSON_GetArraySize(pos);
                CHECK(n == cJSON_GetArraySize(tags) && n > 0 && n < n_prompt);
                int prev = -1;
                for (int i = 0; i < n; i++) {
                    int p = cJSON_GetArrayItem(pos, i)->valueint;
                    const char *t = cJSON_GetArrayItem(tags, i)->valuestring;
                    const char *want = p >= img0 && p < img0 + n_img ? "image" : "text";
                    CHECK_MSG(!strcmp(t, want), "position %d tagged %s, expected %s", p, t, want);
                    CHECK(p > prev);
                    prev = p;
                }
                checked++;
            }
        }
        CHECK(checked == 5 * 4);
        /* the end snapshot holds generated tokens tagged as such */
        cJSON *end = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "snapshots"), 1);
        cJSON *h0 = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(end, "layers"), 0), "heads"), 0);
        cJSON *tags = cJSON_GetObjectItem(h0, "tags");
        CHECK(!strcmp(cJSON_GetArrayItem(tags, cJSON_GetArraySize(tags) - 1)->valuestring, "generated"));
        cJSON_Delete(root);
    }
    free(txt);

    /* the same through the C API */
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    struct ekv_vision *v = NULL;
    struct ekv_seq *s = NULL;
    CHECK_OK(ekv_model_load(lm, NULL, &m));
    CHECK_OK(ekv_vision_load(mm, &v));
    if (m && v) {
        CHECK_OK(ekv_context_new(m, NULL, &c));
        CHECK(ekv_vision_n_tokens(v) == 16 && ekv_vision_n_embd(v) == 64);
        float *embd = malloc(16 * 64 * sizeof(float));
        CHECK_OK(ekv_vision_encode_file(v, c, photo, embd));
        CHECK(ekv_vision_encode_file(v, c, "/nonexistent.png", embd) != EKV_OK && ekv_last_error()[0]);
        char prompt[512];
        size_t plen = 0;
        CHECK_OK(ekv_chat_format("llava-1.5", NULL, "Describe it.", true, prompt, sizeof prompt, &plen));
        CHECK(strstr(prompt, "USER: <image>\nDescribe it. ASSISTANT:") != NULL);
        int32_t toks[1024];
        size_t nt = 0;
        int32_t at = -1;
        CHECK_OK(ekv_tokenize_prompt(m, prompt, plen, toks, 1024, &nt, &at));
        CHECK(at > 0 && (size_t)at < nt);
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.policy = "vlcache";
        kp.budget = 0.5;
        CHECK_OK(ekv_seq_new(c, &kp, &s));
        struct ekv_segment segs[3] = {
            {.tokens = toks, .n = at, .tag = EKV_TAG_TEXT},
            {.embd = embd, .n = 16, .tag = EKV_TAG_IMAGE},
            {.tokens = toks + at, .n = (int32_t)nt - at, .tag = EKV_TAG_TEXT},
        };
        struct ekv_input in = {.segs = segs, .n_segs = 3, .is_prompt = true};
        CHECK_OK(ekv_seq_eval(s, &in, NULL));
        CHECK(ekv_seq_kv_window_start(s) == at + 16);
        CHECK(ekv_seq_n_seen(s) == (int64_t)nt + 16);
        free(embd);
    }
    ekv_seq_free(s);
    ekv_vision_free(v);
    ekv_context_free(c);
    ekv_model_free(m);

    /* CLI errors: --image without --mmproj, an unreadable image, a marker without an image */
    snprintf(cmd, sizeof cmd, "%s/ekv run -m %s --image %s -p hi -n 1 >/dev/null 2>&1", EKV_BINARY_DIR, lm, photo);
    CHECK(run(cmd) == 1);
    snprintf(cmd, sizeof cmd, "%s/ekv run -m %s --mmproj %s --image %s/nope.png -p hi -n 1 >/dev/null 2>&1",
             EKV_BINARY_DIR, lm, mm, dir);
    CHECK(run(cmd) == 1);
    snprintf(cmd, sizeof cmd, "%s/ekv run -m %s -p 'look: <image>' -n 1 >/dev/null 2>&1", EKV_BINARY_DIR, lm);
    CHECK(run(cmd) == 1);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(run(cmd) == 0);
    return test_finish("test_vlm");
}
