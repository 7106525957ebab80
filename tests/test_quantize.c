/*
 * test_quantize.c — ekv_model_quantize (`ekv quantize`):
 *  - the bundled stories260K (F32) to q8_0, q4_0 and f16: metadata kept
 *    (file type updated), 1-D tensors byte-identical, every matrix within
 *    the round-trip error bound of its type (per 32-block: q8_0 |e| <=
 *    d/2 with d = amax/127, q4_0 |e| <= |d| with d = max/-8 (the clamp at
 *    +7 costs up to one step), each plus |q|max * d * 2^-11 for d stored
 *    in fp16; f16 relative 2^-11), rows of 172 (not a
 *    multiple of 32) written as F16;
 *  - the converted models load and their teacher-forced logits stay close
 *    to the F32 model's (q8_0: same argmax on >= 95% of positions);
 *  - bad input: unknown type, a quantised input, the output equal to the
 *    input, a missing or truncated input, an unwritable output: a clear
 *    error and no output file (nor its .tmp);
 *  - the shipped models/ekv-ref-28m-q8_0.gguf: it loads and greedy decoding
 *    gives the reference model's known text; with ../shared present it is
 *    byte-identical to quantising ../shared/models/ekv-ref-28m-f16.gguf now.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "testutil.h"

static char g_dir[64];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int slot;
    char *b = buf[slot++ & 3];
    snprintf(b, 256, "%s/%s", g_dir, name);
    return b;
}

static bool file_exists(const char *p) { return access(p, F_OK) == 0; }

static bool no_output(const char *p) {
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    return !file_exists(p) && !file_exists(tmp);
}

/* Largest error a round trip through type t may make on block x[0..32). */
static double block_bound(enum ekv_dtype t, const float *x) {
    double amax = 0, mx = 0;
    for (int i = 0; i < 32; i++)
        if (fabs(x[i]) > amax) {
            amax = fabs(x[i]);
            mx = x[i];
        }
    (void)mx;
    /* half a step (q8_0) or one step (q4_0, clamp at +7), plus the fp16
     * rounding of d (relative 2^-11) times the largest |q| */
    if (t == EKV_Q8_0) return amax / 127.0 * (0.5 + 127 * 0x1p-11) + 1e-7;
    return amax / 8.0 * (1.0 + 8 * 0x1p-11) + 1e-7;
}

