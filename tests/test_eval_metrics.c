/*
 * test_eval_metrics.c — hand-computed checks of libekv_eval: ROUGE-L in both
 * flavours (pltrdy summary-level and plain sentence-level), perplexity, KL,
 * top-1, top-k, Jaccard, cache hit rate, the JSONL / text readers (aliases,
 * offsets, malformed and oversized input) and the CSV / JSON / Markdown /
 * gnuplot writers. The arithmetic behind each expected value is in the
 * comments next to it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ekv_eval.h"
#include "testutil.h"

static char g_tmp[256];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int slot;
    char *b = buf[slot++ & 3];
    snprintf(b, 512, "%s/%s", g_tmp, name);
    return b;
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

/* pltrdy's F for given P and R, in its own operation order. */
static double pl_f(double p, double r) { return 2.0 * ((p * r) / (p + r + 1e-8)); }

static void test_rouge_sentence(void) {
    struct ekv_rouge r;
    /* hyp "the cat sat on the mat" (6 words), ref "the cat is on the mat" (6):
     * LCS = "the cat on the mat" = 5, P = R = 5/6, F = 2PR/(P+R) = 5/6. */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "the cat sat on the mat", "the cat is on the mat", &r));
    CHECK(r.overlap == 5 && r.hyp_len == 6 && r.ref_len == 6);
    CHECK_NEAR(r.p, 5.0 / 6.0, 1e-15);
    CHECK_NEAR(r.r, 5.0 / 6.0, 1e-15);
    CHECK_NEAR(r.f, 5.0 / 6.0, 1e-15);
    /* hyp "a b c d", ref "a c e": LCS "a c" = 2, P = 2/4, R = 2/3,
     * F = 2(1/2)(2/3) / (1/2 + 2/3) = (2/3) / (7/6) = 4/7. */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "a b c d", "a c e", &r));
    CHECK(r.overlap == 2);
    CHECK_NEAR(r.p, 0.5, 1e-15);
    CHECK_NEAR(r.r, 2.0 / 3.0, 1e-15);
    CHECK_NEAR(r.f, 4.0 / 7.0, 1e-15);
    /* whitespace of every kind separates words; '.' does not split here:
     * hyp "x.\ty\n z" = [x., y, z], ref "x. z" = [x., z]: LCS 2, P 2/3, R 1. */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "x.\ty\n z", "x. z", &r));
    CHECK(r.overlap == 2 && r.hyp_len == 3 && r.ref_len == 2);
    CHECK_NEAR(r.f, 0.8, 1e-15); /* 2(2/3)(1)/(5/3) = 4/5 */
    /* identical -> exactly 1; disjoint -> 0; case matters (no lowercasing) */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "One day Tim ran", "One day Tim ran", &r));
    CHECK(r.f == 1.0 && r.p == 1.0 && r.r == 1.0);
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "a b c", "d e f", &r));
    CHECK(r.f == 0.0 && r.p == 0.0 && r.r == 0.0);
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "The", "the", &r));
    CHECK(r.f == 0.0);
    /* empty hypothesis or reference is an error */
    CHECK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "", "a", &r) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_rouge_l(EKV_ROUGE_SENTENCE, " \t\n", "a", &r) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "a", "", &r) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "reference") != NULL);
}

static void test_rouge_pltrdy(void) {
    struct ekv_rouge r;
    /* Same pair with set semantics: distinct hyp words {the,cat,sat,on,mat}
     * n = 5, ref {the,cat,is,on,mat} m = 5; the LCS "the cat on the mat" is the
     * set {the,cat,on,mat} = 4. P = R = 4/5, F = 2(.64)/(1.6+1e-8). */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "the cat sat on the mat", "the cat is on the mat", &r));
    CHECK(r.hyp_len == 5 && r.ref_len == 5 && r.overlap == 4);
    CHECK_NEAR(r.p, 0.8, 1e-15);
    CHECK_NEAR(r.f, pl_f(0.8, 0.8), 1e-15);
    CHECK_NEAR(r.f, 0.799999995, 1e-9);
    /* Lin's union-LCS example (the one in pltrdy's _union_lcs docstring):
     * ref r = "w1 w2 w3 w4 w5", hyp = "w1 w2 w6 w7 w8. w1 w3 w8 w9 w5".
     * LCS(r, c1) = {w1,w2}, LCS(r, c2) = {w1,w3,w5}, union {w1,w2,w3,w5} = 4.
     * n = distinct hyp words {w1,w2,w6,w7,w8,w3,w9,w5} = 8, m = 5.
     * P = 4/8, R = 4/5, F = 2(.4)/(1.3+1e-8) = 0.6153846106... */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "w1 w2 w6 w7 w8. w1 w3 w8 w9 w5", "w1 w2 w3 w4 w5", &r));
    CHECK(r.hyp_len == 8 && r.ref_len == 5 && r.overlap == 4);
    CHECK_NEAR(r.p, 0.5, 1e-15);
    CHECK_NEAR(r.r, 0.8, 1e-15);
    CHECK_NEAR(r.f, pl_f(0.5, 0.8), 1e-15);
    CHECK_NEAR(r.f, 0.8 / 1.3, 1e-8);
    /* Sentence-level would count the whole hyp as one sequence:
     * LCS(w1 w2 w6 w7 w8. w1 w3 w8 w9 w5 | w1 w2 w3 w4 w5): "w8." is a word
     * there, LCS = w1 w2 w3 w5 = 4, P = 4/10, R = 4/5, F = .64/1.2 = 8/15. */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, "w1 w2 w6 w7 w8. w1 w3 w8 w9 w5", "w1 w2 w3 w4 w5", &r));
    CHECK_NEAR(r.f, 8.0 / 15.0, 1e-15);
    /* Back-tracking tie rule. ref = "a b. b" -> sentences [a b], [b];
     * hyp = "b a". LCS([a b], [b a]) has length 1 and two paths; pltrdy at
     * (2,2): no match, T[1][2] = 1 is not > T[2][1] = 1, so it goes left and
     * picks "b". LCS([b], [b a]) = {b}. Union = {b} = 1 (picking "a" would
     * give 2). n = m = 2, P = R = 1/2, F = .5/(1+1e-8). */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "b a", "a b. b", &r));
    CHECK(r.overlap == 1 && r.hyp_len == 2 && r.ref_len == 2);
    CHECK_NEAR(r.f, pl_f(0.5, 0.5), 1e-15);
    /* A whitespace-only '.'-segment becomes the word "": hyp "a b. . c" ->
     * ["a b", "", "c"] -> words {a,b,"",c} n = 4; ref "a b c" m = 3;
     * union {a,b} + {} + {c} = 3; P = 3/4, R = 1, F = 1.5/(1.75+1e-8). */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "a b. . c", "a b c", &r));
    CHECK(r.hyp_len == 4 && r.ref_len == 3 && r.overlap == 3);
    CHECK_NEAR(r.f, pl_f(0.75, 1.0), 1e-15);
    /* Repeated words count once: hyp "a a a", ref "a": n = m = 1, union {a},
     * P = R = 1 -> F = 2/(2+1e-8). */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "a a a", "a", &r));
    CHECK(r.hyp_len == 1 && r.overlap == 1);
    CHECK_NEAR(r.f, 2.0 / (2.0 + 1e-8), 1e-15);
    /* identical -> 2/(2+1e-8), not exactly 1 */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "Tim ran. He was happy.", "Tim ran. He was happy.", &r));
    CHECK_NEAR(r.f, 0.999999995, 1e-12);
    CHECK(r.p == 1.0 && r.r == 1.0);
    /* disjoint -> 0 */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "a b. c", "d e. f", &r));
    CHECK(r.f == 0.0 && r.overlap == 0);
    /* Unicode whitespace splits words as in Python (U+00A0, U+3000) */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "a\xc2\xa0" "b\xe3\x80\x80" "c", "a b c", &r));
    CHECK(r.hyp_len == 3 && r.overlap == 3);
    /* empty hypothesis: "" and "..." have no non-empty segment -> error */
    CHECK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "", "a b", &r) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "hypothesis is empty") != NULL);
    CHECK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "...", "a b", &r) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "a", "", &r) == EKV_ERR_INVALID_ARG);
    /* but "  " is one sentence with the word "" (pltrdy does not raise) */
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "  ", "a b", &r));
    CHECK(r.f == 0.0 && r.hyp_len == 1);
    CHECK(ekv_rouge_l(EKV_ROUGE_PLTRDY, NULL, "a", &r) == EKV_ERR_INVALID_ARG);
    enum ekv_rouge_kind k;
    CHECK_OK(ekv_rouge_kind_parse("sentence", &k));
    CHECK(k == EKV_ROUGE_SENTENCE);
    CHECK(ekv_rouge_kind_parse("rouge2", &k) == EKV_ERR_INVALID_ARG);
    CHECK(strcmp(ekv_rouge_kind_name(EKV_ROUGE_PLTRDY), "pltrdy") == 0);
}

