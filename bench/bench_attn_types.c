/*
 * bench_attn_types.c — the attention share of one decode step by KV storage
 * type: a cache of the given shape (default TinyLlama-1.1B: 22 layers, 4 KV
 * heads of 64, 8 query heads per KV head) filled with `depth` random
 * entries per head through the cache API (so KIVI has its groups and fp16
 * residual), then one query row attended over every (layer, KV head), on
 * one thread, best of `reps`. Prints microseconds per decode step, the K/V
 * bytes read and the resulting GB/s, for the reference and the SIMD path.
 * docs/performance.md ("Decode by KV storage type") quotes it.
 *
 *   bench_attn_types [depth=4096] [reps=5] [types=f32,f16,q8_0,q4_0,kivi4,kivi2] [layers=22] [kv_heads=4] [R=8] [d=64]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"
#include "kv/kv.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

int main(int argc, char **argv) {
    const int depth = argc > 1 ? atoi(argv[1]) : 4096, reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *types = argc > 3 ? argv[3] : "f32,f16,q8_0,q4_0,kivi4,kivi2";
    const int L = argc > 4 ? atoi(argv[4]) : 22, G = argc > 5 ? atoi(argv[5]) : 4, R = argc > 6 ? atoi(argv[6]) : 8;
    const int d = argc > 7 ? atoi(argv[7]) : 64;
    if (depth < 1 || reps < 1 || L < 1 || G < 1 || R < 1 || d < 8 || d % 8) {
        fprintf(stderr, "usage: bench_attn_types [depth] [reps] [types] [layers] [kv_heads] [R] [d]\n");
        return 2;
    }
    float *q = malloc(sizeof(float) * (size_t)R * d), *o = malloc(sizeof(float) * (size_t)R * d);
    float *p = malloc(sizeof(float) * (size_t)R * depth), *rowbuf = malloc(sizeof(float) * EKV_ATTN_ROWS * (size_t)d);
    float *k = malloc(sizeof(float) * (size_t)d), *v = malloc(sizeof(float) * (size_t)d);
    if (!q || !o || !p || !rowbuf || !k || !v) return 1;
    for (int i = 0; i < R * d; i++) q[i] = frand();
    char *list = strdup(types);
    printf("attention of one decode step: %d layers x %d KV heads x %d query heads, d %d, depth %d, 1 thread, best of %d\n",
           L, G, R, d, depth, reps);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        enum ekv_kv_type t;
        if (ekv_kv_type_parse(tok, &t) != EKV_OK) {
            fprintf(stderr, "%s\n", ekv_last_error());
            return 2;
        }
        struct ekv_kv_params kp = ekv_kv_default_params();
        kp.type_k = kp.type_v = t;
        struct ekv_kv *kv = NULL;
        if (ekv_kv_new(L, G * R, G, d, &kp, &kv) != EKV_OK) {
            fprintf(stderr, "%s: %s\n", tok, ekv_last_error());
            return 1;
        }
        for (int il = 0; il < L; il++) {
            if (ekv_kv_reserve(kv, il, depth) != EKV_OK) return 1;
            for (int hk = 0; hk < G; hk++)
                for (int j = 0; j < depth; j++) {
                    for (int c = 0; c < d; c++) k[c] = frand(), v[c] = frand();
                    ekv_kv_head_append(kv, &kv->layers[il].heads[hk], k, v, j, 0, NULL);
                }
            if (ekv_kv_flush(kv, il) != EKV_OK) return 1;
        }
        const double bytes = (double)ekv_kv_bytes(kv);
        for (int simd = 1; simd >= 0; simd--) {
            if (simd && !ekv_cpu_has_avx2()) continue; /* quant.h */
            ekv_kernels_use_reference(!simd);
            double best = 1e30;
            for (int r = 0; r < (simd ? reps : 1); r++) {
                const double t0 = now();
                for (int il = 0; il < L; il++)
                    for (int hk = 0; hk < G; hk++) {
                        const struct ekv_kv_head *h = &kv->layers[il].heads[hk];
                        const struct ekv_kv_view kw = ekv_store_view(&kv->fk, &h->ks, h->len);
                        const struct ekv_kv_view vw = ekv_store_view(&kv->fv, &h->vs, h->len);
                        ekv_attn_row_kv(q, R, &kw, &vw, h->len, 0.125f, o, p, rowbuf, NULL);
                    }
                const double dt = now() - t0;
                best = dt < best ? dt : best;
            }
            printf("%-6s %-9s %9.0f us/step  K+V %7.1f MiB  %6.1f GB/s\n", tok, simd ? ekv_kernels_isa() : "reference",
                   best * 1e6, bytes / 1048576.0, bytes / best / 1e9);
        }
        ekv_kernels_use_reference(false);
        ekv_kv_free(kv);
    }
    free(list);
    free(q);
    free(o);
    free(p);
    free(rowbuf);
    free(k);
    free(v);
    return 0;
}
