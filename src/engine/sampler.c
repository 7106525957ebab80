/*
 * sampler.c — choosing the next token: logit biases (llama.cpp's first
 * step, OpenAI's logit_bias), then the repetition, frequency and presence
 * penalties over a window of the text's last tokens (llama.cpp's rule),
 * then greedy at temperature <= 0, else llama.cpp's default order: top-k,
 * top-p and min-p on the untempered distribution, then temperature, then a
 * draw from a seeded generator (splitmix64 + xoshiro256**), so a seed
 * reproduces a run. Biases and the window's counts are sorted token lists
 * walked beside the vocabulary (no n_vocab buffer); without either the
 * logits are read as given. ekv_logprobs reports the model's own
 * distribution for the server's logprobs.
 */
#include <math.h>
#include <stdbool.h>
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
    /* the penalties' window: a ring of the last w tokens accepted (hn of
     * them, the next written at hpos), and scratch for its distinct tokens
     * (ascending) and their counts; NULL when no penalty is on */
    int32_t *hist, *wt, *wc;
    int32_t w, hn, hpos;
    /* the logit biases: nb distinct tokens ascending, their summed biases */
    int32_t *bt;
    float *bv;
    int32_t nb;
};

struct ekv_sampler_params ekv_sampler_default_params(void) {
    struct ekv_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 0xEC0,
                                   .repeat_penalty = 1.0f, .repeat_last_n = 64};
    return p;
}

static bool penalties_on(const struct ekv_sampler_params *p) {
    const bool any = p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    return p->repeat_last_n > 0 && any;
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
    if (!(isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f) || p.repeat_last_n < 0 ||
        p.repeat_last_n > (1 << 24) || !isfinite(p.frequency_penalty) || !isfinite(p.presence_penalty))
        return ekv_err(EKV_ERR_INVALID_ARG,
                       "sampler penalties out of range (repeat penalty %g > 0, last n %d in [0, 2^24], frequency %g "
                       "and presence %g finite)",
                       (double)p.repeat_penalty, (int)p.repeat_last_n, (double)p.frequency_penalty,
                       (double)p.presence_penalty);
    struct ekv_sampler *s = calloc(1, sizeof *s);
    if (!s) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    s->p = p;
    if (penalties_on(&p)) {
        s->w = p.repeat_last_n;
        s->hist = malloc((size_t)s->w * sizeof *s->hist);
        s->wt = malloc((size_t)s->w * sizeof *s->wt);
        s->wc = malloc((size_t)s->w * sizeof *s->wc);
        if (!s->hist || !s->wt || !s->wc) {
            ekv_sampler_free(s);
            return ekv_err(EKV_ERR_NOMEM, "sampler: out of memory for a window of %d tokens", (int)p.repeat_last_n);
        }
    }
    uint64_t x = p.seed;
    for (int i = 0; i < 4; i++) s->s[i] = splitmix64(&x);
    *out = s;
    return EKV_OK;
}

void ekv_sampler_free(struct ekv_sampler *s) {
    if (!s) return;
    free(s->buf);
    free(s->hist);
    free(s->wt);
    free(s->wc);
    free(s->bt);
    free(s->bv);
    free(s);
}

struct bias_pair {
    int32_t tok;
    float bias;
};

static int cmp_pair(const void *a, const void *b) {
    const int32_t x = ((const struct bias_pair *)a)->tok, y = ((const struct bias_pair *)b)->tok;
    return (x > y) - (x < y);
}

enum ekv_status ekv_sampler_set_logit_bias(struct ekv_sampler *s, const int32_t *tokens, const float *bias,
                                           int32_t n) {
    if (!s) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_sampler_set_logit_bias: NULL sampler");
    if (n < 0 || n > (1 << 24) || (n > 0 && (!tokens || !bias)))
        return ekv_err(EKV_ERR_INVALID_ARG, "logit bias: %d entries (0 .. 2^24, with both arrays)", (int)n);
    for (int32_t i = 0; i < n; i++) {
        if (tokens[i] < 0) return ekv_err(EKV_ERR_INVALID_ARG, "logit bias %d: token %d is negative", (int)i, (int)tokens[i]);
        if (!(isfinite(bias[i]) || bias[i] == -INFINITY))
            return ekv_err(EKV_ERR_INVALID_ARG, "logit bias %d (token %d): %g is not finite or -inf", (int)i,
                           (int)tokens[i], (double)bias[i]);
    }
    struct bias_pair *pr = n ? malloc((size_t)n * sizeof *pr) : NULL;
    if (n && !pr) return ekv_err(EKV_ERR_NOMEM, "logit bias: out of memory for %d entries", (int)n);
    for (int32_t i = 0; i < n; i++) pr[i] = (struct bias_pair){tokens[i], bias[i]};
    if (n > 1) qsort(pr, (size_t)n, sizeof *pr, cmp_pair);
    int32_t d = 0;
    for (int32_t i = 0; i < n; i++) { /* duplicates summed (-inf stays -inf) */
        if (d > 0 && pr[d - 1].tok == pr[i].tok) pr[d - 1].bias += pr[i].bias;
        else pr[d++] = pr[i];
        if (pr[d - 1].bias == INFINITY) {
            const int32_t t = pr[d - 1].tok;
            free(pr);
            return ekv_err(EKV_ERR_INVALID_ARG, "logit bias: the biases of token %d sum past the float range", (int)t);
        }
    }
    int32_t *bt = d ? malloc((size_t)d * sizeof *bt) : NULL;
    float *bv = d ? malloc((size_t)d * sizeof *bv) : NULL;
    if (d && (!bt || !bv)) {
        free(pr);
        free(bt);
        free(bv);
        return ekv_err(EKV_ERR_NOMEM, "logit bias: out of memory for %d entries", (int)d);
    }
    for (int32_t i = 0; i < d; i++) bt[i] = pr[i].tok, bv[i] = pr[i].bias;
    free(pr);
    free(s->bt);
    free(s->bv);
    s->bt = bt;
    s->bv = bv;
    s->nb = d;
    return EKV_OK;
}

