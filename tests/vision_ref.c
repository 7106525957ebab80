/*
 * vision_ref.c — plain double-precision references for the vision tests
 * (test_vision, test_idefics3), written from the definitions, not from
 * ekv's code: Pillow's resampling (bicubic and Lanczos), and the ViT
 * (patch embedding, pre-LN blocks, LayerNorm, linear maps) reading the
 * f32 tensors of an mmproj by name.
 */
#include "vision_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "vision/image.h"

/* Pillow's resampling (Image.resize(BICUBIC) for the LLaVA processors,
 * LANCZOS for Idefics3's), written from its definition in double
 * precision: the kernel (cubic a = -0.5 on [-2, 2], or sinc(x) sinc(x/3)
 * on [-3, 3)), widened by the scale when shrinking, normalised weights,
 * rows then columns, each pass rounded to 8 bits; a pass whose size does
 * not change is skipped. */
static double ref_kernel(bool lanczos, double x) {
    if (lanczos) {
        if (x < -3 || x >= 3) return 0;
        const double a = M_PI * x, b = M_PI * x / 3;
        return (x == 0 ? 1 : sin(a) / a) * (x == 0 ? 1 : sin(b) / b);
    }
    x = fabs(x);
    if (x < 1) return (1.5 * x - 2.5) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * -0.5;
    return 0;
}

/* n_in -> n_out along one axis: in[i * step], out[o * step]. */
static void ref_resample_line(bool lanczos, const uint8_t *in, int n_in, uint8_t *out, int n_out, size_t step) {
    const double scale = (double)n_in / n_out, fs = scale < 1 ? 1 : scale, sup = (lanczos ? 3 : 2) * fs;
    for (int o = 0; o < n_out; o++) {
        const double centre = (o + 0.5) * scale;
        int lo = (int)(centre - sup + 0.5), hi = (int)(centre + sup + 0.5);
        lo = lo < 0 ? 0 : lo;
        hi = hi > n_in ? n_in : hi;
        double sum = 0, acc = 0;
        for (int i = lo; i < hi; i++) {
            const double w = ref_kernel(lanczos, (i - centre + 0.5) / fs);
            sum += w;
            acc += w * in[(size_t)i * step];
        }
        const double v = floor(acc / sum + 0.5);
        out[(size_t)o * step] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
}

void ref_resize_filter(bool lanczos, const uint8_t *src, int nx, int ny, uint8_t *dst, int ox, int oy) {
    uint8_t *mid = malloc((size_t)ox * ny * 3);
    for (int y = 0; y < ny; y++)
        for (int c = 0; c < 3; c++) {
            if (ox == nx)
                for (int x = 0; x < nx; x++) mid[((size_t)y * ox + x) * 3 + c] = src[((size_t)y * nx + x) * 3 + c];
            else
                ref_resample_line(lanczos, src + (size_t)y * nx * 3 + c, nx, mid + (size_t)y * ox * 3 + c, ox, 3);
        }
    for (int x = 0; x < ox; x++)
        for (int c = 0; c < 3; c++) {
            if (oy == ny)
                for (int y = 0; y < ny; y++) dst[((size_t)y * ox + x) * 3 + c] = mid[((size_t)y * ox + x) * 3 + c];
            else
                ref_resample_line(lanczos, mid + (size_t)x * 3 + c, ny, dst + (size_t)x * 3 + c, oy, (size_t)ox * 3);
        }
    free(mid);
}

void ref_resize(const uint8_t *src, int nx, int ny, uint8_t *dst, int ox, int oy) {
    ref_resize_filter(false, src, nx, ny, dst, ox, oy);
}

const float *T(struct ekv_gguf_file *f, const char *name) {
    const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(f, name);
    CHECK_MSG(t && t->type == EKV_F32, "tensor %s missing or not f32", name);
    return t && t->type == EKV_F32 ? (const float *)t->data : NULL;
}

const float *Tn(struct ekv_gguf_file *f, const char *fmt, int il) {
    char name[96];
    snprintf(name, sizeof name, fmt, il);
    return T(f, name);
}

void ref_ln(double *out, const double *x, const float *w, const float *b, int n, double eps) {
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= n;
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean) / sqrt(var + eps) * w[i] + b[i];
}

