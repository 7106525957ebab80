/*
 * matmul.c — matrix-vector and matrix-matrix products over GGUF weight
 * types, driven by the thread pool, and the run-time choice between the
 * reference kernels (quant.c) and the AVX2 ones (*_avx2.c).
 *
 * Work is split by weight rows: each output element is computed by
 * exactly one thread with a fixed summation order, so results do not
 * depend on the thread count. Quantised weights are multiplied with an
 * activation quantised once per call (Q8_0 for Q4_0/Q8_0, Q8_K for the
 * K-quants) using integer block dots, as llama.cpp does.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

/* ------------------------------------------------------------------ */
/* Dispatch                                                             */
/* ------------------------------------------------------------------ */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_has_avx2;
static struct ekv_type_kernels g_simd[EKV_DTYPE_COUNT]; /* reference entries overridden by AVX2 */
static atomic_bool g_force_ref;

bool ekv_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

static void init_dispatch(void) {
    g_has_avx2 = ekv_cpu_has_avx2();
    for (int t = 0; t < EKV_DTYPE_COUNT; t++) {
        g_simd[t] = *ekv_kernels_ref((enum ekv_dtype)t);
        if (g_has_avx2) ekv_kernels_avx2_fill((enum ekv_dtype)t, &g_simd[t]);
    }
}

bool ekv_kernels_simd(void) {
    pthread_once(&g_once, init_dispatch);
    return g_has_avx2 && !atomic_load_explicit(&g_force_ref, memory_order_relaxed);
}

void ekv_kernels_use_reference(bool on) { atomic_store(&g_force_ref, on); }

const char *ekv_kernels_isa(void) { return ekv_kernels_simd() ? "avx2" : "reference"; }

static const struct ekv_type_kernels *kernels_for(enum ekv_dtype t) {
    return ekv_kernels_simd() ? &g_simd[t] : ekv_kernels_ref(t);
}

bool ekv_dtype_can_compute(enum ekv_dtype t) {
    return (unsigned)t < EKV_DTYPE_COUNT && ekv_kernels_ref(t)->vec_dot != NULL;
}

/* ------------------------------------------------------------------ */
/* Codecs                                                               */
/* ------------------------------------------------------------------ */

static enum ekv_status block_check(enum ekv_dtype t, int64_t n, const void *src, const void *dst,
                                   const char *what) {
    const struct ekv_dtype_info *ti = ekv_dtype_get((uint32_t)t);
    if (!ti->name) return ekv_err(EKV_ERR_UNSUPPORTED, "%s: unknown type id %d", what, (int)t);
    if (n < 0 || n % ti->block_size)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: %lld elements is not a multiple of the %s block size %u", what,
                       (long long)n, ti->name, ti->block_size);
    if (n > 0 && (!src || !dst)) return ekv_err(EKV_ERR_INVALID_ARG, "%s: NULL source or destination", what);
    return EKV_OK;
}

enum ekv_status ekv_dequantize_row(enum ekv_dtype t, const void *src, float *dst, int64_t n) {
    enum ekv_status s = block_check(t, n, src, dst, "dequantize");
    if (s != EKV_OK) return s;
    switch (t) {
    case EKV_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case EKV_F16: ekv_dequant_f16(src, dst, n); break;
    case EKV_BF16: ekv_dequant_bf16(src, dst, n); break;
    case EKV_Q8_0: ekv_dequant_q8_0(src, dst, n); break;
    case EKV_Q4_0: ekv_dequant_q4_0(src, dst, n); break;
    case EKV_Q4_K: ekv_dequant_q4_K(src, dst, n); break;
    case EKV_Q5_K: ekv_dequant_q5_K(src, dst, n); break;
    case EKV_Q6_K: ekv_dequant_q6_K(src, dst, n); break;
    case EKV_Q8_K: ekv_dequant_q8_K(src, dst, n); break;
    default: return ekv_err(EKV_ERR_UNSUPPORTED, "dequantize: type %s is not supported", ekv_dtype_name(t));
    }
    return EKV_OK;
}