/* Compares every tensor of out with in. Returns the number of violations. */
static int compare_files(const char *in_path, const char *out_path, enum ekv_dtype to, uint32_t ftype) {
    struct ekv_gguf_file *a = NULL, *b = NULL;
    CHECK_OK(ekv_gguf_open(in_path, &a));
    CHECK_OK(ekv_gguf_open(out_path, &b));
    if (!a || !b) {
        ekv_gguf_close(a);
        ekv_gguf_close(b);
        return 1;
    }
    int bad = 0;
    /* metadata: every input key is there; file type updated */
    for (size_t i = 0; i < ekv_gguf_n_kv(a); i++) {
        const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(a, i);
        char key[128];
        ekv_gguf_str_copy(kv->key, key, sizeof key);
        const struct ekv_gguf_kv *kb = ekv_gguf_find_kv(b, key);
        if (!kb || kb->value.type != kv->value.type) {
            fprintf(stderr, "  key %s missing or retyped\n", key);
            bad++;
        }
    }
    uint32_t ft = 99;
    CHECK_OK(ekv_gguf_get_u32(b, "general.file_type", &ft));
    CHECK_MSG(ft == ftype, "file type %u, expected %u", ft, ftype);
    CHECK(ekv_gguf_n_tensors(a) == ekv_gguf_n_tensors(b));
    float *x = NULL, *y = NULL;
    for (size_t i = 0; i < ekv_gguf_n_tensors(a); i++) {
        const struct ekv_gguf_tensor *ta = ekv_gguf_tensor_at(a, i);
        const struct ekv_gguf_tensor *tb = ekv_gguf_find_tensor(b, ta->name);
        if (!tb || tb->n_dims != ta->n_dims || memcmp(ta->ne, tb->ne, sizeof ta->ne) != 0) {
            fprintf(stderr, "  tensor %s missing or reshaped\n", ta->name);
            bad++;
            continue;
        }
        if (ta->n_dims == 1) {
            if (tb->type != ta->type || memcmp(ta->data, tb->data, ta->nbytes) != 0) {
                fprintf(stderr, "  1-D tensor %s changed\n", ta->name);
                bad++;
            }
            continue;
        }
        const int64_t ne0 = ta->ne[0], rows = ta->ne[1] * ta->ne[2] * ta->ne[3];
        const enum ekv_dtype want = ne0 % 32 == 0 ? to : EKV_F16;
        if (tb->type != want) {
            fprintf(stderr, "  %s is %s, expected %s\n", ta->name, ekv_dtype_name(tb->type), ekv_dtype_name(want));
            bad++;
            continue;
        }
        x = realloc(x, (size_t)ne0 * sizeof *x);
        y = realloc(y, (size_t)ne0 * sizeof *y);
        size_t rba = 0, rbb = 0;
        ekv_dtype_row_bytes(ta->type, ne0, &rba);
        ekv_dtype_row_bytes(tb->type, ne0, &rbb);
        for (int64_t r = 0; r < rows; r++) {
            CHECK_OK(ekv_dequantize_row(ta->type, (const char *)ta->data + (size_t)r * rba, x, ne0));
            CHECK_OK(ekv_dequantize_row(tb->type, (const char *)tb->data + (size_t)r * rbb, y, ne0));
            for (int64_t c = 0; c < ne0; c++) {
                double bound = tb->type == EKV_F16 ? fabs(x[c]) * 0x1p-11 + 6e-8
                                                   : block_bound(tb->type, x + c / 32 * 32);
                if (fabs((double)x[c] - (double)y[c]) > bound) {
                    if (bad < 5)
                        fprintf(stderr, "  %s[%lld][%lld]: %g -> %g (bound %g)\n", ta->name, (long long)r,
                                (long long)c, x[c], y[c], bound);
                    bad++;
                }
            }
        }
    }
    free(x);
    free(y);
    ekv_gguf_close(a);
    ekv_gguf_close(b);
    return bad;
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* Greedy 48 tokens on `ref`, teacher-forced into `other`: argmax agreement. */
static double agreement(const char *ref, const char *other) {
    struct ekv_model *ma = NULL, *mb = NULL;
    struct ekv_context *ca = NULL, *cb = NULL;
    struct ekv_seq *sa = NULL, *sb = NULL;
    CHECK_OK(ekv_model_load(ref, NULL, &ma));
    CHECK_OK(ekv_model_load(other, NULL, &mb));
    double agree = 0;
    if (ma && mb && ekv_context_new(ma, NULL, &ca) == EKV_OK && ekv_context_new(mb, NULL, &cb) == EKV_OK &&
        ekv_seq_new(ca, NULL, &sa) == EKV_OK && ekv_seq_new(cb, NULL, &sb) == EKV_OK) {
        struct ekv_model_info mi;
        ekv_model_get_info(ma, &mi);
        float *la = malloc((size_t)mi.n_vocab * sizeof *la), *lb = malloc((size_t)mi.n_vocab * sizeof *lb);
        int32_t toks[64];
        size_t n = 0;
        const char *p = "Once upon a time";
        CHECK_OK(ekv_tokenize(ma, p, strlen(p), true, false, toks, 64, &n));
        CHECK_OK(ekv_seq_prefill(sa, toks, (int32_t)n, la));
        CHECK_OK(ekv_seq_prefill(sb, toks, (int32_t)n, lb));
        int same = 0;
        for (int i = 0; i < 48; i++) {
            const int t = argmax(la, mi.n_vocab);
            same += t == argmax(lb, mi.n_vocab);
            CHECK_OK(ekv_seq_decode(sa, t, la));
            CHECK_OK(ekv_seq_decode(sb, t, lb));
        }
        agree = same / 48.0;
        free(la);
        free(lb);
    }
    ekv_seq_free(sa);
    ekv_seq_free(sb);
    ekv_context_free(ca);
    ekv_context_free(cb);
    ekv_model_free(ma);
    ekv_model_free(mb);
    return agree;
}

static void test_round_trip(void) {
    const char *in = tu_src("models/stories260K.gguf");
    static const struct { const char *type; enum ekv_dtype dt; uint32_t ftype; double min_agree; } cases[] = {
        {"q8_0", EKV_Q8_0, 7, 0.95}, {"q4_0", EKV_Q4_0, 2, 0.5}, {"f16", EKV_F16, 1, 0.95}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "st-%s.gguf", cases[i].type);
        char out[256];
        snprintf(out, sizeof out, "%s", tmp_path(name));
        struct ekv_quantize_params qp = ekv_quantize_default_params();
        qp.type = cases[i].type;
        struct ekv_quantize_result res;
        CHECK_OK(ekv_model_quantize(in, out, &qp, &res));
        /* stories260K: 48 tensors, 11 of them 1-D; ffn_down rows are 172 long */
        CHECK_MSG(res.n_tensors == 48 && res.n_converted + res.n_fallback == 37, "%s: %d tensors, %d + %d matrices",
                  cases[i].type, res.n_tensors, res.n_converted, res.n_fallback);
        CHECK(res.n_fallback == (cases[i].dt == EKV_F16 ? 0 : 5));
        CHECK(!file_exists(tmp_path("st-q8_0.gguf.tmp")));
        int bad = compare_files(in, out, cases[i].dt, cases[i].ftype);
        CHECK_MSG(bad == 0, "%s: %d values outside the bound", cases[i].type, bad);
        double ag = agreement(in, out);
        printf("  %s: greedy argmax agreement with F32 %.3f\n", cases[i].type, ag);
        CHECK_MSG(ag >= cases[i].min_agree, "%s: agreement %.3f", cases[i].type, ag);
    }
}

