/*
 * bench_matvec.c — measures matrix-vector and matrix-matrix throughput of
 * ekv's kernels for one weight shape and type: weight GB/s for matvec
 * (what decoding is bound by) and GFLOP/s for matmul (prefill).
 *
 *   bench_matvec [type=q8_0] [rows=5632] [cols=2048] [threads=1] [prefill_rows=64] [ref|rows|x16]
 *
 * The weights are laid out as the model loader lays them out: Q8_0/Q4_0
 * matrices of a multiple of 16 rows repacked 16 rows interleaved
 * (EKV_LAYOUT_X16; `x16` says so explicitly), others as in the file.
 * rows: the file's row layout (what `ekv run --no-repack` uses); ref: the
 * plain-C kernels. EKV_ISA=avx2|avxvnni|avx512 caps the SIMD level.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"
#include "kernels/kernels.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void noop(void *ctx, int ith, int nth) { (void)ctx; (void)ith; (void)nth; }

int main(int argc, char **argv) {
    enum ekv_dtype t = EKV_Q8_0;
    if (argc > 1 && !ekv_dtype_from_name(argv[1], &t)) {
        fprintf(stderr, "unknown type %s\n", argv[1]);
        return 2;
    }
    const int64_t ne1 = argc > 2 ? atoll(argv[2]) : 5632, ne0 = argc > 3 ? atoll(argv[3]) : 2048;
    const int nth = argc > 4 ? atoi(argv[4]) : 1;
    const int64_t np = argc > 5 ? atoll(argv[5]) : 64;
    if (argc > 6 && strcmp(argv[6], "ref") == 0) ekv_kernels_use_reference(true);
    const bool rows_layout = argc > 6 && strcmp(argv[6], "rows") == 0;
    size_t rb;
    if (!ekv_dtype_can_compute(t) || !ekv_dtype_row_bytes(t, ne0, &rb) || ne1 <= 0 || nth < 1 || np < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    char *w = malloc(rb * ne1);
    float *row = malloc(ne0 * sizeof(float)), *x = malloc(np * ne0 * sizeof(float)), *y = malloc(np * ne1 * sizeof(float));
    unsigned s = 1;
    for (int64_t r = 0; r < ne1; r++) {
        for (int64_t i = 0; i < ne0; i++) row[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
        ekv_quantize_row(t, row, w + r * rb, ne0);
    }
    for (int64_t i = 0; i < np * ne0; i++) x[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
    struct ekv_pool *pool = NULL;
    if (ekv_pool_new(nth, &pool) != EKV_OK) return 1;
    struct ekv_weight wt = {.type = t, .ne0 = ne0, .ne1 = ne1, .row_bytes = rb, .data = w};
    /* as the loader: repacked where it can be (ekv_weights_repack_mapped) */
    if (argc > 6 && strcmp(argv[6], "x16") == 0 && !ekv_weight_can_repack(&wt)) {
        fprintf(stderr, "cannot repack: not a Q8_0/Q4_0 matrix of a multiple of 16 rows\n");
        return 2;
    }
    const bool x16 = !rows_layout && ekv_weight_can_repack(&wt);
    if (x16 && ekv_weight_repack(&wt, w) != EKV_OK) {
        fprintf(stderr, "cannot repack: %s\n", ekv_last_error());
        return 2;
    }
    ekv_matvec(pool, &wt, x, y);
    /* best and mean of repeated runs over about a second each (the best is
     * the less noisy figure on a shared machine) */
    double best = 1e30, total = 0;
    int reps = 0;
    do {
        double t0 = now();
        ekv_matvec(pool, &wt, x, y);
        double el = now() - t0;
        best = el < best ? el : best;
        total += el;
        reps++;
    } while (total < 1.0);
    const double bytes = (double)rb * ne1;
    printf("%s%s %s matvec [%lld x %lld] %d thread(s): best %.3f ms = %.2f GB/s, mean %.3f ms = %.2f GB/s\n",
           ekv_dtype_name(t), x16 ? " x16" : "", ekv_kernels_isa(), (long long)ne1, (long long)ne0, nth, best * 1e3,
           bytes / best / 1e9, total / reps * 1e3, bytes * reps / total / 1e9);
    best = 1e30;
    total = 0;
    reps = 0;
    do {
        double t0 = now();
        ekv_matmul(pool, &wt, x, np, y);
        double el = now() - t0;
        best = el < best ? el : best;
        total += el;
        reps++;
    } while (total < 1.0);
    printf("%s %s matmul [%lld x %lld] x %lld rows %d thread(s): best %.3f ms = %.1f GFLOP/s, mean %.1f GFLOP/s\n",
           ekv_dtype_name(t), ekv_kernels_isa(), (long long)ne1, (long long)ne0, (long long)np, nth, best * 1e3,
           2.0 * ne0 * ne1 * np / best / 1e9, 2.0 * ne0 * ne1 * np * reps / total / 1e9);
    /* cost of waking the pool for an empty task */
    double t0 = now();
    for (int i = 0; i < 20000; i++) ekv_pool_run(pool, noop, NULL);
    printf("pool of %d: %.2f us per empty ekv_pool_run\n", nth, (now() - t0) / 20000 * 1e6);
    ekv_pool_free(pool);
    free(w); free(row); free(x); free(y);
    return 0;
}
