/*
 * test_sampler.c — token sampling: greedy is the first maximum, a seed
 * reproduces a draw sequence, top-k 1 / top-p tiny / min-p 1 all collapse
 * to greedy, top-k restricts draws to the k best, the empirical frequencies
 * at temperature 1 follow the softmax, and bad parameters are refused.
 * Penalties (llama.cpp's rule): a worked vector, the window's length, ids
 * outside the vocabulary ignored, the frequencies at temperature 1 follow
 * the softmax of the penalised logits, and without penalties accepting
 * tokens changes no draw. Logit biases: summed per token, applied before
 * the penalties (the frequencies at temperature 1 tell the two orders
 * apart), -inf bans, ids outside the vocabulary ignored, bad lists refused
 * with the sampler unchanged. ekv_logprobs: the log-softmax against a
 * double-precision sum (1e-6), the top tokens in order with ties by id,
 * no overflow at large logits, bad arguments refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "testutil.h"

/* n draws counted per token follow the softmax of logits (4-sigma bounds). */
static void check_softmax(const int *count, const float *logits, int v, int n, const char *what) {
    double z = 0;
    for (int i = 0; i < v; i++) z += exp(logits[i]);
    for (int i = 0; i < v; i++) {
        const double pi = exp(logits[i]) / z, sd = sqrt(n * pi * (1 - pi));
        CHECK_MSG(fabs(count[i] - n * pi) <= 4 * sd + 1, "%s %d: %d draws, expected %.0f", what, i, count[i], n * pi);
    }
}

/* Penalties on 6 logits after the tokens 0, 0, 2, 4 (and two ids outside
 * the vocabulary): repeat 2, frequency 0.1, presence 0.2 give token 0 (seen
 * twice) 2.0 / 2 - (0.2 + 0.2) = 0.6, token 2 -1.0 * 2 - 0.3 = -2.3, token 4
 * 1.9 / 2 - 0.3 = 0.65, so greedy goes from 0 to 1. */
static void test_penalties(void) {
    enum { V = 6 };
    const float lg[V] = {2.0f, 1.0f, -1.0f, 0.5f, 1.9f, -3.0f};
    const float pen[V] = {0.6f, 1.0f, -2.3f, 0.5f, 0.65f, -3.0f};
    static const int32_t seen[] = {0, 99, 0, -5, 2, 4};
    struct ekv_sampler_params p = ekv_sampler_default_params();
    struct ekv_sampler *s = NULL;
    CHECK(p.repeat_penalty == 1.0f && p.repeat_last_n == 64 && p.frequency_penalty == 0.0f &&
          p.presence_penalty == 0.0f);
    p.temp = 0.0f;
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.1f;
    p.presence_penalty = 0.2f;
    CHECK_OK(ekv_sampler_new(&p, &s));
    CHECK(ekv_sampler_sample(s, lg, V) == 0); /* nothing accepted yet */
    for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) CHECK_OK(ekv_sampler_accept(s, seen[i]));
    CHECK(ekv_sampler_sample(s, lg, V) == 1);
    CHECK(ekv_sampler_sample(s, lg, 1) == 0); /* a vocabulary of one token */
    ekv_sampler_free(s);
    /* a window of 2 holds 2 and 4 only: token 0 is not penalised */
    p.repeat_last_n = 2;
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) CHECK_OK(ekv_sampler_accept(s, seen[i]));
    CHECK(ekv_sampler_sample(s, lg, V) == 0);
    CHECK_OK(ekv_sampler_accept(s, 0)); /* now 4 and 0 */
    CHECK(ekv_sampler_sample(s, lg, V) == 1);
    ekv_sampler_free(s);
    /* a window of 0 is off */
    p.repeat_last_n = 0;
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) CHECK_OK(ekv_sampler_accept(s, seen[i]));
    CHECK(ekv_sampler_sample(s, lg, V) == 0);
    ekv_sampler_free(s);
    /* temperature 1, no filters: the frequencies follow the penalised softmax */
    p.repeat_last_n = 64;
    p.temp = 1.0f, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f, p.seed = 11;
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) CHECK_OK(ekv_sampler_accept(s, seen[i]));
    enum { N = 100000 };
    int count[V] = {0};
    for (int i = 0; i < N; i++) count[ekv_sampler_sample(s, lg, V)]++;
    ekv_sampler_free(s);
    check_softmax(count, pen, V, N, "penalised token");
    /* penalties off: accepted tokens change no draw */
    struct ekv_sampler_params q = ekv_sampler_default_params();
    q.seed = 5;
    struct ekv_sampler *s2 = NULL;
    CHECK_OK(ekv_sampler_new(&q, &s));
    CHECK_OK(ekv_sampler_new(&q, &s2));
    int differ = 0;
    for (int i = 0; i < 200 && s && s2; i++) {
        CHECK_OK(ekv_sampler_accept(s2, i % V));
        differ += ekv_sampler_sample(s, lg, V) != ekv_sampler_sample(s2, lg, V);
    }
    CHECK(differ == 0);
    ekv_sampler_free(s), ekv_sampler_free(s2);
    /* refused: a penalty of 0 or below, NaN, a window below 0, infinite penalties; NULL */
    static const float bad_rp[] = {0.0f, -1.0f, NAN, INFINITY};
    for (size_t i = 0; i < 4; i++) {
        q = ekv_sampler_default_params();
        q.repeat_penalty = bad_rp[i];
        s = NULL;
        CHECK(ekv_sampler_new(&q, &s) == EKV_ERR_INVALID_ARG && !s && strstr(ekv_last_error(), "penalt"));
    }
    q = ekv_sampler_default_params();
    q.repeat_last_n = -1;
    CHECK(ekv_sampler_new(&q, &s) == EKV_ERR_INVALID_ARG);
    q = ekv_sampler_default_params();
    q.frequency_penalty = INFINITY;
    CHECK(ekv_sampler_new(&q, &s) == EKV_ERR_INVALID_ARG);
    q = ekv_sampler_default_params();
    q.presence_penalty = NAN;
    CHECK(ekv_sampler_new(&q, &s) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_sampler_accept(NULL, 1) == EKV_ERR_INVALID_ARG);
}

