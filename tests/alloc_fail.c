/*
 * alloc_fail.c — allocation-failure injection (issue 23): every malloc,
 * calloc, realloc, strdup and aligned_alloc that ekv's code makes (the
 * library, the eval runner and the server's request parsing, linked with
 * -Wl,--wrap so that their calls go to alloc_walk.c) can be made to fail.
 * Each scenario runs once to count its allocations, then once per
 * allocation with exactly that one failing: the scenario must end with a
 * status and a message (or succeed with the same results when the failure
 * was one the code may absorb, such as a shrinking realloc), never crash,
 * and free what it made (the ASan build's LeakSanitizer checks that at
 * exit). The server over HTTP has its own walk: alloc_fail_http.c.
 *
 * Scenarios: model load + context (stories260K GGUF, and the llama2.c
 * checkpoint when ../shared has it); per policy, a sequence's prompt,
 * decode steps, copy, save and load (stories260K; a tiny-llama3 model from
 * `ekv mkmodel` for the quantised and KIVI storage types); an evaluation
 * (data set, runner, full-cache reference, a policy's ppl/kl/rouge); a
 * vision tower encoding a JPEG and a PNG; the image prompt of each tower
 * kind (LLaVA-1.6 anyres, Idefics3, Qwen2-VL, Qwen2.5-VL) read by a
 * sequence; a server request (chat with per-request KV options and
 * prefix-reuse boundaries, a completion, /tokenize).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "ekv.h"
#include "ekv_eval.h"
#include "serve.h"
#include "alloc_walk.h"
#include "testutil.h"

/* ---- scenarios ---- */

struct load_arg {
    const char *path, *tok;
};

static enum ekv_status sc_load(void *argp, double *sum) {
    const struct load_arg *a = argp;
    struct ekv_model_params mp = ekv_model_default_params();
    mp.tokenizer_path = a->tok;
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    enum ekv_status s = ekv_model_load(a->path, &mp, &m);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.device = "cpu";
    cp.n_threads = 1;
    cp.n_ctx = 128;
    if (s == EKV_OK) s = ekv_context_new(m, &cp, &c);
    if (s == EKV_OK) *sum = (double)ekv_model_fingerprint(m);
    ekv_context_free(c);
    ekv_model_free(m);
    return s;
}

struct vision_arg {
    const char *mmproj, *image;
};

/* a vision tower loaded, an image decoded, preprocessed and encoded */
static enum ekv_status sc_vision(void *argp, double *sum) {
    const struct vision_arg *a = argp;
    struct ekv_vision *v = NULL;
    float *out = NULL;
    int32_t nt = 0;
    enum ekv_status s = ekv_vision_load(a->mmproj, &v);
    const struct ekv_image_input img = {.path = a->image};
    if (s == EKV_OK) s = ekv_vision_image_tokens(v, &img, &nt);
    const size_t n = (size_t)nt * (size_t)(v ? ekv_vision_n_embd(v) : 0);
    if (s == EKV_OK && !(out = __real_malloc(n * sizeof *out))) s = EKV_ERR_NOMEM; /* the harness's own: never fails */
    if (s == EKV_OK) s = ekv_vision_encode_file(v, NULL, a->image, out);
    if (s == EKV_OK) {
        double t = 0;
        for (size_t i = 0; i < n; i++) t += (double)out[i] * (double)(i % 7 + 1);
        *sum = t;
    }
    free(out);
    ekv_vision_free(v);
    return s;
}

static double sum_of(const float *x, int32_t n) {
    double s = 0;
    for (int32_t i = 0; i < n; i++) s += (double)x[i] * (double)(i % 7 + 1);
    return s;
}

struct prompt_arg {
    const struct ekv_model *model;
    struct ekv_context *ctx;
    const char *mmproj, *image, *text;
    const char *policy; /* the sequence that reads the prompt */
};

/* a vision-language pair: a chat prompt with an image, the image encoded by
 * the tower (LLaVA-1.6 anyres tiles, Idefics3 tiles with their separator
 * tokens, Qwen2-VL's grid), then the prompt read by a sequence under an
 * image-aware policy (M-RoPE positions for Qwen2-VL) */
