/*
 * kvquant.h — storage types of the KV cache as rows of one table (ggml's
 * type_traits shape: each type is one row of sizes and function pointers):
 * the geometry, the reference codecs and their SIMD twins of f32, f16, q8_0,
 * q4_0 and the KIVI 2/4-bit layouts, and the view through which the
 * attention kernels read one side (keys or values) of one KV head without
 * knowing how the cache manages it. Kernels only: no policy, no allocation.
 *
 * Row types (f32, f16, q8_0, q4_0): every entry is one row of head_dim
 * elements in the type's blocks (q8_0/q4_0 are GGML's blocks of 32, so
 * head_dim % 32 == 0). llama.cpp stores K/V rows the same way.
 *
 * KIVI (arXiv 2402.02750, docs/policies.md "KIVI storage"), b = 2 or 4 bits, group G:
 *  - quantiser of a group x[0..n): mn = min, mx = max, s = (mx - mn) /
 *    (2^b - 1); s and mn are stored as fp16 and the codes are computed
 *    with the stored values, q = clamp(rint((x - mn16) / s16), 0, 2^b - 1)
 *    (rint: half to even, like torch.round); x^ = q * s16 + mn16. A
 *    constant group (mx == mn, or s below fp16's range) stores s = 0 and
 *    q = 0, so x^ = mn16 ([CHOICE], docs/policies.md "KIVI storage");
 *  - keys: per channel over a group of up to G consecutive entries. A key
 *    group is [s: d fp16][mn: d fp16][codes: n rows of d*b/8 bytes], the
 *    codes token-major (entry r's d codes together, channel c in bits
 *    b*(c % (8/b)) of byte c / (8/b)) so that one entry dequantises alone;
 *    groups of different sizes are packed one after another;
 *  - values: per entry, in groups of G channels (d % G == 0): a value row
 *    is d/G times [s fp16][mn fp16][G*b/8 bytes of codes];
 *  - the most recent entries stay in fp16 (the residual, managed by the
 *    cache): entries [0, nq) are quantised, [nq, n) are fp16 rows.
 *
 * Dequantisation is exact arithmetic up to one rounding (q*s is exact for
 * b-bit q and fp16 s, then one add or FMA), so the SIMD codecs equal the
 * references bit for bit, and attention over a typed view equals the f32
 * attention over the dequantised rows.
 */
#ifndef EKV_KVQUANT_H
#define EKV_KVQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ekv.h"

/* One storage type. */
struct ekv_kv_type_traits {
    const char *name;      /* as on the command line: "f16", "kivi2", ... */
    int blck;              /* row types: elements per block of a row; 0 for KIVI */
    size_t blck_bytes;     /* row types: bytes per block */
    int bits;              /* KIVI: bits per code; 0 for row types */
    /* row types: n elements (n % blck == 0) */
    void (*to_float)(const void *src, float *dst, int64_t n);
    void (*from_float)(const float *src, void *dst, int64_t n);
};

/* Row of the table; NULL for EKV_KV_DEFAULT or an invalid value. */
const struct ekv_kv_type_traits *ekv_kv_traits(enum ekv_kv_type t);
static inline bool ekv_kv_type_is_kivi(enum ekv_kv_type t) { return t == EKV_KV_KIVI2 || t == EKV_KV_KIVI4; }

/* Bytes of one stored row of d elements: a row type's row, or a KIVI
 * quantised value row (channel groups of g). 0 when d does not fit the
 * type's blocks (see ekv_kv_type_check). */
size_t ekv_kv_row_bytes(enum ekv_kv_type t, int d, int g);
/* Bytes of a KIVI key group of n entries of d channels at b bits. */
static inline size_t ekv_kivi_kgroup_bytes(int d, int n, int bits) {
    return (size_t)d * 4 + (size_t)n * ((size_t)d * (size_t)bits / 8);
}
/* NULL when type t can store rows of d elements with KIVI group g (as
 * keys when is_v is false), else a static message saying why not. */
const char *ekv_kv_type_check(enum ekv_kv_type t, bool is_v, int d, int g);

/* ---- KIVI reference codecs ---- */