/* y[o] = b[o] + sum_i W[o][i] x[i]; W stored with ne = [in, out]. */
void ref_linear(double *y, const float *W, const float *b, const double *x, int in, int out) {
    for (int o = 0; o < out; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++) s += (double)W[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

/* Patch embedding + class + positions + pre-LN. x: [n_pos][E]. */
void ref_embed(struct ekv_gguf_file *f, const struct ekv_clip_hparams *hp, const float *pix,
                      double *x) {
    const int E = hp->n_embd, P = hp->patch_size, S = hp->image_size, G = S / P;
    const int first = hp->has_class ? 1 : 0; /* SigLIP: no class token */
    const float *w = T(f, "v.patch_embd.weight");
    const float *cls = hp->has_class ? T(f, "v.class_embd") : NULL;
    const float *pb = ekv_gguf_find_tensor(f, "v.patch_embd.bias") ? T(f, "v.patch_embd.bias") : NULL;
    const float *pos = T(f, "v.position_embd.weight");
    bool pre = ekv_gguf_find_tensor(f, "v.pre_ln.weight") != NULL;
    const float *lw = pre ? T(f, "v.pre_ln.weight") : NULL, *lb = pre ? T(f, "v.pre_ln.bias") : NULL;
    if (!w || !pos || (hp->has_class && !cls) || (pre && (!lw || !lb))) return;
    for (int e = 0; e < E && cls; e++) x[e] = cls[e];
    for (int py = 0; py < G; py++)
        for (int px = 0; px < G; px++)
            for (int e = 0; e < E; e++) {
                double s = 0;
                /* conv weight [E][3][P][P] (GGUF ne = [P,P,3,E]) */
                for (int c = 0; c < 3; c++)
                    for (int ky = 0; ky < P; ky++)
                        for (int kx = 0; kx < P; kx++)
                            s += (double)w[((size_t)(e * 3 + c) * P + ky) * P + kx] *
                                 pix[(size_t)c * S * S + (size_t)(py * P + ky) * S + px * P + kx];
                x[(size_t)(first + py * G + px) * E + e] = s + (pb ? pb[e] : 0.0);
            }
    for (int r = 0; r < hp->n_pos; r++)
        for (int e = 0; e < E; e++) x[(size_t)r * E + e] += pos[(size_t)r * E + e];
    double *tmp = malloc(sizeof(double) * E);
    for (int r = 0; r < hp->n_pos && pre; r++) {
        ref_ln(tmp, x + (size_t)r * E, lw, lb, E, hp->eps);
        memcpy(x + (size_t)r * E, tmp, sizeof(double) * E);
    }
    free(tmp);
}

/* One pre-LN block: x += attn(LN1 x); x += fc2(quick_gelu(fc1(LN2 x))). */
void ref_block(struct ekv_gguf_file *f, const struct ekv_clip_hparams *hp, int il, double *x) {
    const int E = hp->n_embd, F = hp->n_ff, N = hp->n_pos, H = hp->n_head, D = E / H;
    const float *l1w = Tn(f, "v.blk.%d.ln1.weight", il), *l1b = Tn(f, "v.blk.%d.ln1.bias", il);
    const float *l2w = Tn(f, "v.blk.%d.ln2.weight", il), *l2b = Tn(f, "v.blk.%d.ln2.bias", il);
    const float *qw = Tn(f, "v.blk.%d.attn_q.weight", il), *qb = Tn(f, "v.blk.%d.attn_q.bias", il);
    const float *kw = Tn(f, "v.blk.%d.attn_k.weight", il), *kb = Tn(f, "v.blk.%d.attn_k.bias", il);
    const float *vw = Tn(f, "v.blk.%d.attn_v.weight", il), *vb = Tn(f, "v.blk.%d.attn_v.bias", il);
    const float *ow = Tn(f, "v.blk.%d.attn_out.weight", il), *ob = Tn(f, "v.blk.%d.attn_out.bias", il);
    /* llama.cpp's LLaVA converter: fc1 = ffn_down [E->F], fc2 = ffn_up [F->E];
     * its SigLIP converter the other way round (told apart by ffn_up's shape) */
    char nm[96];
    snprintf(nm, sizeof nm, "v.blk.%d.ffn_up.weight", il);
    const struct ekv_gguf_tensor *tu = ekv_gguf_find_tensor(f, nm);
    const bool siglip_names = tu && tu->ne[0] == E && tu->ne[1] == F && E != F;
    const char *n1 = siglip_names ? "up" : "down", *n2 = siglip_names ? "down" : "up";
    char a1[64], b1[64], a2[64], b2[64];
    snprintf(a1, sizeof a1, "v.blk.%%d.ffn_%s.weight", n1);
    snprintf(b1, sizeof b1, "v.blk.%%d.ffn_%s.bias", n1);
    snprintf(a2, sizeof a2, "v.blk.%%d.ffn_%s.weight", n2);
    snprintf(b2, sizeof b2, "v.blk.%%d.ffn_%s.bias", n2);
    const float *f1w = Tn(f, a1, il), *f1b = Tn(f, b1, il);
    const float *f2w = Tn(f, a2, il), *f2b = Tn(f, b2, il);
    if (!l1w || !l1b || !l2w || !l2b || !qw || !qb || !kw || !kb || !vw || !vb || !ow || !ob ||
        !f1w || !f1b || !f2w || !f2b)
        return;
    double *h = malloc(sizeof(double) * N * E), *q = malloc(sizeof(double) * N * E);
    double *k = malloc(sizeof(double) * N * E), *v = malloc(sizeof(double) * N * E);
    double *a = malloc(sizeof(double) * N * E), *t = malloc(sizeof(double) * N * F);
    double *p = malloc(sizeof(double) * N);
    for (int r = 0; r < N; r++) {
        ref_ln(h + r * E, x + r * E, l1w, l1b, E, hp->eps);
        ref_linear(q + r * E, qw, qb, h + r * E, E, E);
        ref_linear(k + r * E, kw, kb, h + r * E, E, E);
        ref_linear(v + r * E, vw, vb, h + r * E, E, E);
    }
    for (int r = 0; r < N; r++)
        for (int hh = 0; hh < H; hh++) {
            double mx = -1e300, sum = 0;
            for (int s = 0; s < N; s++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += q[r * E + hh * D + i] * k[s * E + hh * D + i];
                p[s] = d / sqrt((double)D);
                if (p[s] > mx) mx = p[s];
            }
            for (int s = 0; s < N; s++) sum += (p[s] = exp(p[s] - mx));
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int s = 0; s < N; s++) o += p[s] / sum * v[s * E + hh * D + i];
                a[r * E + hh * D + i] = o;
            }
        }
    for (int r = 0; r < N; r++) {
        ref_linear(h + r * E, ow, ob, a + r * E, E, E);
        for (int e = 0; e < E; e++) x[r * E + e] += h[r * E + e];
    }
    for (int r = 0; r < N; r++) {
        ref_ln(h + r * E, x + r * E, l2w, l2b, E, hp->eps);
        ref_linear(t + r * F, f1w, f1b, h + r * E, E, F);
        for (int i = 0; i < F; i++) {
            double z = t[r * F + i];
            t[r * F + i] = hp->use_gelu ? 0.5 * z * (1.0 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
                                        : z / (1.0 + exp(-1.702 * z));
        }
        ref_linear(h + r * E, f2w, f2b, t + r * F, F, E);
        for (int e = 0; e < E; e++) x[r * E + e] += h[r * E + e];
    }
    free(h); free(q); free(k); free(v); free(a); free(t); free(p);
}

double max_abs_diff_fd(const float *a, const double *b, size_t n, double *maxref) {
    double m = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
        if (fabs(b[i]) > r) r = fabs(b[i]);
    }
    if (maxref) *maxref = r;
    return m;
}