static enum ekv_status sc_prompt(void *argp, double *sum) {
    const struct prompt_arg *a = argp;
    struct ekv_vision *v = NULL;
    struct ekv_prompt *p = NULL;
    struct ekv_seq *seq = NULL;
    const struct ekv_image_input img = {.path = a->image};
    struct ekv_model_info mi;
    ekv_model_get_info(a->model, &mi);
    const int32_t nv = mi.n_vocab;
    float *lg = __real_malloc((size_t)nv * sizeof *lg);
    enum ekv_status s = ekv_vision_load(a->mmproj, &v);
    if (s == EKV_OK) s = ekv_prompt_new(a->model, a->text, strlen(a->text), true, &p);
    if (s == EKV_OK) s = ekv_prompt_set_images(p, v, NULL, &img, 1);
    const struct ekv_segment *segs = NULL;
    int32_t ns = 0;
    if (s == EKV_OK) s = ekv_prompt_segments(p, &segs, &ns);
    for (int32_t i = 0; s == EKV_OK && i < ns; i++)
        for (int32_t j = 0; j < segs[i].n; j++)
            *sum += segs[i].embd ? (double)segs[i].embd[(size_t)j * 16] * (j % 7 + 1) : segs[i].tokens[j] * 1e-3;
    struct ekv_kv_params kv = ekv_kv_default_params();
    kv.policy = a->policy;
    kv.budget = 0.5;
    if (s == EKV_OK) s = ekv_seq_new(a->ctx, &kv, &seq);
    if (s == EKV_OK) s = ekv_seq_eval_prompt(seq, p, lg);
    if (s == EKV_OK) *sum += sum_of(lg, nv);
    ekv_seq_free(seq);
    ekv_prompt_free(p);
    ekv_vision_free(v);
    free(lg);
    return s;
}

struct seq_arg {
    struct ekv_context *ctx;
    int32_t n_vocab;
    struct ekv_kv_params kv;
    bool no_save; /* a cache that cannot be saved (on a GPU): no save / load part */
};

/* prompt, 2 steps, copy, a step of the copy, save, load, a step of the
 * loaded (the last three unless a->no_save) */
static enum ekv_status sc_seq(void *argp, double *sum) {
    struct seq_arg *a = argp;
    int32_t toks[24];
    for (int i = 0; i < 24; i++) toks[i] = 1 + (i * 37 + 11) % (a->n_vocab - 1);
    float *lg = __real_malloc((size_t)a->n_vocab * sizeof *lg);
    struct ekv_seq *s1 = NULL, *s2 = NULL, *s3 = NULL;
    void *buf = NULL;
    size_t n = 0;
    enum ekv_status s = lg ? ekv_seq_new(a->ctx, &a->kv, &s1) : EKV_ERR_NOMEM;
    if (s == EKV_OK) s = ekv_seq_prefill(s1, toks, 14, lg);
    for (int i = 0; i < 2 && s == EKV_OK; i++) s = ekv_seq_decode(s1, toks[14 + i], lg);
    if (s == EKV_OK) s = ekv_seq_copy(s1, &s2);
    if (s == EKV_OK) s = ekv_seq_decode(s2, toks[20], lg);
    if (s == EKV_OK) *sum += sum_of(lg, a->n_vocab);
    if (!a->no_save) {
        if (s == EKV_OK) s = ekv_seq_save_mem(s1, toks, 16, &buf, &n);
        if (s == EKV_OK) s = ekv_seq_load_mem(a->ctx, buf, n, &s3, NULL, NULL);
        if (s == EKV_OK) s = ekv_seq_decode(s3, toks[21], lg);
        if (s == EKV_OK) *sum += sum_of(lg, a->n_vocab) + (double)n;
    }
    free(buf);
    ekv_seq_free(s3);
    ekv_seq_free(s2);
    ekv_seq_free(s1);
    free(lg);
    return s;
}

struct eval_arg {
    struct ekv_context *ctx;
    const char *data;
};

static enum ekv_status sc_eval(void *argp, double *sum) {
    struct eval_arg *a = argp;
    struct ekv_dataset ds = {0};
    struct ekv_eval_runner r;
    memset(&r, 0, sizeof r);
    bool runner = false;
    struct ekv_data_opts o = ekv_data_default_opts();
    enum ekv_status s = ekv_dataset_load(a->data, &o, &ds);
    struct ekv_eval_cfg cfg = ekv_eval_default_cfg();
    cfg.metrics = EKV_METRIC_PPL | EKV_METRIC_KL | EKV_METRIC_ROUGE;
    cfg.n_predict = 2;
    if (s == EKV_OK) s = ekv_eval_runner_init(&r, a->ctx, &ds, &cfg);
    runner = s == EKV_OK;
    /* a group (shared prompt, batched steps) of h2o and snapkv, and a cell
     * that cannot join (--kv-chunk) and runs alone */
    struct ekv_eval_cell cell[3];
    struct ekv_kv_params kv[3];
    const char *pol[3] = {"h2o", "snapkv", "h2o"};
    for (int i = 0; i < 3; i++) {
        ekv_eval_cell_init(&cell[i]);
        kv[i] = ekv_kv_default_params();
        kv[i].policy = pol[i];
        kv[i].budget = 0.5;
    }
    kv[2].chunk = 4;
    for (size_t u = 0; runner && u < r.n_units && s == EKV_OK; u++) {
        s = ekv_eval_unit_prepare(&r, u);
        if (s == EKV_OK) s = ekv_eval_unit_run_group(&r, kv, 3, cell);
    }
    double ppl[3] = {0, 0, 0};
    if (s == EKV_OK && ekv_ppl_value(&cell[0].ppl, &ppl[0]) == EKV_OK && ekv_ppl_value(&cell[1].ppl, &ppl[1]) == EKV_OK &&
        ekv_ppl_value(&cell[2].ppl, &ppl[2]) == EKV_OK)
        *sum = ppl[0] + ppl[1] + ppl[2];
    if (runner) ekv_eval_runner_free(&r);
    ekv_dataset_free(&ds);
    return s;
}

