/*
 * bench_membw.c — measures memory read bandwidth the way a decode step
 * reads weights: each of T threads streams its share of one large buffer
 * (far larger than the caches) and sums it, so the roofline in
 * docs/performance.md uses a number measured on the same machine.
 *
 *   bench_membw [MiB=1024] [threads=1] [passes=5] [streams=1]   -> best and median GB/s
 *
 * streams > 1: each thread reads its share as that many parts far apart,
 * a block of each in turn (as ekv's F16 decode takes rows from four
 * quarters of its range): on some hosts (an AMD EPYC Zen 4 VM) one thread
 * reads more that way than from one sequence.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct part {
    const uint64_t *p;
    size_t n;
    int streams;
    uint64_t sum;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 64-byte vectors (GCC splits them into what the target has), four
 * independent sums so the loop is bound by loads, not by adds; cloned for
 * AVX-512 and AVX2 and picked at run time, as the kernels are: a scalar
 * loop of 8-byte loads reads only ~2/3 of the bandwidth wide loads reach. */
typedef uint64_t v8u64 __attribute__((vector_size(64)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static uint64_t sum_range(const uint64_t *p, size_t n) {
    v8u64 a = {0}, b = {0}, c = {0}, d = {0};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        v8u64 x0, x1, x2, x3;
        memcpy(&x0, p + i, 64);
        memcpy(&x1, p + i + 8, 64);
        memcpy(&x2, p + i + 16, 64);
        memcpy(&x3, p + i + 24, 64);
        a += x0;
        b += x1;
        c += x2;
        d += x3;
    }
    v8u64 t = a + b + c + d;
    uint64_t s = 0;
    for (int l = 0; l < 8; l++) s += t[l];
    for (; i < n; i++) s += p[i];
    return s;
}

/* blocks of 1 KiB (128 words) from each of s parts in turn */
static void *reader(void *arg) {
    struct part *pt = arg;
    const int s = pt->streams;
    if (s <= 1) {
        pt->sum = sum_range(pt->p, pt->n);
        return NULL;
    }
    const size_t q = pt->n / (size_t)s / 128 * 128, blk = 128;
    uint64_t sum = 0;
    for (size_t i = 0; i < q; i += blk)
        for (int j = 0; j < s; j++) sum += sum_range(pt->p + (size_t)j * q + i, blk);
    sum += sum_range(pt->p + (size_t)s * q, pt->n - (size_t)s * q);
    pt->sum = sum;
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    const int nth = argc > 2 ? atoi(argv[2]) : 1;
    const int passes = argc > 3 ? atoi(argv[3]) : 5;
    const int streams = argc > 4 ? atoi(argv[4]) : 1;
    if (mib < 1 || nth < 1 || nth > 64 || passes < 1 || passes > 100 || streams < 1 || streams > 64) {
        fprintf(stderr, "usage: bench_membw [MiB] [threads] [passes] [streams per thread]\n");
        return 2;
    }
    const size_t n = mib * 1048576 / sizeof(uint64_t);
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double gbs[100];
    uint64_t total = 0;
    for (int ps = 0; ps < passes; ps++) {
        pthread_t tid[64];
        struct part pt[64];
        double t0 = now();
        for (int t = 0; t < nth; t++) {
            size_t a = n * (size_t)t / (size_t)nth, b = n * (size_t)(t + 1) / (size_t)nth;
            pt[t] = (struct part){buf + a, b - a, streams, 0};
            if (pthread_create(&tid[t], NULL, reader, &pt[t]) != 0) return 1;
        }
        for (int t = 0; t < nth; t++) {
            pthread_join(tid[t], NULL);
            total += pt[t].sum;
        }
        gbs[ps] = (double)(n * sizeof *buf) / (now() - t0) / 1e9;
    }
    qsort(gbs, (size_t)passes, sizeof gbs[0], cmp);
    printf("read bandwidth, %zu MiB, %d thread(s), %d stream(s) each, %d passes: best %.2f GB/s, median %.2f GB/s "
           "(checksum %llu)\n",
           mib, nth, streams, passes, gbs[passes - 1], gbs[passes / 2], (unsigned long long)(total & 0xffff));
    free(buf);
    return 0;
}
