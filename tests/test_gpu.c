/*
 * test_gpu.c — the Vulkan backend on a real Vulkan device: lavapipe (Mesa's
 * CPU device, installed by scripts/setup.sh --test) in CI, under the
 * Khronos validation layer, where any validation warning or error fails
 * the test. EKV_TEST_DEVICE=vulkan:N picks another device (a real GPU).
 *
 * - every matvec shader (each weight type) against a double-precision
 *   reference of the dequantised weights, on odd shapes;
 * - the whole forward against the CPU: stories260K logits and 64 greedy
 *   tokens; ekv-ref-28m (Q8_0, in models/) teacher-forced top-1 agreement
 *   over 512 positions of data/longctx text;
 * - the KV cache's storage types: test_gpu_kv.c;
 * - batch invariance on the GPU: batched decode == each sequence alone (an
 *   f16 and a KIVI cache in one forward), a prompt in two pieces == one
 *   piece, a prompt read by ekv_prefill_* == one piece (bit for bit);
 * - faults: no GPU for `vulkan`, a bad index, a bad spec, a cap on a full
 *   cache's entries (CPU only). Compressing policies: test_gpu_policy.c;
 * - the vision tower on the device (LLaVA-1.5, each LLaVA-1.6 tile, the
 *   project's ekv-ref-vlm) against the CPU's tower.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "ekv_eval.h"
#include "engine/backend_vk.h"
#include "engine/engine.h"
#include "gpu/vk.h"
#include "gpu/vk_push.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"
#include "vision/clip.h"
#include <unistd.h>
#include "gputest.h"
#include "testutil.h"

static char g_dev[32];


/* One matvec shader in both shapes (decode, prompt): W [ne1][ne0] of type
 * t, X [n][ne0] -> Y [n][ne1], with a bias and accumulation on top, against
 * double sums of the dequantised weights. Returns the largest error
 * relative to sum |w x|; *same: whether both shapes gave the same bits. */
static double check_matvec(struct ekv_vk *vk, enum ekv_dtype t, enum ekv_vk_mv_type mt, int ne0, int ne1, int n,
                           bool *same) {
    size_t rb = 0;
    ekv_dtype_row_bytes(t, ne0, &rb);
    uint8_t *rows = malloc(rb * (size_t)ne1);
    float *wf = malloc(sizeof(float) * (size_t)ne0 * ne1), *x = malloc(sizeof(float) * (size_t)ne0 * n);
    float *y0 = malloc(sizeof(float) * (size_t)ne1 * n), *b = malloc(sizeof(float) * (size_t)ne1);
    float *y = malloc(sizeof(float) * (size_t)ne1 * n);
    for (int r = 0; r < ne1; r++) {
        float *src = wf + (size_t)r * ne0;
        for (int c = 0; c < ne0; c++) src[c] = gt_frand();
        uint8_t *dst = rows + (size_t)r * rb;
        if (t == EKV_F32) memcpy(dst, src, rb);
        else if (t == EKV_F16 || t == EKV_BF16)
            for (int c = 0; c < ne0; c++) {
                uint16_t h = t == EKV_F16 ? ekv_f32_to_fp16(src[c]) : ekv_f32_to_bf16(src[c]);
                memcpy(dst + 2 * c, &h, 2);
            }
        else ekv_quantize_row(t, src, dst, ne0);
        ekv_dequantize_row(t, dst, src, ne0); /* the reference uses the stored values */
    }
    for (int i = 0; i < ne0 * n; i++) x[i] = gt_frand();
    for (int i = 0; i < ne1 * n; i++) y0[i] = gt_frand();
    for (int i = 0; i < ne1; i++) b[i] = gt_frand();
    /* the device layout: rows as stored, or Q8_0/Q4_0 as scales then quants */
    size_t bytes = rb * (size_t)ne1, q_off = 0;
    uint8_t *dev = rows;
    if (t == EKV_Q6_K) { /* blocks padded from 210 to 212 bytes */
        const int nb = ne0 / 256;
        bytes = (size_t)ne1 * nb * 212;
        dev = calloc(1, bytes);
        for (int r = 0; r < ne1; r++)
            for (int k = 0; k < nb; k++)
                memcpy(dev + ((size_t)r * nb + k) * 212, rows + (size_t)r * rb + (size_t)k * 210, 210);
    }
    if (t == EKV_Q8_0 || t == EKV_Q4_0) {
        const int nb = ne0 / 32, qb = t == EKV_Q8_0 ? 32 : 16, blk = t == EKV_Q8_0 ? 34 : 18;
        q_off = ((size_t)ne1 * nb * 2 + 15) & ~(size_t)15;
        bytes = q_off + (size_t)ne1 * nb * qb;
        dev = calloc(1, bytes);
        for (int r = 0; r < ne1; r++)
            for (int k = 0; k < nb; k++) {
                const uint8_t *bp = rows + (size_t)r * rb + (size_t)k * blk;
                memcpy(dev + 2 * ((size_t)r * nb + k), bp, 2);
                memcpy(dev + q_off + ((size_t)r * nb + k) * qb, bp + 2, (size_t)qb);
            }
    }
    struct ekv_vk_buf bw, bx, by, bb;
    CHECK_OK(ekv_vk_buf_new(vk, bytes, false, "w", &bw));
    CHECK_OK(ekv_vk_buf_new(vk, sizeof(float) * (size_t)ne0 * n, false, "x", &bx));
    CHECK_OK(ekv_vk_buf_new(vk, sizeof(float) * (size_t)ne1 * n, false, "y", &by));
    CHECK_OK(ekv_vk_buf_new(vk, sizeof(float) * (size_t)ne1, false, "b", &bb));

    CHECK_OK(ekv_vk_upload(vk, &bw, 0, dev, bytes));
    CHECK_OK(ekv_vk_upload(vk, &bx, 0, x, sizeof(float) * (size_t)ne0 * n));
    CHECK_OK(ekv_vk_upload(vk, &by, 0, y0, sizeof(float) * (size_t)ne1 * n));
    CHECK_OK(ekv_vk_upload(vk, &bb, 0, b, sizeof(float) * (size_t)ne1));
    double worst = 0.0;
    float *y_first = malloc(sizeof(float) * (size_t)ne1 * n);
    *same = true;
    /* shapes: decode, prompt, one activation row per workgroup */
    for (int shape = EKV_VK_MV_DECODE; shape <= EKV_VK_MV_ONE; shape++) {
    enum ekv_vk_pipe p = ekv_vk_matvec_pipe(mt, ekv_vk_matvec_m(vk), (enum ekv_vk_mv_shape)shape);
    struct ekv_vk_pc_matvec pc = {.w = bw.addr + q_off, .s = bw.addr, .x = bx.addr, .y = by.addr, .b = bb.addr,
                                  .ne0 = (uint32_t)ne0, .ne1 = (uint32_t)ne1, .n = (uint32_t)n,
                                  .x_stride = (uint32_t)ne0, .y_stride = (uint32_t)ne1,
                                  .flags = EKV_VK_MV_ACC | EKV_VK_MV_BIAS};
    CHECK_OK(ekv_vk_upload(vk, &by, 0, y0, sizeof(float) * (size_t)ne1 * n));
    CHECK_OK(ekv_vk_begin(vk));
    /* fewer workgroups than row blocks: the grid-stride loop is exercised */
    ekv_vk_dispatch(vk, p, &pc, sizeof pc, (uint32_t)(ne1 < 3 ? ne1 : 3),
                    (uint32_t)(shape == EKV_VK_MV_ONE ? n : (n + 7) / 8), 1);
    CHECK_OK(ekv_vk_submit(vk));
    CHECK_OK(ekv_vk_download(vk, &by, 0, y, sizeof(float) * (size_t)ne1 * n));
    if (shape == 0) memcpy(y_first, y, sizeof(float) * (size_t)ne1 * n);
    else *same = *same && !memcmp(y_first, y, sizeof(float) * (size_t)ne1 * n);
    for (int tt = 0; tt < n; tt++)
        for (int r = 0; r < ne1; r++) {
            double sum = 0.0, mag = 0.0;
            for (int c = 0; c < ne0; c++) {
                double v = (double)wf[(size_t)r * ne0 + c] * x[(size_t)tt * ne0 + c];
                sum += v;
                mag += fabs(v);
            }
            double want = y0[(size_t)tt * ne1 + r] + (sum + b[r]);
            double err = fabs(y[(size_t)tt * ne1 + r] - want) / (mag + fabs(b[r]) + fabs(y0[(size_t)tt * ne1 + r]));
            if (err > worst) worst = err;
        }
    }
    free(y_first);
    ekv_vk_buf_free(vk, &bw), ekv_vk_buf_free(vk, &bx), ekv_vk_buf_free(vk, &by), ekv_vk_buf_free(vk, &bb);
    if (dev != rows) free(dev);
    free(rows), free(wf), free(x), free(y0), free(b), free(y);
    return worst;
}