/* Reference values printed by pltrdy `rouge` 1.0.1 itself (git tag 1.0.1,
 * Rouge(metrics=["rouge-l"]).get_scores(hyp, ref), Python 3, "%.17g"). The
 * C port follows pltrdy's operation order, so they agree to the last bit or
 * so; the tolerance is 1e-15. Row 4 by hand: hyp distinct {The,cat,sat}
 * n = 3, ref distinct {The,cat,sat,on,the,mat} m = 6 ("The" != "the"),
 * union {The,cat,sat} = 3: P = 1, R = 1/2, F = 1/(1.5+1e-8). */
static void test_rouge_pltrdy_reference(void) {
    static const struct {
        const char *hyp, *ref;
        double p, r, f;
    } v[] = {
        {"Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
         "Once upon a time, there was a little girl named Lily. She loved to play with her toys.",
         0.77777777777777779, 0.82352941176470584, 0.79999999500408159},
        {"Tim and the dog played together now. They were very happy.",
         "They were very happy. Tim and the dog played together now.", 1, 1, 0.99999999500000003},
        {"One day, Ben saw a big red ball. He ran to the ball and kicked it. The ball went far away.",
         "One day, Ben found a ball. The ball was red and big. Ben kicked the ball far.",
         0.52631578947368418, 0.7142857142857143, 0.60606060117539029},
        {"The cat sat. The cat sat. The cat sat.", "The cat sat on the mat.", 1, 0.5, 0.66666666222222226},
        {"Lily said, \"I want to play!\" Her mom smiled.", "Her mom smiled and said, \"You can play, Lily.\"",
         0.33333333333333331, 0.29999999999999999, 0.31578946869806096},
        {"a b c d e f g. h i j", "j i h. g f e d c b a", 0.2, 0.2, 0.19999999500000015},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        struct ekv_rouge r;
        CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, v[i].hyp, v[i].ref, &r));
        CHECK_MSG(fabs(r.p - v[i].p) <= 1e-15 && fabs(r.r - v[i].r) <= 1e-15 &&
                  fabs(r.f - v[i].f) <= 1e-15, "case %zu: p %.17g r %.17g f %.17g", i, r.p, r.r, r.f);
    }
}

static void test_rouge_limits(void) {
    /* 9000 x 9000 words in one sentence needs 81M LCS cells > 2^26: refused */
    size_t n = 9000;
    char *s = malloc(n * 2 + 1);
    if (!s) return;
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = 'w';
        s[2 * i + 1] = ' ';
    }
    s[2 * n] = '\0';
    struct ekv_rouge r;
    CHECK(ekv_rouge_l(EKV_ROUGE_PLTRDY, s, s, &r) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "LCS limit") != NULL);
    CHECK(ekv_rouge_l(EKV_ROUGE_SENTENCE, s, s, &r) == EKV_ERR_INVALID_ARG);
    /* texts over 1 MiB are refused before any table is built */
    char *big = malloc(EKV_ROUGE_MAX_BYTES + 2);
    if (big) {
        memset(big, 'a', EKV_ROUGE_MAX_BYTES + 1);
        big[EKV_ROUGE_MAX_BYTES + 1] = '\0';
        CHECK(ekv_rouge_l(EKV_ROUGE_PLTRDY, big, "a", &r) == EKV_ERR_INVALID_ARG);
        CHECK(strstr(ekv_last_error(), "hypothesis of 1048577 bytes") != NULL);
        big[EKV_ROUGE_MAX_BYTES] = '\0'; /* exactly 1 MiB: one word, accepted */
        CHECK_OK(ekv_rouge_l(EKV_ROUGE_PLTRDY, "a", big, &r));
        CHECK(r.overlap == 0 && r.ref_len == 1);
        free(big);
    }
    /* 2000 x 2000 is fine: all words "w", LCS = 2000 */
    s[2 * 2000] = '\0';
    CHECK_OK(ekv_rouge_l(EKV_ROUGE_SENTENCE, s, s, &r));
    CHECK(r.overlap == 2000 && r.f == 1.0);
    free(s);
}

static void test_perplexity(void) {
    /* Uniform logits over V: p = 1/V for every token, NLL = ln V, PPL = V. */
    enum { V = 512 };
    static float u[V];
    for (int i = 0; i < V; i++) u[i] = 3.25f;
    struct ekv_ppl_acc acc;
    ekv_ppl_init(&acc);
    double nll, ppl;
    for (int t = 0; t < 7; t++) CHECK_OK(ekv_ppl_add_logits(&acc, u, V, (t * 97) % V, &nll));
    CHECK_NEAR(nll, log(512.0), 1e-12);
    CHECK_OK(ekv_ppl_value(&acc, &ppl));
    CHECK_NEAR(ppl, 512.0, 512.0 * 1e-12);

    /* Two tokens by hand.
     * token 1: logits [1, 2, 3], target 0:
     *   lse = ln(e + e^2 + e^3), NLL = lse - 1 = ln(1 + e + e^2)
     *       = ln(1 + 2.718281828 + 7.389056099) = ln(11.107337927) = 2.407605964
     * token 2: logits [0, 0], target 1: NLL = ln 2 = 0.693147181
     * mean = 1.550376572, PPL = exp(mean) = sqrt(2 (1 + e + e^2)) = 4.713244...
     */
    const float l1[3] = {1.0f, 2.0f, 3.0f}, l2[2] = {0.0f, 0.0f};
    ekv_ppl_init(&acc);
    CHECK_OK(ekv_ppl_add_logits(&acc, l1, 3, 0, &nll));
    double e = exp(1.0);
    CHECK_NEAR(nll, log(1.0 + e + e * e), 1e-12);
    CHECK_NEAR(nll, 2.407605964, 1e-9);
    CHECK_OK(ekv_ppl_add_logits(&acc, l2, 2, 1, NULL));
    double mean;
    CHECK_OK(ekv_ppl_mean_nll(&acc, &mean));
    CHECK_NEAR(mean, 1.550376572, 1e-9);
    CHECK_OK(ekv_ppl_value(&acc, &ppl));
    CHECK_NEAR(ppl, sqrt(2.0 * (1.0 + e + e * e)), 1e-12);
    CHECK_NEAR(ppl, 4.713244, 1e-6);
    CHECK(acc.n_tokens == 2);

    /* Pooling is token-weighted: merging {2 tokens} with {1 token of NLL ln 4}
     * gives exp((2.407605964 + 0.693147181 + 1.386294361) / 3). */
    struct ekv_ppl_acc b;
    ekv_ppl_init(&b);
    CHECK_OK(ekv_ppl_add_nll(&b, log(4.0)));
    ekv_ppl_merge(&acc, &b);
    CHECK_OK(ekv_ppl_value(&acc, &ppl));
    CHECK_NEAR(ppl, exp((log(1.0 + e + e * e) + log(2.0) + log(4.0)) / 3.0), 1e-12);

    /* Large logits do not overflow: [1000, 1000] target 0 -> ln 2. */
    const float big[2] = {1000.0f, 1000.0f};
    CHECK_OK(ekv_nll_from_logits(big, 2, 0, &nll));
    CHECK_NEAR(nll, log(2.0), 1e-12);
    /* -inf is a masked token: [0, -inf] target 0 -> 0; target 1 -> +inf */
    const float masked[2] = {0.0f, -INFINITY};
    CHECK_OK(ekv_nll_from_logits(masked, 2, 0, &nll));
    CHECK(nll == 0.0);
    CHECK_OK(ekv_nll_from_logits(masked, 2, 1, &nll));
    CHECK(isinf(nll) && nll > 0);

    /* errors */
    const float bad[2] = {0.0f, NAN};
    CHECK(ekv_nll_from_logits(bad, 2, 0, &nll) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_nll_from_logits(l2, 2, 2, &nll) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_nll_from_logits(l2, 2, -1, &nll) == EKV_ERR_INVALID_ARG);
    ekv_ppl_init(&b);
    CHECK(ekv_ppl_value(&b, &ppl) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_ppl_add_nll(&b, -0.5) == EKV_ERR_INVALID_ARG);
}

