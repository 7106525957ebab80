/*
 * test_batch_attend.c — ekv_kv_layer_forward_batch (the attention of all
 * sequences of a batched decode step as one pool job) against separate
 * ekv_kv_layer_forward calls per sequence: three caches with different
 * policies (full, h2o with column sums, tova with last rows) and prompt
 * lengths, a pool of 3 threads for the batch and none for the reference;
 * outputs, kept positions and statistics must agree bit for bit, and a
 * repeated cache or an empty batch is an error.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"
#include "testutil.h"

static uint64_t g_rng = 0xBA7C4;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

enum { L = 2, H = 8, G = 2, DD = 16, S = 3, STEPS = 6 };
static const char *const k_pol[S] = {"full", "h2o", "tova"};
static const int k_prompt[S] = {5, 17, 40};

static void fill(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = s * frand();
}

int main(void) {
    struct ekv_kv *a[S] = {NULL}, *b[S] = {NULL};
    struct ekv_pool *pool = NULL;
    CHECK_OK(ekv_pool_new(3, &pool));
    static float q[64][H * DD], k[64][G * DD], v[64][G * DD], o1[64][H * DD], o2[64][H * DD];
    for (int i = 0; i < S; i++) {
        struct ekv_kv_params p = ekv_kv_default_params();
        p.policy = k_pol[i];
        p.budget = i ? 0.5 : 1.0;
        CHECK_OK(ekv_kv_new(L, H, G, DD, &p, &a[i]));
        CHECK_OK(ekv_kv_new(L, H, G, DD, &p, &b[i]));
        if (!a[i] || !b[i]) goto done;
        /* same prompt into both copies, one sequence at a time */
        const int P = k_prompt[i];
        struct ekv_kv_step st = {.is_prompt = true, .last_chunk = true, .pos0 = 0, .n_new = P, .prompt_len = P};
        fill(&q[0][0], (size_t)P * H * DD, 2.0f);
        fill(&k[0][0], (size_t)P * G * DD, 2.0f);
        fill(&v[0][0], (size_t)P * G * DD, 1.0f);
        struct ekv_kv *both[2] = {a[i], b[i]};
        for (int c = 0; c < 2; c++) {
            CHECK_OK(ekv_kv_begin(both[c], &st));
            for (int il = 0; il < L; il++)
                CHECK_OK(ekv_kv_layer_forward(both[c], NULL, il, &st, &q[0][0], &k[0][0], &v[0][0], &o1[0][0]));
            CHECK_OK(ekv_kv_end(both[c], &st));
        }
    }
    /* decode steps: a one by one without a pool, b as one batch on the pool */
    for (int t = 0; t < STEPS; t++) {
        struct ekv_kv_step st[S];
        struct ekv_kv_part parts[S];
        fill(&q[0][0], (size_t)S * H * DD, 2.0f);
        fill(&k[0][0], (size_t)S * G * DD, 2.0f);
        fill(&v[0][0], (size_t)S * G * DD, 1.0f);
        for (int i = 0; i < S; i++) {
            st[i] = (struct ekv_kv_step){.pos0 = k_prompt[i] + t, .n_new = 1, .prompt_pos0 = k_prompt[i] + t};
            CHECK_OK(ekv_kv_begin(a[i], &st[i]));
            CHECK_OK(ekv_kv_begin(b[i], &st[i]));
            parts[i] = (struct ekv_kv_part){.kv = b[i], .step = &st[i], .q = q[i], .k = k[i], .v = v[i], .out = o2[i]};
        }
        for (int il = 0; il < L; il++) {
            for (int i = 0; i < S; i++)
                CHECK_OK(ekv_kv_layer_forward(a[i], NULL, il, &st[i], q[i], k[i], v[i], o1[i]));
            CHECK_OK(ekv_kv_layer_forward_batch(pool, il, parts, S));
            CHECK(memcmp(o1, o2, (size_t)S * sizeof o1[0]) == 0);
        }
        for (int i = 0; i < S; i++) {
            CHECK_OK(ekv_kv_end(a[i], &st[i]));
            CHECK_OK(ekv_kv_end(b[i], &st[i]));
        }
    }
    for (int i = 0; i < S; i++)
        for (int il = 0; il < L; il++)
            for (int g = 0; g < G; g++) {
                const struct ekv_kv_head *x = &a[i]->layers[il].heads[g], *y = &b[i]->layers[il].heads[g];
                CHECK(x->len == y->len && x->len > 0);
                CHECK(memcmp(x->pos, y->pos, (size_t)x->len * sizeof *x->pos) == 0);
                if (x->len == y->len && x->len > 0) {
                    float *kx = malloc((size_t)x->len * DD * sizeof(float)), *ky = malloc((size_t)x->len * DD * sizeof(float));
                    CHECK(kx && ky);
                    if (kx && ky) {
                        CHECK_OK(ekv_kv_head_gather(a[i], x, NULL, x->len, kx, NULL));
                        CHECK_OK(ekv_kv_head_gather(b[i], y, NULL, y->len, ky, NULL));
                        CHECK(memcmp(kx, ky, (size_t)x->len * DD * sizeof(float)) == 0);
                    }
                    free(kx);
                    free(ky);
                }
                if (x->colsum) CHECK(memcmp(x->colsum, y->colsum, (size_t)x->len * sizeof *x->colsum) == 0);
                if (x->lastrow) CHECK(memcmp(x->lastrow, y->lastrow, (size_t)x->len * sizeof *x->lastrow) == 0);
            }
    CHECK(a[1]->layers[0].heads[0].len < k_prompt[1] + STEPS); /* h2o did evict */
    {
        struct ekv_kv_step st = {.pos0 = 100, .n_new = 1, .prompt_pos0 = 100};
        struct ekv_kv_part twice[2] = {{.kv = b[0], .step = &st, .q = q[0], .k = k[0], .v = v[0], .out = o2[0]},
                                       {.kv = b[0], .step = &st, .q = q[1], .k = k[1], .v = v[1], .out = o2[1]}};
        CHECK(ekv_kv_layer_forward_batch(pool, 0, twice, 2) == EKV_ERR_INVALID_ARG);
        CHECK(ekv_kv_layer_forward_batch(pool, 0, twice, 0) == EKV_ERR_INVALID_ARG);
    }
done:
    for (int i = 0; i < S; i++) {
        ekv_kv_free(a[i]);
        ekv_kv_free(b[i]);
    }
    ekv_pool_free(pool);
    return test_finish("test_batch_attend");
}