static void test_matvec_shaders(void) {
    struct ekv_vk *vk = NULL;
    CHECK_OK(ekv_vk_open(g_dev, &vk));
    if (!vk) return;
    /* shapes: rows not multiples of the grid (grid-stride), 1 and many
     * activation rows (8 per workgroup), columns with and without the
     * vector path (ne0 % 8) */
    /* rows of 8k values (the shader reads 16-byte pieces; the engine refuses others) */
    const int shapes[][3] = {{64, 7, 1},   {96, 33, 3},   {256, 130, 9}, {512, 17, 17}, {40, 5, 2},
                             {768, 21, 11}, {1024, 3, 1}, {2304, 70, 4}};
    /* in the order of enum ekv_vk_mv_type (the pipelines) */
    const enum ekv_dtype types[] = {EKV_F32, EKV_F16, EKV_BF16, EKV_Q8_0, EKV_Q4_0, EKV_Q4_K, EKV_Q5_K, EKV_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum ekv_dtype t = types[ti];
        const int blk = t == EKV_Q4_K || t == EKV_Q5_K || t == EKV_Q6_K ? 256 : t == EKV_Q8_0 || t == EKV_Q4_0 ? 32 : 1;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int ne0 = shapes[si][0], ne1 = shapes[si][1], n = shapes[si][2];
            if (ne0 % blk) continue;
            bool same = false;
            double e = check_matvec(vk, types[ti], (enum ekv_vk_mv_type)ti, ne0, ne1, n, &same);
            /* float32 sums of up to 2304 products: relative error of a few ulps x sqrt(n) */
            CHECK_MSG(e < 2e-5, "matvec %s %dx%d x %d rows: relative error %.3g", ekv_dtype_name(types[ti]), ne1,
                      ne0, n, e);
            CHECK_MSG(same, "matvec %s %dx%d x %d rows: decode and prompt shapes differ", ekv_dtype_name(types[ti]),
                      ne1, ne0, n);
        }
    }
    CHECK_MSG(ekv_vk_validation_errors(vk) == 0, "%llu validation messages, first: %s",
              (unsigned long long)ekv_vk_validation_errors(vk), ekv_vk_validation_first(vk));
    ekv_vk_close(vk);
}


