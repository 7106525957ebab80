/*
 * test_batch_invariance.c — the batch-invariance contract of the products
 * and the engine: a row's result never depends on what it is computed with.
 *
 * Kernels: for every weight type ekv computes, on the reference and the
 * SIMD paths, each row of ekv_matmul(n rows) equals ekv_matvec on that row
 * bit for bit, for many n (every size from 1 to 40 and some larger ones,
 * so that every tile shape and remainder of every GEMM is reached) and
 * 1, 2 and 3 threads.
 *
 * ekv_matmul_multi (one quantisation, one job for Q/K/V or gate/up) equals
 * separate products bit for bit.
 *
 * Element-wise ops: SwiGLU over several rows equals SwiGLU of each row.
 *
 * Engine: decoding several sequences together (ekv_decode_batch, batch
 * sizes 1 to 6, 1 and 2 threads) gives each sequence the same logits, bit
 * for bit, as decoding it alone, and a prompt read in one forward gives the
 * logits of feeding it token by token — on the bundled stories260K model
 * (F32; both kernel paths) and, when ../shared is present, ekv-ref-28m
 * (F16) and ekv-ref-28m converted to Q8_0 and Q4_0 here (matrices the
 * loader repacks: the repacked model gives the logits of the file's layout
 * bit for bit, and the file is not modified).
 *
 * The server's determinism (a request's text does not depend on the other
 * requests it is batched with) rests on this.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

#include "core/util.h"
#include "ekv.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "testutil.h"

static uint64_t rng = 0x5DEECE66Dull;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static const enum ekv_dtype k_types[] = {EKV_F32, EKV_F16, EKV_BF16, EKV_Q8_0, EKV_Q4_0,
                                         EKV_Q4_K, EKV_Q5_K, EKV_Q6_K};

/* Every n up to 20 (every remainder of the row tiles), then sizes around
 * the token blocks of the GEMMs (48, 64). */
static const int64_t k_ns[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14,
                               15, 16, 17, 18, 19, 20, 31, 33, 47, 49, 64, 67, 100};

static void check_type(enum ekv_dtype t, struct ekv_pool **pools, int n_pools) {
    const int bs = (int)ekv_dtype_get(t)->block_size;
    /* ne0: a few blocks (K-quants: 2 super-blocks; others 13 blocks of 32
     * or 77 floats, which leaves a tail after the 16- and 8-wide steps);
     * ne1: 37 rows (not a multiple of any row tile) */
    const int64_t ne0 = bs == 256 ? 512 : bs == 32 ? 32 * 13 : 77, ne1 = 37, nmax = 100;
    size_t rb;
    CHECK(ekv_dtype_row_bytes(t, ne0, &rb));
    char *wq = calloc((size_t)ne1, rb);
    float *wf = malloc((size_t)ne0 * sizeof(float));
    float *x = malloc((size_t)(ne0 * nmax) * sizeof(float));
    float *y = malloc((size_t)(ne1 * nmax) * sizeof(float));
    float *ref = malloc((size_t)(ne1 * nmax) * sizeof(float));
    for (int64_t r = 0; r < ne1; r++) {
        for (int64_t i = 0; i < ne0; i++) wf[i] = frand() * (0.25f + (float)(r % 5));
        CHECK_OK(ekv_quantize_row(t, wf, wq + (size_t)r * rb, ne0));
    }
    /* rows of very different magnitudes, so that scales differ per row */
    for (int64_t r = 0; r < nmax; r++)
        for (int64_t i = 0; i < ne0; i++) x[r * ne0 + i] = frand() * ldexpf(1.0f, (int)(r % 7) - 3);
    struct ekv_weight w = {.type = t, .ne0 = ne0, .ne1 = ne1, .row_bytes = rb, .data = wq};
    for (int simd = 0; simd < 2; simd++) {
        ekv_kernels_use_reference(!simd);
        for (int64_t r = 0; r < nmax; r++) CHECK_OK(ekv_matvec(NULL, &w, x + r * ne0, ref + r * ne1));
        int bad = 0;
        for (int pi = 0; pi < n_pools; pi++) {
            for (size_t ni = 0; ni < EKV_ARRAY_LEN(k_ns); ni++) {
                const int64_t n = k_ns[ni];
                /* the rows of this call start at a different row each time */
                const int64_t off = (n * 7 + pi) % (nmax - n + 1);
                CHECK_OK(ekv_matmul(pools[pi], &w, x + off * ne0, n, y));
                if (memcmp(y, ref + off * ne1, (size_t)(n * ne1) * sizeof(float)) != 0) {
                    if (bad++ < 3)
                        fprintf(stderr, "%s %s: matmul of %lld rows (%d threads) != matvec\n", ekv_dtype_name(t),
                                ekv_kernels_isa(), (long long)n, ekv_pool_size(pools[pi]));
                }
            }
            /* matvec itself does not depend on the thread count */
            for (int64_t r = 0; r < 5; r++) {
                CHECK_OK(ekv_matvec(pools[pi], &w, x + r * ne0, y));
                if (memcmp(y, ref + r * ne1, (size_t)ne1 * sizeof(float)) != 0) bad++;
            }
        }
        CHECK_MSG(bad == 0, "%s %s: %d batch-dependent results", ekv_dtype_name(t), ekv_kernels_isa(), bad);
    }
    ekv_kernels_use_reference(false);
    free(wq); free(wf); free(x); free(y); free(ref);
}

