/*
 * test_rope.c — RoPE scaling: cos/sin of ekv_rope_sincos_ext against values
 * computed by hand (Python, double precision, from the formulas of
 * llama.cpp's ggml_rope_ext and the YaRN paper; the numbers are written
 * below) for linear scaling, YaRN, per-dimension factors and longrope's
 * attention factor; the all-ones case equals the unscaled rotation bit for
 * bit; the model-level parameters (ekv_model_rope_params) as read from GGUF
 * files written by `ekv mkmodel`: Llama 3's rope_freqs against the
 * converter's formula, Phi-3's long/short choice by context size, YaRN's
 * correction range and attention factor; and hostile scaling metadata
 * refused with the key named. ekv_rope_shift_ext (elastic-v2:key=rotate):
 * a vector roped at p and shifted by q - p equals the vector roped at q
 * (ekv_rope, or ekv_rope_sincos_ext + apply with YaRN) within 1e-5, for
 * pairs and NeoX halves, full and partial rotary dims, shifts both ways up
 * to 4000 positions; dims past rope_dim never move; a shift of 0 is the
 * identity bit for bit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ekv.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/model.h"
#include "testutil.h"

static int run(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void check_cs(const char *what, const float *cs, const double want[][2], int n) {
    for (int i = 0; i < n; i++) {
        CHECK_MSG(fabs(cs[2 * i] - want[i][0]) < 2e-7 && fabs(cs[2 * i + 1] - want[i][1]) < 2e-7,
                  "%s pair %d: got (%.9f, %.9f), want (%.9f, %.9f)", what, i, cs[2 * i], cs[2 * i + 1], want[i][0],
                  want[i][1]);
    }
}

static struct ekv_rope_params plain(int dim, double base) {
    struct ekv_rope_params p = {.dim = dim, .freq_base = base, .freq_scale = 1.0, .attn_factor = 1.0};
    return p;
}

static void kernel_values(void) {
    float cs[64], ref[64];
    /* no scaling: identical to the unscaled rotation */
    struct ekv_rope_params p = plain(8, 10000.0);
    for (int64_t pos = 0; pos < 3000; pos += 37) {
        ekv_rope_sincos_ext(&p, pos, cs);
        ekv_rope_sincos(ref, 8, pos, 10000.0f);
        CHECK(!memcmp(cs, ref, 8 * sizeof(float)));
    }
    /* linear, factor 2: theta_i = 3 * 10000^(-i/4) / 2 */
    p.freq_scale = 0.5;
    ekv_rope_sincos_ext(&p, 3, cs);
    static const double lin[4][2] = {{0.0707372016677029, 0.9974949866040544},
                                     {0.9887710779360422, 0.14943813247359924},
                                     {0.9998875021093592, 0.01499943750632809},
                                     {0.9999988750002109, 0.0014999994375000632}};
    check_cs("linear", cs, lin, 4);
    /* YaRN, dim 8, base 10000, original context 64, factor 4, betas 32/1:
     * corr dims floor(-0.497) -> 0 and ceil(1.008) = 2; pair 0 extrapolates,
     * pair 1 is half way, pairs 2-3 interpolate; mscale 1 + 0.1 ln 4 */
    double cd[2];
    ekv_rope_yarn_corr_dims(8, 64, 10000.0, 32.0, 1.0, cd);
    CHECK(cd[0] == 0.0 && cd[1] == 2.0);
    p = plain(8, 10000.0);
    p.freq_scale = 0.25;
    p.ext_factor = 1.0;
    p.corr_lo = cd[0];
    p.corr_hi = cd[1];
    ekv_rope_sincos_ext(&p, 100, cs);
    static const double yarn[4][2] = {{0.9818616513016518, -0.5765628244032905},
                                      {1.1380025274954173, -0.03777883262818219},
                                      {1.1032322043742933, 0.28170143061785097},
                                      {1.1382736329451981, 0.028462770814637044}};
    check_cs("yarn", cs, yarn, 4);
    /* per-dimension factors {1, 2, 4, 8} at position 5 */
    static const float ff[4] = {1.0f, 2.0f, 4.0f, 8.0f};
    p = plain(8, 10000.0);
    p.freq_factors = ff;
    ekv_rope_sincos_ext(&p, 5, cs);
    static const double fac[4][2] = {{0.28366218546322625, -0.9589242746631385},
                                     {0.9689124217106447, 0.24740395925452294},
                                     {0.9999218760172474, 0.012499674481709789},
                                     {0.9999998046875064, 0.0006249999593098966}};
    check_cs("factors", cs, fac, 4);
    /* longrope: factors {1.5, 1, 3, 0.5}, attention factor 1.2, position 7 */
    static const float lr[4] = {1.5f, 1.0f, 3.0f, 0.5f};
    p = plain(8, 10000.0);
    p.freq_factors = lr;
    p.attn_factor = 1.2;
    ekv_rope_sincos_ext(&p, 7, cs);
    static const double lrw[4][2] = {{-0.05484766168629654, -1.1987459005175138},
                                     {0.917810624741386, 0.7730612246852293},
                                     {1.199673348154052, 0.027997459328422975},
                                     {1.1998824019207874, 0.016799451205378214}};
    check_cs("longrope", cs, lrw, 4);
}

