/*
 * test_arch.c — every architecture and RoPE scaling against a reference
 * forward written here, plainly, in double precision, that reads the GGUF
 * itself (metadata and F32 tensors through the GGUF reader only): Llama 3
 * (rope_freqs), Mistral (sliding window), Phi-3 (fused QKV and gate-up,
 * longrope long and short), Gemma (scaled embeddings, GeGLU, head size
 * beside n_embd / n_head), and linear and YaRN scaling, on `ekv mkmodel`'s
 * tiny-* presets in F32. ekv's logits at every prompt position and over
 * decode steps must match the reference within 1e-5 (float32 against
 * double over two layers: about 5e-7 is seen; the largest error is printed),
 * and the variants must differ from each other (a detail that did nothing
 * would pass unnoticed otherwise).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ekv.h"
#include "model/gguf.h"
#include "testutil.h"

#define TOL 1e-5

/* ---- the reference ---- */

struct ref {
    struct ekv_gguf_file *f;
    char arch[32];
    int E, L, H, HKV, HD, FF, V, RD, swa, orig_ctx;
    double eps, base, scale_factor, attn_factor, beta_fast, beta_slow;
    char scaling[16];
    bool neox, gemma;
};

static const float *tensor(const struct ref *r, const char *name) {
    const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(r->f, name);
    if (!t || t->type != EKV_F32) return NULL;
    return (const float *)t->data;
}

static uint32_t key_u32(const struct ref *r, const char *suffix, uint32_t dflt) {
    char k[128];
    uint32_t v;
    snprintf(k, sizeof k, "%s.%s", r->arch, suffix);
    return ekv_gguf_get_u32(r->f, k, &v) == EKV_OK ? v : dflt;
}

static double key_f32(const struct ref *r, const char *suffix, double dflt) {
    char k[128];
    float v;
    snprintf(k, sizeof k, "%s.%s", r->arch, suffix);
    return ekv_gguf_get_f32(r->f, k, &v) == EKV_OK ? v : dflt;
}

static int ref_open(struct ref *r, const char *path) {
    memset(r, 0, sizeof *r);
    if (ekv_gguf_open(path, &r->f) != EKV_OK) return 0;
    struct ekv_gguf_str s;
    if (ekv_gguf_get_str(r->f, "general.architecture", &s) != EKV_OK) return 0;
    ekv_gguf_str_copy(s, r->arch, sizeof r->arch);
    r->E = (int)key_u32(r, "embedding_length", 0);
    r->L = (int)key_u32(r, "block_count", 0);
    r->H = (int)key_u32(r, "attention.head_count", 0);
    r->HKV = (int)key_u32(r, "attention.head_count_kv", (uint32_t)r->H);
    r->HD = (int)key_u32(r, "attention.key_length", (uint32_t)(r->E / r->H));
    r->RD = (int)key_u32(r, "rope.dimension_count", (uint32_t)r->HD);
    r->FF = (int)key_u32(r, "feed_forward_length", 0);
    r->swa = (int)key_u32(r, "attention.sliding_window", 0);
    r->orig_ctx = (int)key_u32(r, "rope.scaling.original_context_length", key_u32(r, "context_length", 0));
    r->eps = key_f32(r, "attention.layer_norm_rms_epsilon", 1e-5);
    r->base = key_f32(r, "rope.freq_base", 10000.0);
    r->scale_factor = key_f32(r, "rope.scaling.factor", 1.0);
    r->attn_factor = key_f32(r, "rope.scaling.attn_factor", 1.0);
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.type", r->arch);
    if (ekv_gguf_get_str(r->f, k, &s) == EKV_OK) ekv_gguf_str_copy(s, r->scaling, sizeof r->scaling);
    r->gemma = !strcmp(r->arch, "gemma");
    r->neox = strcmp(r->arch, "llama") != 0;
    const struct ekv_gguf_tensor *te = ekv_gguf_find_tensor(r->f, "token_embd.weight");
    r->V = te ? (int)te->ne[1] : 0;
    return r->E > 0 && r->L > 0 && r->V > 0;
}

/* y[rows] = W x, W: [rows][cols] f32 */
static void mv(double *y, const float *w, const double *x, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        double s = 0.0;
        for (int j = 0; j < cols; j++) s += (double)w[(size_t)i * cols + j] * x[j];
        y[i] = s;
    }
}

static void rmsnorm(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double k = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * k * w[i];
}

/* cos/sin of pair i at position p, with the model's scaling: divide theta by
 * the per-dimension factor; linear: theta / factor; YaRN: blend theta and
 * theta / factor with a ramp between the dimensions where the original
 * context makes beta_fast and beta_slow turns, and scale by
 * attn_factor * (1 + 0.1 ln factor); longrope: attn_factor alone. */
