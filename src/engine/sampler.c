/*
 * sampler.c — choosing the next token: greedy at temperature <= 0, else
 * llama.cpp's default order: top-k, top-p and min-p on the untempered
 * distribution, then temperature, then a draw from a seeded generator
 * (splitmix64 + xoshiro256**), so a seed reproduces a run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

struct cand {
    float logit;
    int32_t id;
};

struct ekv_sampler {
    struct ekv_sampler_params p;
    uint64_t s[4];
    struct cand *buf;
    int32_t cap;
};

struct ekv_sampler_params ekv_sampler_default_params(void) {
    struct ekv_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 0xEC0};
    return p;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(struct ekv_sampler *r) {
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

enum ekv_status ekv_sampler_new(const struct ekv_sampler_params *params, struct ekv_sampler **out) {
    ekv_err_clear();
    if (!out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_sampler_new: out is required");
    *out = NULL;
    struct ekv_sampler_params p = params ? *params : ekv_sampler_default_params();
    if (!isfinite(p.temp) || p.top_k < 0 || !(p.top_p > 0.0f && p.top_p <= 1.0f) ||
        !(p.min_p >= 0.0f && p.min_p <= 1.0f))
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "sampler parameters out of range (temp %g, top-k %d >= 0, top-p %g in (0,1], min-p %g in [0,1])",
                       (double)p.temp, p.top_k, (double)p.top_p, (double)p.min_p);
    struct ekv_sampler *s = calloc(1, sizeof *s);
    if (!s) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    s->p = p;
    uint64_t x = p.seed;
    for (int i = 0; i < 4; i++) s->s[i] = splitmix64(&x);
    *out = s;
    return EKV_OK;
}

void ekv_sampler_free(struct ekv_sampler *s) {
    if (!s) return;
    free(s->buf);
    free(s);
}

static int cmp_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

static int32_t argmax(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

int32_t ekv_sampler_sample(struct ekv_sampler *s, const float *logits, int32_t n_vocab) {
    if (n_vocab <= 0) return -1;
    if (s->p.temp <= 0.0f) return argmax(logits, n_vocab);
    if (s->cap < n_vocab) {
        struct cand *nb = realloc(s->buf, (size_t)n_vocab * sizeof *nb);
        if (!nb) return argmax(logits, n_vocab); /* degrade to greedy rather than fail */
        s->buf = nb;
        s->cap = n_vocab;
    }
    struct cand *c = s->buf;
    float mx = logits[argmax(logits, n_vocab)];
    /* min-p first as a cheap linear pre-filter: p_i >= min_p * p_max  <=>  l_i >= mx + log(min_p) */
    float floor_l = s->p.min_p > 0.0f ? mx + logf(s->p.min_p) : -INFINITY;
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (logits[i] >= floor_l) c[n++] = (struct cand){logits[i], i};
    qsort(c, (size_t)n, sizeof *c, cmp_desc);
    if (s->p.top_k > 0 && n > s->p.top_k) n = s->p.top_k;
    if (s->p.top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        for (int32_t i = 0; i < n; i++) z += exp((double)c[i].logit - mx);
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - mx) / z;
            if (cum >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) z += exp(((double)c[i].logit - mx) / s->p.temp);
    double u = (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0) * z, acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp(((double)c[i].logit - mx) / s->p.temp);
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}