static struct ekv_model *load(const char *path) {
    struct ekv_model *m = NULL;
    enum ekv_status s = ekv_model_load(path, NULL, &m);
    CHECK_MSG(s == EKV_OK, "%s: %s", path, ekv_last_error());
    return m;
}

static void model_params(const char *dir) {
    char path[512], cmd[1024];
    /* Llama 3: rope_freqs as the converter computes them (factor 32, low 1, high 4, original 8192) */
    snprintf(path, sizeof path, "%s/l3.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-llama3 -o %s >/dev/null", EKV_BINARY_DIR, path);
    CHECK(run(cmd) == 0);
    struct ekv_model *m = load(path);
    if (m) {
        struct ekv_model_info mi;
        ekv_model_get_info(m, &mi);
        CHECK(mi.rope_freqs && !strcmp(mi.rope_scaling, "none") && mi.rope_dim == 64);
        struct ekv_rope_params p;
        ekv_model_rope_params(m, 4096, &p);
        CHECK(p.freq_factors != NULL && p.freq_scale == 1.0 && p.ext_factor == 0.0 && p.attn_factor == 1.0);
        int n1 = 0, n32 = 0, mid = 0;
        for (int i = 0; p.freq_factors && i < 32; i++) {
            double freq = pow(500000.0, -2.0 * i / 64.0), wl = 2 * M_PI / freq, want;
            if (wl < 8192.0 / 4.0) want = 1.0;
            else if (wl > 8192.0) want = 32.0;
            else {
                double smooth = (8192.0 / wl - 1.0) / 3.0;
                want = 1.0 / ((1.0 - smooth) / 32.0 + smooth);
            }
            CHECK_MSG(fabs(p.freq_factors[i] - want) < 1e-5 * want, "rope_freqs[%d] = %g, want %g", i,
                      p.freq_factors[i], want);
            n1 += want == 1.0;
            n32 += want == 32.0;
            mid += want != 1.0 && want != 32.0;
        }
        CHECK(n1 > 0 && n32 > 0 && mid > 0); /* all three regimes are exercised */
        ekv_model_free(m);
    }
    /* Phi-3 longrope: long factors when the context exceeds the original 512 */
    snprintf(path, sizeof path, "%s/p3.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-phi3 -o %s >/dev/null", EKV_BINARY_DIR, path);
    CHECK(run(cmd) == 0);
    if ((m = load(path))) {
        struct ekv_model_info mi;
        ekv_model_get_info(m, &mi);
        CHECK(!strcmp(mi.rope_scaling, "longrope") && mi.rope_long_short && mi.rope_orig_ctx == 512);
        CHECK(fabs(mi.rope_attn_factor - sqrt(1.0 + log(4096.0 / 512.0) / log(512.0))) < 1e-6);
        struct ekv_rope_params lo, hi;
        ekv_model_rope_params(m, 512, &lo);
        ekv_model_rope_params(m, 513, &hi);
        CHECK(lo.freq_factors && hi.freq_factors && lo.freq_factors != hi.freq_factors);
        /* the long factors grow to about 60, the short stay near 1 */
        CHECK(hi.freq_factors[15] > 50.0f && lo.freq_factors[15] < 1.2f);
        CHECK(fabs(lo.attn_factor - mi.rope_attn_factor) < 1e-7 && lo.ext_factor == 0.0);
        ekv_model_free(m);
    }
    /* YaRN from metadata: factor 4 over 256, llama.cpp's attention factor */
    snprintf(path, sizeof path, "%s/y.gguf", dir);
    snprintf(cmd, sizeof cmd,
             "%s/ekv mkmodel --preset tiny-mistral --rope-scaling yarn --rope-scale 4 --rope-orig-ctx 256 -o %s >/dev/null",
             EKV_BINARY_DIR, path);
    CHECK(run(cmd) == 0);
    if ((m = load(path))) {
        struct ekv_rope_params p;
        ekv_model_rope_params(m, 2048, &p);
        CHECK(p.freq_scale == 0.25 && p.ext_factor == 1.0);
        /* mscale(4) / (1 + 0.1 ln 4) = 1; the kernel then scales by 1 + 0.1 ln 4 */
        CHECK(fabs(p.attn_factor - 1.0) < 1e-12);
        /* dim 32, base 10000, 256: corr_dim(32) = 32 ln(256 / 64 pi) / (2 ln 10000) = 0.41 -> 0;
         * corr_dim(1) = 32 ln(256 / 2 pi) / (2 ln 10000) = 6.44 -> 7 */
        CHECK(p.corr_lo == 0.0 && p.corr_hi == 7.0);
        ekv_model_free(m);
    }
    /* linear: factor 4 divides every angle; no YaRN mixing */
    snprintf(path, sizeof path, "%s/lin.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-mistral --rope-scaling linear --rope-scale 4 -o %s >/dev/null",
             EKV_BINARY_DIR, path);
    CHECK(run(cmd) == 0);
    if ((m = load(path))) {
        struct ekv_rope_params p;
        ekv_model_rope_params(m, 2048, &p);
        CHECK(p.freq_scale == 0.25 && p.ext_factor == 0.0 && p.attn_factor == 1.0 && !p.freq_factors);
        ekv_model_free(m);
    }
}