enum ekv_status ekv_quantize_row(enum ekv_dtype t, const float *src, void *dst, int64_t n) {
    enum ekv_status s = block_check(t, n, src, dst, "quantize");
    if (s != EKV_OK) return s;
    switch (t) {
    case EKV_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case EKV_F16: ekv_quant_f16(src, dst, n); break;
    case EKV_BF16: ekv_quant_bf16(src, dst, n); break;
    case EKV_Q8_0: ekv_quant_q8_0(src, dst, n); break;
    case EKV_Q4_0: ekv_quant_q4_0(src, dst, n); break;
    case EKV_Q4_K: ekv_quant_q4_K(src, dst, n); break;
    case EKV_Q5_K: ekv_quant_q5_K(src, dst, n); break;
    case EKV_Q6_K: ekv_quant_q6_K(src, dst, n); break;
    case EKV_Q8_K: ekv_quant_q8_K(src, dst, n); break;
    default: return ekv_err(EKV_ERR_UNSUPPORTED, "quantize: type %s is not supported", ekv_dtype_name(t));
    }
    return EKV_OK;
}

/* ------------------------------------------------------------------ */
/* Products                                                             */
/* ------------------------------------------------------------------ */

static enum ekv_status check_weight(const struct ekv_weight *w, const char *what) {
    if (!w) return ekv_err(EKV_ERR_INVALID_ARG, "%s: NULL weight", what);
    if (!ekv_dtype_can_compute(w->type))
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: weight type %s has no kernels", what, ekv_dtype_name(w->type));
    size_t rb;
    if (w->ne0 < 0 || w->ne1 < 0 || !ekv_dtype_row_bytes(w->type, w->ne0, &rb))
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: bad %s shape [%lld x %lld]", what, ekv_dtype_name(w->type),
                       (long long)w->ne1, (long long)w->ne0);
    if (w->row_bytes < rb)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: row_bytes %zu < %zu needed for %lld %s values", what,
                       w->row_bytes, rb, (long long)w->ne0, ekv_dtype_name(w->type));
    if (!w->data && w->ne1 > 0 && w->ne0 > 0) return ekv_err(EKV_ERR_INVALID_ARG, "%s: NULL weight data", what);
    return EKV_OK;
}

struct mm_ctx {
    const struct ekv_weight *w;
    const struct ekv_type_kernels *k;
    const float *x;        /* [n][ne0] float activations (for quantising) */
    const void *xa;        /* activations in the kernel's format */
    size_t xa_stride;      /* bytes between activation rows */
    int64_t n;             /* activation rows */
    float *y;              /* [n][ne1] */
};

/* Rows [r0, r1) of thread ith: contiguous ranges in multiples of 8 rows. */
static void split_rows(int64_t ne1, int ith, int nth, int64_t *r0, int64_t *r1) {
    int64_t per = (ne1 + nth - 1) / nth;
    per = (per + 7) & ~(int64_t)7;
    *r0 = EKV_MIN(ne1, per * ith);
    *r1 = EKV_MIN(ne1, *r0 + per);
}

static void gemv_task(void *arg, int ith, int nth) {
    const struct mm_ctx *c = arg;
    int64_t r0, r1;
    split_rows(c->w->ne1, ith, nth, &r0, &r1);
    if (r0 >= r1) return;
    if (c->k->gemv) {
        c->k->gemv(c->w, r0, r1, c->xa, c->y);
        return;
    }
    const char *base = c->w->data;
    for (int64_t r = r0; r < r1; r++) c->k->vec_dot(c->w->ne0, &c->y[r], base + (size_t)r * c->w->row_bytes, c->xa);
}

static void gemm_task(void *arg, int ith, int nth) {
    const struct mm_ctx *c = arg;
    int64_t r0, r1;
    split_rows(c->w->ne1, ith, nth, &r0, &r1);
    if (r0 >= r1) return;
    if (c->k->gemm) {
        c->k->gemm(c->w, r0, r1, c->xa, c->xa_stride, c->n, c->y, c->w->ne1);
        return;
    }
    /* blocks of activation rows stay in cache while the weight rows stream */
    const char *base = c->w->data;
    const char *xa = c->xa;
    for (int64_t t0 = 0; t0 < c->n; t0 += 16) {
        const int64_t t1 = EKV_MIN(c->n, t0 + 16);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = t0; t < t1; t++)
                c->k->vec_dot(c->w->ne0, &c->y[t * c->w->ne1 + r], base + (size_t)r * c->w->row_bytes,
                              xa + (size_t)t * c->xa_stride);
    }
}