/* stories260K: prompt logits close to the CPU's, 64 greedy tokens equal. */
static void test_stories_greedy(void) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &m));
    if (!m) return;
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 256), *cc = gt_ctx_on(m, "cpu", 256);
    CHECK(cg && cg->gpu && strstr(ekv_context_device(cg), "vulkan:") == ekv_context_device(cg));
    CHECK(cc && !cc->gpu && !strcmp(ekv_context_device(cc), "cpu"));
    CHECK(ekv_context_device_bytes(cg) > 0 && ekv_context_device_bytes(cc) == 0);
    struct ekv_seq *sg = NULL, *sc = NULL;
    CHECK_OK(ekv_seq_new(cg, NULL, &sg));
    CHECK_OK(ekv_seq_new(cc, NULL, &sc));
    CHECK(ekv_seq_on_device(sg) && !ekv_seq_on_device(sc));
    const int32_t V = m->info.n_vocab;
    float *lg = malloc(sizeof(float) * V), *lc = malloc(sizeof(float) * V);
    int32_t toks[64];
    size_t ntz = 0;
    CHECK_OK(ekv_tokenize(m, "Once upon a time", 16, true, false, toks, 64, &ntz));
    const int32_t nt = (int32_t)ntz;
    CHECK_OK(ekv_seq_prefill(sg, toks, nt, lg));
    CHECK_OK(ekv_seq_prefill(sc, toks, nt, lc));
    double maxd = 0.0, maxv = 0.0;
    for (int32_t i = 0; i < V; i++) {
        maxd = fmax(maxd, fabs(lg[i] - lc[i]));
        maxv = fmax(maxv, fabs(lc[i]));
    }
    printf("stories260K prompt logits: max |gpu - cpu| %.3g (max |logit| %.3g)\n", maxd, maxv);
    CHECK_MSG(maxd <= 1e-3 * maxv, "max diff %.3g", maxd);
    int same = 0;
    for (int step = 0; step < 64; step++) {
        int32_t a = gt_argmax(lg, V), b = gt_argmax(lc, V);
        same += a == b;
        if (a != b) break;
        CHECK_OK(ekv_seq_decode(sg, a, lg));
        CHECK_OK(ekv_seq_decode(sc, b, lc));
    }
    CHECK_MSG(same == 64, "greedy tokens equal for %d of 64 steps", same);
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(sg, &st);
    CHECK(st.n_seen == nt + 64 && st.entries == st.entries_full && st.bytes > 0);
    gt_check_validation(cg);
    free(lg), free(lc);
    ekv_seq_free(sg), ekv_seq_free(sc);
    ekv_context_free(cg), ekv_context_free(cc);
    ekv_model_free(m);
}

/* ekv-ref-28m Q8_0: teacher-forced top-1 agreement over 512 positions. */
/* Teacher-forced top-1 agreement GPU vs CPU over the first n positions of a
 * data/longctx text, and the largest logit difference relative to the
 * largest logit (below max_rel). */
static void test_ref28m_agreement(const char *path, const char *label, int n, double min_agree, double max_rel) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m) return;
    size_t len = 0;
    char *text = tu_read_file(tu_src("data/longctx/cont_1k.jsonl"), &len);
    CHECK(text != NULL);
    if (!text) {
        ekv_model_free(m);
        return;
    }
    const int N = n;
    int32_t *toks = malloc(sizeof(int32_t) * (len + 8));
    size_t ntz = 0;
    CHECK_OK(ekv_tokenize(m, text, len, true, false, toks, len + 8, &ntz));
    const int32_t nt = (int32_t)ntz;
    CHECK(nt >= N);
    const int32_t V = m->info.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V * N), *lc = malloc(sizeof(float) * (size_t)V * N);
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 1024), *cc = gt_ctx_on(m, "cpu", 1024);
    struct ekv_seq *sg = NULL, *sc = NULL;
    CHECK_OK(ekv_seq_new(cg, NULL, &sg));
    CHECK_OK(ekv_seq_new(cc, NULL, &sc));
    struct ekv_segment seg = {.tokens = toks, .n = N, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &seg, .n_segs = 1, .is_prompt = true, .logits_all = true};
    CHECK_OK(ekv_seq_eval(sg, &in, lg));
    CHECK_OK(ekv_seq_eval(sc, &in, lc));
    int agree = 0;
    double maxrel = 0.0;
    for (int i = 0; i < N; i++) {
        const float *a = lg + (size_t)i * V, *b = lc + (size_t)i * V;
        agree += gt_argmax(a, V) == gt_argmax(b, V);
        double d = 0.0, mv = 0.0;
        for (int32_t j = 0; j < V; j++) d = fmax(d, fabs(a[j] - b[j])), mv = fmax(mv, fabs(b[j]));
        maxrel = fmax(maxrel, d / mv);
    }
    printf("%s, %d positions: top-1 agreement %.4f, max |gpu - cpu| / max |logit| %.3g\n", label, N,
           agree / (double)N, maxrel);
    CHECK_MSG(agree >= (int)ceil(min_agree * N), "%s: top-1 agreement %d of %d", label, agree, N);
    CHECK_MSG(maxrel < max_rel, "%s: max relative logit difference %.3g", label, maxrel);
    gt_check_validation(cg);
    free(lg), free(lc), free(toks), free(text);
    ekv_seq_free(sg), ekv_seq_free(sc);
    ekv_context_free(cg), ekv_context_free(cc);
    ekv_model_free(m);
}