/* ekv_matmul_multi: one quantisation and one job for several weights,
 * the results of separate products bit for bit (mixed types and layouts). */
static void test_multi(struct ekv_pool **pools) {
    const enum ekv_dtype types[] = {EKV_Q8_0, EKV_Q4_0, EKV_F16, EKV_Q8_0};
    const int64_t ne0 = 256, ne1s[] = {48, 32, 40, 16};
    struct ekv_weight ws[4];
    void *data[4];
    float *x = malloc(7 * ne0 * sizeof(float)), *row = malloc(ne0 * sizeof(float));
    for (int i = 0; i < 7 * ne0; i++) x[i] = frand();
    for (int i = 0; i < 4; i++) {
        size_t rb;
        CHECK(ekv_dtype_row_bytes(types[i], ne0, &rb));
        data[i] = malloc(rb * (size_t)ne1s[i]);
        for (int64_t r = 0; r < ne1s[i]; r++) {
            for (int64_t c = 0; c < ne0; c++) row[c] = frand();
            CHECK_OK(ekv_quantize_row(types[i], row, (char *)data[i] + r * rb, ne0));
        }
        ws[i] = (struct ekv_weight){.type = types[i], .ne0 = ne0, .ne1 = ne1s[i], .row_bytes = rb, .data = data[i]};
    }
    CHECK_OK(ekv_weight_repack(&ws[0], data[0])); /* one X16, one rows-layout Q8_0 */
    for (int simd = 0; simd < 2; simd++) {
        ekv_kernels_use_reference(!simd);
        for (int pi = 0; pi < 3; pi++)
            for (int64_t n = 1; n <= 7; n += 3) {
                float *sep[4], *mul[4];
                const struct ekv_weight *wp[4];
                for (int i = 0; i < 4; i++) {
                    sep[i] = malloc((size_t)(n * ne1s[i]) * sizeof(float));
                    mul[i] = malloc((size_t)(n * ne1s[i]) * sizeof(float));
                    wp[i] = &ws[i];
                    CHECK_OK(ekv_matmul(pools[pi], &ws[i], x, n, sep[i]));
                }
                CHECK_OK(ekv_matmul_multi(pools[pi], wp, 4, x, n, mul));
                int bad = 0;
                for (int i = 0; i < 4; i++) {
                    bad += memcmp(sep[i], mul[i], (size_t)(n * ne1s[i]) * sizeof(float)) != 0;
                    free(sep[i]);
                    free(mul[i]);
                }
                CHECK_MSG(bad == 0, "matmul_multi %s n=%lld: %d products differ", ekv_kernels_isa(), (long long)n, bad);
            }
    }
    ekv_kernels_use_reference(false);
    CHECK(ekv_matmul_multi(NULL, NULL, 2, x, 1, NULL) == EKV_ERR_INVALID_ARG);
    for (int i = 0; i < 4; i++) free(data[i]);
    free(x);
    free(row);
}

static void test_kernels(void) {
    struct ekv_pool *pools[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) CHECK_OK(ekv_pool_new(i + 1, &pools[i]));
    for (size_t i = 0; i < EKV_ARRAY_LEN(k_types); i++) check_type(k_types[i], pools, 3);
    test_multi(pools);
    for (int i = 0; i < 3; i++) ekv_pool_free(pools[i]);
}

/* Element-wise ops over several rows at once (the forward applies SwiGLU
 * to [rows][n_ff] in one call) give each row what it gets alone. */
static void test_elementwise(void) {
    enum { W = 172, R = 5 };
    static float g[R * W], u[R * W], all[R * W], one[W];
    for (int i = 0; i < R * W; i++) {
        g[i] = frand() * 6.0f;
        u[i] = frand();
    }
    for (int simd = 0; simd < 2; simd++) {
        ekv_kernels_use_reference(!simd);
        ekv_swiglu(all, g, u, R * W);
        int bad = 0;
        for (int r = 0; r < R; r++) {
            ekv_swiglu(one, g + r * W, u + r * W, W);
            bad += memcmp(one, all + r * W, sizeof one) != 0;
        }
        CHECK_MSG(bad == 0, "swiglu %s: %d rows depend on their neighbours", ekv_kernels_isa(), bad);
    }
    ekv_kernels_use_reference(false);
}