static void rope_angle(const struct ref *r, const float *ff, int n_ctx, int i, int p, double *c, double *s) {
    (void)n_ctx;
    double theta = p * pow(r->base, -2.0 * i / r->RD);
    if (ff) theta /= ff[i];
    double scale = 1.0;
    if (!strcmp(r->scaling, "linear")) {
        theta /= r->scale_factor;
    } else if (!strcmp(r->scaling, "yarn")) {
        const double fct = r->scale_factor;
        double lo = floor(r->RD * log(r->orig_ctx / (r->beta_fast * 2 * M_PI)) / (2 * log(r->base)));
        double hi = ceil(r->RD * log(r->orig_ctx / (r->beta_slow * 2 * M_PI)) / (2 * log(r->base)));
        if (lo < 0) lo = 0;
        if (hi > r->RD - 1) hi = r->RD - 1;
        double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
        double ramp = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y); /* 1: keep theta (extrapolate) */
        theta = theta / fct * (1.0 - ramp) + theta * ramp;
        scale = 1.0 + 0.1 * log(fct);
    }
    scale *= r->attn_factor;
    *c = cos(theta) * scale;
    *s = sin(theta) * scale;
}

static void rope_vec(const struct ref *r, const float *ff, int n_ctx, double *x, int p) {
    for (int i = 0; i < r->RD / 2; i++) {
        double c, s;
        rope_angle(r, ff, n_ctx, i, p, &c, &s);
        int a = r->neox ? i : 2 * i, b = r->neox ? i + r->RD / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/* Logits of every position of toks[0..n): out [n][V]. */
static int ref_forward(const struct ref *r, const int32_t *toks, int n, int n_ctx, double *out) {
    const int E = r->E, H = r->H, HKV = r->HKV, HD = r->HD, FF = r->FF, V = r->V;
    const int QD = H * HD, KVD = HKV * HD;
    const float *emb = tensor(r, "token_embd.weight"), *onorm = tensor(r, "output_norm.weight");
    const float *outw = tensor(r, "output.weight");
    if (!outw) outw = emb;
    const float *ff = tensor(r, "rope_freqs.weight");
    if (!ff) ff = tensor(r, n_ctx > r->orig_ctx ? "rope_factors_long.weight" : "rope_factors_short.weight");
    if (!emb || !onorm) return 0;
    double *x = calloc((size_t)n * E, sizeof *x), *xn = malloc(sizeof(double) * (size_t)(E > FF ? E : FF) * 2);
    double *q = malloc(sizeof(double) * (size_t)n * QD), *k = malloc(sizeof(double) * (size_t)n * KVD);
    double *v = malloc(sizeof(double) * (size_t)n * KVD), *att = malloc(sizeof(double) * QD);
    double *tmp = malloc(sizeof(double) * (size_t)(QD + 2 * KVD + 2 * FF + E)), *sc = malloc(sizeof(double) * n);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++)
            x[(size_t)t * E + i] = emb[(size_t)toks[t] * E + i] * (r->gemma ? sqrt((double)E) : 1.0);
    char nm[96];
    for (int l = 0; l < r->L; l++) {
#define T(fmt) (snprintf(nm, sizeof nm, "blk.%d." fmt, l), tensor(r, nm))
        const float *an = T("attn_norm.weight"), *fn = T("ffn_norm.weight"), *wo = T("attn_output.weight");
        const float *wqkv = T("attn_qkv.weight"), *wq = T("attn_q.weight"), *wk = T("attn_k.weight"),
                    *wv = T("attn_v.weight"), *wg = T("ffn_gate.weight"), *wu = T("ffn_up.weight"),
                    *wd = T("ffn_down.weight");
#undef T
        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * E;
            rmsnorm(xn, xt, an, E, r->eps);
            if (wqkv) {
                mv(tmp, wqkv, xn, QD + 2 * KVD, E);
                memcpy(q + (size_t)t * QD, tmp, sizeof(double) * QD);
                memcpy(k + (size_t)t * KVD, tmp + QD, sizeof(double) * KVD);
                memcpy(v + (size_t)t * KVD, tmp + QD + KVD, sizeof(double) * KVD);
            } else {
                mv(q + (size_t)t * QD, wq, xn, QD, E);
                mv(k + (size_t)t * KVD, wk, xn, KVD, E);
                mv(v + (size_t)t * KVD, wv, xn, KVD, E);
            }
            for (int h = 0; h < H; h++) rope_vec(r, ff, n_ctx, q + (size_t)t * QD + (size_t)h * HD, t);
            for (int h = 0; h < HKV; h++) rope_vec(r, ff, n_ctx, k + (size_t)t * KVD + (size_t)h * HD, t);
            /* causal attention, the last swa positions when a window is set */
            int s0 = r->swa > 0 && t - r->swa + 1 > 0 ? t - r->swa + 1 : 0;
            for (int h = 0; h < H; h++) {
                int hk = h / (H / HKV);
                const double *qh = q + (size_t)t * QD + (size_t)h * HD;
                double mx = -1e300, sum = 0.0;
                for (int s = s0; s <= t; s++) {
                    double d = 0.0;
                    for (int j = 0; j < HD; j++) d += qh[j] * k[(size_t)s * KVD + (size_t)hk * HD + j];
                    sc[s] = d / sqrt((double)HD);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = s0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int j = 0; j < HD; j++) {
                    double a = 0.0;
                    for (int s = s0; s <= t; s++) a += sc[s] / sum * v[(size_t)s * KVD + (size_t)hk * HD + j];
                    att[(size_t)h * HD + j] = a;
                }
            }
            mv(tmp, wo, att, E, QD);
            for (int i = 0; i < E; i++) xt[i] += tmp[i];
            /* feed-forward: gate and up (one fused tensor: gate rows first) */
            rmsnorm(xn, xt, fn, E, r->eps);
            double *g = tmp, *u = tmp + FF;
            if (wg) {
                mv(g, wg, xn, FF, E);
                mv(u, wu, xn, FF, E);
            } else {
                mv(g, wu, xn, 2 * FF, E);
            }
            for (int i = 0; i < FF; i++) {
                double a = r->gemma ? 0.5 * g[i] * (1.0 + tanh(sqrt(2.0 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i])))
                                    : g[i] / (1.0 + exp(-g[i]));
                g[i] = a * u[i];
            }
            double *dn = tmp + 2 * FF;
            mv(dn, wd, g, E, FF);
            for (int i = 0; i < E; i++) xt[i] += dn[i];
        }
    }
    for (int t = 0; t < n; t++) {
        rmsnorm(xn, x + (size_t)t * E, onorm, E, r->eps);
        mv(out + (size_t)t * V, outw, xn, V, E);
    }
    free(x); free(xn); free(q); free(k); free(v); free(att); free(tmp); free(sc);
    return 1;
}

