/*
 * kvquant.c — the table of KV-cache storage types and their reference
 * codecs (kvquant.h): f32, f16, q8_0 and q4_0 rows through quant.c's GGML
 * block codecs, the KIVI group quantiser (half-even rounding, fp16 scale
 * and minimum, the constant-group rule of docs/policies.md "KIVI storage") with its key
 * and value layouts, and ekv_kv_view_rows, which turns any range of a
 * head's entries into floats for the attention kernels and the cache's
 * entry access.
 */
#include <ctype.h>
#include <math.h>
#include <string.h>

#include "core/util.h"
#include "kernels/kvquant.h"
#include "kernels/quant.h"

static void f32_to_float(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
static void f32_from_float(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static const struct ekv_kv_type_traits g_traits[EKV_KV_TYPE_COUNT] = {
    [EKV_KV_F32] = {"f32", 1, 4, 0, f32_to_float, f32_from_float},
    [EKV_KV_F16] = {"f16", 1, 2, 0, ekv_dequant_f16, ekv_quant_f16},
    [EKV_KV_Q8_0] = {"q8_0", EKV_QK8_0, sizeof(struct ekv_block_q8_0), 0, ekv_dequant_q8_0, ekv_quant_q8_0},
    [EKV_KV_Q4_0] = {"q4_0", EKV_QK4_0, sizeof(struct ekv_block_q4_0), 0, ekv_dequant_q4_0, ekv_quant_q4_0},
    [EKV_KV_KIVI2] = {"kivi2", 0, 0, 2, NULL, NULL},
    [EKV_KV_KIVI4] = {"kivi4", 0, 0, 4, NULL, NULL},
};

const struct ekv_kv_type_traits *ekv_kv_traits(enum ekv_kv_type t) {
    if ((int)t <= (int)EKV_KV_DEFAULT || (int)t >= (int)EKV_KV_TYPE_COUNT) return NULL;
    return &g_traits[t];
}

const char *ekv_kv_type_name(enum ekv_kv_type t) {
    if (t == EKV_KV_DEFAULT) return "default";
    const struct ekv_kv_type_traits *tr = ekv_kv_traits(t);
    return tr ? tr->name : "unknown";
}

enum ekv_kv_type ekv_kv_type_default(void) { return EKV_KV_F16; }

enum ekv_status ekv_kv_type_parse(const char *name, enum ekv_kv_type *out) {
    if (!name || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_kv_type_parse: NULL argument");
    for (int t = EKV_KV_F32; t < EKV_KV_TYPE_COUNT; t++) {
        const char *a = g_traits[t].name, *b = name;
        while (*a && *b && tolower((unsigned char)*b) == *a) a++, b++;
        if (!*a && !*b) {
            *out = (enum ekv_kv_type)t;
            return EKV_OK;
        }
    }
    return ekv_err(EKV_ERR_INVALID_ARG, "unknown kv type '%s' (known: f32, f16, q8_0, q4_0, kivi2, kivi4)", name);
}

size_t ekv_kv_row_bytes(enum ekv_kv_type t, int d, int g) {
    const struct ekv_kv_type_traits *tr = ekv_kv_traits(t);
    if (!tr || d <= 0) return 0;
    if (tr->bits) {
        if (g <= 0 || d % g != 0 || (g * tr->bits) % 8 != 0) return 0;
        return (size_t)(d / g) * (4 + (size_t)g * (size_t)tr->bits / 8);
    }
    if (d % tr->blck != 0) return 0;
    return (size_t)(d / tr->blck) * tr->blck_bytes;
}

const char *ekv_kv_type_check(enum ekv_kv_type t, bool is_v, int d, int g) {
    const struct ekv_kv_type_traits *tr = ekv_kv_traits(t);
    if (!tr) return "not a storage type";
    if (d <= 0) return "head_dim must be positive";
    if (!tr->bits) return d % tr->blck == 0 ? NULL : "needs head_dim to be a multiple of its block size 32";
    if (g <= 0 || g > 1024) return "needs a group size in [1, 1024]";
    if ((d * tr->bits) % 8 != 0) return "needs head_dim * bits to be a multiple of 8";
    if (is_v && d % g != 0) return "quantises values in groups of kv_group channels: head_dim must be a multiple of it";
    if (is_v && (g * tr->bits) % 8 != 0) return "needs kv_group * bits to be a multiple of 8";
    return NULL;
}

/* ------------------------------------------------------------------ */
/* KIVI                                                                 */
/* ------------------------------------------------------------------ */

void ekv_kivi_quant_group(const float *x, int n, size_t stride, int bits, uint16_t *s16, uint16_t *mn16,
                          uint8_t *q) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) {
        const float v = x[(size_t)i * stride];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    const int qmax = (1 << bits) - 1;
    const uint16_t m16 = ekv_f32_to_fp16(mn);
    const uint16_t sc16 = ekv_f32_to_fp16((mx - mn) / (float)qmax);
    const float mnh = ekv_fp16_to_f32(m16), sh = ekv_fp16_to_f32(sc16);
    *mn16 = m16;
    if (!(mx > mn) || !(sh > 0.0f) || !isfinite(sh)) { /* constant group: q = 0, x^ = mn [CHOICE] */
        *s16 = 0;
        memset(q, 0, (size_t)n);
        return;
    }
    *s16 = sc16;
    for (int i = 0; i < n; i++) {
        float t = rintf((x[(size_t)i * stride] - mnh) / sh); /* half to even */
        if (!(t >= 0.0f)) t = 0.0f; /* also NaN */
        if (t > (float)qmax) t = (float)qmax;
        q[i] = (uint8_t)t;
    }
}

/* Code of channel c in a packed run of b-bit codes. */
static inline int kivi_code(const uint8_t *codes, int c, int bits) {
    const int per = 8 / bits;
    return (codes[c / per] >> (bits * (c % per))) & ((1 << bits) - 1);
}

static inline void kivi_put(uint8_t *codes, int c, int bits, int q) {
    const int per = 8 / bits;
    codes[c / per] |= (uint8_t)(q << (bits * (c % per)));
}

void ekv_kivi_quant_vrow(const float *x, int d, int g, int bits, void *dst) {
    uint8_t *p = dst;
    uint8_t q[1024];
    const size_t cb = (size_t)g * (size_t)bits / 8;
    for (int c0 = 0; c0 < d; c0 += g) {
        uint16_t s16, m16;
        ekv_kivi_quant_group(x + c0, g, 1, bits, &s16, &m16, q);
        memcpy(p, &s16, 2);
        memcpy(p + 2, &m16, 2);
        memset(p + 4, 0, cb);
        for (int c = 0; c < g; c++) kivi_put(p + 4, c, bits, q[c]);
        p += 4 + cb;
    }
}

void ekv_kivi_dequant_vrow(const void *src, int d, int g, int bits, float *dst) {
    const uint8_t *p = src;
    const size_t cb = (size_t)g * (size_t)bits / 8;
    for (int c0 = 0; c0 < d; c0 += g) {
        uint16_t s16, m16;
        memcpy(&s16, p, 2);
        memcpy(&m16, p + 2, 2);
        const float s = ekv_fp16_to_f32(s16), mn = ekv_fp16_to_f32(m16);
        for (int c = 0; c < g; c++) dst[c0 + c] = (float)kivi_code(p + 4, c, bits) * s + mn; /* q*s exact: = fma */
        p += 4 + cb;
    }
}

void ekv_kivi_quant_kgroup(const float *x, int n, int d, int bits, void *dst) {
    uint8_t *p = dst;
    uint16_t *s = (uint16_t *)(void *)p, *mn = s + d; /* 2-byte aligned: groups are 2-byte multiples */
    uint8_t *codes = p + (size_t)d * 4;
    const size_t rb = (size_t)d * (size_t)bits / 8;
    uint8_t q[1024];
    memset(codes, 0, (size_t)n * rb);
    for (int c = 0; c < d; c++) {
        uint16_t s16, m16;
        ekv_kivi_quant_group(x + c, n, (size_t)d, bits, &s16, &m16, q);
        memcpy(s + c, &s16, 2);
        memcpy(mn + c, &m16, 2);
        for (int r = 0; r < n; r++) kivi_put(codes + (size_t)r * rb, c, bits, q[r]);
    }
}

void ekv_kivi_dequant_kgroup(const void *grp, int d, int bits, int r0, int r1, float *dst) {
    const uint8_t *p = grp;
    const uint8_t *codes = p + (size_t)d * 4;
    const size_t rb = (size_t)d * (size_t)bits / 8;
    for (int c = 0; c < d; c++) {
        uint16_t s16, m16;
        memcpy(&s16, p + 2 * (size_t)c, 2);
        memcpy(&m16, p + 2 * ((size_t)d + (size_t)c), 2);
        const float s = ekv_fp16_to_f32(s16), mn = ekv_fp16_to_f32(m16);
        for (int r = r0; r < r1; r++)
            dst[(size_t)(r - r0) * (size_t)d + (size_t)c] = (float)kivi_code(codes + (size_t)r * rb, c, bits) * s + mn;
    }
}

/* ------------------------------------------------------------------ */
/* Views                                                                */
/* ------------------------------------------------------------------ */

void ekv_kv_f16_from_float(const float *x, uint16_t *dst, int d) {
    if (ekv_kernels_level() >= EKV_ISA_AVX2)
        ekv_f32_to_f16_avx2(x, dst, d);
    else
        ekv_quant_f16(x, dst, d);
}

void ekv_kv_row_from_float(enum ekv_kv_type t, const float *x, void *dst, int d) {
    if (t == EKV_KV_F16)
        ekv_kv_f16_from_float(x, dst, d);
    else
        ekv_kv_traits(t)->from_float(x, dst, (int64_t)d);
}

/* Rows [j0, j1) of the quantised part (j1 <= v->nq). */
static void quant_rows(const struct ekv_kv_view *v, int32_t j0, int32_t j1, float *dst, struct ekv_kv_cursor *cur,
                       bool simd) {
    const size_t d = (size_t)v->d;
    const struct ekv_kv_type_traits *tr = ekv_kv_traits(v->type);
    if (!tr->bits || v->is_v) {
        const uint8_t *src = v->data + (size_t)j0 * v->row_bytes;
        if (simd) {
            ekv_kv_rows_to_float_avx2(v->type, src, v->row_bytes, j1 - j0, v->d, v->g, dst);
            return;
        }
        for (int32_t j = j0; j < j1; j++, src += v->row_bytes, dst += d) {
            if (tr->bits) ekv_kivi_dequant_vrow(src, v->d, v->g, tr->bits, dst);
            else tr->to_float(src, dst, (int64_t)d);
        }
        return;
    }
    /* KIVI key groups: find the group of j0, then walk */
    struct ekv_kv_cursor local = {0, 0, 0};
    if (!cur || cur->g >= v->ng || j0 < cur->first) cur = &local;
    while (cur->g < v->ng && j0 >= cur->first + v->gn[cur->g]) {
        cur->off += ekv_kivi_kgroup_bytes(v->d, v->gn[cur->g], tr->bits);
        cur->first += v->gn[cur->g];
        cur->g++;
    }
    int32_t j = j0;
    while (j < j1 && cur->g < v->ng) {
        const int32_t n_g = v->gn[cur->g];
        const int32_t r0 = j - cur->first, r1 = EKV_MIN(j1 - cur->first, n_g);
        const uint8_t *grp = v->data + cur->off;
        if (simd) ekv_kivi_dequant_kgroup_avx2(grp, v->d, tr->bits, r0, r1, dst);
        else ekv_kivi_dequant_kgroup(grp, v->d, tr->bits, r0, r1, dst);
        dst += (size_t)(r1 - r0) * d;
        j += r1 - r0;
        if (r1 == n_g) {
            cur->off += ekv_kivi_kgroup_bytes(v->d, n_g, tr->bits);
            cur->first += n_g;
            cur->g++;
        }
    }
}

void ekv_kv_view_rows(const struct ekv_kv_view *v, int32_t j0, int32_t j1, float *dst, struct ekv_kv_cursor *cur,
                      bool simd) {
    if (j1 <= j0) return;
    j0 += v->first;
    j1 += v->first;
    const size_t d = (size_t)v->d;
    const int32_t qe = EKV_MIN(j1, v->nq);
    if (j0 < qe) {
        quant_rows(v, j0, qe, dst, cur, simd);
        dst += (size_t)(qe - j0) * d;
        j0 = qe;
    }
    if (j0 < j1) { /* the fp16 residual */
        const uint16_t *src = v->tail + (size_t)(j0 - v->nq) * d;
        const int64_t n = (int64_t)(j1 - j0) * (int64_t)d;
        if (simd) ekv_f16_to_float_avx2(src, dst, n);
        else ekv_dequant_f16(src, dst, n);
    }
}

const float *ekv_kv_view_block(const struct ekv_kv_view *v, int32_t j0, int32_t j1, float *buf,
                               struct ekv_kv_cursor *cur, bool simd) {
    if (v->type == EKV_KV_F32)
        return (const float *)(const void *)v->data + ((size_t)v->first + (size_t)j0) * (size_t)v->d;
    ekv_kv_view_rows(v, j0, j1, buf, cur, simd);
    return buf;
}