static void quantize_task(void *arg, int ith, int nth) {
    const struct mm_ctx *c = arg;
    for (int64_t t = ith; t < c->n; t += nth)
        c->k->quantize_act(c->x + t * c->w->ne0, (char *)c->xa + (size_t)t * c->xa_stride, c->w->ne0);
}

/* Small products are not worth waking the workers for. */
static struct ekv_pool *pool_for(struct ekv_pool *p, const struct ekv_weight *w, int64_t n) {
    return (double)w->ne0 * (double)w->ne1 * (double)n < 16384.0 ? NULL : p;
}

static enum ekv_status product(struct ekv_pool *p, const struct ekv_weight *w, const float *x, int64_t n,
                               float *y, const char *what) {
    enum ekv_status s = check_weight(w, what);
    if (s != EKV_OK) return s;
    if (n < 0) return ekv_err(EKV_ERR_INVALID_ARG, "%s: negative row count %lld", what, (long long)n);
    if (n == 0 || w->ne1 == 0) return EKV_OK;
    if (!x || !y) return ekv_err(EKV_ERR_INVALID_ARG, "%s: NULL input or output", what);
    if (w->ne0 == 0) {
        memset(y, 0, (size_t)n * (size_t)w->ne1 * sizeof(float));
        return EKV_OK;
    }
    struct mm_ctx c = {.w = w, .k = kernels_for(w->type), .x = x, .n = n, .y = y};
    struct ekv_pool *pp = pool_for(p, w, n);
    if (c.k->quantize_act) {
        size_t rb, total;
        if (!ekv_dtype_row_bytes(ekv_act_type(w->type), w->ne0, &rb) || !ekv_mul_ok(rb, (size_t)n, &total))
            return ekv_err(EKV_ERR_OVERFLOW, "%s: activation buffer size overflows", what);
        void *buf = ekv_pool_scratch_shared(p, total);
        if (!buf) return ekv_err(EKV_ERR_NOMEM, "%s: cannot allocate %zu bytes of activation scratch", what, total);
        c.xa = buf;
        c.xa_stride = rb;
        if (n == 1)
            c.k->quantize_act(x, buf, w->ne0);
        else
            ekv_pool_run(pp, quantize_task, &c);
    } else {
        c.xa = x;
        c.xa_stride = (size_t)w->ne0 * sizeof(float);
    }
    ekv_pool_run(pp, n == 1 ? gemv_task : gemm_task, &c);
    return EKV_OK;
}

enum ekv_status ekv_matvec(struct ekv_pool *p, const struct ekv_weight *w, const float *x, float *y) {
    return product(p, w, x, 1, y, "matvec");
}

enum ekv_status ekv_matmul(struct ekv_pool *p, const struct ekv_weight *w, const float *x, int64_t n, float *y) {
    return product(p, w, x, n, y, "matmul");
}

enum ekv_status ekv_weight_get_row(const struct ekv_weight *w, int64_t r, float *dst) {
    if (!w) return ekv_err(EKV_ERR_INVALID_ARG, "get_row: NULL weight");
    size_t rb;
    if (w->ne0 < 0 || !ekv_dtype_row_bytes(w->type, w->ne0, &rb) || w->row_bytes < rb)
        return ekv_err(EKV_ERR_INVALID_ARG, "get_row: bad %s weight of %lld columns", ekv_dtype_name(w->type),
                       (long long)w->ne0);
    if (r < 0 || r >= w->ne1)
        return ekv_err(EKV_ERR_INVALID_ARG, "get_row: row %lld out of range [0, %lld)", (long long)r,
                       (long long)w->ne1);
    if (!w->data || !dst) return ekv_err(EKV_ERR_INVALID_ARG, "get_row: NULL data or destination");
    return ekv_dequantize_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, dst, w->ne0);
}