/* ------------------------------------------------------------------ */
/* Engine: batched decode == each sequence decoded alone, bit for bit. */

static int32_t rand_tok(int n_vocab) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng >> 33) % (uint64_t)n_vocab);
}

#define NSEQ 6
#define STEPS 4

static void check_model(const char *path, const char *name, int nseq, int steps, int nt0) {
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m) return;
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    const int V = mi.n_vocab;
    /* prompts of different lengths, tokens from a fixed pseudo-random stream */
    int32_t prompts[NSEQ][24], plen[NSEQ], feed[NSEQ][STEPS];
    for (int s = 0; s < nseq; s++) {
        plen[s] = 3 + 4 * s;
        for (int i = 0; i < plen[s]; i++) prompts[s][i] = rand_tok(V);
        for (int i = 0; i < steps; i++) feed[s][i] = rand_tok(V);
    }
    float *alone = malloc((size_t)NSEQ * STEPS * V * sizeof(float));
    float *batch = malloc((size_t)NSEQ * V * sizeof(float));
    for (int nt = nt0; nt <= 2; nt++) {
        struct ekv_context_params cp = ekv_context_default_params();
        cp.n_threads = nt;
        struct ekv_context *c = NULL;
        CHECK_OK(ekv_context_new(m, &cp, &c));
        if (!c) break;
        /* each sequence alone */
        for (int s = 0; s < nseq; s++) {
            struct ekv_seq *q = NULL;
            CHECK_OK(ekv_seq_new(c, NULL, &q));
            CHECK_OK(ekv_seq_prefill(q, prompts[s], plen[s], NULL));
            for (int i = 0; i < steps; i++) CHECK_OK(ekv_seq_decode(q, feed[s][i], alone + ((size_t)s * STEPS + i) * V));
            ekv_seq_free(q);
        }
        /* a prompt read in one forward gives the logits of feeding it token by token */
        {
            struct ekv_seq *qa = NULL, *qb = NULL;
            CHECK_OK(ekv_seq_new(c, NULL, &qa));
            CHECK_OK(ekv_seq_new(c, NULL, &qb));
            const int s = nseq - 1;
            CHECK_OK(ekv_seq_prefill(qa, prompts[s], plen[s], batch));
            for (int i = 0; i < plen[s]; i++) CHECK_OK(ekv_seq_decode(qb, prompts[s][i], batch + V));
            CHECK_MSG(memcmp(batch, batch + V, (size_t)V * sizeof(float)) == 0,
                      "%s (%d threads): prefill of %d tokens != token-by-token decode", name, nt, plen[s]);
            ekv_seq_free(qa);
            ekv_seq_free(qb);
        }
        /* batches of b sequences: the first b, decoded together step by step */
        for (int b = 1; b <= nseq; b++) {
            struct ekv_seq *q[NSEQ] = {NULL};
            for (int s = 0; s < b; s++) {
                CHECK_OK(ekv_seq_new(c, NULL, &q[s]));
                CHECK_OK(ekv_seq_prefill(q[s], prompts[s], plen[s], NULL));
            }
            int bad = 0;
            for (int i = 0; i < steps; i++) {
                int32_t tok[NSEQ];
                for (int s = 0; s < b; s++) tok[s] = feed[s][i];
                CHECK_OK(ekv_decode_batch(c, q, tok, b, batch));
                for (int s = 0; s < b; s++)
                    if (memcmp(batch + (size_t)s * V, alone + ((size_t)s * STEPS + i) * V, (size_t)V * sizeof(float)))
                        bad++;
            }
            CHECK_MSG(bad == 0, "%s: batch of %d (%d threads): %d rows differ from decoding alone", name, b, nt, bad);
            for (int s = 0; s < b; s++) ekv_seq_free(q[s]);
        }
        ekv_context_free(c);
    }
    free(alone);
    free(batch);
    ekv_model_free(m);
}

/* ------------------------------------------------------------------ */
/* Quantised models: the load-time repack (X16 layout) changes no bit, and
 * the model file is left as it was. */

static uint64_t file_hash(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 1469598103934665603ull;
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
    fclose(f);
    return h;
}

