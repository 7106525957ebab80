/*
 * test_mrope.c — M-RoPE (Qwen2-VL, architecture "qwen2vl") in the language
 * model and the KV cache, on a tiny-qwen2vl pair written by `ekv mkmodel`
 * (f32, seed 3) and the repository's astronaut_crop.png (320 x 200):
 *  - the kernels: three positions equal give the one-position RoPE bit for
 *    bit; each pair takes its section's component (llama.cpp's
 *    ggml_rope_multi rule, wrapping when the sections cover fewer pairs);
 *    turning a key by per-component deltas lands where rotating it there
 *    directly does; ekv_rope_shift_cs's pairs turn it the same, bit for bit;
 *  - the prompt: the image's rows cached with (t, t + row, t + col), text
 *    after it shifted back by rows - max(grid), the next position equal to
 *    mtmd's n_pos; a grid that does not match its rows refused;
 *  - agreement with llama.cpp's mtmd, recorded by the probes of
 *    docs/models.md on this exact file and image (first-token logits at a
 *    few ids, 16 greedy tokens; without M-RoPE the same logits move by
 *    0.008 and greedy leaves mtmd's at step 6 on a smaller image);
 *  - one prompt read in pieces (ekv_prefill_step, 7 rows a unit) equals one
 *    ekv_seq_eval bit for bit, and so do a copy and a saved-and-loaded
 *    cache decoding on; the saved file cut short is refused; compressed
 *    caches (elastic-v2 key=rotate, snapkv, ...) run;
 *  - refusals: --kv-compat ref, sections that do not fit the rotated pairs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "kv/kv.h"
#include "testutil.h"

static char g_dir[] = "/tmp/ekv_test_mrope_XXXXXX";
static char g_lm[256], g_mm[256];

static const char k_prompt[] = "<|im_start|>user\n<image>Describe the image.<|im_end|>\n<|im_start|>assistant\n";
/* llama.cpp v0.5.0 mtmd (tools/mtmd, CPU, f32 KV) on tiny-qwen2vl f32 seed 3 and
 * data/images/astronaut_crop.png, prompt k_prompt with <__media__>: 260 image
 * tokens (20 x 13), n_pos 76 */
static const int32_t k_mtmd_greedy[16] = {466, 260, 77, 237, 222, 222, 222, 222,
                                          222, 222, 222, 222, 222, 222, 222, 222};
static const struct {
    int32_t id;
    float logit;
} k_mtmd_logits[] = {{0, 0.072837f}, {1, -0.249229f}, {100, 0.117961f}, {259, 0.206359f}, {444, 0.453031f},
                     {511, -0.072149f}};

/* ---- kernels ---- */