/* Paired bootstrap of a PPL ratio on known cases: equal policies give 1
 * and [1, 1]; a constant per-token NLL shift d gives exp(d) on every
 * resample; with 3 units the interval's ends are the smallest and largest
 * ratios of any resample (each single-unit resample, probability 1/27 >
 * 2.5 %, is drawn among 4000); the interval is the same on a rerun and
 * moves with the seed only inside those bounds; bad input is refused. */
static void test_bootstrap(void) {
    const double a[3] = {30.0, 80.0, 20.0}, same[3] = {30.0, 80.0, 20.0};
    const size_t tok[3] = {10, 40, 10};
    double r, lo, hi, r2, lo2, hi2;
    CHECK_OK(ekv_bootstrap_ppl_ratio(a, same, tok, 3, 500, 1, &r, &lo, &hi));
    CHECK(r == 1.0 && lo == 1.0 && hi == 1.0);
    double shifted[3];
    for (int i = 0; i < 3; i++) shifted[i] = a[i] + 0.25 * (double)tok[i];
    CHECK_OK(ekv_bootstrap_ppl_ratio(shifted, a, tok, 3, 500, 1, &r, &lo, &hi));
    CHECK_NEAR(r, exp(0.25), 1e-12);
    CHECK_NEAR(lo, exp(0.25), 1e-12);
    CHECK_NEAR(hi, exp(0.25), 1e-12);
    /* unit ratios differ: per-token NLL differences 0.5, -0.25, 0 */
    const double b[3] = {25.0, 90.0, 20.0};
    CHECK_OK(ekv_bootstrap_ppl_ratio(a, b, tok, 3, 4000, 7, &r, &lo, &hi));
    CHECK_NEAR(r, exp((130.0 - 135.0) / 60.0), 1e-12);
    CHECK_NEAR(lo, exp(-0.25), 1e-12); /* all three draws unit 1 */
    CHECK_NEAR(hi, exp(0.5), 1e-12);   /* all three draws unit 0 */
    CHECK_OK(ekv_bootstrap_ppl_ratio(a, b, tok, 3, 4000, 7, &r2, &lo2, &hi2));
    CHECK(r2 == r && lo2 == lo && hi2 == hi);
    /* more units: the interval holds the ratio and is narrower than the range */
    enum { N = 40 };
    double x[N], y[N];
    size_t t[N];
    for (int i = 0; i < N; i++) t[i] = 50, y[i] = 100.0 + i, x[i] = y[i] + 2.0 + (i % 5);
    CHECK_OK(ekv_bootstrap_ppl_ratio(x, y, t, N, 2000, 3, &r, &lo, &hi));
    CHECK_MSG(lo < r && r < hi && lo > exp(2.0 / 50) && hi < exp(6.0 / 50), "ratio %g in [%g, %g]", r, lo, hi);
    CHECK(ekv_bootstrap_ppl_ratio(x, y, t, 0, 10, 1, &r, &lo, &hi) == EKV_ERR_INVALID_ARG);
    const size_t zero[3] = {0, 0, 0};
    CHECK(ekv_bootstrap_ppl_ratio(a, b, zero, 3, 10, 1, &r, &lo, &hi) == EKV_ERR_INVALID_ARG);
    const double neg[3] = {-1.0, 1.0, 1.0};
    CHECK(ekv_bootstrap_ppl_ratio(neg, b, tok, 3, 10, 1, &r, &lo, &hi) == EKV_ERR_INVALID_ARG);
}

/* Paired bootstrap of a mean difference (accuracy, ROUGE-L): equal scores
 * give 0 in [0, 0]; a constant shift gives it on every resample; with 3
 * units the ends are the single-unit resamples' differences (as above);
 * reruns repeat; bad input is refused. */
static void test_bootstrap_diff(void) {
    const double a[3] = {1.0, 0.0, 0.5}, b[3] = {0.5, 0.5, 0.5};
    double d, lo, hi, d2, lo2, hi2;
    CHECK_OK(ekv_bootstrap_mean_diff(a, a, 3, 500, 1, &d, &lo, &hi));
    CHECK(d == 0.0 && lo == 0.0 && hi == 0.0);
    const double up[3] = {1.25, 0.25, 0.75};
    CHECK_OK(ekv_bootstrap_mean_diff(up, a, 3, 500, 1, &d, &lo, &hi));
    CHECK_NEAR(d, 0.25, 1e-12);
    CHECK_NEAR(lo, 0.25, 1e-12);
    CHECK_NEAR(hi, 0.25, 1e-12);
    CHECK_OK(ekv_bootstrap_mean_diff(a, b, 3, 4000, 7, &d, &lo, &hi));
    CHECK_NEAR(d, 0.0, 1e-12);
    CHECK_NEAR(lo, -0.5, 1e-12); /* all three draws unit 1 */
    CHECK_NEAR(hi, 0.5, 1e-12);  /* all three draws unit 0 */
    CHECK_OK(ekv_bootstrap_mean_diff(a, b, 3, 4000, 7, &d2, &lo2, &hi2));
    CHECK(d2 == d && lo2 == lo && hi2 == hi);
    enum { N = 60 };
    double x[N], y[N];
    for (int i = 0; i < N; i++) y[i] = (i % 3) ? 1.0 : 0.0, x[i] = (i % 4) ? 1.0 : 0.0;
    CHECK_OK(ekv_bootstrap_mean_diff(x, y, N, 2000, 3, &d, &lo, &hi));
    CHECK_MSG(lo < d && d < hi && lo > -1 && hi < 1 && fabs(d - (45.0 - 40.0) / N) < 1e-12, "diff %g in [%g, %g]", d, lo, hi);
    CHECK(ekv_bootstrap_mean_diff(x, y, 0, 10, 1, &d, &lo, &hi) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_bootstrap_mean_diff(x, y, N, 0, 1, &d, &lo, &hi) == EKV_ERR_INVALID_ARG);
    const double bad[3] = {NAN, 1.0, 1.0};
    CHECK(ekv_bootstrap_mean_diff(bad, b, 3, 10, 1, &d, &lo, &hi) == EKV_ERR_INVALID_ARG);
}

