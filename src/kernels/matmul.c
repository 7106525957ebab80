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
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

/* ------------------------------------------------------------------ */
/* Dispatch                                                             */
/* ------------------------------------------------------------------ */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static enum ekv_isa g_cpu_isa;                                  /* the best level the CPU runs */
static struct ekv_type_kernels g_tab[EKV_ISA_COUNT][EKV_DTYPE_COUNT]; /* per level, filled up to g_cpu_isa */
static atomic_int g_isa;                                        /* selected level */
static atomic_bool g_force_ref;

static const char *const k_isa_names[EKV_ISA_COUNT] = {"reference", "avx2", "avxvnni", "avx512"};

bool ekv_cpu_has_avx2(void) { return ekv_cpu_isa() >= EKV_ISA_AVX2; }

enum ekv_isa ekv_cpu_isa(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return EKV_ISA_REF;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return EKV_ISA_AVX512;
    if (__builtin_cpu_supports("avxvnni")) return EKV_ISA_AVXVNNI;
    return EKV_ISA_AVX2;
#else
    return EKV_ISA_REF;
#endif
}

static bool cpu_has_avxvnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avxvnni");
#else
    return false;
#endif
}

static int isa_by_name(const char *name) {
    for (int i = 0; i < EKV_ISA_COUNT; i++)
        if (name && strcmp(name, k_isa_names[i]) == 0) return i;
    return -1;
}

static void init_dispatch(void) {
    g_cpu_isa = ekv_cpu_isa();
    for (int t = 0; t < EKV_DTYPE_COUNT; t++) {
        const enum ekv_dtype dt = (enum ekv_dtype)t;
        g_tab[EKV_ISA_REF][t] = *ekv_kernels_ref(dt);
        if (g_cpu_isa >= EKV_ISA_AVX2) {
            g_tab[EKV_ISA_AVX2][t] = g_tab[EKV_ISA_REF][t];
            ekv_kernels_avx2_fill(dt, &g_tab[EKV_ISA_AVX2][t]);
        }
        if (g_cpu_isa >= EKV_ISA_AVXVNNI) {
            g_tab[EKV_ISA_AVXVNNI][t] = g_tab[EKV_ISA_AVX2][t];
            /* AVX-512 CPUs need not have the VEX-encoded AVX-VNNI */
            if (cpu_has_avxvnni()) ekv_kernels_avxvnni_fill(dt, &g_tab[EKV_ISA_AVXVNNI][t]);
        }
        if (g_cpu_isa >= EKV_ISA_AVX512) {
            g_tab[EKV_ISA_AVX512][t] = g_tab[EKV_ISA_AVX2][t];
            ekv_kernels_avx512_fill(dt, &g_tab[EKV_ISA_AVX512][t]);
        }
    }
    int sel = (int)g_cpu_isa;
    const int cap = isa_by_name(getenv("EKV_ISA"));
    if (cap >= 0 && cap < sel) sel = cap;
    atomic_store(&g_isa, sel);
}

static enum ekv_isa current_isa(void) {
    pthread_once(&g_once, init_dispatch);
    if (atomic_load_explicit(&g_force_ref, memory_order_relaxed)) return EKV_ISA_REF;
    return (enum ekv_isa)atomic_load_explicit(&g_isa, memory_order_relaxed);
}

bool ekv_kernels_simd(void) { return current_isa() != EKV_ISA_REF; }

void ekv_kernels_use_reference(bool on) { atomic_store(&g_force_ref, on); }

bool ekv_kernels_set_isa(const char *name) {
    pthread_once(&g_once, init_dispatch);
    const int i = isa_by_name(name);
    if (i < 0 || i > (int)g_cpu_isa) return false;
    if (i == EKV_ISA_AVXVNNI && !cpu_has_avxvnni()) return false;
    atomic_store(&g_isa, i);
    atomic_store(&g_force_ref, false);
    return true;
}

const char *ekv_kernels_isa(void) { return k_isa_names[current_isa()]; }

static const struct ekv_type_kernels *kernels_for(enum ekv_dtype t) { return &g_tab[current_isa()][t]; }

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
    if (w->layout == EKV_LAYOUT_X16 && ((w->type != EKV_Q8_0 && w->type != EKV_Q4_0) || w->ne1 % 16 || w->row_bytes != rb))
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: %s weight [%lld x %lld] cannot be in the X16 layout", what,
                       ekv_dtype_name(w->type), (long long)w->ne1, (long long)w->ne0);
    if (w->layout != EKV_LAYOUT_ROWS && w->layout != EKV_LAYOUT_X16)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: unknown weight layout %d", what, (int)w->layout);
    return EKV_OK;
}