void check_resize_vs_ref(bool lanczos, int nx, int ny, int ox, int oy, uint32_t seed) {
    const uint8_t black[3] = {0, 0, 0};
    const char *what = lanczos ? "lanczos" : "resize";
    struct ekv_image src = {0}, got = {0};
    CHECK_OK(ekv_image_new(nx, ny, black, &src));
    if (!src.rgb) return;
    uint32_t r = seed;
    for (size_t i = 0; i < (size_t)nx * ny * 3; i++) r = r * 1103515245u + 12345u, src.rgb[i] = (uint8_t)(r >> 16);
    uint8_t *want = malloc((size_t)ox * oy * 3);
    ref_resize_filter(lanczos, src.rgb, nx, ny, want, ox, oy);
    CHECK_OK(ekv_image_resize(&src, ox, oy, lanczos ? EKV_RESAMPLE_LANCZOS : EKV_RESAMPLE_BICUBIC, &got));
    int maxd = 0;
    size_t same = 0, n = (size_t)ox * oy * 3;
    for (size_t i = 0; got.rgb && i < n; i++) {
        const int d = abs((int)got.rgb[i] - (int)want[i]);
        maxd = d > maxd ? d : maxd;
        same += d == 0;
    }
    printf("%s %dx%d -> %dx%d: %zu of %zu values equal to the double reference, max diff %d\n", what, nx, ny, ox, oy,
           same, n, maxd);
    CHECK_MSG(got.rgb && maxd <= 1 && same >= n - n / 100, "%s %dx%d -> %dx%d: max diff %d, %zu of %zu equal", what, nx,
              ny, ox, oy, maxd, same, n);
    free(want);
    ekv_image_free(&src);
    ekv_image_free(&got);
}