static void test_kl_top1(void) {
    /* identical distributions -> 0 exactly */
    const float a[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    double kl;
    CHECK_OK(ekv_kl_from_logits(a, a, 4, &kl));
    CHECK(kl == 0.0);
    /* shifted logits are the same distribution: KL ~ 0 */
    const float a2[4] = {10.5f, 9.0f, 12.0f, 10.0f};
    CHECK_OK(ekv_kl_from_logits(a, a2, 4, &kl));
    CHECK_NEAR(kl, 0.0, 1e-12);
    /* P = softmax[0,0] = [.5,.5], Q = softmax[0, ln 3] = [.25,.75]:
     * KL(P||Q) = .5 ln(.5/.25) + .5 ln(.5/.75) = .5 ln(4/3) = 0.143841036 */
    const float p[2] = {0.0f, 0.0f}, q[2] = {0.0f, (float)log(3.0)};
    CHECK_OK(ekv_kl_from_logits(p, q, 2, &kl));
    CHECK_NEAR(kl, 0.5 * log(4.0 / 3.0), 1e-7);
    CHECK_NEAR(kl, 0.143841036, 1e-7);
    /* reverse: KL(Q||P) = .25 ln(.25/.5) + .75 ln(.75/.5) = .75 ln 3 - ln 2 = 0.130812035 */
    CHECK_OK(ekv_kl_from_logits(q, p, 2, &kl));
    CHECK_NEAR(kl, 0.75 * log(3.0) - log(2.0), 1e-7);
    /* P = [1, 0] (masked), Q = [.5,.5]: KL = ln 2; and the reverse is +inf */
    const float pm[2] = {0.0f, -INFINITY};
    CHECK_OK(ekv_kl_from_logits(pm, p, 2, &kl));
    CHECK_NEAR(kl, log(2.0), 1e-12);
    CHECK_OK(ekv_kl_from_logits(p, pm, 2, &kl));
    CHECK(isinf(kl));

    /* argmax: first of equal maxima */
    const float t[5] = {1.0f, 3.0f, -2.0f, 3.0f, 0.0f};
    size_t idx;
    CHECK_OK(ekv_argmax(t, 5, &idx));
    CHECK(idx == 1);
    /* accumulator: positions (p,q) [agree, KL .5 ln 4/3] and (a,a) [agree, 0]
     * and (t, t') with argmax 1 vs 4 [disagree]. */
    struct ekv_kl_acc acc;
    ekv_kl_init(&acc);
    const float q2[2] = {0.0f, (float)log(3.0)};
    CHECK_OK(ekv_kl_add(&acc, p, q2, 2)); /* argmax p = 0 (tie), q = 1: disagree */
    CHECK_OK(ekv_kl_add(&acc, a, a, 4));  /* agree, KL 0 */
    const float u1[3] = {0.0f, 1.0f, 0.0f}, u2[3] = {0.0f, 1.0f, 0.5f};
    CHECK_OK(ekv_kl_add(&acc, u1, u2, 3)); /* agree */
    double mkl, top1;
    CHECK_OK(ekv_kl_result(&acc, &mkl, &top1));
    CHECK_NEAR(top1, 2.0 / 3.0, 1e-15);
    double kl3;
    CHECK_OK(ekv_kl_from_logits(u1, u2, 3, &kl3));
    CHECK_NEAR(mkl, (0.5 * log(4.0 / 3.0) + kl3) / 3.0, 1e-7);
    ekv_kl_init(&acc);
    CHECK(ekv_kl_result(&acc, &mkl, &top1) == EKV_ERR_INVALID_ARG);
}

static void test_sets(void) {
    /* Jaccard {1,2,3,4} vs {3,4,5}: |{3,4}| / |{1,2,3,4,5}| = 2/5 */
    const uint32_t a[4] = {4, 1, 3, 2}, b[3] = {5, 3, 4};
    double j;
    CHECK_OK(ekv_jaccard(a, 4, b, 3, &j));
    CHECK_NEAR(j, 0.4, 1e-15);
    /* duplicates ignored: {1,1,2} vs {2} = 1/2; empty vs empty = 1; A vs {} = 0 */
    const uint32_t c[3] = {1, 1, 2}, d[1] = {2};
    CHECK_OK(ekv_jaccard(c, 3, d, 1, &j));
    CHECK_NEAR(j, 0.5, 1e-15);
    CHECK_OK(ekv_jaccard(NULL, 0, NULL, 0, &j));
    CHECK(j == 1.0);
    CHECK_OK(ekv_jaccard(a, 4, NULL, 0, &j));
    CHECK(j == 0.0);

    /* top-k with ties ranked by index (docs/policies.md "Ties") */
    const float s[6] = {0.2f, 0.4f, 0.2f, 0.4f, 0.1f, 0.2f};
    uint32_t top[3];
    CHECK_OK(ekv_topk_indices(s, 6, 3, top)); /* .4(1) .4(3) .2(0) */
    CHECK(top[0] == 0 && top[1] == 1 && top[2] == 3);
    CHECK(ekv_topk_indices(s, 6, 7, top) == EKV_ERR_INVALID_ARG);

    /* Cache hit rate on row q7 of the 8-token test matrix (full attention of the next
     * query): [.20 .04 .15 .06 .25 .11 .09 .10]. Top-4 = .25(4) .20(0)
     * .15(2) .11(5) -> S* = {0,2,4,5}. H2O (w=2) keeps {0,2,6,7}:
     *   hit rate = |{0,2}| / 4 = 0.5
     *   Jaccard  = 2 / |{0,2,4,5,6,7}| = 1/3
     *   mass     = .20 + .15 + .09 + .10 = .54 of 1.00 */
    const float q7[8] = {.20f, .04f, .15f, .06f, .25f, .11f, .09f, .10f};
    const uint32_t h2o[4] = {0, 2, 6, 7};
    double hr, jac, mass;
    CHECK_OK(ekv_kept_agreement(q7, 8, h2o, 4, 0, &hr, &jac, &mass));
    CHECK_NEAR(hr, 0.5, 1e-15);
    CHECK_NEAR(jac, 1.0 / 3.0, 1e-15);
    CHECK_NEAR(mass, 0.54, 1e-6);
    /* pure TOVA keeps exactly S* -> 1, 1 */
    const uint32_t tova[4] = {5, 4, 2, 0};
    CHECK_OK(ekv_kept_agreement(q7, 8, tova, 4, 0, &hr, &jac, NULL));
    CHECK(hr == 1.0 && jac == 1.0);
    /* explicit k = 2: S* = {0,4}; H2O hits {0}: 1/2; Jaccard 1/|{0,2,4,6,7}| = 1/5 */
    CHECK_OK(ekv_kept_agreement(q7, 8, h2o, 4, 2, &hr, &jac, NULL));
    CHECK_NEAR(hr, 0.5, 1e-15);
    CHECK_NEAR(jac, 0.2, 1e-15);
    /* bad kept sets */
    const uint32_t dup[2] = {1, 1}, oob[1] = {8};
    CHECK(ekv_kept_agreement(q7, 8, dup, 2, 0, &hr, NULL, NULL) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_kept_agreement(q7, 8, oob, 1, 0, &hr, NULL, NULL) == EKV_ERR_INVALID_ARG);
    const float neg[2] = {0.5f, -0.1f};
    CHECK(ekv_kept_agreement(neg, 2, h2o, 1, 0, &hr, NULL, NULL) == EKV_ERR_INVALID_ARG);

    struct ekv_mean_acc m = {0};
    ekv_mean_add(&m, 0.5);
    ekv_mean_add(&m, 1.0);
    CHECK_NEAR(ekv_mean_value(&m), 0.75, 1e-15);
}

static void test_dataset_jsonl(void) {
    const char *p = tmp_path("all.jsonl");
    write_text(p,
               "{\"instruction\":\"i1\",\"answer\":\"a1\",\"system\":\"s1\",\"image\":\"img.png\",\"id\":7}\n"
               "{\"prompt\":\"i2\",\"reference\":\"a2\"}\r\n"
               "   \n"
               "{\"question\":\"i3\",\"output\":\"a3\",\"question_id\":\"q3\",\"type\":\"color\"}\n"
               "{\"article\":\"i4\",\"summary_gt\":\"a4\",\"type\":3,\"category\":\"news\"}\n"
               "{\"input\":\"i5\",\"target\":\"a5\",\"type\":{\"k\":1}}\n"
               "{\"document\":\"i6\",\"summary\":\"a6\",\"extra\":[1,2,{\"x\":null}]}\n"
               "{\"instruction\":\"first\",\"prompt\":\"second\",\"answer\":\"A\",\"output\":\"B\"}\n"
               "{\"instruction\":\"no answer \\u00e9\\n\"}");
    struct ekv_data_opts o = ekv_data_default_opts();
    struct ekv_dataset ds;
    CHECK_OK(ekv_dataset_load(p, &o, &ds));
    CHECK(ds.format == EKV_DATA_JSONL);
    CHECK(ds.n_items == 8 && ds.n_total == 8);
    if (ds.n_items == 8) {
        const char *ins[8] = {"i1", "i2", "i3", "i4", "i5", "i6", "first", "no answer \xc3\xa9\n"};
        const char *ans[8] = {"a1", "a2", "a3", "a4", "a5", "a6", "A", NULL};
        const size_t lines[8] = {1, 2, 4, 5, 6, 7, 8, 9};
        for (int i = 0; i < 8; i++) {
            CHECK_MSG(strcmp(ds.items[i].instruction, ins[i]) == 0, "item %d", i);
            CHECK_MSG(ans[i] ? ds.items[i].answer && strcmp(ds.items[i].answer, ans[i]) == 0
                             : ds.items[i].answer == NULL, "item %d", i);
            CHECK_MSG(ds.items[i].line == lines[i], "item %d line %zu", i, ds.items[i].line);
            CHECK(ds.items[i].text == NULL);
        }
        CHECK(strcmp(ds.items[0].system, "s1") == 0 && strcmp(ds.items[0].image, "img.png") == 0);
        CHECK(strcmp(ds.items[0].id, "7") == 0 && strcmp(ds.items[2].id, "q3") == 0);
        CHECK(ds.items[1].system == NULL && ds.items[1].image == NULL && ds.items[1].id == NULL);
        /* "type" (else "category") as a string; other values are not types */
        CHECK(ds.items[2].type && !strcmp(ds.items[2].type, "color"));
        CHECK(ds.items[3].type && !strcmp(ds.items[3].type, "news"));
        CHECK(ds.items[4].type == NULL && ds.items[0].type == NULL);
    }
    ekv_dataset_free(&ds);

    /* "images": several paths (image is the first); "image" fills both */
    const char *pi = tmp_path("imgs.jsonl");
    write_text(pi, "{\"instruction\":\"<image> vs <image>\",\"images\":[\"a.png\",\"b.png\"]}\n"
                   "{\"instruction\":\"one\",\"image\":\"c.png\"}\n");
    CHECK_OK(ekv_dataset_load(pi, &o, &ds));
    CHECK(ds.n_items == 2);
    if (ds.n_items == 2) {
        CHECK(ds.items[0].n_images == 2 && !strcmp(ds.items[0].images[1], "b.png") &&
              ds.items[0].image == ds.items[0].images[0] && !strcmp(ds.items[0].image, "a.png"));
        CHECK(ds.items[1].n_images == 1 && !strcmp(ds.items[1].images[0], "c.png"));
    }
    ekv_dataset_free(&ds);
    const char *bad_images[] = {"{\"instruction\":\"x\",\"image\":\"a\",\"images\":[\"b\"]}",
                                "{\"instruction\":\"x\",\"images\":[]}", "{\"instruction\":\"x\",\"images\":\"a\"}",
                                "{\"instruction\":\"x\",\"images\":[\"a\",3]}", "{\"instruction\":\"x\",\"images\":[\"\"]}",
                                "{\"instruction\":\"x\",\"images\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
                                "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"]}"};
    for (size_t k = 0; k < sizeof bad_images / sizeof bad_images[0]; k++) {
        write_text(pi, bad_images[k]);
        CHECK_MSG(ekv_dataset_load(pi, &o, &ds) == EKV_ERR_FORMAT && strstr(ekv_last_error(), "imgs.jsonl:1: ") &&
                      strstr(ekv_last_error(), "image"),
                  "bad images case %zu: %s", k, ekv_last_error());
    }

    /* offset / limit count items (non-blank lines), not lines */
    o.offset = 2;
    o.limit = 2;
    CHECK_OK(ekv_dataset_load(p, &o, &ds));
    CHECK(ds.n_items == 2 && ds.n_total == 4);
    if (ds.n_items == 2) {
        CHECK(strcmp(ds.items[0].instruction, "i3") == 0 && ds.items[0].line == 4);
        CHECK(strcmp(ds.items[1].instruction, "i4") == 0 && ds.items[1].line == 5);
    }
    ekv_dataset_free(&ds);
    o.offset = 100;
    o.limit = 0;
    CHECK_OK(ekv_dataset_load(p, &o, &ds));
    CHECK(ds.n_items == 0 && ds.n_total == 8);
    ekv_dataset_free(&ds);
    /* require_answer: item 8 has none */
    o = ekv_data_default_opts();
    o.require_answer = true;
    CHECK(ekv_dataset_load(p, &o, &ds) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "all.jsonl:9: no answer field") != NULL);
    CHECK(ds.items == NULL && ds.n_items == 0);

    /* malformed line 3 */
    const char *bad = tmp_path("bad.jsonl");
    write_text(bad, "{\"instruction\":\"x\"}\n{\"instruction\":\"y\"}\n{\"instruction\": \"z\", }\n");
    o = ekv_data_default_opts();
    CHECK(ekv_dataset_load(bad, &o, &ds) == EKV_ERR_FORMAT);
    CHECK_MSG(strstr(ekv_last_error(), "bad.jsonl:3: invalid JSON at column") != NULL, "%s",
              ekv_last_error());
    /* a bad line outside the selection is not read */
    o.limit = 2;
    CHECK_OK(ekv_dataset_load(bad, &o, &ds));
    CHECK(ds.n_items == 2);
    ekv_dataset_free(&ds);

    /* other malformed shapes, each with its line number */
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"{\"answer\":\"a\"}\n", ":1: no instruction field"},
        {"[1,2]\n", ":1: expected a JSON object"},
        {"\n{\"prompt\":5}\n", ":2: field \"prompt\" must be a string"},
        {"{\"prompt\":\"\"}\n", ":1: field \"prompt\" is empty"},
        {"{\"prompt\":\"a\"} x\n", ":1: unexpected text after the JSON value at column 16"},
        {"{\"prompt\":\"a\",\"id\":[1]}\n", ":1: field \"id\" must be a string or a number"},
        {"{\"prompt\":\"a\"\n", ":1: invalid JSON"},
    };
    o = ekv_data_default_opts();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(bad, cases[i].text);
        CHECK(ekv_dataset_load(bad, &o, &ds) == EKV_ERR_FORMAT);
        CHECK_MSG(strstr(ekv_last_error(), cases[i].msg) != NULL, "case %zu: %s", i, ekv_last_error());
    }
    CHECK(ekv_dataset_load(tmp_path("missing.jsonl"), &o, &ds) == EKV_ERR_IO);
    CHECK(strstr(ekv_last_error(), "missing.jsonl: cannot open") != NULL);
}