struct mm_ctx {
    const struct ekv_weight *w;
    const struct ekv_type_kernels *k;
    struct ekv_pool *pool;
    const float *x;        /* [n][ne0] float activations (for quantising) */
    const void *xa;        /* activations in the kernel's format */
    size_t xa_stride;      /* bytes between activation rows */
    int64_t n;             /* activation rows */
    float *y;              /* [n][ne1] */
    int64_t chunk;         /* rows per claimed chunk (a multiple of 16) */
    int64_t n_chunks;
    atomic_llong next;     /* next chunk to claim */
};

/* Rows [r0, r1) of one kernel call: the product of an output never
 * depends on which call computes it, so chunks go to whichever thread
 * claims them (a descheduled thread does not hold up the others). */
static void run_rows(const struct mm_ctx *c, int ith, int64_t r0, int64_t r1) {
    const struct ekv_weight *w = c->w;
    const struct ekv_type_kernels *k = c->k;
    if (w->layout == EKV_LAYOUT_X16) {
        if (k->gemm_x16) {
            k->gemm_x16(w, r0, r1, c->xa, c->xa_stride, c->n, c->y, w->ne1);
            return;
        }
        /* no X16 kernel on this path: each row unpacked, then dotted */
        char *row = ekv_pool_scratch(c->pool, ith, w->row_bytes);
        if (!row) return; /* cannot happen after the pre-allocation in product() */
        for (int64_t r = r0; r < r1; r++) {
            ekv_x16_unpack_row(w, r, row);
            for (int64_t t = 0; t < c->n; t++)
                k->vec_dot(w->ne0, &c->y[t * w->ne1 + r], row, (const char *)c->xa + (size_t)t * c->xa_stride);
        }
        return;
    }
    if (c->n == 1 && k->gemv) {
        k->gemv(w, r0, r1, c->xa, c->y);
        return;
    }
    if (k->gemm) {
        k->gemm(w, r0, r1, c->xa, c->xa_stride, c->n, c->y, w->ne1);
        return;
    }
    /* blocks of activation rows stay in cache while the weight rows stream */
    const char *base = w->data;
    const char *xa = c->xa;
    for (int64_t t0 = 0; t0 < c->n; t0 += 16) {
        const int64_t t1 = EKV_MIN(c->n, t0 + 16);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = t0; t < t1; t++)
                k->vec_dot(w->ne0, &c->y[t * w->ne1 + r], base + (size_t)r * w->row_bytes,
                           xa + (size_t)t * c->xa_stride);
    }
}

static void product_task(void *arg, int ith, int nth) {
    struct mm_ctx *c = arg;
    (void)nth;
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (i >= c->n_chunks) return;
        const int64_t r0 = i * c->chunk;
        run_rows(c, ith, r0, EKV_MIN(c->w->ne1, r0 + c->chunk));
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
    struct ekv_pool *pp = pool_for(p, w, n);
    struct mm_ctx c = {.w = w, .k = kernels_for(w->type), .pool = pp, .x = x, .n = n, .y = y};
    if (c.k->quantize_act) {
        size_t rb, total;
        const int64_t nblk = w->ne0 / c.k->act_block;
        if (!ekv_mul_ok((size_t)nblk, c.k->act_block_bytes, &rb) || !ekv_mul_ok(rb, (size_t)n, &total))
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
    if (w->layout == EKV_LAYOUT_X16 && !c.k->gemm_x16) {
        for (int i = 0; i < ekv_pool_size(pp); i++)
            if (!ekv_pool_scratch(pp, i, w->row_bytes))
                return ekv_err(EKV_ERR_NOMEM, "%s: cannot allocate row scratch", what);
    }
    /* chunks: about 4 per thread, whole groups of 16 rows */
    const int nth = ekv_pool_size(pp);
    int64_t chunk = (w->ne1 + 4 * nth - 1) / (4 * nth);
    chunk = EKV_MAX((int64_t)16, (chunk + 15) & ~(int64_t)15);
    c.chunk = chunk;
    c.n_chunks = (w->ne1 + chunk - 1) / chunk;
    atomic_init(&c.next, 0);
    ekv_pool_run(pp, product_task, &c);
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
    if (w->layout == EKV_LAYOUT_X16) {
        enum ekv_status s = check_weight(w, "get_row");
        if (s != EKV_OK) return s;
        void *tmp = malloc(w->row_bytes);
        if (!tmp) return ekv_err(EKV_ERR_NOMEM, "get_row: out of memory");
        ekv_x16_unpack_row(w, r, tmp);
        s = ekv_dequantize_row(w->type, tmp, dst, w->ne0);
        free(tmp);
        return s;
    }
    return ekv_dequantize_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, dst, w->ne0);
}
