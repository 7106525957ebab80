/*
 * threadpool.c — a persistent pthread pool for the kernels. Every product
 * of a forward pass is one ekv_pool_run, so waking the workers must be
 * cheap: workers spin briefly on a generation counter and then sleep on a
 * condition variable; the calling thread runs task 0 itself. Each thread
 * owns a growable, 64-byte aligned scratch buffer.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kernels.h"

/* How many polls of the generation counter before sleeping. Short: the
 * machine may have fewer cores than the pool has threads. */
#define EKV_POOL_SPIN 20000

struct ekv_scratch {
    void *ptr;
    size_t cap;
};

struct ekv_worker {
    struct ekv_pool *pool;
    int ith;
    pthread_t tid;
};

struct ekv_pool {
    int n;                       /* threads including the caller */
    struct ekv_worker *workers;  /* [n - 1], worker i has ith = i + 1 */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_start;     /* generation changed or stop */
    pthread_cond_t cv_done;      /* pending reached 0 */
    atomic_uint generation;      /* bumped once per ekv_pool_run */
    atomic_int pending;          /* workers still running the current task */
    atomic_bool stop;
    ekv_task_fn fn;              /* current task, published before generation */
    void *ctx;
    struct ekv_scratch *scratch; /* [n + 1]: per thread, then the shared slot */
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

static void *worker_main(void *arg) {
    struct ekv_worker *w = arg;
    struct ekv_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int i = 0; g == seen && i < EKV_POOL_SPIN; i++) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
            if ((i & 255) == 255) sched_yield();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
                   !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        p->fn(p->ctx, w->ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_broadcast(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
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
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, false);
    for (int i = 0; i < n_threads - 1; i++) {
        struct ekv_worker *w = &p->workers[i];
        w->pool = p;
        w->ith = i + 1;
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
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->n);

    for (int i = 0; i < EKV_POOL_SPIN; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        if ((i & 255) == 255) sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
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