static void test_kernels(void) {
    struct ekv_rope_params p = {.dim = 16, .neox = true, .freq_base = 10000.0, .freq_scale = 1.0,
                                .attn_factor = 1.0, .sections = {2, 3, 3, 0}};
    float a[16], b[16];
    const int64_t same[4] = {37, 37, 37, 37};
    ekv_rope_sincos_multi(&p, same, a);
    ekv_rope_sincos_ext(&p, 37, b);
    CHECK(!memcmp(a, b, sizeof a));
    /* height alone at 5: pairs 2..4 turn, the others stay */
    const int64_t h5[4] = {0, 5, 0, 0};
    ekv_rope_sincos_multi(&p, h5, a);
    for (int i = 0; i < 8; i++) {
        const bool turns = i >= 2 && i <= 4;
        CHECK_MSG((a[2 * i + 1] != 0.0f) == turns && (a[2 * i] == 1.0f) == !turns, "pair %d (sections 2/3/3)", i);
    }
    /* sections over 3 of 8 pairs: pair i takes component i mod 3 */
    struct ekv_rope_params w = p;
    memcpy(w.sections, (int[4]){1, 1, 1, 0}, sizeof w.sections);
    const int64_t w7[4] = {0, 0, 7, 0};
    ekv_rope_sincos_multi(&w, w7, a);
    for (int i = 0; i < 8; i++) CHECK_MSG((a[2 * i + 1] != 0.0f) == (i % 3 == 2), "pair %d (sections 1/1/1)", i);
    CHECK(ekv_rope_section(&w, 5) == 2 && ekv_rope_section(&w, 6) == 0 && ekv_rope_section(&p, 7) == 2);
    /* turning by per-component deltas == rotating there directly */
    float x[2 * 16], y[2 * 16], cs[16];
    for (int i = 0; i < 32; i++) x[i] = y[i] = sinf(0.37f * (float)i) + 0.1f * (float)(i % 5);
    const int64_t A[4] = {3, 9, 14, 0}, B[4] = {20, 4, 30, 0}, D[4] = {17, -5, 16, 0};
    ekv_rope_sincos_multi(&p, A, cs);
    ekv_rope_apply(x, 2, 16, 16, cs, true);
    ekv_rope_shift_multi(&p, D, x, 2, 16);
    ekv_rope_sincos_multi(&p, B, cs);
    ekv_rope_apply(y, 2, 16, 16, cs, true);
    float md = 0;
    for (int i = 0; i < 32; i++) md = fmaxf(md, fabsf(x[i] - y[i]));
    CHECK_MSG(md < 1e-5f, "shift by deltas vs rotation at the target: %g", md);
    /* ekv_rope_shift_cs (what a device turns merged keys by): its pairs applied
     * as a - b s, a s + b c give ekv_rope_shift_multi / _ext bit for bit */
    struct ekv_rope_params plain = p;
    memset(plain.sections, 0, sizeof plain.sections);
    for (int mode = 0; mode < 4; mode++) {
        struct ekv_rope_params q = mode < 2 ? p : plain;
        q.neox = mode % 2 == 0;
        const int64_t d4[4] = {mode < 2 ? 17 : -23, -5, 0, 0};
        float want[16], got[16], c2[16];
        for (int i = 0; i < 16; i++) want[i] = got[i] = cosf(0.91f * (float)i) - 0.2f;
        if (mode < 2) ekv_rope_shift_multi(&q, d4, want, 1, 16);
        else ekv_rope_shift_ext(&q, d4[0], want, 1, 16);
        CHECK(ekv_rope_shift_cs(&q, d4, 16, c2) == 16);
        for (int i = 0; i < 8; i++) {
            const int i0 = q.neox ? i : 2 * i, i1 = q.neox ? i + 8 : 2 * i + 1;
            const float a0 = got[i0], b0 = got[i1];
            got[i0] = a0 * c2[2 * i] - b0 * c2[2 * i + 1];
            got[i1] = a0 * c2[2 * i + 1] + b0 * c2[2 * i];
        }
        CHECK_MSG(!memcmp(want, got, sizeof want), "ekv_rope_shift_cs, mode %d", mode);
    }
}

/* ---- the model ---- */

struct fixture {
    struct ekv_model *m;
    struct ekv_context *ctx;
    struct ekv_vision *v;
    struct ekv_prompt *p;
};

static bool open_fixture(struct fixture *f) {
    memset(f, 0, sizeof *f);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    cp.device = "cpu";
    CHECK_OK(ekv_model_load(g_lm, NULL, &f->m));
    if (!f->m) return false;
    CHECK_OK(ekv_context_new(f->m, &cp, &f->ctx));
    CHECK_OK(ekv_vision_load(g_mm, &f->v));
    if (!f->ctx || !f->v) return false;
    CHECK_OK(ekv_prompt_new(f->m, k_prompt, strlen(k_prompt), true, &f->p));
    struct ekv_image_input img = {.path = tu_src("data/images/astronaut_crop.png")};
    CHECK_OK(ekv_prompt_set_images(f->p, f->v, f->ctx, &img, 1));
    return f->p != NULL;
}

static void close_fixture(struct fixture *f) {
    ekv_prompt_free(f->p);
    ekv_vision_free(f->v);
    ekv_context_free(f->ctx);
    ekv_model_free(f->m);
}

static int n_vocab(const struct ekv_model *m) {
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    return mi.n_vocab;
}