/* EKV_VK_PROFILE: device time per shader, summed over forwards; none on the CPU. */
static void test_profile(void) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &m));
    if (!m) return;
    setenv("EKV_VK_PROFILE", "1", 1);
    struct ekv_context *cg = gt_ctx_on(m, g_dev, 64), *cc = gt_ctx_on(m, "cpu", 64);
    unsetenv("EKV_VK_PROFILE");
    struct ekv_seq *s = NULL;
    CHECK_OK(ekv_seq_new(cg, NULL, &s));
    int32_t toks[3] = {1, 400, 20};
    float *lg = malloc(sizeof(float) * m->info.n_vocab);
    CHECK_OK(ekv_seq_prefill(s, toks, 3, lg));
    CHECK_OK(ekv_seq_decode(s, 7, lg));
    char buf[2048];
    CHECK_OK(ekv_context_device_profile(cg, buf, sizeof buf));
    /* 5 layers x 2 forwards: 10 attention dispatches, 10 x 3 projections + wo + 3 ffn + classifier */
    CHECK_MSG(strstr(buf, "matvec_f32") && strstr(buf, "rmsnorm") && strstr(buf, "attn_f16_f16 "), "%s", buf);
    const char *a = strstr(buf, "\nattn_f16_f16 ");
    CHECK(a && strtoull(a + 14, NULL, 10) == 10);
    CHECK(ekv_context_device_profile(cc, buf, sizeof buf) == EKV_ERR_UNSUPPORTED);
    gt_check_validation(cg);
    free(lg);
    ekv_seq_free(s);
    ekv_context_free(cg), ekv_context_free(cc);
    ekv_model_free(m);
}

/* Batched decode == alone; a prompt in two pieces == one piece; bit for bit. */
static void test_batch_invariance(void) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &m));
    if (!m) return;
    struct ekv_context *c = gt_ctx_on(m, g_dev, 256);
    const int32_t V = m->info.n_vocab;
    int32_t p1[40], p2[23];
    for (int i = 0; i < 40; i++) p1[i] = 1 + (i * 37) % (V - 1);
    for (int i = 0; i < 23; i++) p2[i] = 1 + (i * 91 + 5) % (V - 1);
    struct ekv_seq *a = NULL, *b = NULL, *a2 = NULL, *b2 = NULL, *pc = NULL;
    /* b in another storage type (KIVI 4-bit, group 8, residual 16: its
     * prompt and decode steps cross quantisation blocks) batched with a in f16 */
    struct ekv_kv_params kb = ekv_kv_default_params();
    kb.type_k = kb.type_v = EKV_KV_KIVI4;
    kb.kv_group = 8;
    kb.kv_residual = 16;
    CHECK_OK(ekv_seq_new(c, NULL, &a));
    CHECK_OK(ekv_seq_new(c, &kb, &b));
    CHECK_OK(ekv_seq_new(c, NULL, &a2));
    CHECK_OK(ekv_seq_new(c, &kb, &b2));
    CHECK_OK(ekv_seq_new(c, NULL, &pc));
    CHECK(ekv_seq_on_device(b) && ekv_seq_on_device(b2));
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V), *lbat = malloc(sizeof(float) * 2 * V);
    float *lp = malloc(sizeof(float) * V);
    CHECK_OK(ekv_seq_prefill(a, p1, 40, la));
    CHECK_OK(ekv_seq_prefill(b, p2, 23, lb));
    CHECK_OK(ekv_seq_prefill(a2, p1, 40, la));
    CHECK_OK(ekv_seq_prefill(b2, p2, 23, lb));
    /* the same prompt in pieces of 17 and 23 */
    CHECK_OK(ekv_seq_prefill(pc, p1, 17, lp));
    CHECK_OK(ekv_seq_prefill(pc, p1 + 17, 23, lp));
    CHECK_MSG(!memcmp(lp, la, sizeof(float) * V), "prompt in two pieces differs from one piece");
    int same = 1;
    for (int step = 0; step < 8; step++) {
        int32_t ta = gt_argmax(la, V), tb = gt_argmax(lb, V);
        struct ekv_seq *both[2] = {a2, b2};
        int32_t tk[2] = {ta, tb};
        CHECK_OK(ekv_decode_batch(c, both, tk, 2, lbat));
        CHECK_OK(ekv_seq_decode(a, ta, la));
        CHECK_OK(ekv_seq_decode(b, tb, lb));
        same &= !memcmp(lbat, la, sizeof(float) * V) && !memcmp(lbat + V, lb, sizeof(float) * V);
    }
    CHECK_MSG(same, "batched decode differs from decode alone");
    gt_check_validation(c);
    free(la), free(lb), free(lbat), free(lp);
    ekv_seq_free(a), ekv_seq_free(b), ekv_seq_free(a2), ekv_seq_free(b2), ekv_seq_free(pc);
    ekv_context_free(c);
    ekv_model_free(m);
}

/* Every tiny architecture preset of `ekv mkmodel` (F32 weights, F32 cache)
 * and every RoPE scaling, GPU against CPU: prompt logits of every row and
 * four decode steps, max |gpu - cpu| / max |logit| stated per case (2-3e-7
 * measured on lavapipe; bound 1e-5). Gemma's shape (GeGLU, head 256) has no
 * tiny preset: its full vocabulary would make a 2 GB test file. */