static void logits_of(const char *path, bool no_repack, float *out, int n_vocab_max, int *V) {
    struct ekv_model_params mp = ekv_model_default_params();
    mp.no_repack = no_repack;
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(path, &mp, &m));
    if (!m) return;
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    *V = mi.n_vocab;
    CHECK(mi.n_vocab <= n_vocab_max);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    struct ekv_context *c = NULL;
    struct ekv_seq *q = NULL;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    CHECK_OK(ekv_seq_new(c, NULL, &q));
    int32_t toks[9];
    for (int i = 0; i < 9; i++) toks[i] = (int32_t)((i * 7919 + 11) % mi.n_vocab);
    CHECK_OK(ekv_seq_prefill(q, toks, 8, out));
    CHECK_OK(ekv_seq_decode(q, toks[8], out + mi.n_vocab));
    ekv_seq_free(q);
    ekv_context_free(c);
    ekv_model_free(m);
}

/* ekv-ref-28m with every matrix converted to `t` (Q8_0 or Q4_0), written
 * to path; 1-D tensors and metadata as they are. */
static bool write_quantised(const char *src, enum ekv_dtype t, const char *path) {
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_open(src, &f));
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!f || !w) return false;
    for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) CHECK_OK(ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(f, i)));
    const size_t n = ekv_gguf_n_tensors(f);
    void **bufs = calloc(n, sizeof *bufs);
    bool ok = bufs != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        const struct ekv_gguf_tensor *te = ekv_gguf_tensor_at(f, i);
        if (te->n_dims != 2) {
            CHECK_OK(ekv_gguf_writer_add_tensor(w, te->name, te->type, te->n_dims, te->ne, te->data, NULL, NULL));
            continue;
        }
        size_t rb_in, rb;
        ok = ekv_dtype_row_bytes(te->type, te->ne[0], &rb_in) && ekv_dtype_row_bytes(t, te->ne[0], &rb);
        float *row = malloc((size_t)te->ne[0] * sizeof(float));
        bufs[i] = malloc(rb * (size_t)te->ne[1]);
        for (int64_t r = 0; ok && r < te->ne[1]; r++) {
            ok = ekv_dequantize_row(te->type, (const char *)te->data + (size_t)r * rb_in, row, te->ne[0]) == EKV_OK &&
                 ekv_quantize_row(t, row, (char *)bufs[i] + (size_t)r * rb, te->ne[0]) == EKV_OK;
        }
        free(row);
        if (ok) CHECK_OK(ekv_gguf_writer_add_tensor(w, te->name, t, 2, te->ne, bufs[i], NULL, NULL));
    }
    CHECK(ok);
    if (ok) CHECK_OK(ekv_gguf_writer_write(w, path));
    for (size_t i = 0; i < n && bufs; i++) free(bufs[i]);
    free(bufs);
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
    return ok;
}

static void check_quantised(const char *ref, enum ekv_dtype t) {
    char dir[] = "/tmp/ekv-bi-XXXXXX", path[256], name[64];
    if (!mkdtemp(dir)) {
        CHECK_MSG(false, "mkdtemp failed");
        return;
    }
    snprintf(path, sizeof path, "%s/ref-%s.gguf", dir, ekv_dtype_name(t));
    snprintf(name, sizeof name, "ekv-ref-28m %s", ekv_dtype_name(t));
    if (write_quantised(ref, t, path)) {
        const uint64_t h0 = file_hash(path);
        enum { VMAX = 65536 };
        float *a = malloc(2 * VMAX * sizeof(float)), *b = malloc(2 * VMAX * sizeof(float));
        int V = 0;
        logits_of(path, false, a, VMAX, &V);
        logits_of(path, true, b, VMAX, &V);
        CHECK_MSG(V > 0 && memcmp(a, b, 2 * (size_t)V * sizeof(float)) == 0, "%s: repacked weights change the logits",
                  name);
        /* batched decode == alone on the repacked (X16) weights */
        check_model(path, name, 3, 2, 2);
        CHECK_MSG(file_hash(path) == h0, "%s: the model file changed", name);
        free(a);
        free(b);
    }
    remove(path);
    rmdir(dir);
}

int main(void) {
    test_kernels();
    test_elementwise();
    /* stories260K: n_ff 172 is not a multiple of the SIMD width */
    for (int simd = 0; simd < 2; simd++) {
        ekv_kernels_use_reference(!simd);
        check_model(tu_src("models/stories260K.gguf"), simd ? "stories260K (simd)" : "stories260K (reference)", NSEQ, STEPS, 1);
    }
    ekv_kernels_use_reference(false);
    const char *ref = tu_shared("models/ekv-ref-28m-f16.gguf");
    if (access(ref, R_OK) == 0) {
        check_model(ref, "ekv-ref-28m-f16", 4, 2, 2);
        check_quantised(ref, EKV_Q8_0);
        check_quantised(ref, EKV_Q4_0);
    } else {
        printf("test_batch_invariance: ekv-ref-28m (F16, and as Q8_0/Q4_0) skipped: ../shared absent\n");
    }
    return test_finish("test_batch_invariance");
}