enum ekv_status ekv_sampler_accept(struct ekv_sampler *s, int32_t token) {
    if (!s) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_sampler_accept: NULL sampler");
    if (!s->hist) return EKV_OK;
    s->hist[s->hpos] = token;
    s->hpos = s->hpos + 1 == s->w ? 0 : s->hpos + 1;
    if (s->hn < s->w) s->hn++;
    return EKV_OK;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The window's distinct tokens in [0, n_vocab), ascending, into s->wt with
 * their counts in s->wc; returns how many. */
static int32_t window_counts(struct ekv_sampler *s, int32_t n_vocab) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->hn; i++)
        if (s->hist[i] >= 0 && s->hist[i] < n_vocab) s->wt[n++] = s->hist[i];
    qsort(s->wt, (size_t)n, sizeof *s->wt, cmp_i32);
    int32_t d = 0;
    for (int32_t i = 0; i < n; i++) {
        if (d > 0 && s->wt[d - 1] == s->wt[i]) {
            s->wc[d - 1]++;
        } else {
            s->wt[d] = s->wt[i];
            s->wc[d++] = 1;
        }
    }
    return d;
}

/* A logit of a token seen c > 0 times in the window, as llama.cpp's
 * penalties sampler leaves it. */
static float penalised(const struct ekv_sampler_params *p, float l, int32_t c) {
    if (l <= 0.0f) l *= p->repeat_penalty;
    else l /= p->repeat_penalty;
    return l - ((float)c * p->frequency_penalty + p->presence_penalty);
}

/* Where the walk over the vocabulary stands in the two sorted lists: the
 * window's distinct tokens (k of nw) and the biases (b of s->nb). */
struct walk {
    int32_t k, nw, b;
};

/* Logit i with its bias, then the penalties; i ascends from 0 between
 * resets of the walk. */
static inline float logit_at(const struct ekv_sampler *s, const float *logits, int32_t i, struct walk *w) {
    float l = logits[i];
    if (w->b < s->nb && s->bt[w->b] == i) l += s->bv[w->b++];
    if (w->k < w->nw && s->wt[w->k] == i) l = penalised(&s->p, l, s->wc[w->k++]);
    return l;
}

static int cmp_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

int32_t ekv_sampler_sample(struct ekv_sampler *s, const float *logits, int32_t n_vocab) {
    if (n_vocab <= 0) return -1;
    const int32_t nw = s->hist && s->hn > 0 ? window_counts(s, n_vocab) : 0;
    int32_t best = 0;
    struct walk w = {.nw = nw};
    float mx = logit_at(s, logits, 0, &w);
    for (int32_t i = 1; i < n_vocab; i++) {
        const float l = logit_at(s, logits, i, &w);
        if (l > mx) mx = l, best = i;
    }
    if (s->p.temp <= 0.0f || mx == -INFINITY) return best; /* every token banned: token 0 */
    if (s->cap < n_vocab) {
        struct cand *nb = realloc(s->buf, (size_t)n_vocab * sizeof *nb);
        if (!nb) return best; /* degrade to greedy rather than fail */
        s->buf = nb;
        s->cap = n_vocab;
    }
    struct cand *c = s->buf;
    /* min-p first as a cheap linear pre-filter: p_i >= min_p * p_max  <=>  l_i >= mx + log(min_p) */
    float floor_l = s->p.min_p > 0.0f ? mx + logf(s->p.min_p) : -INFINITY;
    int32_t n = 0;
    w = (struct walk){.nw = nw};
    for (int32_t i = 0; i < n_vocab; i++) {
        const float l = logit_at(s, logits, i, &w);
        if (l >= floor_l && l > -INFINITY) c[n++] = (struct cand){l, i}; /* banned tokens never */
    }
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

enum ekv_status ekv_logprobs(const float *logits, int32_t n_vocab, int32_t token, int32_t n_top,
                             struct ekv_token_logprob *top, float *lp) {
    if (!logits || !lp || n_vocab <= 0 || token < 0 || token >= n_vocab || n_top < 0 || n_top > n_vocab ||
        (n_top > 0 && !top))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_logprobs: token %d, top %d of a vocabulary of %d (and the arrays)",
                       (int)token, (int)n_top, (int)n_vocab);
    float mx = logits[0];
    for (int32_t i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double z = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) z += exp((double)logits[i] - mx);
    const double lz = (double)mx + log(z);
    *lp = (float)((double)logits[token] - lz);
    /* the n_top best by insertion into a sorted run (n_top is small: the API allows 20) */
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab && n_top > 0; i++) {
        const float l = logits[i];
        if (n == n_top && !(l > top[n - 1].logprob)) continue; /* ties keep the lower id */
        int32_t k = n < n_top ? n++ : n - 1;
        while (k > 0 && l > top[k - 1].logprob) {
            top[k] = top[k - 1];
            k--;
        }
        top[k] = (struct ekv_token_logprob){i, l};
    }
    for (int32_t i = 0; i < n; i++) top[i].logprob = (float)((double)top[i].logprob - lz);
    return EKV_OK;
}