static void test_presets(void) {
    static const struct {
        const char *label, *args;
        int n;
    } cases[] = {
        {"tiny-llama3 (rope_freqs, tied output)", "--preset tiny-llama3", 96},
        {"tiny-llama3, linear x4", "--preset tiny-llama3 --rope-scaling linear --rope-scale 4", 96},
        {"tiny-llama3, yarn x4 from 1024", "--preset tiny-llama3 --rope-scaling yarn --rope-scale 4 --rope-orig-ctx 1024",
         96},
        {"tiny-mistral (sliding window 32)", "--preset tiny-mistral", 100},
        {"tiny-phi3 (fused QKV/gate-up, NeoX, longrope long factors)", "--preset tiny-phi3", 96},
        {"tiny-vlm language model (n_ff 172: padded rows)", "--preset tiny-vlm", 96},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char path[96], cmd[512];
        snprintf(path, sizeof path, "/tmp/ekv-test-gpu-%ld-preset%d.gguf", (long)getpid(), (int)ci);
        snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel %s --type f32 -o '%s' > /dev/null 2>&1", tu_bin(),
                 cases[ci].args, path);
        CHECK_MSG(system(cmd) == 0, "%s: %s failed", cases[ci].label, cmd);
        struct ekv_model *m = NULL;
        CHECK_OK(ekv_model_load(path, NULL, &m));
        if (!m) continue;
        struct ekv_context *cg = gt_ctx_on(m, g_dev, 1024), *cc = gt_ctx_on(m, "cpu", 1024);
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.type_k = kp.type_v = EKV_KV_F32;
        struct ekv_seq *sg = NULL, *sc = NULL;
        CHECK_OK(ekv_seq_new(cg, &kp, &sg));
        CHECK_OK(ekv_seq_new(cc, &kp, &sc));
        CHECK(sg && ekv_seq_on_device(sg));
        const int32_t V = m->info.n_vocab, N = cases[ci].n;
        int32_t toks[128];
        for (int32_t i = 0; i < N; i++) toks[i] = 1 + (i * 37 + 11) % (V - 1);
        float *lg = malloc(sizeof(float) * (size_t)V * N), *lc = malloc(sizeof(float) * (size_t)V * N);
        double maxv = 0.0, maxd = gt_prompt_diff(sg, sc, toks, N, V, lg, lc, &maxv);
        const float *last = lc + (size_t)V * (N - 1);
        for (int step = 0; step < 4; step++) { /* both follow the CPU's greedy token */
            const int32_t t = gt_argmax(step == 0 ? last : lc, V);
            CHECK_OK(ekv_seq_decode(sg, t, lg));
            CHECK_OK(ekv_seq_decode(sc, t, lc));
            for (int32_t i = 0; i < V; i++) maxd = fmax(maxd, fabs(lg[i] - lc[i])), maxv = fmax(maxv, fabs(lc[i]));
        }
        printf("%s: %d prompt rows + 4 decode steps, max |gpu - cpu| / max |logit| %.3g\n", cases[ci].label, N,
               maxv > 0 ? maxd / maxv : maxd);
        CHECK_MSG(maxv > 0 && maxd <= 1e-5 * maxv, "%s: max |gpu - cpu| %.3g of max |logit| %.3g", cases[ci].label, maxd,
                  maxv);
        gt_check_validation(cg);
        free(lg), free(lc);
        ekv_seq_free(sg), ekv_seq_free(sc);
        ekv_context_free(cg), ekv_context_free(cc);
        ekv_model_free(m);
        remove(path);
        char mmproj[112]; /* a vision preset writes its tower beside the model */
        snprintf(mmproj, sizeof mmproj, "/tmp/ekv-test-gpu-%ld-preset%d.mmproj.gguf", (long)getpid(), (int)ci);
        remove(mmproj);
    }
}

/* A prompt read in pieces (ekv_prefill_*, the server's way) on the GPU: in
 * chunks of 7 rows through all layers, equal bit for bit to the prompt in
 * one piece (logits, then 4 decode steps), for row types and KIVI (one
 * chunk there); units counted down. */