static void test_dataset_huge_line(void) {
    /* a 100 MB line: refused after the 16 MiB default cap, with its line number */
    const char *p = tmp_path("huge.jsonl");
    FILE *f = fopen(p, "wb");
    if (!f) {
        CHECK(f != NULL);
        return;
    }
    fputs("{\"instruction\":\"ok\"}\n{\"instruction\":\"", f);
    size_t blk = 1 << 20;
    char *buf = malloc(blk);
    if (buf) {
        memset(buf, 'x', blk);
        for (int i = 0; i < 100; i++) fwrite(buf, 1, blk, f);
        free(buf);
    }
    fputs("\"}\n", f);
    fclose(f);
    struct ekv_data_opts o = ekv_data_default_opts();
    struct ekv_dataset ds;
    CHECK(ekv_dataset_load(p, &o, &ds) == EKV_ERR_FORMAT);
    CHECK_MSG(strstr(ekv_last_error(), "huge.jsonl:2: line longer than 16777216 bytes") != NULL, "%s",
              ekv_last_error());
    /* with a bigger cap the same line loads */
    o.max_line_bytes = 128u << 20;
    CHECK_OK(ekv_dataset_load(p, &o, &ds));
    CHECK(ds.n_items == 2 && ds.n_items == 2 && strlen(ds.items[1].instruction) == 100u << 20);
    ekv_dataset_free(&ds);
    unlink(p);
}

