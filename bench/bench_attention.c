/*
 * bench_attention.c — time of one attention row (R query heads sharing a
 * KV head, n keys of size d) for the reference, the AVX2 path and, where
 * the CPU has it, the AVX-512 one (on f32 views), with and
 * without the statistics a policy such as Elastic Cache collects; the
 * attention share of prefill and long-context decode in docs/performance.md.
 *
 *   bench_attention [n=7500] [R=8] [d=64] [reps=50]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/attention.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef void (*row_fn)(const float *, int, int, const float *, const float *, int32_t, float, float *, float *,
                       const struct ekv_attn_stats *);

/* The AVX-512 row reads typed views: here f32 views of k and v, read in
 * place (as the prompt's f32 copies are). */
static float *g_rowbuf;
static void row_avx512_f32(const float *q, int R, int d, const float *k, const float *v, int32_t n, float scale,
                           float *o, float *p, const struct ekv_attn_stats *st) {
    const struct ekv_kv_view kv = {.type = EKV_KV_F32, .d = d, .n = n, .nq = n, .data = (const uint8_t *)k,
                                   .row_bytes = (size_t)d * sizeof(float)};
    struct ekv_kv_view vv = kv;
    vv.is_v = true;
    vv.data = (const uint8_t *)v;
    ekv_attn_row_kv_avx512(q, R, &kv, &vv, n, scale, o, p, g_rowbuf, st);
}

static double best_of(row_fn f, int reps, const float *q, int R, int d, const float *k, const float *v, int n,
                      float *o, float *p, const struct ekv_attn_stats *st) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        f(q, R, d, k, v, n, 0.125f, o, p, st);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 7500, R = argc > 2 ? atoi(argv[2]) : 8;
    const int d = argc > 3 ? atoi(argv[3]) : 64, reps = argc > 4 ? atoi(argv[4]) : 50;
    if (n < 1 || R < 1 || d < 8 || d % 8 || reps < 1) {
        fprintf(stderr, "usage: bench_attention [n] [R] [d multiple of 8] [reps]\n");
        return 2;
    }
    float *q = malloc(sizeof(float) * R * d), *k = malloc(sizeof(float) * n * d), *v = malloc(sizeof(float) * n * d);
    float *o = malloc(sizeof(float) * R * d), *p = malloc(sizeof(float) * R * n);
    double *colsum = calloc(n, 8), *sumsq = calloc(n, 8), *winsum = calloc(n, 8), sz = 0, stot = 0;
    int32_t *count = calloc(n, 4);
    float *lastrow = calloc(n, 4), *bincount = calloc(n, 4);
    if (!q || !k || !v || !o || !p || !colsum || !sumsq || !winsum || !count || !lastrow || !bincount) return 1;
    for (int i = 0; i < R * d; i++) q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (int i = 0; i < n * d; i++) k[i] = (float)((i * 53) % 103) / 103.0f - 0.5f;
    for (int i = 0; i < n * d; i++) v[i] = (float)((i * 61) % 107) / 107.0f - 0.5f;
    struct ekv_attn_stats st = {.flags = EKV_STAT_COLSUM | EKV_STAT_LASTROW, .colsum = colsum, .count = count,
                                .sumsq = sumsq, .lastrow = lastrow, .winsum = winsum, .bincount = bincount,
                                .sparse_zero = &sz, .sparse_total = &stot, .sparsity_p = 0.01f};
    const double flops = 4.0 * R * (double)n * d; /* QK and PV multiply-adds */
    const char *names[3] = {"reference", "avx2", "avx512"};
    row_fn fns[3] = {ekv_attn_row_ref, ekv_attn_row_avx2, row_avx512_f32};
    if (!(g_rowbuf = malloc(sizeof(float) * (size_t)EKV_ATTN_ROWS * (size_t)d))) return 1;
    const int n_fns = ekv_kernels_level() >= EKV_ISA_AVX512 ? 3 : 2;
    for (int i = 0; i < n_fns; i++) {
        double t = best_of(fns[i], reps, q, R, d, k, v, n, o, p, NULL);
        double ts = best_of(fns[i], reps, q, R, d, k, v, n, o, p, &st);
        printf("%-9s n=%d R=%d d=%d: %.1f us/row (%.1f GFLOP/s); with colsum+lastrow statistics %.1f us (+%.1f%%)\n",
               names[i], n, R, d, t * 1e6, flops / t / 1e9, ts * 1e6, 100.0 * (ts / t - 1.0));
    }
    free(g_rowbuf);
    return 0;
}
