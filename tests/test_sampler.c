/*
 * test_sampler.c — token sampling: greedy is the first maximum, a seed
 * reproduces a draw sequence, top-k 1 / top-p tiny / min-p 1 all collapse
 * to greedy, top-k restricts draws to the k best, the empirical frequencies
 * at temperature 1 follow the softmax, and bad parameters are refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "testutil.h"

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
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i]);
    for (int i = 0; i < V; i++) {
        double pi = exp(logits[i]) / z, sd = sqrt(N * pi * (1 - pi));
        CHECK_MSG(fabs(count[i] - N * pi) <= 4 * sd + 1, "token %d: %d draws, expected %.0f", i, count[i], N * pi);
    }
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
    return test_finish("test_sampler");
}