static void test_prefill_pieces(void) {
    char path[96], cmd[256];
    snprintf(path, sizeof path, "/tmp/ekv-test-gpu-%ld-pf.gguf", (long)getpid());
    snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset tiny-llama3 --type f32 -o '%s' > /dev/null 2>&1", tu_bin(), path);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m) return;
    struct ekv_context *c = gt_ctx_on(m, g_dev, 256);
    const int32_t V = m->info.n_vocab, N = 45, L = m->info.n_layer;
    int32_t toks[45];
    for (int32_t i = 0; i < N; i++) toks[i] = 1 + (i * 53 + 7) % (V - 1);
    const enum ekv_kv_type types[3] = {EKV_KV_F16, EKV_KV_Q8_0, EKV_KV_KIVI4};
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    for (int ti = 0; ti < 3; ti++) {
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.type_k = kp.type_v = types[ti];
        kp.kv_group = 8;
        kp.kv_residual = 16;
        struct ekv_seq *a = NULL, *b = NULL;
        CHECK_OK(ekv_seq_new(c, &kp, &a));
        CHECK_OK(ekv_seq_new(c, &kp, &b));
        if (!a || !b) {
            ekv_seq_free(a), ekv_seq_free(b);
            continue;
        }
        CHECK(ekv_seq_on_device(a) && ekv_seq_on_device(b));
        CHECK_OK(ekv_seq_prefill(a, toks, N, la));
        struct ekv_segment sg = {.tokens = toks, .n = N, .tag = EKV_TAG_TEXT};
        struct ekv_input in = {.segs = &sg, .n_segs = 1, .is_prompt = true};
        struct ekv_prefill *pf = NULL;
        CHECK_OK(ekv_prefill_new(b, &in, 7, &pf));
        const int64_t units0 = ekv_prefill_units_left(pf);
        const bool kivi = types[ti] == EKV_KV_KIVI4;
        CHECK_MSG(units0 == (int64_t)L * (kivi ? 1 : (N + 6) / 7), "%s: %lld units", ekv_kv_type_name(types[ti]),
                  (long long)units0);
        bool done = false;
        int steps = 0;
        while (!done && steps < 100) {
            CHECK_OK(ekv_prefill_step(pf, 1, lb, &done)); /* 1 unit asked: a whole chunk runs */
            steps++;
            if (!done) CHECK(ekv_prefill_units_left(pf) == units0 - (int64_t)steps * L);
        }
        CHECK(done && ekv_prefill_units_left(pf) == 0 && steps == (kivi ? 1 : (N + 6) / 7));
        ekv_prefill_free(pf);
        bool same = !memcmp(la, lb, sizeof(float) * V);
        for (int step = 0; step < 4; step++) {
            const int32_t t = gt_argmax(la, V);
            CHECK_OK(ekv_seq_decode(a, t, la));
            CHECK_OK(ekv_seq_decode(b, t, lb));
            same = same && !memcmp(la, lb, sizeof(float) * V);
        }
        CHECK_MSG(same, "%s: the prompt in chunks of 7 differs from one piece", ekv_kv_type_name(types[ti]));
        ekv_seq_free(a), ekv_seq_free(b);
    }
    gt_check_validation(c);
    free(la), free(lb);
    ekv_context_free(c);
    ekv_model_free(m);
    remove(path);
}

static void test_faults(void) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(tu_src("models/stories260K.gguf"), NULL, &m));
    if (!m) return;
    struct ekv_context_params cp = ekv_context_default_params();
    struct ekv_context *c = NULL;
    cp.device = "vulkan:99";
    CHECK(ekv_context_new(m, &cp, &c) == EKV_ERR_NOT_FOUND && !c && strstr(ekv_last_error(), "vulkan:99"));
    cp.device = "metal";
    CHECK(ekv_context_new(m, &cp, &c) == EKV_ERR_INVALID_ARG && !c && strstr(ekv_last_error(), "metal"));
    /* `vulkan` takes GPUs only: with lavapipe alone it is a clear error, never lavapipe */
    struct ekv_device_info d[8];
    int32_t n = 0;
    bool any_gpu = false;
    CHECK_OK(ekv_devices_list(d, 8, &n));
    for (int32_t i = 0; i < n && i < 8; i++) any_gpu |= d[i].usable && strcmp(d[i].type, "cpu") != 0;
    cp.device = "vulkan";
    enum ekv_status s = ekv_context_new(m, &cp, &c);
    if (!any_gpu) CHECK_MSG(s == EKV_ERR_NOT_FOUND && !c, "vulkan without a GPU: %s", ekv_status_str(s));
    ekv_context_free(c);
    c = NULL;
    cp.device = "auto";
    CHECK_OK(ekv_context_new(m, &cp, &c));
    if (!any_gpu) CHECK(c && !strcmp(ekv_context_device(c), "cpu"));
    ekv_context_free(c);
    /* a compressing policy runs on the device (test_gpu_policy: what it
     * refuses, KIVI storage with such a policy) */
    c = gt_ctx_on(m, g_dev, 128);
    /* the device list says whether the quantised cache types can run there */
    for (int32_t i = 0; c && c->gpu && i < n && i < 8; i++)
        if (!strncmp(g_dev, "vulkan:", 7) && d[i].index == atoi(g_dev + 7))
            CHECK(d[i].fp64 == ekv_vk_has_f64(c->gpu->vk));
    struct ekv_kv_params kp = ekv_kv_default_params();
    kp.policy = "h2o";
    kp.budget = 0.5;
    struct ekv_seq *sq = NULL;
    CHECK_OK(ekv_seq_new(c, &kp, &sq));
    CHECK(sq && ekv_seq_on_device(sq));
    ekv_seq_free(sq);
    sq = NULL;
    kp.policy = "full";
    kp.budget = 1.0;
    kp.max_tokens = 16; /* full ignores a cap on entries (as on the CPU): on the device too */
    enum ekv_status scap = ekv_seq_new(c, &kp, &sq);
    CHECK_MSG(scap == EKV_OK && sq && ekv_seq_on_device(sq), "%s: %s", ekv_status_str(scap), ekv_last_error());
    ekv_seq_free(sq);
    sq = NULL;
    kp.max_tokens = 0;
    /* f32 storage runs on the GPU and agrees with f16 on the greedy token */
    kp.type_k = kp.type_v = EKV_KV_F32;
    CHECK_OK(ekv_seq_new(c, &kp, &sq));
    CHECK(ekv_seq_on_device(sq));
    int32_t toks[4] = {1, 400, 20, 33};
    float *lg = malloc(sizeof(float) * m->info.n_vocab);
    CHECK_OK(ekv_seq_prefill(sq, toks, 4, lg));
    /* the context runs out: an error, not a crash */
    int32_t many[200];
    for (int i = 0; i < 200; i++) many[i] = 5;
    CHECK(ekv_seq_prefill(sq, many, 200, lg) == EKV_ERR_CONTEXT_FULL);
    gt_check_validation(c);
    free(lg);
    ekv_seq_free(sq);
    ekv_context_free(c);
    ekv_model_free(m);
}