static struct srv g_srv;

static enum ekv_status sc_request(void *argp, double *sum) {
    (void)argp;
    static const char *const bodies[3] = {
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Once upon a time there was a dog.\"}, "
        "{\"role\": \"user\", \"content\": \"Who?\"}, {\"role\": \"assistant\", \"content\": \"A dog.\"}, "
        "{\"role\": \"user\", \"content\": \"And then?\"}], \"max_tokens\": 8, \"stop\": [\"x\", \"yy\"], "
        "\"kv\": {\"policy\": \"elastic-v2:bias=1\", \"budget\": 0.3, \"type\": \"f16\"}}",
        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4, \"kv_policy\": \"snapkv\", \"kv_budget\": 0.5}",
        "{\"content\": \"Once upon a time\"}"};
    enum ekv_status s = EKV_OK;
    for (int i = 0; i < 3 && s == EKV_OK; i++) {
        struct srv_error e;
        memset(&e, 0, sizeof e);
        if (i == 2) {
            char *out = srv_tokenize_json(&g_srv, bodies[i], strlen(bodies[i]), &e);
            if (out) *sum += (double)strlen(out);
            else s = EKV_ERR_NOMEM;
            free(out);
        } else {
            struct srv_request r;
            if (srv_request_parse(&g_srv, i == 0 ? SRV_CHAT : SRV_COMPLETION, bodies[i], strlen(bodies[i]), &r, &e))
                *sum += r.n_tokens; /* not n_bounds: without memory for them the prompt is read whole */
            else
                s = e.status >= 500 ? EKV_ERR_NOMEM : EKV_ERR_INVALID_ARG;
            srv_request_free(&r);
        }
        /* the server's errors carry their message in e */
        if (s != EKV_OK) snprintf(aw_msg, sizeof aw_msg, "%s", e.message);
    }
    return s;
}

/* ---- the walks ---- */

static void walk_policies(const char *model_path, bool quantised) {
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_model_load(model_path, NULL, &m));
    struct ekv_context_params cp = ekv_context_default_params();
    cp.device = "cpu";
    cp.n_threads = 1; /* a sanitizer build walks ~13K runs: one core, not a spinning pool */
    cp.n_ctx = 128;
    if (m) CHECK_OK(ekv_context_new(m, &cp, &c));
    if (!c) {
        ekv_model_free(m);
        return;
    }
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    struct seq_arg a = {.ctx = c, .n_vocab = mi.n_vocab};
    static const char *const pols[] = {"full", "random", "local", "h2o", "scissorhands", "tova", "roco", "snapkv",
                                       "pyramidkv", "vlcache", "elastic", "elastic-v2:bias=1:key=rotate"};
    static const enum ekv_kv_type qt[][2] = {{EKV_KV_Q8_0, EKV_KV_Q4_0}, {EKV_KV_KIVI4, EKV_KV_KIVI2}};
    char name[96];
    for (size_t i = 0; i < EKV_ARRAY_LEN(pols); i++) {
        if (quantised && strcmp(pols[i], "snapkv") && strcmp(pols[i], "elastic-v2:bias=1:key=rotate")) continue;
        for (size_t t = 0; t < (quantised ? EKV_ARRAY_LEN(qt) : 1); t++) {
            a.kv = ekv_kv_default_params();
            a.kv.policy = pols[i];
            a.kv.budget = 0.4;
            a.kv.recompress = 2;
            a.kv.type_k = quantised ? qt[t][0] : EKV_KV_F16;
            a.kv.type_v = quantised ? qt[t][1] : EKV_KV_F16;
            if (quantised) a.kv.kv_residual = 0;
            snprintf(name, sizeof name, "seq %s %s/%s", pols[i], ekv_kv_type_name(a.kv.type_k),
                     ekv_kv_type_name(a.kv.type_v));
            aw_walk(name, sc_seq, &a);
        }
    }
    if (!quantised) { /* an evaluation with this model */
        char data[96];
        snprintf(data, sizeof data, "/tmp/ekv-alloc-fail-%ld.jsonl", (long)getpid());
        FILE *f = fopen(data, "w");
        if (f) {
            fputs("{\"instruction\": \"Once upon a time there was a little dog\", \"answer\": \" who liked to run.\"}\n", f);
            fclose(f);
            struct eval_arg e = {.ctx = c, .data = data};
            aw_walk("eval h2o+snapkv group, h2o chunked 0.5 ppl,kl,rouge", sc_eval, &e);
            remove(data);
        }
    }
    ekv_context_free(c);
    ekv_model_free(m);
}