/* ---- the comparison ---- */

static int run(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Makes a model with `args`, runs n_prompt positions as a prompt (logits of
 * every one) and n_dec decode steps in ekv and in the reference, and
 * compares every logit. */
static double check_model(const char *dir, const char *label, const char *args, int n_ctx, int n_prompt, int n_dec,
                          const char *want_arch, const char *want_scaling) {
    double sig = 0.0; /* reference logit of the last position, token 7: tells variants apart */
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, label);
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel %s --type f32 --seed 11 -o %s >/dev/null 2>&1", EKV_BINARY_DIR, args, path);
    CHECK_MSG(run(cmd) == 0, "%s: mkmodel failed", label);
    struct ref r;
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    struct ekv_seq *sq = NULL;
    CHECK_MSG(ref_open(&r, path), "%s: reference cannot read the file", label);
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (!m || !r.f) goto out;
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    CHECK_MSG(!strcmp(mi.arch, want_arch) && !strcmp(mi.rope_scaling, want_scaling), "%s: arch %s, scaling %s", label,
              mi.arch, mi.rope_scaling);
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 2;
    cp.n_ctx = n_ctx;
    CHECK_OK(ekv_context_new(m, &cp, &c));
    struct ekv_kv_params fp = ekv_kv_default_params();
    fp.type_k = fp.type_v = EKV_KV_F32; /* the reference keeps K/V in double: compare with f32 storage */
    if (c) CHECK_OK(ekv_seq_new(c, &fp, &sq));
    if (!sq) goto out;
    const int n = n_prompt + n_dec, V = r.V;
    int32_t *toks = malloc(sizeof *toks * n);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(3 + (st >> 33) % (uint64_t)(V - 3));
    }
    double *ref = malloc(sizeof(double) * (size_t)n * V);
    float *got = malloc(sizeof(float) * (size_t)n * V);
    CHECK(ref_forward(&r, toks, n, n_ctx, ref));
    struct ekv_segment sg = {.tokens = toks, .n = n_prompt, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &sg, .n_segs = 1, .is_prompt = true, .logits_all = true};
    CHECK_OK(ekv_seq_eval(sq, &in, got));
    for (int i = 0; i < n_dec; i++) CHECK_OK(ekv_seq_decode(sq, toks[n_prompt + i], got + (size_t)(n_prompt + i) * V));
    double worst = 0.0, scale = 0.0;
    int top_agree = 0;
    for (int t = 0; t < n; t++) {
        int bg = 0, br = 0;
        for (int j = 0; j < V; j++) {
            double d = fabs((double)got[(size_t)t * V + j] - ref[(size_t)t * V + j]);
            if (d > worst) worst = d;
            if (fabs(ref[(size_t)t * V + j]) > scale) scale = fabs(ref[(size_t)t * V + j]);
            if (got[(size_t)t * V + j] > got[(size_t)t * V + bg]) bg = j;
            if (ref[(size_t)t * V + j] > ref[(size_t)t * V + br]) br = j;
        }
        top_agree += bg == br;
    }
    printf("test_arch: %-22s %d positions, largest |logit| %.3f, largest error %.2e, top-1 agrees %d/%d\n", label, n,
           scale, worst, top_agree, n);
    CHECK_MSG(worst <= TOL, "%s: logits differ from the reference by %g", label, worst);
    CHECK_MSG(scale > 0.05, "%s: logits too small to tell anything (%g)", label, scale);
    CHECK(top_agree == n);
    sig = ref[(size_t)(n - 1) * V + 7];
    free(toks);
    free(ref);
    free(got);