static void test_dataset_text(void) {
    /* the shared TinyStories sample: 5 stories separated by <|endoftext|> */
    const char *p = tu_shared("data/perplexity/tinystories_sample.txt");
    struct ekv_data_opts o = ekv_data_default_opts();
    struct ekv_dataset ds;
    o.format = EKV_DATA_TEXT;
    o.doc_sep = "<|endoftext|>";
    CHECK_OK(ekv_dataset_load(p, &o, &ds));
    CHECK(ds.format == EKV_DATA_TEXT && ds.n_items == 5);
    if (ds.n_items == 5) {
        CHECK(strncmp(ds.items[0].text, "Once upon a time there was a little boy named Ben.", 50) == 0);
        CHECK(ds.items[0].line == 2 && ds.items[1].line == 8 && ds.items[4].line == 22);
        CHECK(strlen(ds.items[2].text) == 513); /* "One day, a little boy named Tim..." */
        CHECK(ds.items[0].instruction == NULL && ds.items[0].answer == NULL);
    }
    ekv_dataset_free(&ds);
    o.offset = 1;
    o.limit = 2;
    CHECK_OK(ekv_dataset_load(p, &o, &ds));
    CHECK(ds.n_items == 2 && ds.n_total == 3);
    if (ds.n_items == 2) CHECK(strncmp(ds.items[1].text, "One day, a little boy named Tim", 31) == 0);
    ekv_dataset_free(&ds);
    /* whole file as one document (auto: not .jsonl -> text) */
    o = ekv_data_default_opts();
    CHECK_OK(ekv_dataset_load(p, &o, &ds));
    CHECK(ds.format == EKV_DATA_TEXT && ds.n_items == 1);
    if (ds.n_items == 1) CHECK(strstr(ds.items[0].text, "<|endoftext|>") != NULL);
    ekv_dataset_free(&ds);
    /* size cap and NUL bytes */
    o.max_file_bytes = 1000;
    CHECK(ekv_dataset_load(p, &o, &ds) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "larger than 1000 bytes") != NULL);
    const char *nul = tmp_path("nul.txt");
    FILE *f = fopen(nul, "wb");
    if (f) {
        fwrite("ab\0cd", 1, 5, f);
        fclose(f);
    }
    o = ekv_data_default_opts();
    CHECK(ekv_dataset_load(nul, &o, &ds) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "NUL byte at offset 2") != NULL);
    enum ekv_data_format fmt;
    CHECK_OK(ekv_data_format_parse("jsonl", &fmt));
    CHECK(fmt == EKV_DATA_JSONL);
    CHECK(ekv_data_format_parse("csv", &fmt) == EKV_ERR_INVALID_ARG);
}

/* The shipped in-domain set and the ../shared sets load as they are. */
static void test_dataset_shipped_and_shared(void) {
    struct ekv_data_opts o = ekv_data_default_opts();
    struct ekv_dataset ds, stories;
    /* data/tinystories_eval.jsonl: 19 items, the 5 stories of the shared
     * sample each cut at up to 4 sentence ends (30/40/50/60%; two fractions
     * of story 1 land on one cut); each item is its story cut in two
     * (instruction + whitespace + answer = the story), its id names the
     * story and the fraction, no story appears twice with the same cut. */
    o.require_answer = true;
    CHECK_OK(ekv_dataset_load(tu_src("data/tinystories_eval.jsonl"), &o, &ds));
    struct ekv_data_opts to = ekv_data_default_opts();
    to.format = EKV_DATA_TEXT;
    to.doc_sep = "<|endoftext|>";
    CHECK_OK(ekv_dataset_load(tu_shared("data/perplexity/tinystories_sample.txt"), &to, &stories));
    CHECK(ds.n_items == 19 && stories.n_items == 5);
    size_t per_story[5] = {0}, prev_li = 0, prev_story = 0;
    for (size_t i = 0; i < ds.n_items; i++) {
        unsigned sn = 0, frac = 0;
        CHECK_MSG(ds.items[i].id && sscanf(ds.items[i].id, "tinystories-sample-%u-%u", &sn, &frac) == 2 &&
                  sn >= 1 && sn <= 5 && frac >= 30 && frac <= 60, "item %zu id", i);
        if (sn < 1 || sn > 5) continue;
        per_story[sn - 1]++;
        const char *st = stories.items[sn - 1].text, *in = ds.items[i].instruction, *an = ds.items[i].answer;
        size_t ls = strlen(st), li = strlen(in), la = strlen(an);
        CHECK_MSG(strncmp(st, in, li) == 0 && ls >= li + la && strcmp(st + ls - la, an) == 0 &&
                  ls - li - la >= 1 && ls - li - la <= 2, "item %zu", i);
        /* the cut lies at or after its fraction, before the next one + slack */
        CHECK_MSG(li * 100 >= frac * ls && li * 100 <= (frac + 20) * ls, "item %zu: %zu of %zu", i, li, ls);
        /* cuts of one story grow */
        if (sn == prev_story) CHECK_MSG(li > prev_li, "item %zu repeats a cut", i);
        prev_story = sn;
        prev_li = li;
    }
    for (size_t k = 0; k < 5; k++) CHECK_MSG(per_story[k] >= 3 && per_story[k] <= 4, "story %zu", k + 1);
    ekv_dataset_free(&ds);
    ekv_dataset_free(&stories);
    /* XSum (article/summary_gt), AlpacaEval (instruction/output), the HF XSum
     * fixture (document/summary, ".json" read as JSONL) */
    static const char *const sets[] = {"data/summarization/xsum_0shot.jsonl",
                                       "data/instructions/alpaca_eval.jsonl",
                                       "data/summarization/hf_fixture_xsum_sample.json"};
    for (size_t i = 0; i < 3; i++) {
        o = ekv_data_default_opts();
        o.require_answer = true;
        o.offset = 1;
        o.limit = 3;
        CHECK_OK(ekv_dataset_load(tu_shared(sets[i]), &o, &ds));
        CHECK_MSG(ds.n_items == 3 && ds.items[0].line == 2 && ds.items[0].answer &&
                  strlen(ds.items[0].instruction) > 10, "%s", sets[i]);
        ekv_dataset_free(&ds);
    }
    /* WikiText-2 test split as one document */
    o = ekv_data_default_opts();
    CHECK_OK(ekv_dataset_load(tu_shared("data/perplexity/wikitext2_wiki.test.raw"), &o, &ds));
    CHECK(ds.n_items == 1 && ds.items[0].text && strlen(ds.items[0].text) > 1000000);
    ekv_dataset_free(&ds);
}