static struct ekv_seq *new_seq(struct fixture *f, const char *policy, double budget) {
    struct ekv_kv_params kv = ekv_kv_default_params();
    kv.type_k = kv.type_v = EKV_KV_F32;
    kv.policy = policy;
    kv.budget = budget;
    struct ekv_seq *q = NULL;
    CHECK_OK(ekv_seq_new(f->ctx, &kv, &q));
    return q;
}

static void test_positions_and_mtmd(struct fixture *f) {
    const struct ekv_segment *segs;
    int32_t ns;
    CHECK_OK(ekv_prompt_segments(f->p, &segs, &ns));
    int32_t img = -1;
    for (int32_t i = 0; i < ns; i++)
        if (segs[i].embd) img = i;
    CHECK(img > 0 && segs[img].grid_w == 20 && segs[img].grid_h == 13 && segs[img].n == 260);
    int64_t p0 = 0;
    for (int32_t i = 0; i < img && img > 0; i++) p0 += segs[i].n;
    const int V = f->m ? n_vocab(f->m) : 0;
    float *L = malloc((size_t)V * sizeof *L);
    struct ekv_seq *q = new_seq(f, "full", 1.0);
    if (!q || !L || img <= 0) goto out;
    CHECK_OK(ekv_seq_eval_prompt(q, f->p, L));
    /* next text position as mtmd's n_pos: rows - 260 + max(20, 13) */
    CHECK(q->rope_delta == 20 - 260);
    CHECK_MSG(q->n_seen + q->rope_delta == 76, "next RoPE position %lld, mtmd's n_pos 76",
              (long long)(q->n_seen + q->rope_delta));
    const struct ekv_kv_head *h = &q->kv->layers[1].heads[1];
    CHECK(h->mpos != NULL && h->len == q->n_seen);
    for (int32_t j = 0; h->mpos && j < h->len; j++) {
        int32_t want[3];
        if (j >= p0 && j < p0 + 260) {
            want[0] = (int32_t)p0;
            want[1] = (int32_t)(p0 + (j - p0) / 20);
            want[2] = (int32_t)(p0 + (j - p0) % 20);
        } else {
            want[0] = want[1] = want[2] = j < p0 ? j : j - 240;
        }
        if (memcmp(h->mpos + 3 * j, want, sizeof want)) {
            CHECK_MSG(0, "entry %d: (%d, %d, %d), want (%d, %d, %d)", (int)j, h->mpos[3 * j], h->mpos[3 * j + 1],
                      h->mpos[3 * j + 2], want[0], want[1], want[2]);
            break;
        }
    }
    /* mtmd's first-token logits and greedy tokens */
    for (size_t i = 0; i < sizeof k_mtmd_logits / sizeof k_mtmd_logits[0]; i++)
        CHECK_MSG(fabsf(L[k_mtmd_logits[i].id] - k_mtmd_logits[i].logit) < 2e-3f, "logit %d: ekv %g, mtmd %g",
                  (int)k_mtmd_logits[i].id, L[k_mtmd_logits[i].id], k_mtmd_logits[i].logit);
    int same = 0;
    for (int i = 0; i < 16; i++) {
        int32_t b = 0;
        for (int32_t j = 1; j < V; j++)
            if (L[j] > L[b]) b = j;
        if (b != k_mtmd_greedy[i]) break;
        same++;
        CHECK_OK(ekv_seq_decode(q, b, L));
    }
    CHECK_MSG(same == 16, "greedy tokens equal to mtmd's: %d of 16", same);
    /* generated tokens go on from the shifted position */
    CHECK(h->mpos && h->mpos[3 * (h->len - 1)] == 76 + 15 && h->mpos[3 * (h->len - 1) + 2] == 76 + 15);
out:
    ekv_seq_free(q);
    free(L);
}

/* Decodes n greedy tokens from logits L (updated) into out. */
static void decode_n(struct ekv_seq *q, float *L, int V, int n, int32_t *out) {
    for (int i = 0; i < n; i++) {
        int32_t b = 0;
        for (int32_t j = 1; j < V; j++)
            if (L[j] > L[b]) b = j;
        out[i] = b;
        CHECK_OK(ekv_seq_decode(q, b, L));
    }
}

