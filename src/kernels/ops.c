/*
 * ops.c — the element-wise and small operations of a transformer layer in
 * plain C (dot, axpy, RMSNorm, LayerNorm, softmax, RoPE, SwiGLU, GELU,
 * add). The public entry points use the AVX2 variants from ops_avx2.c
 * when the dispatcher has selected them; the *_ref functions are the
 * reference the tests compare against.
 */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"

float ekv_dot_f32_ref(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void ekv_axpy_f32_ref(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* Mean of squares in double, then y = (x * 1/sqrt(ms + eps)) * w as llama.cpp. */
void ekv_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float mean = n > 0 ? (float)(ss / (double)n) : 0.0f;
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] * scale) * (w ? w[i] : 1.0f);
}

/* Max-subtracted, exp in fp32, sum in double. */
void ekv_softmax_ref(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void ekv_swiglu_ref(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* ---- public entry points ---- */

float ekv_dot_f32(const float *a, const float *b, int64_t n) {
    return ekv_kernels_simd() ? ekv_dot_f32_avx2(a, b, n) : ekv_dot_f32_ref(a, b, n);
}

void ekv_axpy_f32(float *y, float a, const float *x, int64_t n) {
    if (ekv_kernels_simd())
        ekv_axpy_f32_avx2(y, a, x, n);
    else
        ekv_axpy_f32_ref(y, a, x, n);
}

void ekv_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    if (ekv_kernels_simd())
        ekv_rmsnorm_avx2(out, x, w, n, eps);
    else
        ekv_rmsnorm_ref(out, x, w, n, eps);
}

void ekv_softmax(float *x, int64_t n) {
    if (ekv_kernels_simd())
        ekv_softmax_avx2(x, n);
    else
        ekv_softmax_ref(x, n);
}

void ekv_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    if (ekv_kernels_simd())
        ekv_swiglu_avx2(out, gate, up, n);
    else
        ekv_swiglu_ref(out, gate, up, n);
}

void ekv_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n, float eps) {
    if (n <= 0) return;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    const double mean = sum / (double)n;
    double var = 0.0;
    for (int64_t i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
    var /= (double)n;
    const float inv = (float)(1.0 / sqrt(var + eps));
    const float m = (float)mean;
    for (int64_t i = 0; i < n; i++) {
        float v = (x[i] - m) * inv;
        if (w) v *= w[i];
        if (b) v += b[i];
        out[i] = v;
    }
}

/* theta_i = pos * base^(-2i/rope_dim), computed in double, for i < rope_dim/2. */
static inline void rope_cs(int i, int rope_dim, int64_t pos, float freq_base, float *c, float *s) {
    const double theta = (double)pos * pow((double)freq_base, -2.0 * i / (double)rope_dim);
    *c = (float)cos(theta);
    *s = (float)sin(theta);
}

static inline void rope_pair(float *x, int n_heads, int head_dim, int i0, int i1, float c, float s) {
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
    }
}

void ekv_rope(float *x, int n_heads, int head_dim, int rope_dim, int64_t pos, float freq_base, bool neox) {
    if (rope_dim > head_dim) rope_dim = head_dim;
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float c, s;
        rope_cs(i, rope_dim, pos, freq_base, &c, &s);
        rope_pair(x, n_heads, head_dim, neox ? i : 2 * i, neox ? i + half : 2 * i + 1, c, s);
    }
}

void ekv_rope_sincos(float *cs, int rope_dim, int64_t pos, float freq_base) {
    for (int i = 0; i < rope_dim / 2; i++) rope_cs(i, rope_dim, pos, freq_base, &cs[2 * i], &cs[2 * i + 1]);
}

void ekv_rope_apply(float *x, int n_heads, int head_dim, int rope_dim, const float *cs, bool neox) {
    if (rope_dim > head_dim) rope_dim = head_dim;
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++)
        rope_pair(x, n_heads, head_dim, neox ? i : 2 * i, neox ? i + half : 2 * i + 1, cs[2 * i], cs[2 * i + 1]);
}

/* ---- RoPE with scaling (llama.cpp's ggml_rope_ext) ---- */

/* Dimension at which a rotation of n_rot turns fits the original context:
 * dim * ln(n_ctx_orig / (2 pi n_rot)) / (2 ln base). */
static double yarn_corr_dim(int dim, int n_ctx_orig, double n_rot, double base) {
    return dim * log((double)n_ctx_orig / (n_rot * 2.0 * M_PI)) / (2.0 * log(base));
}

void ekv_rope_yarn_corr_dims(int dim, int n_ctx_orig, double base, double beta_fast, double beta_slow,
                             double out[2]) {
    const double lo = floor(yarn_corr_dim(dim, n_ctx_orig, beta_fast, base));
    const double hi = ceil(yarn_corr_dim(dim, n_ctx_orig, beta_slow, base));
    out[0] = lo > 0.0 ? lo : 0.0;
    out[1] = hi < dim - 1 ? hi : dim - 1;
}