/* The GPU backend (opt-in: EKV_ALLOC_FAIL_GPU=vulkan:N, e.g. lavapipe's
 * vulkan:0; each failure re-creates the device, so a walk takes minutes;
 * EKV_ALLOC_FAIL_GPU_POLICIES=full,h2o narrows it, EKV_ALLOC_FAIL_FROM=N
 * starts each walk at allocation N): a
 * context on the device and, per policy, a sequence's prompt, decode steps,
 * a copy and its step there. Only ekv's own allocations fail; the Vulkan
 * driver's are not wrapped. */
struct gpu_arg {
    const struct ekv_model *model;
    const char *device;
    struct ekv_kv_params kv;
};

static enum ekv_status sc_gpu(void *argp, double *sum) {
    struct gpu_arg *a = argp;
    struct ekv_context_params cp = ekv_context_default_params();
    cp.device = a->device;
    cp.n_ctx = 64;
    struct ekv_context *c = NULL;
    enum ekv_status s = ekv_context_new(a->model, &cp, &c);
    struct ekv_model_info mi;
    ekv_model_get_info(a->model, &mi);
    /* sc_seq's prompt, steps, copy (on the device) and its step; a saved GPU cache is refused */
    struct seq_arg sa = {.ctx = c, .n_vocab = mi.n_vocab, .kv = a->kv, .no_save = true};
    if (s == EKV_OK) s = sc_seq(&sa, sum);
    ekv_context_free(c);
    return s;
}

static void walk_gpu(const char *device) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &m));
    if (!m) return;
    static const char *const pols[] = {"full", "h2o", "elastic-v2:bias=1:key=rotate"};
    const char *only = getenv("EKV_ALLOC_FAIL_GPU_POLICIES"); /* a comma list narrows the walk */
    char name[96];
    for (size_t i = 0; i < EKV_ARRAY_LEN(pols); i++) {
        const size_t base = strcspn(pols[i], ":"); /* the policy's name without its options */
        char pname[32];
        snprintf(pname, sizeof pname, "%.*s", (int)base, pols[i]);
        if (only && *only && !strstr(only, pname)) continue;
        struct gpu_arg a = {.model = m, .device = device, .kv = ekv_kv_default_params()};
        a.kv.policy = pols[i];
        a.kv.budget = 0.4;
        a.kv.recompress = 2;
        snprintf(name, sizeof name, "gpu %s %s", device, pols[i]);
        aw_walk(name, sc_gpu, &a);
    }
    ekv_model_free(m);
}

/* Each kind of vision tower that `ekv mkmodel` writes a tiny pair of: its
 * image prompt (sc_prompt). */