static void test_pieces_copy_save(struct fixture *f) {
    const int V = n_vocab(f->m);
    float *La = malloc((size_t)V * 4), *Lb = malloc((size_t)V * 4), *Lc = malloc((size_t)V * 4),
          *Ld = malloc((size_t)V * 4);
    struct ekv_seq *a = new_seq(f, "full", 1.0), *b = new_seq(f, "full", 1.0), *c = NULL, *d = NULL;
    const struct ekv_segment *segs;
    int32_t ns;
    struct ekv_prefill *pf = NULL;
    void *blob = NULL;
    size_t blob_n = 0;
    if (!a || !b || !La || !Lb || !Lc || !Ld) goto out;
    CHECK_OK(ekv_seq_eval_prompt(a, f->p, La));
    CHECK_OK(ekv_prompt_segments(f->p, &segs, &ns));
    struct ekv_input in = {.segs = segs, .n_segs = ns, .is_prompt = true};
    CHECK_OK(ekv_prefill_new(b, &in, 7, &pf));
    bool done = false;
    for (int guard = 0; pf && !done && guard < 100000; guard++) CHECK_OK(ekv_prefill_step(pf, 3, Lb, &done));
    ekv_prefill_free(pf);
    CHECK(done && !memcmp(La, Lb, (size_t)V * 4) && b->rope_delta == a->rope_delta);
    CHECK_OK(ekv_seq_copy(a, &c));
    CHECK_OK(ekv_seq_save_mem(a, NULL, 0, &blob, &blob_n));
    CHECK_OK(ekv_seq_load_mem(f->ctx, blob, blob_n, &d, NULL, NULL));
    if (!c || !d) goto out;
    CHECK(d->rope_delta == a->rope_delta);
    memcpy(Lc, La, (size_t)V * 4);
    memcpy(Ld, La, (size_t)V * 4);
    int32_t ta[6], tb[6], tc[6], td[6];
    decode_n(a, La, V, 6, ta);
    decode_n(b, Lb, V, 6, tb);
    decode_n(c, Lc, V, 6, tc);
    decode_n(d, Ld, V, 6, td);
    CHECK_MSG(!memcmp(ta, tb, sizeof ta) && !memcmp(La, Lb, (size_t)V * 4), "prompt in pieces differs");
    CHECK_MSG(!memcmp(ta, tc, sizeof ta) && !memcmp(La, Lc, (size_t)V * 4), "copy differs");
    CHECK_MSG(!memcmp(ta, td, sizeof ta) && !memcmp(La, Ld, (size_t)V * 4), "saved and loaded cache differs");
    const struct ekv_kv_head *ha = &a->kv->layers[0].heads[0], *hd = &d->kv->layers[0].heads[0];
    CHECK(ha->len == hd->len && hd->mpos && !memcmp(ha->mpos, hd->mpos, (size_t)ha->len * 3 * sizeof *ha->mpos));
    /* the file cut anywhere (about 400 places) is refused, never half loaded */
    int bad_cuts = 0;
    for (size_t cut = 0; cut < blob_n; cut += 1 + blob_n / 400) {
        struct ekv_seq *e = NULL;
        const enum ekv_status st = ekv_seq_load_mem(f->ctx, blob, cut, &e, NULL, NULL);
        if (st != EKV_ERR_FORMAT || e) bad_cuts++;
        ekv_seq_free(e);
    }
    CHECK_MSG(bad_cuts == 0, "%d cuts of a saved M-RoPE cache were not refused as malformed", bad_cuts);
out:
    free(blob);
    ekv_seq_free(a);
    ekv_seq_free(b);
    ekv_seq_free(c);
    ekv_seq_free(d);
    free(La);
    free(Lb);
    free(Lc);
    free(Ld);
}