/* Quantises the n values x[0], x[stride], ... (one KIVI group) to b-bit
 * codes q[0..n) with fp16 scale and minimum (see the file comment). */
void ekv_kivi_quant_group(const float *x, int n, size_t stride, int bits, uint16_t *s16, uint16_t *mn16,
                          uint8_t *q);
/* Value row: d floats -> d/g channel groups. */
void ekv_kivi_quant_vrow(const float *x, int d, int g, int bits, void *dst);
void ekv_kivi_dequant_vrow(const void *src, int d, int g, int bits, float *dst);
/* Key group of n entries from x [n][d] (row stride d). */
void ekv_kivi_quant_kgroup(const float *x, int n, int d, int bits, void *dst);
/* Entries [r0, r1) of a key group as floats into dst [r1 - r0][d]. */
void ekv_kivi_dequant_kgroup(const void *grp, int d, int bits, int r0, int r1, float *dst);

/* ---- a view of one side of one KV head ---- */

struct ekv_kv_view {
    enum ekv_kv_type type;
    int d;                 /* head_dim */
    int g;                 /* KIVI group G */
    bool is_v;             /* KIVI: value layout (per entry) rather than key groups */
    int32_t n;             /* entries */
    int32_t nq;            /* entries in `data` (row types: n) */
    const uint8_t *data;   /* row types, KIVI values: [nq][row_bytes]; KIVI keys: packed groups */
    size_t row_bytes;
    const uint16_t *tail;  /* KIVI: entries [nq, n) as fp16 rows [n - nq][d] */
    int32_t ng;            /* KIVI keys: groups in data */
    const int32_t *gn;     /* KIVI keys: [ng] entries per group, in order */
    int32_t first;         /* row j of the view is stored entry first + j (a sliding window hides the entries
                              before it); 0 = all */
    const float *bias;     /* keys only: an additive attention-logit bias per stored entry (row j of the view
                              gets bias[first + j] added to its scaled score before the softmax), e.g. the log
                              of the tokens a merged entry stands for; NULL = none (no cost, results unchanged) */
};

/* Sequential position in a view's KIVI key groups (zero-initialise). */
struct ekv_kv_cursor {
    int32_t g;             /* current group */
    int32_t first;         /* entry index of its first entry */
    size_t off;            /* byte offset of the group in data */
};

/* Entries [j0, j1) of a view as floats into dst [j1 - j0][d], through the
 * reference codecs (simd false) or the SIMD ones (bit-identical; simd true
 * only when ekv_cpu_has_avx2()). cur speeds up ascending calls on KIVI
 * keys (any j0 works; NULL allowed). */
void ekv_kv_view_rows(const struct ekv_kv_view *v, int32_t j0, int32_t j1, float *dst, struct ekv_kv_cursor *cur,
                      bool simd);

/* Rows [j0, j1) of a view as floats: f32 storage is returned in place (no
 * copy), other types are decoded into buf [j1 - j0][d] by ekv_kv_view_rows.
 * The one place attention kernels get K/V rows from. */
const float *ekv_kv_view_block(const struct ekv_kv_view *v, int32_t j0, int32_t j1, float *buf,
                               struct ekv_kv_cursor *cur, bool simd);

/* SIMD codecs (kvquant_avx2.c): same results as the references. */
void ekv_kv_rows_to_float_avx2(enum ekv_kv_type t, const void *src, size_t row_bytes, int32_t n, int d, int g,
                               float *dst);
void ekv_kivi_dequant_kgroup_avx2(const void *grp, int d, int bits, int r0, int r1, float *dst);
void ekv_f16_to_float_avx2(const uint16_t *src, float *dst, int64_t n);
void ekv_f32_to_f16_avx2(const float *src, uint16_t *dst, int64_t n);

/* One row of d floats into storage of type t (not KIVI): the type's
 * from_float, or its SIMD encoder (the same bits) when the kernels run at
 * the AVX2 level or above. Used for every key and value a cache stores. */
void ekv_kv_row_from_float(enum ekv_kv_type t, const float *x, void *dst, int d);

/* d floats into fp16 (KIVI's unquantised tail), as ekv_kv_row_from_float. */
void ekv_kv_f16_from_float(const float *x, uint16_t *dst, int d);

#endif