/* A copy of src with one metadata value (f32 or string) replaced. */
static int rewrite(const char *src, const char *dst, const char *key, const char *sval, float fval) {
    struct ekv_gguf_file *f = NULL;
    struct ekv_gguf_writer *w = NULL;
    if (ekv_gguf_open(src, &f) != EKV_OK || ekv_gguf_writer_new(&w) != EKV_OK) return 0;
    enum ekv_status s = EKV_OK;
    for (size_t i = 0; i < ekv_gguf_n_kv(f) && s == EKV_OK; i++) {
        const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(f, i);
        if (kv->key.len == strlen(key) && !memcmp(kv->key.ptr, key, kv->key.len)) continue;
        s = ekv_gguf_writer_copy_kv(w, kv);
    }
    if (s == EKV_OK) s = sval ? ekv_gguf_writer_set_str(w, key, sval) : ekv_gguf_writer_set_f32(w, key, fval);
    for (size_t i = 0; i < ekv_gguf_n_tensors(f) && s == EKV_OK; i++) {
        const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
        s = ekv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, NULL, NULL);
    }
    if (s == EKV_OK) s = ekv_gguf_writer_write(w, dst);
    ekv_gguf_writer_free(w);
    ekv_gguf_close(f);
    return s == EKV_OK;
}

static void hostile(const char *dir) {
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/y.gguf", dir);
    snprintf(dst, sizeof dst, "%s/bad.gguf", dir);
    struct ekv_model *m = NULL;
    CHECK(rewrite(src, dst, "llama.rope.scaling.type", "ntk-by-parts", 0));
    CHECK(ekv_model_load(dst, NULL, &m) == EKV_ERR_UNSUPPORTED && strstr(ekv_last_error(), "ntk-by-parts"));
    CHECK(rewrite(src, dst, "llama.rope.scaling.factor", NULL, -2.0f));
    CHECK(ekv_model_load(dst, NULL, &m) == EKV_ERR_FORMAT && strstr(ekv_last_error(), "scaling factor"));
    CHECK(rewrite(src, dst, "llama.rope.scaling.factor", NULL, NAN));
    CHECK(ekv_model_load(dst, NULL, &m) == EKV_ERR_FORMAT);
    CHECK(rewrite(src, dst, "llama.rope.scaling.attn_factor", NULL, 0.0f));
    CHECK(ekv_model_load(dst, NULL, &m) == EKV_ERR_FORMAT && strstr(ekv_last_error(), "attn_factor"));
    CHECK(rewrite(src, dst, "llama.rope.scaling.yarn_beta_fast", NULL, INFINITY));
    CHECK(ekv_model_load(dst, NULL, &m) == EKV_ERR_FORMAT && strstr(ekv_last_error(), "YaRN"));
    CHECK(m == NULL);
}