out:
    ekv_seq_free(sq);
    ekv_context_free(c);
    ekv_model_free(m);
    ekv_gguf_close(r.f);
    return sig;
}

/* The sliding window beside compressing policies: every policy runs a
 * prompt longer than the window and decode steps; the window's first
 * entries in the statistics arrays are shifted, never overrun (ASan). */
static void swa_with_policies(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/mistral-swa.gguf", dir);
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    CHECK_OK(ekv_model_load(path, NULL, &m));
    if (m) CHECK_OK(ekv_context_new(m, NULL, &c));
    int32_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = 3 + (i * 37) % 500;
    for (int i = 0; c && i < ekv_kv_policy_count(); i++) {
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.policy = ekv_kv_policy_name(i);
        kp.budget = 0.5;
        struct ekv_seq *s = NULL;
        enum ekv_status st = ekv_seq_new(c, &kp, &s);
        if (st == EKV_OK) st = ekv_seq_prefill(s, toks, 90, NULL);
        for (int k = 90; st == EKV_OK && k < 100; k++) st = ekv_seq_decode(s, toks[k], NULL);
        CHECK_MSG(st == EKV_OK, "policy %s with a sliding window: %s", kp.policy, ekv_last_error());
        ekv_seq_free(s);
    }
    ekv_context_free(c);
    ekv_model_free(m);
}

int main(void) {
    char dir[] = "/tmp/ekv_arch_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    check_model(dir, "llama3", "--preset tiny-llama3", 4096, 48, 8, "llama", "none");
    /* the window (32) matters from position 32 on */
    double swa = check_model(dir, "mistral-swa", "--preset tiny-mistral", 2048, 72, 8, "llama", "none");
    double full = check_model(dir, "mistral-full", "--preset tiny-mistral --sliding-window 0", 2048, 72, 8, "llama", "none");
    /* context above the original 512: long factors; within it: short ones */
    double lng = check_model(dir, "phi3-long", "--preset tiny-phi3", 4096, 48, 8, "phi3", "longrope");
    double sht = check_model(dir, "phi3-short", "--preset tiny-phi3", 512, 48, 8, "phi3", "longrope");
    check_model(dir, "gemma", "--preset tiny-gemma", 2048, 48, 8, "gemma", "none");
    double lin = check_model(dir, "linear", "--preset tiny-mistral --sliding-window 0 --rope-scaling linear --rope-scale 4",
                             2048, 48, 8, "llama", "linear");
    double yarn = check_model(dir, "yarn", "--preset tiny-mistral --sliding-window 0 --rope-scaling yarn --rope-scale 4 "
                              "--rope-orig-ctx 256", 2048, 48, 8, "llama", "yarn");
    check_model(dir, "yarn-neox", "--preset tiny-gemma --rope-scaling yarn --rope-scale 8 --rope-orig-ctx 128", 2048,
                40, 8, "gemma", "yarn");
    double none48 = check_model(dir, "unscaled", "--preset tiny-mistral --sliding-window 0", 2048, 48, 8, "llama", "none");
    CHECK_MSG(fabs(swa - full) > 1e-4, "the sliding window changed nothing (%g vs %g)", swa, full);
    CHECK_MSG(fabs(lng - sht) > 1e-4, "long and short factors gave the same logits (%g)", lng);
    CHECK_MSG(fabs(lin - none48) > 1e-4 && fabs(yarn - none48) > 1e-4 && fabs(yarn - lin) > 1e-4,
              "scalings indistinguishable (%g %g %g)", lin, yarn, none48);
    swa_with_policies(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(run(cmd) == 0);
    return test_finish("test_arch");
}