/* Angle of pair i at position pos (linear in pos: every scaling only
 * changes the pair's frequency). */
static double rope_theta_ext(const struct ekv_rope_params *p, int64_t pos, int i) {
    double extrap = (double)pos * pow(p->freq_base, -2.0 * i / (double)p->dim);
    if (p->freq_factors) extrap /= (double)p->freq_factors[i];
    double theta = p->freq_scale == 1.0 ? extrap : p->freq_scale * extrap;
    if (p->ext_factor != 0.0) {
        /* YaRN: extrapolate the fast dimensions, interpolate the slow
         * ones, a linear ramp between corr_lo and corr_hi */
        double y = (i - p->corr_lo) / fmax(0.001, p->corr_hi - p->corr_lo);
        double ramp = (1.0 - fmin(1.0, fmax(0.0, y))) * p->ext_factor;
        theta = theta * (1.0 - ramp) + extrap * ramp;
    }
    return theta;
}

void ekv_rope_sincos_ext(const struct ekv_rope_params *p, int64_t pos, float *cs) {
    const int half = p->dim / 2;
    double mscale = p->attn_factor;
    if (p->ext_factor != 0.0) mscale *= 1.0 + 0.1 * log(1.0 / p->freq_scale);
    for (int i = 0; i < half; i++) {
        const double theta = rope_theta_ext(p, pos, i);
        cs[2 * i] = (float)(cos(theta) * mscale);
        cs[2 * i + 1] = (float)(sin(theta) * mscale);
    }
}

void ekv_rope_shift_ext(const struct ekv_rope_params *p, int64_t delta, float *x, int n_heads, int head_dim) {
    if (delta == 0) return;
    const int dim = p->dim > head_dim ? head_dim : p->dim;
    const int half = dim / 2;
    for (int i = 0; i < half; i++) {
        const double theta = rope_theta_ext(p, delta, i);
        rope_pair(x, n_heads, head_dim, p->neox ? i : 2 * i, p->neox ? i + half : 2 * i + 1, (float)cos(theta),
                  (float)sin(theta));
    }
}

int ekv_rope_section(const struct ekv_rope_params *p, int i) {
    const int s0 = p->sections[0], s1 = p->sections[1], s2 = p->sections[2];
    const int sum = s0 + s1 + s2 + p->sections[3];
    if (sum <= 0) return 0;
    const int k = i % sum;
    return k < s0 ? 0 : k < s0 + s1 ? 1 : k < s0 + s1 + s2 ? 2 : 3;
}

void ekv_rope_sincos_multi(const struct ekv_rope_params *p, const int64_t pos[4], float *cs) {
    const int half = p->dim / 2;
    double mscale = p->attn_factor;
    if (p->ext_factor != 0.0) mscale *= 1.0 + 0.1 * log(1.0 / p->freq_scale);
    for (int i = 0; i < half; i++) {
        const double theta = rope_theta_ext(p, pos[ekv_rope_section(p, i)], i);
        cs[2 * i] = (float)(cos(theta) * mscale);
        cs[2 * i + 1] = (float)(sin(theta) * mscale);
    }
}

int ekv_rope_shift_cs(const struct ekv_rope_params *p, const int64_t delta[4], int head_dim, float *cs) {
    const int dim = p->dim > head_dim ? head_dim : p->dim;
    const int half = dim / 2;
    const bool multi = ekv_rope_is_multi(p);
    for (int i = 0; i < half; i++) {
        const int64_t d = multi ? delta[ekv_rope_section(p, i)] : delta[0];
        const double theta = d ? rope_theta_ext(p, d, i) : 0.0;
        cs[2 * i] = d ? (float)cos(theta) : 1.0f;
        cs[2 * i + 1] = d ? (float)sin(theta) : 0.0f;
    }
    return 2 * half;
}

void ekv_rope_shift_multi(const struct ekv_rope_params *p, const int64_t delta[4], float *x, int n_heads,
                          int head_dim) {
    const int dim = p->dim > head_dim ? head_dim : p->dim;
    const int half = dim / 2;
    for (int i = 0; i < half; i++) {
        const int64_t d = delta[ekv_rope_section(p, i)];
        if (d == 0) continue;
        const double theta = rope_theta_ext(p, d, i);
        rope_pair(x, n_heads, head_dim, p->neox ? i : 2 * i, p->neox ? i + half : 2 * i + 1, (float)cos(theta),
                  (float)sin(theta));
    }
}

/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
void ekv_gelu(float *x, int64_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
}

void ekv_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