static void test_compressed_and_refusals(struct fixture *f) {
    const int V = n_vocab(f->m);
    float *L = malloc((size_t)V * 4);
    static const char *const pol[] = {"elastic-v2:key=rotate", "snapkv", "vlcache", "elastic", "h2o+merge:merge_key=rotate"};
    for (size_t i = 0; i < sizeof pol / sizeof pol[0] && L; i++) {
        struct ekv_seq *q = new_seq(f, pol[i], 0.2);
        if (!q) continue;
        CHECK_OK(ekv_seq_eval_prompt(q, f->p, L));
        int32_t t[4];
        decode_n(q, L, V, 4, t);
        const struct ekv_kv_head *h = &q->kv->layers[2].heads[0];
        CHECK_MSG(h->len < q->n_seen / 2 && isfinite(L[0]), "%s: %d of %lld entries", pol[i], (int)h->len,
                  (long long)q->n_seen);
        ekv_seq_free(q);
    }
    free(L);
    /* Elastic's reference mode renumbers positions */
    struct ekv_kv_params kv = ekv_kv_default_params();
    kv.policy = "elastic";
    kv.compat_ref = true;
    struct ekv_seq *q = NULL;
    CHECK(ekv_seq_new(f->ctx, &kv, &q) == EKV_ERR_UNSUPPORTED && !q && strstr(ekv_last_error(), "M-RoPE"));
    /* a grid that does not cover its rows */
    static float rows[6 * 64];
    struct ekv_segment sg = {.embd = rows, .n = 6, .tag = EKV_TAG_IMAGE, .grid_w = 4, .grid_h = 2};
    struct ekv_input in = {.segs = &sg, .n_segs = 1, .is_prompt = true};
    q = new_seq(f, "full", 1.0);
    if (q) CHECK(ekv_seq_eval(q, &in, NULL) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "4 x 2"));
    ekv_seq_free(q);
}

/* The language model with its sections patched to {a, b, c, d}. */
static void test_bad_sections(void) {
    size_t n = 0;
    char *buf = tu_read_file(g_lm, &n);
    static const char key[] = "qwen2vl.rope.dimension_sections";
    char *k = NULL;
    for (size_t i = 0; buf && i + sizeof key < n && !k; i++)
        if (!memcmp(buf + i, key, sizeof key - 1)) k = buf + i;
    CHECK(k != NULL);
    if (!k) {
        free(buf);
        return;
    }
    char *vals = k + sizeof key - 1 + 4 + 4 + 8; /* value type, element type, count */
    static const int32_t bad[][4] = {{6, 3, 3, 0}, {-1, 3, 3, 0}, {0, 0, 0, 0}};
    char path[300];
    snprintf(path, sizeof path, "%s/bad.gguf", g_dir);
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        memcpy(vals, bad[b], 16);
        FILE *fp = fopen(path, "wb");
        CHECK(fp && fwrite(buf, 1, n, fp) == n);
        if (fp) fclose(fp);
        struct ekv_model *m = NULL;
        CHECK_MSG(ekv_model_load(path, NULL, &m) == EKV_ERR_FORMAT && !m && strstr(ekv_last_error(), key),
                  "sections {%d, %d, %d, %d}: %s", bad[b][0], bad[b][1], bad[b][2], bad[b][3], ekv_last_error());
        ekv_model_free(m);
    }
    unlink(path);
    free(buf);
}

int main(void) {
    test_kernels();
    if (!mkdtemp(g_dir)) {
        CHECK_MSG(0, "mkdtemp");
        return test_finish("test_mrope");
    }
    snprintf(g_lm, sizeof g_lm, "%s/tq.gguf", g_dir);
    snprintf(g_mm, sizeof g_mm, "%s/tq.mmproj.gguf", g_dir);
    char args[1024];
    snprintf(args, sizeof args, "--preset tiny-qwen2vl --type f32 --seed 3 -o '%s'", g_lm);
    const int rc = tu_mkmodel(args);
    CHECK_MSG(rc == 0, "ekv mkmodel failed (%d); is %s/ekv built?", rc, EKV_BINARY_DIR);
    struct fixture f;
    if (rc == 0 && open_fixture(&f)) {
        test_positions_and_mtmd(&f);
        test_pieces_copy_save(&f);
        test_compressed_and_refusals(&f);
    }
    if (rc == 0) close_fixture(&f);
    if (rc == 0) test_bad_sections();
    unlink(g_lm);
    unlink(g_mm);
    rmdir(g_dir);
    return test_finish("test_mrope");
}