/* One image through the tower on the device of cg and on the CPU
 * (ekv_vision_encode_input, as a prompt's image slot is filled): max |gpu -
 * cpu| / max |cpu| over every row, or -1 when either failed. */
static double tower_diff(const struct ekv_vision *v, struct ekv_context *cg, const char *image, int32_t *rows) {
    const struct ekv_image_input in = {.path = image};
    float *eg = NULL, *ec = NULL;
    int32_t ng = 0, nc = 0, tr;
    int gx, gy, gw, gh;
    CHECK_OK(ekv_vision_encode_input(v, cg, &in, 0, &eg, &ng, &gx, &gy, &tr, &gw, &gh));
    CHECK_OK(ekv_vision_encode_input(v, NULL, &in, 0, &ec, &nc, &gx, &gy, &tr, &gw, &gh));
    double md = -1.0, mv = 0.0;
    if (eg && ec && ng == nc && ng > 0) {
        md = 0.0;
        const size_t n = (size_t)ng * (size_t)ekv_vision_n_embd(v);
        for (size_t i = 0; i < n; i++) md = fmax(md, fabs(eg[i] - ec[i])), mv = fmax(mv, fabs(ec[i]));
        md = mv > 0 ? md / mv : md;
    }
    *rows = ng;
    free(eg), free(ec);
    return md;
}

/* The vision tower on the device (backend_vk_clip.c) against the CPU's:
 * tiny-vlm (LLaVA-1.5 layout: class token, pre-norm, quick GELU, mlp
 * projector), tiny-llava16 (the overview and each anyres tile),
 * tiny-qwen2vl (two patch kernels, 2D RoPE, 2 x 2 merger) and
 * tiny-qwen2.5vl (RMSNorm, SwiGLU, windowed blocks) at the image's own
 * size, tiny-smolvlm (Idefics3: SigLIP without a class token, each tile
 * and the overview, the pixel shuffle, the connector), and the project's
 * ekv-ref-vlm (real weights) on a scene of its
 * dev set. Bound
 * 1e-5 of the largest embedding (the sums run in other orders; measured on
 * lavapipe: printed). The tower must have run on the device (its weights
 * in the context's tower table). */
static void test_vision(void) {
    static const char *const presets[] = {"tiny-vlm", "tiny-llava16", "tiny-qwen2vl", "tiny-qwen2.5vl", "tiny-smolvlm",
                                          NULL};
    for (size_t pi = 0; pi < 6; pi++) {
        char path[128], mm[140], cmd[512];
        if (presets[pi]) {
            snprintf(path, sizeof path, "/tmp/ekv-test-gpu-%ld-vision%d.gguf", (long)getpid(), (int)pi);
            snprintf(mm, sizeof mm, "/tmp/ekv-test-gpu-%ld-vision%d.mmproj.gguf", (long)getpid(), (int)pi);
            snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset %s --type f32 -o '%s' > /dev/null 2>&1", tu_bin(),
                     presets[pi], path);
            CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
        } else {
            snprintf(path, sizeof path, "%s", tu_shared("models/ekv-ref-vlm-lm-f16.gguf"));
            snprintf(mm, sizeof mm, "%s", tu_shared("models/ekv-ref-vlm-mmproj-f16.gguf"));
            FILE *f = fopen(mm, "rb");
            if (!f) {
                printf("vision: ekv-ref-vlm skipped: ../shared absent\n");
                continue;
            }
            fclose(f);
        }
        struct ekv_model *m = NULL;
        struct ekv_vision *v = NULL;
        CHECK_OK(ekv_model_load(path, NULL, &m));
        CHECK_OK(ekv_vision_load(mm, &v));
        struct ekv_context *cg = m ? gt_ctx_on(m, g_dev, 256) : NULL;
        if (cg && v) {
            const char *img = presets[pi] ? tu_src("data/images/astronaut_crop.png")
                                          : tu_shared("data/scenes/dev/images/dev_0000.png");
            int32_t rows = 0;
            const double d = tower_diff(v, cg, img, &rows);
            const char *label = presets[pi] ? presets[pi] : "ekv-ref-vlm";
            printf("vision tower %s: %d rows, max |gpu - cpu| / max |cpu| %.3g, %d tensors on the device\n", label,
                   (int)rows, d, (int)cg->gpu->tower.ct.n);
            CHECK_MSG(d >= 0 && d <= 1e-5, "%s: the device's tower differs by %.3g", label, d);
            CHECK_MSG(cg->gpu->tower.ct.n > 0, "%s: the tower did not run on the device", label);
            gt_check_validation(cg);
            if (pi == 1) { /* a device of the tower's own, encoding without a context (the server's way) */
                CHECK_OK(ekv_vision_set_device(v, g_dev));
                CHECK(strstr(ekv_vision_device(v), "vulkan") != NULL);
                const struct ekv_image_input in = {.path = img};
                float *eo = NULL, *ec = NULL;
                int32_t no = 0, nc = 0, tr;
                int gx, gy, gw, gh;
                CHECK_OK(ekv_vision_encode_input(v, NULL, &in, 0, &eo, &no, &gx, &gy, &tr, &gw, &gh));
                CHECK_OK(ekv_vision_set_device(v, "cpu"));
                CHECK(!strcmp(ekv_vision_device(v), "cpu"));
                CHECK_OK(ekv_vision_encode_input(v, NULL, &in, 0, &ec, &nc, &gx, &gy, &tr, &gw, &gh));
                double md = 0, mv = 0;
                for (size_t i = 0; eo && ec && no == nc && i < (size_t)no * (size_t)ekv_vision_n_embd(v); i++)
                    md = fmax(md, fabs(eo[i] - ec[i])), mv = fmax(mv, fabs(ec[i]));
                printf("vision tower %s on a device of its own: max |gpu - cpu| / max |cpu| %.3g\n", label,
                       mv > 0 ? md / mv : md);
                /* the CPU's result again would be 0: nonzero shows the device ran it */
                CHECK_MSG(eo && ec && no == nc && md > 0 && md <= 1e-5 * mv, "%s on its own device: %.3g of %.3g", label,
                          md, mv);
                free(eo), free(ec);
                CHECK(ekv_vision_set_device(v, "gpu0") == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "gpu0"));
            }
        }
        ekv_context_free(cg);
        ekv_vision_free(v);
        ekv_model_free(m);
        if (presets[pi]) remove(path), remove(mm);
    }
    /* a tower the device cannot run: refused, with the reason (a SwiGLU tower
     * with quick GELU, made by clearing tiny-qwen2.5vl's activation flags) */
    char path[128], mm[140], cmd[512];
    snprintf(path, sizeof path, "/tmp/ekv-test-gpu-%ld-q25.gguf", (long)getpid());
    snprintf(mm, sizeof mm, "/tmp/ekv-test-gpu-%ld-q25.mmproj.gguf", (long)getpid());
    snprintf(cmd, sizeof cmd, "'%s/ekv' mkmodel --preset tiny-qwen2.5vl --type f32 -o '%s' > /dev/null 2>&1", tu_bin(),
             path);
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    struct ekv_clip *c = NULL;
    CHECK_OK(ekv_clip_load(mm, &c));
    if (c) {
        CHECK(ekv_vk_tower_unsupported(c) == NULL);
        struct ekv_clip_hparams *hp = (struct ekv_clip_hparams *)ekv_clip_hparams(c);
        const bool gelu = hp->use_gelu, silu = hp->use_silu;
        hp->use_gelu = hp->use_silu = false;
        const char *why = ekv_vk_tower_unsupported(c);
        CHECK_MSG(why && strstr(why, "quick GELU"), "a SwiGLU tower with quick GELU: %s", why ? why : "accepted");
        hp->use_gelu = gelu, hp->use_silu = silu;
    }
    ekv_clip_free(c);
    remove(path), remove(mm);
}