static void test_grid_parsing(void) {
    double *b;
    size_t n;
    CHECK_OK(ekv_budgets_parse("1, 0.5,0.2", &b, &n));
    CHECK(n == 3 && b[0] == 1.0 && b[1] == 0.5 && b[2] == 0.2);
    free(b);
    CHECK(ekv_budgets_parse("0", &b, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_budgets_parse("1.5", &b, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_budgets_parse("0.5,x", &b, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_budgets_parse("0.5,,1", &b, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_budgets_parse("0.5,0.50", &b, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_budgets_parse("nan", &b, &n) == EKV_ERR_INVALID_ARG);
    unsigned bits;
    CHECK_OK(ekv_metrics_parse("ppl,kl", &bits));
    CHECK(bits == (EKV_METRIC_PPL | EKV_METRIC_KL));
    CHECK_OK(ekv_metrics_parse("hitrate,rouge", &bits));
    CHECK(bits == (EKV_METRIC_HITRATE | EKV_METRIC_ROUGE));
    CHECK(ekv_metrics_parse("ppl,bleu", &bits) == EKV_ERR_INVALID_ARG);
    char **it;
    CHECK_OK(ekv_split_list("full, h2o ,elastic", &it, &n));
    CHECK(n == 3 && strcmp(it[0], "full") == 0 && strcmp(it[1], "h2o") == 0 &&
          strcmp(it[2], "elastic") == 0);
    free(it);
    CHECK(ekv_split_list("h2o,h2o", &it, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_split_list("", &it, &n) == EKV_ERR_INVALID_ARG);

    /* 25 of 100 done in 10 s: 75 left at 0.4 s each = 30 s */
    char buf[128];
    ekv_eval_format_progress(buf, sizeof buf, 25, 100, 10.0);
    CHECK_MSG(strcmp(buf, "[ 25/100  25.0%] 0:00:10 elapsed, ETA 0:00:30") == 0, "%s", buf);
    ekv_eval_format_progress(buf, sizeof buf, 0, 7, 0.0);
    CHECK_MSG(strcmp(buf, "[0/7   0.0%] 0:00:00 elapsed, ETA --:--:--") == 0, "%s", buf);
    ekv_eval_format_progress(buf, sizeof buf, 1, 3, 3725.0); /* 2 x 3725 s = 2:04:10 */
    CHECK_MSG(strcmp(buf, "[1/3  33.3%] 1:02:05 elapsed, ETA 2:04:10") == 0, "%s", buf);
}

static bool file_starts_with(const char *path, const void *magic, size_t n) {
    size_t len;
    char *s = tu_read_file(path, &len);
    bool ok = s && len >= n && memcmp(s, magic, n) == 0;
    free(s);
    return ok;
}

static void test_report(void) {
    struct ekv_report rep;
    ekv_report_init(&rep);
    CHECK_OK(ekv_report_set_title(&rep, "stories260K on \"test\""));
    CHECK_OK(ekv_report_set_meta(&rep, "{\"model\":\"stories260K\",\"items\":5}"));
    CHECK(ekv_report_set_meta(&rep, "[1]") == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_report_add(&rep, "full", 1.0, "ppl", 12.5, 100));
    CHECK_OK(ekv_report_add(&rep, "h2o", 0.5, "ppl", 13.25, 100));
    CHECK_OK(ekv_report_add(&rep, "h2o", 0.5, "rouge_l_f", 0.75, 5));
    CHECK_OK(ekv_report_add(&rep, "h2o", 0.2, "ppl", 20.0, 100));
    CHECK_OK(ekv_report_add(&rep, "elastic", 0.2, "rouge_l_f", NAN, 0));
    CHECK(ekv_report_add(&rep, "h2o", 0.5, "ppl", 1.0, 1) == EKV_ERR_INVALID_ARG); /* duplicate */
    CHECK(ekv_report_add(&rep, "a,b", 0.5, "ppl", 1.0, 1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_report_add(&rep, "h2o", 0.5, "p/l", 1.0, 1) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_report_add(&rep, "h2o", NAN, "ppl", 1.0, 1) == EKV_ERR_INVALID_ARG);
    CHECK(rep.n_rows == 5);

    const char *csv = tmp_path("results.csv");
    CHECK_OK(ekv_report_write_csv(&rep, csv));
    char *s = tu_read_file(csv, NULL);
    CHECK(s && strcmp(s, "policy,kv_type,budget,metric,value,n\n"
                         "full,,1,ppl,12.5,100\n"
                         "h2o,,0.5,ppl,13.25,100\n"
                         "h2o,,0.5,rouge_l_f,0.75,5\n"
                         "h2o,,0.2,ppl,20,100\n"
                         "elastic,,0.2,rouge_l_f,nan,0\n") == 0);
    free(s);

    char *md = NULL;
    CHECK_OK(ekv_report_markdown(&rep, &md));
    CHECK_MSG(md && strcmp(md, "**stories260K on \"test\"**\n\n"
                               "| policy | budget | ppl | rouge_l_f |\n"
                               "|---|---:|---:|---:|\n"
                               "| full | 1 | 12.5 | - |\n"
                               "| h2o | 0.5 | 13.25 | 0.75 |\n"
                               "| h2o | 0.2 | 20 | - |\n"
                               "| elastic | 0.2 | - | nan |\n") == 0, "%s", md ? md : "(null)");
    free(md);
    CHECK_OK(ekv_report_write_markdown(&rep, tmp_path("results.md")));

    const char *js = tmp_path("results.json");
    CHECK_OK(ekv_report_write_json(&rep, js));
    s = tu_read_file(js, NULL);
    cJSON *root = s ? cJSON_Parse(s) : NULL;
    CHECK(root != NULL);
    if (root) {
        const cJSON *res = cJSON_GetObjectItem(root, "results");
        CHECK(cJSON_GetArraySize(res) == 5);
        const cJSON *r1 = cJSON_GetArrayItem(res, 1);
        CHECK(strcmp(cJSON_GetObjectItem(r1, "policy")->valuestring, "h2o") == 0);
        CHECK(cJSON_GetObjectItem(r1, "budget")->valuedouble == 0.5);
        CHECK(cJSON_GetObjectItem(r1, "value")->valuedouble == 13.25);
        CHECK(cJSON_GetObjectItem(r1, "n")->valuedouble == 100);
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(res, 4), "value")));
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "meta"), "items")->valuedouble == 5);
        CHECK(strcmp(cJSON_GetObjectItem(root, "title")->valuestring, "stories260K on \"test\"") == 0);
        cJSON_Delete(root);
    }
    free(s);

    /* gnuplot missing: a clear NOT_FOUND, the scripts are still written */
    struct ekv_plot_opts po = {.gnuplot = "ekv-test-no-such-gnuplot"};
    CHECK(ekv_report_plot(&rep, g_tmp, &po) == EKV_ERR_NOT_FOUND);
    CHECK(strstr(ekv_last_error(), "not found") != NULL);
    s = tu_read_file(tmp_path("ppl.gp"), NULL);
    CHECK(s && strstr(s, "$d1 << EOD\n0.2 20\n0.5 13.25\nEOD\n") != NULL); /* h2o sorted by budget */
    CHECK(s && strstr(s, "title \"full\"") != NULL && strstr(s, "set output \"ppl.png\"") != NULL);
    CHECK(s && strstr(s, "plot 12.5 with lines dt 2") != NULL); /* full: one budget, reference line */
    CHECK(s && strstr(s, "set xrange [0:1.05]") != NULL);
    free(s);
    /* real gnuplot, when installed (scripts/setup.sh installs gnuplot-nox) */
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        CHECK_OK(ekv_report_plot(&rep, g_tmp, NULL));
        static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
        CHECK(file_starts_with(tmp_path("ppl.png"), png, 8));
        CHECK(file_starts_with(tmp_path("rouge_l_f.png"), png, 8));
    } else {
        printf("test_eval_metrics: /usr/bin/gnuplot absent, PNG check skipped\n");
    }
    CHECK(ekv_report_plot(&rep, "", NULL) == EKV_ERR_INVALID_ARG);
    ekv_report_free(&rep);

    /* a storage-type axis: the type is part of a cell's key and a column */
    ekv_report_init(&rep);
    CHECK_OK(ekv_report_add_kv(&rep, "h2o", "f16", 0.5, "ppl", 13.0, 10));
    CHECK_OK(ekv_report_add_kv(&rep, "h2o", "q8_0/kivi4", 0.5, "ppl", 13.5, 10));
    CHECK_OK(ekv_report_add_kv(&rep, "h2o", "f16", 0.5, "kv_bytes_frac", 0.25, 1));
    CHECK_OK(ekv_report_add_kv(&rep, "h2o", "q8_0/kivi4", 0.5, "kv_bytes_frac", 0.1, 1));
    CHECK(ekv_report_add_kv(&rep, "h2o", "f16", 0.5, "ppl", 1.0, 1) == EKV_ERR_INVALID_ARG); /* duplicate */
    CHECK(ekv_report_add_kv(&rep, "h2o", "a,b", 0.5, "ppl", 1.0, 1) == EKV_ERR_INVALID_ARG);
    CHECK_OK(ekv_report_write_csv(&rep, csv));
    s = tu_read_file(csv, NULL);
    CHECK(s && strstr(s, "policy,kv_type,budget,metric,value,n\nh2o,f16,0.5,ppl,13,10\nh2o,q8_0/kivi4,0.5,ppl,13.5,10\n"));
    free(s);
    CHECK_OK(ekv_report_markdown(&rep, &md));
    CHECK_MSG(md && strstr(md, "| policy | kv_type | budget | ppl | kv_bytes_frac |\n|---|---|---:|---:|---:|\n"
                               "| h2o | f16 | 0.5 | 13 | 0.25 |\n| h2o | q8_0/kivi4 | 0.5 | 13.5 | 0.1 |\n"),
              "%s", md ? md : "(null)");
    free(md);
    CHECK(ekv_report_plot(&rep, g_tmp, &po) == EKV_ERR_NOT_FOUND); /* scripts written, no gnuplot */
    s = tu_read_file(tmp_path("pareto_ppl.gp"), NULL);
    CHECK(s && strstr(s, "$d1 << EOD\n0.1 13.5\nEOD\n") && strstr(s, "title \"h2o q8_0/kivi4\"") &&
          strstr(s, "set logscale x"));
    free(s);
    ekv_report_free(&rep);

    /* an interval (--compare-to's ppl_ratio_lo/_hi) draws error bars on its
     * metric's plot and no plots of its own; a series missing an end at one
     * budget keeps plain lines */
    ekv_report_init(&rep);
    const double rb[2] = {0.2, 0.5}, rv[2] = {1.1, 1.02}, rl[2] = {1.05, 0.99}, rh[2] = {1.2, 1.04};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ekv_report_add_kv(&rep, "h2o", NULL, rb[i], "ppl_ratio", rv[i], 9));
        CHECK_OK(ekv_report_add_kv(&rep, "h2o", NULL, rb[i], "ppl_ratio_lo", rl[i], 9));
        CHECK_OK(ekv_report_add_kv(&rep, "h2o", NULL, rb[i], "ppl_ratio_hi", rh[i], 9));
        CHECK_OK(ekv_report_add_kv(&rep, "tova", NULL, rb[i], "ppl_ratio", rv[i] + 0.5, 9));
    }
    CHECK_OK(ekv_report_add_kv(&rep, "tova", NULL, 0.2, "ppl_ratio_lo", 1.4, 9)); /* no _hi, no 0.5 */
    remove(tmp_path("ppl_ratio_lo.gp"));
    CHECK(ekv_report_plot(&rep, g_tmp, &po) == EKV_ERR_NOT_FOUND);
    s = tu_read_file(tmp_path("ppl_ratio.gp"), NULL);
    CHECK_MSG(s && strstr(s, "$d0 << EOD\n0.2 1.1 1.05 1.2\n0.5 1.02 0.99 1.04\nEOD\n") &&
                  strstr(s, "$d0 using 1:2:3:4 with yerrorlines") && strstr(s, "$d1 << EOD\n0.2 1.6\n0.5 1.52\nEOD\n") &&
                  strstr(s, "$d1 using 1:2 with linespoints"),
              "%s", s ? s : "(null)");
    free(s);
    CHECK(access(tmp_path("ppl_ratio_lo.gp"), F_OK) != 0);
    ekv_report_free(&rep);
}