static void walk_image_prompts(void) {
    static const struct {
        const char *preset, *text, *policy, *image;
    } k_pairs[] = {
        {"tiny-llava16", "USER: <image>\nDescribe. ASSISTANT:", "vlcache", "data/images/astronaut_crop.png"},
        {"tiny-smolvlm", "<|im_start|>User: <image>\nDescribe<end_of_utterance>\nAssistant:", "elastic-v2",
         "data/images/astronaut_crop.png"},
        /* Qwen2-VL towers read an image at its own size (320 x 200: 250 rows, 0.1 s a run): a small one */
        {"tiny-qwen2vl", "<|im_start|>user\n<image>Describe.<|im_end|>\n<|im_start|>assistant\n", "snapkv",
         "tests/fuzz/corpus/image/rgba_2x2.png"},
        {"tiny-qwen2.5vl", "<|im_start|>user\n<image>Describe.<|im_end|>\n<|im_start|>assistant\n", "elastic",
         "tests/fuzz/corpus/image/rgba_2x2.png"},
    };
    for (size_t i = 0; i < sizeof k_pairs / sizeof k_pairs[0]; i++) {
        char path[96], mm[112], args[192], name[96];
        snprintf(path, sizeof path, "/tmp/ekv-alloc-fail-vl-%ld.gguf", (long)getpid());
        snprintf(mm, sizeof mm, "/tmp/ekv-alloc-fail-vl-%ld.mmproj.gguf", (long)getpid());
        snprintf(args, sizeof args, "--preset %s --type f16 --seed 3 -o '%s'", k_pairs[i].preset, path);
        CHECK_MSG(tu_mkmodel(args) == 0, "ekv mkmodel %s failed", args);
        struct prompt_arg pa = {.mmproj = mm, .image = tu_src(k_pairs[i].image), .text = k_pairs[i].text, .policy = k_pairs[i].policy};
        struct ekv_model *m = NULL;
        CHECK_OK(ekv_model_load(path, NULL, &m));
        struct ekv_context_params cp = ekv_context_default_params();
        cp.device = "cpu";
        cp.n_threads = 1;
        cp.n_ctx = 2048;
        if (m) CHECK_OK(ekv_context_new(m, &cp, &pa.ctx));
        pa.model = m;
        snprintf(name, sizeof name, "%s image prompt, %s", k_pairs[i].preset, k_pairs[i].policy);
        if (pa.ctx) aw_walk(name, sc_prompt, &pa);
        ekv_context_free(pa.ctx);
        ekv_model_free(m);
        remove(path);
        remove(mm);
    }
}

int main(void) {
    const char *gpu = getenv("EKV_ALLOC_FAIL_GPU");
    if (gpu && *gpu) { /* only the GPU walk */
        /* keep lavapipe loaded until exit so that LeakSanitizer names its frames and
         * tests/lsan_gpu.supp suppresses the driver's own blocks (as test_gpu.c does) */
        (void)dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_GLOBAL);
        walk_gpu(gpu);
        printf("alloc_fail (GPU): %ld allocations failed one at a time: %ld clean errors, %ld absorbed (same results)\n",
               aw_sites, aw_clean, aw_absorbed);
        return test_finish("alloc_fail");
    }
    struct load_arg la = {.path = tu_src("models/stories260K.gguf")};
    aw_walk("model load + context (GGUF)", sc_load, &la);
    struct load_arg lb = {.path = tu_shared("models/stories260K.bin"), .tok = tu_shared("models/tok512.bin")};
    if (access(lb.path, R_OK) == 0 && access(lb.tok, R_OK) == 0) aw_walk("model load + context (llama2.c)", sc_load, &lb);
    else printf("llama2.c checkpoint: skipped: ../shared absent\n");
    walk_policies(tu_src("models/stories260K.gguf"), false);
    /* a vision tower (the fuzz corpus's tiny LLaVA-1.5 mmproj) on a JPEG and on a PNG */
    struct vision_arg va = {.mmproj = tu_src("tests/fuzz/corpus/mmproj/seed_tiny_vlm.gguf"),
                            .image = tu_src("data/images/astronaut_crop.jpg")};
    aw_walk("vision load + encode (JPEG)", sc_vision, &va);
    va.image = tu_src("data/images/astronaut_crop.png");
    aw_walk("vision load + encode (PNG)", sc_vision, &va);
    char path[96], cmd[512];
    walk_image_prompts();
    snprintf(path, sizeof path, "/tmp/ekv-alloc-fail-%ld.gguf", (long)getpid());
    snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset tiny-llama3 --n-layer 2 --type q8_0 -o '%s' > /dev/null 2>&1",
             tu_bin(), path);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    walk_policies(path, true);
    remove(path);
    /* a server request, parsed as the HTTP threads do */
    struct cli_params cli;
    cli_params_init(&cli, CLI_SERVE);
    cli.model = tu_src("models/stories260K.gguf");
    cli.n_ctx = 256;
    CHECK(srv_config_init(&g_srv, &cli));
    CHECK_OK(ekv_model_load(cli.model, NULL, &g_srv.model));
    if (g_srv.model) {
        ekv_model_get_info(g_srv.model, &g_srv.mi);
        g_srv.cfg.n_ctx = 256;
        g_srv.cfg.chat_template = "chatml";
        g_srv.cfg.prefix_cache = 1u << 20; /* message boundaries too */
        aw_walk("server request parse", sc_request, NULL);
        ekv_model_free(g_srv.model);
    }
    cli_params_free(&cli);
    printf("alloc_fail: %ld allocations failed one at a time: %ld clean errors, %ld absorbed (same results)\n", aw_sites,
           aw_clean, aw_absorbed);
    return test_finish("alloc_fail");
}