static void test_bad_input(void) {
    const char *in = tu_src("models/stories260K.gguf");
    char out[256];
    snprintf(out, sizeof out, "%s", tmp_path("bad.gguf"));
    struct ekv_quantize_params qp = ekv_quantize_default_params();
    qp.type = "q3_x";
    CHECK(ekv_model_quantize(in, out, &qp, NULL) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "q3_x") && strstr(ekv_last_error(), "q8_0"));
    CHECK(no_output(out));
    qp.type = NULL;
    CHECK(ekv_model_quantize(in, out, &qp, NULL) == EKV_ERR_INVALID_ARG && no_output(out));
    /* a quantised input, naming the tensor */
    qp = ekv_quantize_default_params();
    CHECK(ekv_model_quantize(tmp_path("st-q8_0.gguf"), out, &qp, NULL) == EKV_ERR_UNSUPPORTED);
    CHECK(strstr(ekv_last_error(), "token_embd.weight") && strstr(ekv_last_error(), "already quantised"));
    CHECK(no_output(out));
    /* output = input */
    CHECK(ekv_model_quantize(tmp_path("st-f16.gguf"), tmp_path("st-f16.gguf"), &qp, NULL) == EKV_ERR_INVALID_ARG);
    CHECK(file_exists(tmp_path("st-f16.gguf")));
    /* missing and truncated input */
    enum ekv_status st = ekv_model_quantize(tmp_path("nonexistent.gguf"), out, &qp, NULL);
    CHECK_MSG(st == EKV_ERR_IO && no_output(out), "missing input: %s (%s)", ekv_status_str(st), ekv_last_error());
    size_t len = 0;
    char *buf = tu_read_file(in, &len);
    CHECK(buf != NULL);
    if (buf) {
        FILE *fp = fopen(tmp_path("trunc.gguf"), "wb");
        CHECK(fp != NULL);
        if (fp) {
            fwrite(buf, 1, len / 2, fp);
            fclose(fp);
        }
        free(buf);
        st = ekv_model_quantize(tmp_path("trunc.gguf"), out, &qp, NULL);
        CHECK_MSG(st == EKV_ERR_FORMAT && no_output(out), "truncated input: %s (%s)", ekv_status_str(st), ekv_last_error());
    }
    /* unwritable output: a directory that does not exist */
    char nodir[256];
    snprintf(nodir, sizeof nodir, "%s", tmp_path("no/such/dir/x.gguf"));
    CHECK(ekv_model_quantize(in, nodir, &qp, NULL) == EKV_ERR_IO && no_output(nodir));
    CHECK(ekv_model_quantize(NULL, out, &qp, NULL) == EKV_ERR_INVALID_ARG);
}

