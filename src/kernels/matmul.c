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
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
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

#if defined(__x86_64__) || defined(__i386__)
/* F16C and AVX-VNNI from CPUID itself: clang before 15 does not know their
 * names in __builtin_cpu_supports (the AVX state they need is checked by
 * the "avx2" test beside them). */
static bool cpuid_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
}
static bool cpuid_avxvnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 4) & 1u;
}
#endif

enum ekv_isa ekv_cpu_isa(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpuid_f16c()))
        return EKV_ISA_REF;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return EKV_ISA_AVX512;
    if (cpuid_avxvnni()) return EKV_ISA_AVXVNNI;
    return EKV_ISA_AVX2;
#else
    return EKV_ISA_REF;
#endif
}

static bool cpu_has_avxvnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    return cpuid_avxvnni();
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

enum ekv_isa ekv_kernels_level(void) { return current_isa(); }

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
const char *ekv_cpu_kernels(void) { return ekv_kernels_isa(); }

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

#define MM_MAX 4 /* weights of one multi-product */

/* One weight of a product job: its rows are cut into chunks of `chunk`
 * rows (whole groups of 16), numbered from `first` in the job. */
struct mm_part {
    const struct ekv_weight *w;
    const struct ekv_type_kernels *k;
    float *y;              /* [n][ne1] */
    int64_t chunk;
    int64_t first;
};

struct mm_ctx {
    struct mm_part parts[MM_MAX];
    int n_parts;
    struct ekv_pool *pool;
    const void *xa;        /* activations in the kernels' format */
    size_t xa_stride;      /* bytes between activation rows */
    int64_t n;             /* activation rows */
    int64_t n_chunks;      /* over all parts */
    atomic_llong next;     /* next chunk to claim */
    /* quantisation */
    const float *x;        /* [n][ne0] float activations */
    int64_t ne0;
    void (*quantize)(const float *src, void *dst, int64_t n);
};

/* Rows [r0, r1) of one weight: the product of an output never depends on
 * which call computes it, so chunks go to whichever thread claims them (a
 * descheduled thread does not hold up the others). */
static void run_rows(const struct mm_ctx *c, const struct mm_part *pt, int ith, int64_t r0, int64_t r1) {
    const struct ekv_weight *w = pt->w;
    const struct ekv_type_kernels *k = pt->k;
    float *y = pt->y;
    if (w->layout == EKV_LAYOUT_X16) {
        if (k->gemm_x16) {
            k->gemm_x16(w, r0, r1, c->xa, c->xa_stride, c->n, y, w->ne1);
            return;
        }
        /* no X16 kernel on this path: each row unpacked, then dotted */
        char *row = ekv_pool_scratch(c->pool, ith, w->row_bytes);
        if (!row) return; /* cannot happen after the pre-allocation in run_job() */
        for (int64_t r = r0; r < r1; r++) {
            ekv_x16_unpack_row(w, r, row);
            for (int64_t t = 0; t < c->n; t++)
                k->vec_dot(w->ne0, &y[t * w->ne1 + r], row, (const char *)c->xa + (size_t)t * c->xa_stride);
        }
        return;
    }
    if (c->n == 1 && k->gemv) {
        k->gemv(w, r0, r1, c->xa, y);
        return;
    }
    if (k->gemm) {
        k->gemm(w, r0, r1, c->xa, c->xa_stride, c->n, y, w->ne1);
        return;
    }
    /* blocks of activation rows stay in cache while the weight rows stream */
    const char *base = w->data;
    const char *xa = c->xa;
    for (int64_t t0 = 0; t0 < c->n; t0 += 16) {
        const int64_t t1 = EKV_MIN(c->n, t0 + 16);
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = t0; t < t1; t++)
                k->vec_dot(w->ne0, &y[t * w->ne1 + r], base + (size_t)r * w->row_bytes, xa + (size_t)t * c->xa_stride);
    }
}

static void product_task(void *arg, int ith, int nth) {
    struct mm_ctx *c = arg;
    (void)nth;
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (i >= c->n_chunks) return;
        int p = 0;
        while (p + 1 < c->n_parts && i >= c->parts[p + 1].first) p++;
        const struct mm_part *pt = &c->parts[p];
        const int64_t r0 = (i - pt->first) * pt->chunk;
        run_rows(c, pt, ith, r0, EKV_MIN(pt->w->ne1, r0 + pt->chunk));
    }
}

static void quantize_task(void *arg, int ith, int nth) {
    const struct mm_ctx *c = arg;
    for (int64_t t = ith; t < c->n; t += nth)
        c->quantize(c->x + t * c->ne0, (char *)c->xa + (size_t)t * c->xa_stride, c->ne0);
}

/* Small products are not worth waking the workers for. */
static struct ekv_pool *pool_for(struct ekv_pool *p, double macs) { return macs < 16384.0 ? NULL : p; }

/* Checks the arguments of a product of n rows x through w; *skip when
 * there is nothing to compute (zero-sized, outputs cleared). */