/* The public error setters libekv_eval reports through (include/ekv.h):
 * the message, the status returned, a prefix, a cut at 1,023 bytes, per
 * thread clearing. */
static void test_error_api(void) {
    CHECK(ekv_error_set(EKV_ERR_FORMAT, "item %d: bad %s", 3, "answer") == EKV_ERR_FORMAT);
    CHECK(!strcmp(ekv_last_error(), "item 3: bad answer"));
    CHECK(ekv_error_prefix(EKV_ERR_IO, "set %s", "x.jsonl") == EKV_ERR_IO);
    CHECK(!strcmp(ekv_last_error(), "set x.jsonl: item 3: bad answer"));
    char big[3000];
    memset(big, 'a', sizeof big - 1), big[sizeof big - 1] = '\0';
    CHECK(ekv_error_set(EKV_ERR_INTERNAL, "%s", big) == EKV_ERR_INTERNAL && strlen(ekv_last_error()) == 1023);
    ekv_error_clear();
    CHECK(ekv_last_error()[0] == '\0');
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "%s/ekv_test_eval_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_error_api();
    test_rouge_sentence();
    test_rouge_pltrdy();
    test_rouge_pltrdy_reference();
    test_rouge_limits();
    test_perplexity();
    test_kl_top1();
    test_bootstrap();
    test_bootstrap_diff();
    test_sets();
    test_dataset_jsonl();
    test_dataset_huge_line();
    test_dataset_text();
    test_dataset_shipped_and_shared();
    test_grid_parsing();
    test_report();
    /* clean up the temporary directory */
    static const char *names[] = {"all.jsonl", "bad.jsonl", "nul.txt", "results.csv", "results.md",
                                  "results.json", "ppl.gp", "ppl.png", "rouge_l_f.gp", "pareto_ppl.gp", "kv_bytes_frac.gp",
                                  "rouge_l_f.png", "gnuplot.log"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tmp_path(names[i]));
    rmdir(g_tmp);
    return test_finish("test_eval_metrics");
}