static void test_shipped(void) {
    const char *shipped = tu_src("models/ekv-ref-28m-q8_0.gguf");
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(shipped, NULL, &m));
    if (m) {
        struct ekv_context *c = NULL;
        struct ekv_seq *s = NULL;
        struct ekv_context_params cp = ekv_context_default_params();
        cp.n_threads = 2;
        CHECK_OK(ekv_context_new(m, &cp, &c));
        if (c) CHECK_OK(ekv_seq_new(c, NULL, &s));
        struct ekv_model_info mi;
        ekv_model_get_info(m, &mi);
        CHECK(mi.n_layer == 8 && mi.n_embd == 512 && mi.n_head_kv == 2 && mi.n_ctx_train == 4096);
        float *lg = malloc((size_t)mi.n_vocab * sizeof *lg);
        int32_t toks[64], gen[40];
        size_t n = 0;
        const char *p = "static int __init";
        CHECK_OK(ekv_tokenize(m, p, strlen(p), true, false, toks, 64, &n));
        if (s && lg) {
            CHECK_OK(ekv_seq_prefill(s, toks, (int32_t)n, lg));
            for (int i = 0; i < 40; i++) {
                gen[i] = argmax(lg, mi.n_vocab);
                CHECK_OK(ekv_seq_decode(s, gen[i], lg));
            }
            char text[1024];
            size_t tl = 0;
            CHECK_OK(ekv_detokenize(m, gen, 40, false, false, text, sizeof text, &tl));
            /* the F16 model's greedy text (../shared/models/SOURCES.md) */
            const char *want = " init_module_init(void)\n{\n\tint ret;\n\n\tret = register_module_notifier(";
            CHECK_MSG(strncmp(text, want, strlen(want)) == 0, "greedy text: '%.80s'", text);
        }
        free(lg);
        ekv_seq_free(s);
        ekv_context_free(c);
        ekv_model_free(m);
    }
    const char *f16 = tu_shared("models/ekv-ref-28m-f16.gguf");
    if (!file_exists(f16)) {
        printf("test_quantize: re-quantising the reference model skipped: ../shared absent\n");
        return;
    }
    char out[256];
    snprintf(out, sizeof out, "%s", tmp_path("ref-q8_0.gguf"));
    CHECK_OK(ekv_model_quantize(f16, out, NULL, NULL));
    size_t la = 0, lb = 0;
    char *a = tu_read_file(shipped, &la), *b = tu_read_file(out, &lb);
    CHECK_MSG(a && b && la == lb && memcmp(a, b, la) == 0, "shipped q8_0 model (%zu B) differs from a fresh quantisation (%zu B)",
              la, lb);
    free(a);
    free(b);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ekv_test_quantize.XXXXXX");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "test_quantize: cannot create a temporary directory\n");
        return 1;
    }
    test_round_trip();
    test_bad_input();
    test_shipped();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_quantize: could not remove %s\n", g_dir);
    return test_finish("test_quantize");
}