static void test_logit_bias(void) {
    enum { V = 6 };
    const float lg[V] = {2.0f, 1.0f, -1.0f, 0.5f, 1.9f, -3.0f};
    struct ekv_sampler_params p = ekv_sampler_default_params();
    struct ekv_sampler *s = NULL;
    p.temp = 0.0f;
    CHECK_OK(ekv_sampler_new(&p, &s));
    /* token 0: 2.0 - 0.5 - 0.2 = 1.3, token 4: 1.9 + 0.2 = 2.1 */
    const int32_t t1[] = {0, 4, 0, 100};
    const float b1[] = {-0.5f, 0.2f, -0.2f, 50.0f};
    CHECK_OK(ekv_sampler_set_logit_bias(s, t1, b1, 4));
    CHECK(ekv_sampler_sample(s, lg, V) == 4);
    CHECK(ekv_sampler_sample(s, lg, 4) == 0); /* a vocabulary of 4: token 4 is outside */
    const int32_t t2[] = {0};
    const float ban[] = {-INFINITY};
    CHECK_OK(ekv_sampler_set_logit_bias(s, t2, ban, 1)); /* replaces the list: 4 is back at 1.9 */
    CHECK(ekv_sampler_sample(s, lg, V) == 4);
    /* refused, the sampler unchanged: negative token, NaN, +inf, a sum past the range, bad counts */
    const int32_t tb[] = {1, -3};
    const float bb[] = {1.0f, 1.0f}, nan1[] = {NAN}, inf1[] = {INFINITY}, big[] = {3e38f, 3e38f};
    const int32_t tt[] = {2, 2};
    CHECK(ekv_sampler_set_logit_bias(s, tb, bb, 2) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "-3"));
    CHECK(ekv_sampler_set_logit_bias(s, t2, nan1, 1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_sampler_set_logit_bias(s, t2, inf1, 1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_sampler_set_logit_bias(s, tt, big, 2) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "token 2"));
    CHECK(ekv_sampler_set_logit_bias(s, NULL, NULL, 1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_sampler_set_logit_bias(s, t2, ban, -1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_sampler_set_logit_bias(NULL, t2, ban, 1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_sampler_sample(s, lg, V) == 4); /* still token 0 banned */
    CHECK_OK(ekv_sampler_set_logit_bias(s, NULL, NULL, 0)); /* cleared */
    CHECK(ekv_sampler_sample(s, lg, V) == 0);
    ekv_sampler_free(s);
    /* every token banned: token 0, greedy or not */
    const int32_t all[V] = {0, 1, 2, 3, 4, 5};
    const float bans[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int t = 0; t < 2; t++) {
        p = ekv_sampler_default_params();
        p.temp = t ? 1.0f : 0.0f;
        CHECK_OK(ekv_sampler_new(&p, &s));
        CHECK_OK(ekv_sampler_set_logit_bias(s, all, bans, V));
        CHECK(ekv_sampler_sample(s, lg, V) == 0);
        ekv_sampler_free(s);
    }
    /* temperature 1, no filters, repeat penalty 2 after tokens 2 and 3: biases first, so token 2 is
       (-1 + 3) / 2 = 1.0 and token 3 (0.5 - 2) * 2 = -3.0 (penalties first would give 1.0 and -1.75);
       token 5 banned is never drawn */
    p = ekv_sampler_default_params();
    p.temp = 1.0f, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f, p.seed = 3, p.repeat_penalty = 2.0f;
    const float want[V] = {2.0f, 1.0f, 1.0f, -3.0f, 1.9f, -INFINITY};
    const int32_t t3[] = {3, 2, 5};
    const float b3[] = {-2.0f, 3.0f, -INFINITY};
    CHECK_OK(ekv_sampler_new(&p, &s));
    CHECK_OK(ekv_sampler_set_logit_bias(s, t3, b3, 3));
    CHECK_OK(ekv_sampler_accept(s, 2));
    CHECK_OK(ekv_sampler_accept(s, 3));
    enum { N = 100000 };
    int count[V] = {0};
    for (int i = 0; i < N; i++) count[ekv_sampler_sample(s, lg, V)]++;
    ekv_sampler_free(s);
    CHECK(count[5] == 0);
    check_softmax(count, want, V, N, "biased token");
}

static void test_logprobs(void) {
    enum { V = 8 };
    const float lg[V] = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f, 0.0f, 1.5f, -3.0f};
    double z = 0;
    for (int i = 0; i < V; i++) z += exp((double)lg[i]);
    struct ekv_token_logprob top[V];
    float lp = 0;
    CHECK_OK(ekv_logprobs(lg, V, 4, 3, top, &lp));
    CHECK_MSG(fabs(lp - (-1.0 - log(z))) < 1e-6, "logprob %g", (double)lp);
    CHECK(top[0].token == 1 && top[1].token == 3 && top[2].token == 6); /* the tie 1/3: the lower id first */
    for (int i = 0; i < 3; i++)
        CHECK_MSG(fabs(top[i].logprob - (lg[top[i].token] - log(z))) < 1e-6, "top %d: %g", i, (double)top[i].logprob);
    CHECK_OK(ekv_logprobs(lg, V, 0, V, top, &lp)); /* all of them: a permutation, descending, summing to 1 */
    double sum = 0;
    int seen = 0;
    for (int i = 0; i < V; i++) {
        sum += exp((double)top[i].logprob);
        seen |= 1 << top[i].token;
        if (i) CHECK(top[i].logprob <= top[i - 1].logprob);
    }
    CHECK(seen == (1 << V) - 1 && fabs(sum - 1.0) < 1e-6);
    CHECK_OK(ekv_logprobs(lg, V, 2, 0, NULL, &lp));
    const float big[3] = {1000.0f, 999.0f, -1000.0f};
    CHECK_OK(ekv_logprobs(big, 3, 1, 1, top, &lp));
    CHECK_MSG(isfinite(lp) && fabs(lp - (-1.0 - log1p(exp(-1.0)))) < 1e-5 && top[0].token == 0, "large logits: %g", (double)lp);
    CHECK(ekv_logprobs(lg, V, V, 1, top, &lp) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_logprobs(lg, V, -1, 1, top, &lp) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_logprobs(lg, V, 0, V + 1, top, &lp) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_logprobs(lg, V, 0, 2, NULL, &lp) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_logprobs(NULL, V, 0, 0, NULL, &lp) == EKV_ERR_INVALID_ARG);
}

int main(void) {
    enum { V = 8 };
    const float logits[V] = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f, 0.0f, 1.5f, -3.0f};
    struct ekv_sampler_params p = ekv_sampler_default_params();
    struct ekv_sampler *s = NULL;

    p.temp = 0.0f;
    CHECK_OK(ekv_sampler_new(&p, &s));
    CHECK(ekv_sampler_sample(s, logits, V) == 1); /* first of the tied maxima */
    ekv_sampler_free(s);

    /* collapse to greedy */
    p = ekv_sampler_default_params();
    p.top_k = 1;
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (int i = 0; i < 50; i++) CHECK(ekv_sampler_sample(s, logits, V) == 1);
    ekv_sampler_free(s);
    p = ekv_sampler_default_params();
    p.top_k = 0;
    p.min_p = 1.0f; /* only the maxima survive: ids 1 and 3 */
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (int i = 0; i < 200; i++) {
        int t = ekv_sampler_sample(s, logits, V);
        CHECK(t == 1 || t == 3);
    }
    ekv_sampler_free(s);

    /* top-k 3: draws among {1, 3, 6} only */
    p = ekv_sampler_default_params();
    p.top_k = 3;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.temp = 1.0f;
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (int i = 0; i < 500; i++) {
        int t = ekv_sampler_sample(s, logits, V);
        CHECK(t == 1 || t == 3 || t == 6);
    }
    ekv_sampler_free(s);

    /* seed reproducibility, different seeds differ */
    p = ekv_sampler_default_params();
    p.top_k = 0; p.top_p = 1.0f; p.min_p = 0.0f; p.temp = 1.0f; p.seed = 42;
    int a[100], b[100], c[100];
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (int i = 0; i < 100; i++) a[i] = ekv_sampler_sample(s, logits, V);
    ekv_sampler_free(s);
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (int i = 0; i < 100; i++) b[i] = ekv_sampler_sample(s, logits, V);
    ekv_sampler_free(s);
    p.seed = 43;
    CHECK_OK(ekv_sampler_new(&p, &s));
    for (int i = 0; i < 100; i++) c[i] = ekv_sampler_sample(s, logits, V);
    ekv_sampler_free(s);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);

    /* frequencies follow softmax at temperature 1 (no filters): 200k draws, 4-sigma bounds */
    p.seed = 7;
    CHECK_OK(ekv_sampler_new(&p, &s));
    enum { N = 200000 };
    int count[V] = {0};
    for (int i = 0; i < N; i++) count[ekv_sampler_sample(s, logits, V)]++;
    ekv_sampler_free(s);
    check_softmax(count, logits, V, N, "token");
    /* temperature 0.5 sharpens: the best pair's share grows */
    p.temp = 0.5f;
    CHECK_OK(ekv_sampler_new(&p, &s));
    int top = 0;
    for (int i = 0; i < 20000; i++) {
        int t = ekv_sampler_sample(s, logits, V);
        top += t == 1 || t == 3;
    }
    ekv_sampler_free(s);
    double share1 = (double)(count[1] + count[3]) / N, share05 = top / 20000.0;
    CHECK_MSG(share05 > share1 + 0.1, "temp 0.5 share %.3f vs temp 1 share %.3f", share05, share1);

    /* invalid parameters */
    p = ekv_sampler_default_params();
    p.top_p = 0.0f;
    CHECK(ekv_sampler_new(&p, &s) == EKV_ERR_INVALID_ARG);
    p = ekv_sampler_default_params();
    p.top_k = -1;
    CHECK(ekv_sampler_new(&p, &s) == EKV_ERR_INVALID_ARG);
    p = ekv_sampler_default_params();
    p.min_p = 2.0f;
    CHECK(ekv_sampler_new(&p, &s) == EKV_ERR_INVALID_ARG && ekv_last_error()[0]);
    ekv_sampler_free(NULL);
    test_penalties();
    test_logit_bias();
    test_logprobs();
    return test_finish("test_sampler");
}