static enum ekv_status check_product(const struct ekv_weight *w, const float *x, int64_t n, float *y, bool *skip,
                                     const char *what) {
    *skip = true;
    enum ekv_status s = check_weight(w, what);
    if (s != EKV_OK) return s;
    if (n < 0) return ekv_err(EKV_ERR_INVALID_ARG, "%s: negative row count %lld", what, (long long)n);
    if (n == 0 || w->ne1 == 0) return EKV_OK;
    if (!x || !y) return ekv_err(EKV_ERR_INVALID_ARG, "%s: NULL input or output", what);
    if (w->ne0 == 0) {
        memset(y, 0, (size_t)n * (size_t)w->ne1 * sizeof(float));
        return EKV_OK;
    }
    *skip = false;
    return EKV_OK;
}

/* Products of the n rows of x through the weights ws[0..nw), all with the
 * same ne0 and activation format: x quantised once, one pool job. */
static enum ekv_status run_job(struct ekv_pool *p, const struct ekv_weight *const *ws, float *const *ys, int nw,
                               const float *x, int64_t n, const char *what) {
    const struct ekv_type_kernels *k0 = kernels_for(ws[0]->type);
    double macs = 0;
    for (int i = 0; i < nw; i++) macs += (double)ws[i]->ne0 * (double)ws[i]->ne1 * (double)n;
    struct ekv_pool *pp = pool_for(p, macs);
    struct mm_ctx c = {.pool = pp, .x = x, .n = n, .ne0 = ws[0]->ne0, .quantize = k0->quantize_act};
    if (k0->quantize_act) {
        size_t rb, total;
        const int64_t nblk = ws[0]->ne0 / k0->act_block;
        if (!ekv_mul_ok((size_t)nblk, k0->act_block_bytes, &rb) || !ekv_mul_ok(rb, (size_t)n, &total))
            return ekv_err(EKV_ERR_OVERFLOW, "%s: activation buffer size overflows", what);
        void *buf = ekv_pool_scratch_shared(p, total);
        if (!buf) return ekv_err(EKV_ERR_NOMEM, "%s: cannot allocate %zu bytes of activation scratch", what, total);
        c.xa = buf;
        c.xa_stride = rb;
        if (n == 1)
            k0->quantize_act(x, buf, ws[0]->ne0);
        else
            ekv_pool_run(pp, quantize_task, &c);
    } else {
        c.xa = x;
        c.xa_stride = (size_t)ws[0]->ne0 * sizeof(float);
    }
    /* chunks: about 4 per thread over all the rows, whole groups of 16 */
    const int nth = ekv_pool_size(pp);
    int64_t rows = 0;
    for (int i = 0; i < nw; i++) rows += ws[i]->ne1;
    int64_t chunk = (rows + 4 * nth - 1) / (4 * nth);
    chunk = EKV_MAX((int64_t)16, (chunk + 15) & ~(int64_t)15);
    for (int i = 0; i < nw; i++) {
        const struct ekv_type_kernels *k = kernels_for(ws[i]->type);
        if (ws[i]->layout == EKV_LAYOUT_X16 && !k->gemm_x16)
            for (int t = 0; t < nth; t++)
                if (!ekv_pool_scratch(pp, t, ws[i]->row_bytes))
                    return ekv_err(EKV_ERR_NOMEM, "%s: cannot allocate row scratch", what);
        c.parts[i] = (struct mm_part){.w = ws[i], .k = k, .y = ys[i], .chunk = chunk, .first = c.n_chunks};
        c.n_chunks += (ws[i]->ne1 + chunk - 1) / chunk;
    }
    c.n_parts = nw;
    atomic_init(&c.next, 0);
    ekv_pool_run(pp, product_task, &c);
    return EKV_OK;
}

static enum ekv_status product(struct ekv_pool *p, const struct ekv_weight *w, const float *x, int64_t n,
                               float *y, const char *what) {
    bool skip;
    enum ekv_status s = check_product(w, x, n, y, &skip, what);
    if (s != EKV_OK || skip) return s;
    return run_job(p, &w, &y, 1, x, n, what);
}

enum ekv_status ekv_matmul_multi(struct ekv_pool *p, const struct ekv_weight *const *w, int n_w, const float *x,
                                 int64_t n, float *const *y) {
    if (n_w < 0 || (n_w > 0 && (!w || !y))) return ekv_err(EKV_ERR_INVALID_ARG, "matmul_multi: bad weight list");
    const struct ekv_weight *ws[MM_MAX];
    float *ys[MM_MAX];
    int m = 0;
    for (int i = 0; i < n_w; i++) {
        bool skip;
        enum ekv_status s = check_product(w[i], x, n, y[i], &skip, "matmul_multi");
        if (s != EKV_OK) return s;
        if (skip) continue;
        /* one job needs one activation format; otherwise (or beyond MM_MAX)
         * this weight runs alone: the same results either way */
        const struct ekv_type_kernels *ki = kernels_for(w[i]->type);
        const struct ekv_type_kernels *k0 = m ? kernels_for(ws[0]->type) : ki;
        if (m == MM_MAX || (m && (w[i]->ne0 != ws[0]->ne0 || ki->quantize_act != k0->quantize_act ||
                                  ki->act_block_bytes != k0->act_block_bytes || ki->act_block != k0->act_block))) {
            s = run_job(p, &w[i], &y[i], 1, x, n, "matmul_multi");
            if (s != EKV_OK) return s;
            continue;
        }
        ws[m] = w[i];
        ys[m++] = y[i];
    }
    return m ? run_job(p, ws, ys, m, x, n, "matmul_multi") : EKV_OK;
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