static uint64_t g_rng = 0x5EED;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* x roped at p, shifted by q - p, against x roped at q (rope: NULL = the
 * plain kernel ekv_rope with base 10000, else sincos_ext + apply). */
static double shift_error(const struct ekv_rope_params *rp, int hd, int64_t p, int64_t q, const float *x, int nh,
                          bool *tail_moved) {
    float a[2 * 128], b[2 * 128], cs[128];
    memcpy(a, x, (size_t)nh * hd * sizeof *a);
    memcpy(b, x, (size_t)nh * hd * sizeof *b);
    if (rp->freq_scale == 1.0 && rp->ext_factor == 0.0 && !rp->freq_factors) {
        ekv_rope(a, nh, hd, rp->dim, p, (float)rp->freq_base, rp->neox);
        ekv_rope(b, nh, hd, rp->dim, q, (float)rp->freq_base, rp->neox);
    } else {
        ekv_rope_sincos_ext(rp, p, cs);
        ekv_rope_apply(a, nh, hd, rp->dim, cs, rp->neox);
        ekv_rope_sincos_ext(rp, q, cs);
        ekv_rope_apply(b, nh, hd, rp->dim, cs, rp->neox);
    }
    ekv_rope_shift_ext(rp, q - p, a, nh, hd);
    double e = 0;
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < hd; c++) {
            e = fmax(e, fabs((double)a[h * hd + c] - b[h * hd + c]));
            if (c >= rp->dim && a[h * hd + c] != x[h * hd + c]) *tail_moved = true;
        }
    return e;
}

static void shift_values(void) {
    enum { HD = 64, NH = 2 };
    static const int64_t P[][2] = {{0, 1}, {5, 0}, {17, 300}, {1000, 999}, {3000, 4000}, {4000, 12}, {2047, 2047}};
    float x[NH * HD];
    int runs = 0;
    for (int yarn = 0; yarn < 2; yarn++)
        for (int neox = 0; neox < 2; neox++)
            for (int rd = HD; rd >= HD / 2; rd -= HD / 2) {
                struct ekv_rope_params rp = plain(rd, 10000.0);
                rp.neox = neox;
                if (yarn) { /* YaRN x4: the angle mixes two frequencies, cos/sin carry the attention factor */
                    double cd[2];
                    ekv_rope_yarn_corr_dims(rd, 1024, 10000.0, 32.0, 1.0, cd);
                    rp.freq_scale = 0.25, rp.ext_factor = 1.0, rp.corr_lo = cd[0], rp.corr_hi = cd[1];
                }
                for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
                    for (int c = 0; c < NH * HD; c++) x[c] = frand();
                    bool moved = false;
                    const double e = shift_error(&rp, HD, P[i][0], P[i][1], x, NH, &moved);
                    CHECK_MSG(e < 1e-5 && !moved, "shift %lld -> %lld (yarn %d, neox %d, dims %d): error %g%s",
                              (long long)P[i][0], (long long)P[i][1], yarn, neox, rd, e, moved ? ", tail moved" : "");
                    runs++;
                }
            }
    /* delta 0: untouched, bit for bit */
    struct ekv_rope_params rp = plain(HD, 10000.0);
    float y[NH * HD];
    for (int c = 0; c < NH * HD; c++) x[c] = y[c] = frand();
    ekv_rope_shift_ext(&rp, 0, y, NH, HD);
    CHECK(memcmp(x, y, sizeof x) == 0);
    /* and it moves something otherwise (the check above can fail) */
    ekv_rope_shift_ext(&rp, 1, y, NH, HD);
    CHECK(memcmp(x, y, sizeof x) != 0);
    CHECK(runs == 56);
}

int main(void) {
    kernel_values();
    shift_values();
    char dir[] = "/tmp/ekv_rope_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    model_params(dir);
    hostile(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(run(cmd) == 0);
    return test_finish("test_rope");
}
