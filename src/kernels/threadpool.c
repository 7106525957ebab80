/*
 * threadpool.c — a persistent pthread pool for the kernels. Every product
 * of a forward pass is one ekv_pool_run, so starting a job must be cheap
 * and must not stall when the machine is busy: the n parts of a job are
 * claimed from a shared counter by whichever threads run (the caller takes
 * parts too, and does them all if the workers are not scheduled); idle
 * workers spin briefly on the job word and then sleep on a condition
 * variable. Each part index owns a growable, 64-byte aligned scratch buffer.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kernels.h"

/* Polls of the job word before a waiting thread sleeps (with a CPU pause
 * between polls, and a yield every 256). */
#define EKV_POOL_SPIN 8192

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#else
static inline void cpu_relax(void) {}
#endif

struct ekv_scratch {
    void *ptr;
    size_t cap;
};

struct ekv_worker {
    struct ekv_pool *pool;
    pthread_t tid;
};

/* A job is n parts fn(ctx, i, n), i < n. Parts are claimed from a shared
 * counter by whichever threads are running — the caller included — so a
 * job never waits for a thread the OS has not scheduled yet (the normal
 * case on a machine with more runnable threads than cores); part i still
 * computes exactly what it would on thread i, so results do not depend on
 * who ran it. `job` packs the job's generation (high 32 bits) with the
 * next part to claim (low 32 bits): a claim is a compare-and-swap that only
 * succeeds while that job is still the current one. */
struct ekv_pool {
    int n;                        /* threads including the caller = parts per job */
    struct ekv_worker *workers;   /* [n - 1] */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_start;      /* a new job or stop */
    pthread_cond_t cv_done;       /* the last part of a job finished */
    _Atomic uint64_t job;         /* generation << 32 | next part */
    atomic_int done;              /* parts finished in the current job */
    atomic_int sleepers;          /* workers blocked on cv_start */
    atomic_bool stop;
    _Atomic(ekv_task_fn) fn;      /* current job, published before `job` */
    _Atomic(void *) ctx;
    struct ekv_scratch *scratch;  /* [n + 1]: per part index, then the shared slot */
};

static void *grow(struct ekv_scratch *s, size_t bytes) {
    if (bytes == 0) bytes = 64;
    if (s->cap >= bytes) return s->ptr;
    size_t cap;
    if (!ekv_add_ok(bytes, 63, &cap)) return NULL;
    cap &= ~(size_t)63;
    void *p = aligned_alloc(64, cap);
    if (!p) return NULL;
    free(s->ptr);
    s->ptr = p;
    s->cap = cap;
    return p;
}

/* Runs parts of job generation `gen` until none is left to claim. */
static void run_parts(struct ekv_pool *p, uint32_t gen) {
    const uint32_t n = (uint32_t)p->n;
    uint64_t st = atomic_load_explicit(&p->job, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(st >> 32) != gen || (uint32_t)st >= n) return;
        ekv_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        /* succeeds only while job `gen` is current, so fn/ctx are its own */
        if (!atomic_compare_exchange_weak_explicit(&p->job, &st, st + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(ctx, (int)(uint32_t)st, (int)n);
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == (int)n) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_broadcast(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
        st = atomic_load_explicit(&p->job, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    struct ekv_worker *w = arg;
    struct ekv_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = (uint32_t)(atomic_load_explicit(&p->job, memory_order_acquire) >> 32);
        for (int i = 0; g == seen && i < EKV_POOL_SPIN; i++) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
            cpu_relax();
            if ((i & 255) == 255) sched_yield();
            g = (uint32_t)(atomic_load_explicit(&p->job, memory_order_acquire) >> 32);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = (uint32_t)(atomic_load(&p->job) >> 32)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv_start, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        run_parts(p, g);
    }
}

enum ekv_status ekv_pool_new(int n_threads, struct ekv_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return ekv_err(EKV_ERR_INVALID_ARG, "thread pool: n_threads %d not in [1, 1024]", n_threads);
    struct ekv_pool *p = calloc(1, sizeof(*p));
    if (!p) return ekv_err(EKV_ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    p->scratch = calloc((size_t)n_threads + 1, sizeof(*p->scratch));
    p->workers = calloc((size_t)n_threads, sizeof(*p->workers));
    if (!p->scratch || !p->workers) {
        free(p->scratch);
        free(p->workers);
        free(p);
        return ekv_err(EKV_ERR_NOMEM, "thread pool: out of memory");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->job, (uint64_t)(uint32_t)n_threads); /* generation 0, nothing to claim */
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    for (int i = 0; i < n_threads - 1; i++) {
        struct ekv_worker *w = &p->workers[i];
        w->pool = p;
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            ekv_pool_free(p);
            return ekv_err(EKV_ERR_NOMEM, "thread pool: cannot start thread %d of %d", i + 1, n_threads);
        }
        p->n_started++;
    }
    *out = p;
    return EKV_OK;
}

void ekv_pool_free(struct ekv_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].tid, NULL);
    for (int i = 0; i <= p->n; i++) free(p->scratch[i].ptr);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->scratch);
    free(p->workers);
    free(p);
}

int ekv_pool_size(const struct ekv_pool *p) { return p ? p->n : 1; }

void ekv_pool_run(struct ekv_pool *p, ekv_task_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint32_t gen = (uint32_t)(atomic_load_explicit(&p->job, memory_order_relaxed) >> 32) + 1;
    atomic_store(&p->job, (uint64_t)gen << 32); /* seq_cst: pairs with the sleepers check below */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }
    run_parts(p, gen);
    /* every part is claimed; wait for those other threads are still running */
    for (int i = 0; i < EKV_POOL_SPIN; i++) {
        if (atomic_load_explicit(&p->done, memory_order_acquire) == p->n) return;
        cpu_relax();
        if ((i & 255) == 255) sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->done, memory_order_acquire) != p->n) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* Scratch for calls without a pool: one per calling thread. */
static _Thread_local struct ekv_scratch tls_scratch[2];

void *ekv_pool_scratch(struct ekv_pool *p, int ith, size_t bytes) {
    if (!p) return ith == 0 ? grow(&tls_scratch[0], bytes) : NULL;
    if (ith < 0 || ith >= p->n) return NULL;
    return grow(&p->scratch[ith], bytes);
}

void *ekv_pool_scratch_shared(struct ekv_pool *p, size_t bytes) {
    if (!p) return grow(&tls_scratch[1], bytes);
    return grow(&p->scratch[p->n], bytes);
}