int main(void) {
    if (!gt_start("test_gpu", g_dev, sizeof g_dev)) return test_finish("test_gpu");
    if (gt_only("matvec")) test_matvec_shaders();
    if (gt_only("stories")) test_stories_greedy();
    if (gt_only("presets")) test_presets();
    if (gt_only("batch")) test_batch_invariance();
    if (gt_only("pieces")) test_prefill_pieces();
    if (gt_only("faults")) test_faults();
    if (gt_only("vision")) test_vision();
    if (gt_only("profile")) test_profile();
    if (!gt_only("ref28m")) return test_finish("test_gpu");
    /* F16, the model's own format: the CPU converts activations to f16 for F16
     * weights or not (see the printed number); Q8_0: the CPU quantises
     * activations to Q8 blocks (as llama.cpp's CPU does), the GPU keeps them
     * f32, so near-ties flip more often: a lower bound, stated */
    FILE *f16 = fopen(tu_shared("models/ekv-ref-28m-f16.gguf"), "rb");
    if (f16) {
        fclose(f16);
        test_ref28m_agreement(tu_shared("models/ekv-ref-28m-f16.gguf"), "ekv-ref-28m-f16", 512, 0.995, 0.05);
        /* K-quants (converted here: ekv quantize --type q4_k / q6_k); the CPU
         * quantises activations to Q8_K blocks (one scale per 256 values,
         * coarser than Q8_0's 32), the GPU keeps them f32: bounds measured
         * on lavapipe over 256 positions: q4_k 0.941, 0.0488; q6_k 0.965,
         * 0.0372; 128 are checked (the GPU's own rounding is bounded by the shader
         * test above: < 2e-5 of sum |w x| against the dequantised weights) */
        const char *kt[2] = {"q4_k", "q6_k"};
        const double kmin[2] = {0.93, 0.955};
        for (int i = 0; i < 2; i++) {
            char path[64], label[48];
            snprintf(path, sizeof path, "/tmp/ekv-test-gpu-%ld-%s.gguf", (long)getpid(), kt[i]);
            snprintf(label, sizeof label, "ekv-ref-28m-%s", kt[i]);
            struct ekv_quantize_params qp = ekv_quantize_default_params();
            qp.type = kt[i];
            CHECK_OK(ekv_model_quantize(tu_shared("models/ekv-ref-28m-f16.gguf"), path, &qp, NULL));
            test_ref28m_agreement(path, label, 128, kmin[i], 0.08);
            remove(path);
        }
    } else {
        printf("skipped: ../shared absent (ekv-ref-28m-f16.gguf)\n");
    }
    test_ref28m_agreement(tu_src("models/ekv-ref-28m-q8_0.gguf"), "ekv-ref-28m-q8_0", 256, 0.98, 0.05);
    return test_finish("test_gpu");
}
