/*
 * gguf.c — the GGUF reader (format versions 2 and 3).
 *
 * Model weights and vocabularies arrive as GGUF files of unknown origin, so
 * this parser treats every byte as hostile: each count and length is checked
 * against the bytes that remain before anything is allocated (an element
 * needs at least one byte, so no count can make us allocate more than a
 * small multiple of the file size), nesting is bounded, every tensor extent
 * is overflow-checked and must lie inside the data section. Scalars, strings
 * and scalar-array payloads are not copied: they point into the mapping.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 * n_kv × {string key, u32 type, value}, n_tensors × {string name, u32 n_dims,
 * u64 ne[n_dims], u32 ggml type, u64 offset}, padding to general.alignment,
 * then the data section that tensor offsets are relative to.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "model/gguf.h"

/* Arrays of arrays deeper than this are rejected (real files use 1 level). */
#define GGUF_MAX_NESTING 8
/* Smallest encodings, used to bound counts by the bytes that remain. */
#define GGUF_MIN_KV_BYTES 13     /* u64 key len + u32 type + 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 32 /* u64 name len + u32 n_dims + u64 ne + u32 type + u64 offset */
#define GGUF_MIN_ARRAY_BYTES 12  /* u32 element type + u64 count */

struct ekv_gguf_file {
    const uint8_t *base;      /* [size] the file bytes (mapped or borrowed) */
    size_t size;
    void *map;                /* mmap address, NULL for borrowed buffers */
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    size_t data_offset;       /* start of the data section (may equal size) */
    size_t n_kv;
    struct ekv_gguf_kv *kvs;      /* [n_kv] */
    size_t n_tensors;
    struct ekv_gguf_tensor *tensors; /* [n_tensors] */
};

/* ---- type names and sizes ---- */

const char *ekv_gguf_type_name(enum ekv_gguf_type t) {
    static const char *const names[GGUF_TYPE_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
        "string", "array", "uint64", "int64", "float64"};
    if ((unsigned)t >= GGUF_TYPE_COUNT) return "unknown";
    return names[t];
}

size_t ekv_gguf_scalar_size(enum ekv_gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- the cursor ---- */

struct cursor {
    const uint8_t *p; /* [size] */
    size_t size;
    size_t pos;
};

static size_t cur_left(const struct cursor *c) { return c->size - c->pos; }

/* Formats up to 64 bytes of a file string for a message, replacing bytes
 * that are not printable ASCII (the string may be hostile). */
static const char *printable(struct ekv_gguf_str s, char *buf, size_t n) {
    size_t len = s.len < n - 4 ? (size_t)s.len : n - 4;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[i] = (ch >= 0x20 && ch < 0x7f && ch != '\'') ? (char)ch : '?';
    }
    if (len < s.len) { memcpy(buf + len, "...", 3); len += 3; }
    buf[len] = '\0';
    return buf;
}

static enum ekv_status need(struct cursor *c, size_t n, const char *what) {
    if (cur_left(c) < n)
        return ekv_err(EKV_ERR_FORMAT, "truncated at offset %zu: %s needs %zu bytes, %zu left (file size %zu)",
                       c->pos, what, n, cur_left(c), c->size);
    return EKV_OK;
}

static enum ekv_status rd_u32(struct cursor *c, uint32_t *v, const char *what) {
    enum ekv_status s = need(c, 4, what);
    if (s) return s;
    const uint8_t *b = c->p + c->pos;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    c->pos += 4;
    return EKV_OK;
}

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static enum ekv_status rd_u64(struct cursor *c, uint64_t *v, const char *what) {
    enum ekv_status s = need(c, 8, what);
    if (s) return s;
    *v = le64(c->p + c->pos);
    c->pos += 8;
    return EKV_OK;
}

static enum ekv_status rd_str(struct cursor *c, struct ekv_gguf_str *out, const char *what) {
    uint64_t len;
    enum ekv_status s = rd_u64(c, &len, what);
    if (s) return s;
    if (len > cur_left(c))
        return ekv_err(EKV_ERR_FORMAT, "%s: string length %llu at offset %zu exceeds the %zu bytes left",
                       what, (unsigned long long)len, c->pos - 8, cur_left(c));
    out->len = len;
    out->ptr = (const char *)c->p + c->pos;
    c->pos += (size_t)len;
    return EKV_OK;
}

/* ---- values ---- */

static void value_free(struct ekv_gguf_value *v) {
    if (v->type != GGUF_TYPE_ARRAY) return;
    if (v->v.arr.vals)
        for (uint64_t i = 0; i < v->v.arr.n; i++) value_free(&v->v.arr.vals[i]);
    free(v->v.arr.vals);
    free(v->v.arr.strs);
    v->v.arr.vals = NULL;
    v->v.arr.strs = NULL;
}

static enum ekv_status parse_value(struct cursor *c, enum ekv_gguf_type type, struct ekv_gguf_value *v,
                                   int depth, const char *key);

static enum ekv_status parse_array(struct cursor *c, struct ekv_gguf_value *v, int depth, const char *key) {
    uint32_t et;
    uint64_t n;
    enum ekv_status s;
    if (depth >= GGUF_MAX_NESTING)
        return ekv_err(EKV_ERR_FORMAT, "key '%s': arrays nested deeper than %d levels", key,
                       GGUF_MAX_NESTING);
    if ((s = rd_u32(c, &et, "array element type")) || (s = rd_u64(c, &n, "array length")))
        return ekv_err_prefix(s, "key '%s'", key);
    if (et >= GGUF_TYPE_COUNT)
        return ekv_err(EKV_ERR_FORMAT, "key '%s': unknown array element type %u", key, et);
    v->v.arr.type = (enum ekv_gguf_type)et;
    size_t left = cur_left(c);
    size_t esz = ekv_gguf_scalar_size((enum ekv_gguf_type)et);
    /* Every element takes at least min_bytes, which bounds n before allocating. */
    size_t min_bytes = esz ? esz : et == GGUF_TYPE_STRING ? 8 : GGUF_MIN_ARRAY_BYTES;
    if (n > left / min_bytes)
        return ekv_err(EKV_ERR_FORMAT,
                       "key '%s': array of %llu %s elements at offset %zu cannot fit in the %zu bytes left",
                       key, (unsigned long long)n, ekv_gguf_type_name((enum ekv_gguf_type)et), c->pos - 12, left);
    if (esz) {
        v->v.arr.data = c->p + c->pos;
        v->v.arr.n = n;
        c->pos += (size_t)n * esz;
        return EKV_OK;
    }
    if (n == 0) {
        v->v.arr.n = 0;
        return EKV_OK;
    }
    if (et == GGUF_TYPE_STRING) {
        struct ekv_gguf_str *strs = calloc((size_t)n, sizeof *strs);
        if (!strs) return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory for %llu strings", key,
                                  (unsigned long long)n);
        v->v.arr.strs = strs;
        v->v.arr.n = n;
        for (uint64_t i = 0; i < n; i++) {
            if ((s = rd_str(c, &strs[i], "array string")))
                return ekv_err_prefix(s, "key '%s' element %llu", key, (unsigned long long)i);
        }
        return EKV_OK;
    }
    /* Arrays of arrays. */
    struct ekv_gguf_value *vals = calloc((size_t)n, sizeof *vals);
    if (!vals) return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory for %llu nested arrays", key,
                              (unsigned long long)n);
    v->v.arr.vals = vals;
    v->v.arr.n = n;
    for (uint64_t i = 0; i < n; i++) vals[i].type = GGUF_TYPE_ARRAY; /* so value_free walks them */
    for (uint64_t i = 0; i < n; i++) {
        if ((s = parse_value(c, GGUF_TYPE_ARRAY, &vals[i], depth + 1, key))) return s;
    }
    return EKV_OK;
}

/* Parses one value of `type` (already read) into *v; `depth` counts the
 * arrays that enclose it. On error *v may hold allocations (value_free). */
static enum ekv_status parse_value(struct cursor *c, enum ekv_gguf_type type, struct ekv_gguf_value *v,
                                   int depth, const char *key) {
    enum ekv_status s;
    memset(v, 0, sizeof *v);
    v->type = type;
    size_t esz = ekv_gguf_scalar_size(type);
    if (esz) {
        if ((s = need(c, esz, ekv_gguf_type_name(type)))) return ekv_err_prefix(s, "key '%s'", key);
        const uint8_t *b = c->p + c->pos;
        uint64_t u = 0;
        for (size_t i = esz; i-- > 0;) u = u << 8 | b[i];
        c->pos += esz;
        switch (type) {
        case GGUF_TYPE_INT8: v->v.i64 = (int8_t)(uint8_t)u; break;
        case GGUF_TYPE_INT16: v->v.i64 = (int16_t)(uint16_t)u; break;
        case GGUF_TYPE_INT32: v->v.i64 = (int32_t)(uint32_t)u; break;
        case GGUF_TYPE_INT64: v->v.i64 = (int64_t)u; break;
        case GGUF_TYPE_BOOL: v->v.u64 = u != 0; break;
        case GGUF_TYPE_FLOAT32: {
            uint32_t bits = (uint32_t)u;
            float f;
            memcpy(&f, &bits, 4);
            v->v.f64 = f;
            break;
        }
        case GGUF_TYPE_FLOAT64: memcpy(&v->v.f64, &u, 8); break;
        default: v->v.u64 = u; break;
        }
        return EKV_OK;
    }
    if (type == GGUF_TYPE_STRING) {
        if ((s = rd_str(c, &v->v.str, "string value"))) return ekv_err_prefix(s, "key '%s'", key);
        return EKV_OK;
    }
    if (type == GGUF_TYPE_ARRAY) return parse_array(c, v, depth, key);
    return ekv_err(EKV_ERR_FORMAT, "key '%s': unknown value type %u", key, (unsigned)type);
}

/* ---- duplicate detection (sort indices by name, compare neighbours) ---- */

static int cmp_str(struct ekv_gguf_str a, struct ekv_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int r = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len;
}

/* Merge sort of name indices (qsort has no context argument in C11). */
static void sort_idx(size_t *idx, size_t *tmp, size_t n, const struct ekv_gguf_file *f, bool tensors) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_idx(idx, tmp, h, f, tensors);
    sort_idx(idx + h, tmp, n - h, f, tensors);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = tensors ? strcmp(f->tensors[idx[i]].name, f->tensors[idx[j]].name)
                        : cmp_str(f->kvs[idx[i]].key, f->kvs[idx[j]].key);
        tmp[k++] = r <= 0 ? idx[i++] : idx[j++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static enum ekv_status check_duplicates(const struct ekv_gguf_file *f, bool tensors) {
    size_t n = tensors ? f->n_tensors : f->n_kv;
    if (n < 2) return EKV_OK;
    size_t *idx = malloc(n * sizeof *idx), *tmp = malloc(n * sizeof *tmp);
    if (!idx || !tmp) {
        free(idx);
        free(tmp);
        return ekv_err(EKV_ERR_NOMEM, "no memory to check %zu names for duplicates", n);
    }
    for (size_t i = 0; i < n; i++) idx[i] = i;
    sort_idx(idx, tmp, n, f, tensors);
    enum ekv_status s = EKV_OK;
    for (size_t i = 1; i < n && !s; i++) {
        if (tensors) {
            if (strcmp(f->tensors[idx[i - 1]].name, f->tensors[idx[i]].name) == 0) {
                struct ekv_gguf_str nm = {strlen(f->tensors[idx[i]].name), f->tensors[idx[i]].name};
                char buf[80];
                s = ekv_err(EKV_ERR_FORMAT, "duplicate tensor name '%s'", printable(nm, buf, sizeof buf));
            }
        } else if (cmp_str(f->kvs[idx[i - 1]].key, f->kvs[idx[i]].key) == 0) {
            char buf[80];
            s = ekv_err(EKV_ERR_FORMAT, "duplicate key '%s'", printable(f->kvs[idx[i]].key, buf, sizeof buf));
        }
    }
    free(idx);
    free(tmp);
    return s;
}

/* ---- the header ---- */

static enum ekv_status parse_alignment(struct ekv_gguf_file *f) {
    const struct ekv_gguf_kv *kv = ekv_gguf_find_kv(f, "general.alignment");
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv) return EKV_OK;
    uint64_t a;
    switch (kv->value.type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        a = kv->value.v.u64;
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        if (kv->value.v.i64 <= 0)
            return ekv_err(EKV_ERR_FORMAT, "general.alignment is %lld (must be a positive power of two)",
                           (long long)kv->value.v.i64);
        a = (uint64_t)kv->value.v.i64;
        break;
    default:
        return ekv_err(EKV_ERR_FORMAT, "general.alignment has type %s (expected an integer)",
                       ekv_gguf_type_name(kv->value.type));
    }
    if (a == 0 || (a & (a - 1)) || a > (1u << 30))
        return ekv_err(EKV_ERR_FORMAT, "general.alignment is %llu (must be a power of two, 1 to 2^30)",
                       (unsigned long long)a);
    f->alignment = (uint32_t)a;
    return EKV_OK;
}

static enum ekv_status parse_tensor_info(struct cursor *c, struct ekv_gguf_tensor *t, size_t i) {
    struct ekv_gguf_str name;
    enum ekv_status s;
    char nb[80];
    if ((s = rd_str(c, &name, "tensor name"))) return ekv_err_prefix(s, "tensor %zu", i);
    if (name.len == 0) return ekv_err(EKV_ERR_FORMAT, "tensor %zu has an empty name", i);
    if (memchr(name.ptr, '\0', (size_t)name.len))
        return ekv_err(EKV_ERR_FORMAT, "tensor %zu: name '%s' contains a NUL byte", i,
                       printable(name, nb, sizeof nb));
    t->name = malloc((size_t)name.len + 1);
    if (!t->name) return ekv_err(EKV_ERR_NOMEM, "tensor %zu: no memory for its name", i);
    memcpy(t->name, name.ptr, (size_t)name.len);
    t->name[name.len] = '\0';
    const char *pn = printable(name, nb, sizeof nb);

    uint32_t n_dims;
    if ((s = rd_u32(c, &n_dims, "n_dims"))) return ekv_err_prefix(s, "tensor '%s'", pn);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return ekv_err(EKV_ERR_FORMAT, "tensor '%s': n_dims is %u (must be 1 to %d)", pn, n_dims,
                       GGUF_MAX_DIMS);
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((s = rd_u64(c, &ne, "dimension"))) return ekv_err_prefix(s, "tensor '%s'", pn);
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return ekv_err(EKV_ERR_FORMAT, "tensor '%s': dimension %u is %lld (must be >= 1)", pn, d,
                           (long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type;
    if ((s = rd_u32(c, &type, "tensor type"))) return ekv_err_prefix(s, "tensor '%s'", pn);
    if (!ekv_dtype_valid(type))
        return ekv_err(EKV_ERR_FORMAT, "tensor '%s': unknown tensor type id %u", pn, type);
    t->type = (enum ekv_dtype)type;
    if ((s = rd_u64(c, &t->offset, "tensor offset"))) return ekv_err_prefix(s, "tensor '%s'", pn);

    /* Element count and bytes, overflow-checked. */
    int64_t rows = 1, elems;
    for (int d = 1; d < GGUF_MAX_DIMS; d++) {
        if (__builtin_mul_overflow(rows, t->ne[d], &rows))
            return ekv_err(EKV_ERR_OVERFLOW, "tensor '%s': element count overflows", pn);
    }
    if (__builtin_mul_overflow(rows, t->ne[0], &elems))
        return ekv_err(EKV_ERR_OVERFLOW, "tensor '%s': element count overflows", pn);
    const struct ekv_dtype_info *ti = ekv_dtype_get(type);
    if ((uint64_t)t->ne[0] % ti->block_size)
        return ekv_err(EKV_ERR_FORMAT, "tensor '%s': row length %lld is not a multiple of the %s block size %u",
                       pn, (long long)t->ne[0], ti->name, ti->block_size);
    size_t row_bytes;
    if (!ekv_dtype_row_bytes(t->type, t->ne[0], &row_bytes) ||
        !ekv_mul_ok(row_bytes, (size_t)rows, &t->nbytes))
        return ekv_err(EKV_ERR_OVERFLOW, "tensor '%s': byte size overflows", pn);
    return EKV_OK;
}

static enum ekv_status parse(struct ekv_gguf_file *f) {
    struct cursor c = {f->base, f->size, 0};
    enum ekv_status s;
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    if ((s = rd_u32(&c, &magic, "magic"))) return s;
    if (magic != GGUF_MAGIC) {
        const uint8_t *b = f->base;
        return ekv_err(EKV_ERR_FORMAT, "not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")",
                       b[0], b[1], b[2], b[3]);
    }
    if ((s = rd_u32(&c, &version, "version"))) return s;
    if (version == 1)
        return ekv_err(EKV_ERR_UNSUPPORTED,
                       "GGUF version 1 is not supported (it predates 64-bit counts); convert the model again");
    if (version != 2 && version != 3) {
        uint32_t sw = __builtin_bswap32(version);
        if (sw == 2 || sw == 3)
            return ekv_err(EKV_ERR_UNSUPPORTED, "big-endian GGUF (version %u) is not supported", sw);
        return ekv_err(EKV_ERR_UNSUPPORTED, "unsupported GGUF version %u (supported: 2 and 3)", version);
    }
    f->version = version;
    if ((s = rd_u64(&c, &n_tensors, "tensor count")) || (s = rd_u64(&c, &n_kv, "key/value count")))
        return s;
    /* Each entry takes a minimum number of bytes, which bounds the counts. */
    size_t left = cur_left(&c);
    if (n_kv > left / GGUF_MIN_KV_BYTES)
        return ekv_err(EKV_ERR_FORMAT, "key/value count %llu cannot fit in the %zu bytes left",
                       (unsigned long long)n_kv, left);
    if (n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        (n_kv && n_tensors > (left - n_kv * GGUF_MIN_KV_BYTES) / GGUF_MIN_TENSOR_BYTES))
        return ekv_err(EKV_ERR_FORMAT, "tensor count %llu cannot fit in the %zu bytes left",
                       (unsigned long long)n_tensors, left);

    if (n_kv) {
        f->kvs = calloc((size_t)n_kv, sizeof *f->kvs);
        if (!f->kvs) return ekv_err(EKV_ERR_NOMEM, "no memory for %llu key/values", (unsigned long long)n_kv);
    }
    for (size_t i = 0; i < n_kv; i++) {
        struct ekv_gguf_kv *kv = &f->kvs[i];
        uint32_t type;
        char kb[80];
        if ((s = rd_str(&c, &kv->key, "key"))) return ekv_err_prefix(s, "key/value %zu", i);
        f->n_kv = i + 1; /* from here on kvs[i] is freed by ekv_gguf_close */
        kv->value.type = GGUF_TYPE_UINT8;
        const char *pk = printable(kv->key, kb, sizeof kb);
        if ((s = rd_u32(&c, &type, "value type"))) return ekv_err_prefix(s, "key '%s'", pk);
        if (type >= GGUF_TYPE_COUNT)
            return ekv_err(EKV_ERR_FORMAT, "key '%s': unknown value type %u", pk, type);
        if ((s = parse_value(&c, (enum ekv_gguf_type)type, &kv->value, 0, pk))) return s;
    }
    if ((s = check_duplicates(f, false))) return s;
    if ((s = parse_alignment(f))) return s;

    if (n_tensors) {
        f->tensors = calloc((size_t)n_tensors, sizeof *f->tensors);
        if (!f->tensors)
            return ekv_err(EKV_ERR_NOMEM, "no memory for %llu tensor infos", (unsigned long long)n_tensors);
    }
    for (size_t i = 0; i < n_tensors; i++) {
        f->n_tensors = i + 1;
        if ((s = parse_tensor_info(&c, &f->tensors[i], i))) return s;
    }
    if ((s = check_duplicates(f, true))) return s;

    /* The data section starts at the next multiple of the alignment. A file
     * without tensors may end before that padding. */
    size_t pad = (f->alignment - c.pos % f->alignment) % f->alignment;
    if (pad > cur_left(&c)) {
        if (n_tensors)
            return ekv_err(EKV_ERR_FORMAT, "truncated: data section would start at offset %zu, past the end of "
                           "the file (size %zu)", c.pos + pad, f->size);
        pad = cur_left(&c);
    }
    f->data_offset = c.pos + pad;
    size_t data_size = f->size - f->data_offset;
    for (size_t i = 0; i < f->n_tensors; i++) {
        struct ekv_gguf_tensor *t = &f->tensors[i];
        char nb[80];
        struct ekv_gguf_str nm = {strlen(t->name), t->name};
        const char *pn = printable(nm, nb, sizeof nb);
        if (t->offset % f->alignment)
            return ekv_err(EKV_ERR_FORMAT, "tensor '%s': data offset %llu is not a multiple of the alignment %u",
                           pn, (unsigned long long)t->offset, f->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            unsigned long long abs_off = (unsigned long long)t->offset + f->data_offset;
            if (abs_off < t->offset) abs_off = (unsigned long long)t->offset; /* wrapped: show the raw value */
            return ekv_err(EKV_ERR_FORMAT, "tensor '%s': data [offset %llu, %zu bytes] extends past end of file "
                           "(size %zu)", pn, abs_off, t->nbytes, f->size);
        }
        t->data = f->base + f->data_offset + t->offset;
    }
    return EKV_OK;
}

/* ---- open / close ---- */

void ekv_gguf_close(struct ekv_gguf_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_kv; i++) value_free(&f->kvs[i].value);
    free(f->kvs);
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap(f->map, f->map_len);
    free(f);
}

enum ekv_status ekv_gguf_open_memory(const void *data, size_t size, struct ekv_gguf_file **out) {
    if (!out || (!data && size))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_gguf_open_memory: NULL argument");
    *out = NULL;
    struct ekv_gguf_file *f = calloc(1, sizeof *f);
    if (!f) return ekv_err(EKV_ERR_NOMEM, "no memory for a GGUF handle");
    static const uint8_t empty[4];
    f->base = data ? data : empty;
    f->size = size;
    enum ekv_status s = parse(f);
    if (s) {
        ekv_gguf_close(f);
        return s;
    }
    *out = f;
    return EKV_OK;
}

enum ekv_status ekv_gguf_open(const char *path, struct ekv_gguf_file **out) {
    if (!path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ekv_err(EKV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ekv_err(EKV_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ekv_err(EKV_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return ekv_err(EKV_ERR_FORMAT, "%s: file is empty (not a GGUF file)", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return ekv_err(EKV_ERR_OVERFLOW, "%s: file too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return ekv_err(EKV_ERR_IO, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
    struct ekv_gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(map, size);
        return ekv_err(EKV_ERR_NOMEM, "%s: no memory for a GGUF handle", path);
    }
    f->base = map;
    f->size = size;
    f->map = map;
    f->map_len = size;
    enum ekv_status s = parse(f);
    if (s) {
        ekv_gguf_close(f);
        return ekv_err_prefix(s, "%s", path);
    }
    *out = f;
    return EKV_OK;
}

/* ---- accessors ---- */

uint32_t ekv_gguf_version(const struct ekv_gguf_file *f) { return f->version; }
uint32_t ekv_gguf_alignment(const struct ekv_gguf_file *f) { return f->alignment; }
size_t ekv_gguf_file_size(const struct ekv_gguf_file *f) { return f->size; }
size_t ekv_gguf_data_offset(const struct ekv_gguf_file *f) { return f->data_offset; }
const void *ekv_gguf_bytes(const struct ekv_gguf_file *f) { return f->base; }
size_t ekv_gguf_n_kv(const struct ekv_gguf_file *f) { return f->n_kv; }
size_t ekv_gguf_n_tensors(const struct ekv_gguf_file *f) { return f->n_tensors; }

const struct ekv_gguf_kv *ekv_gguf_kv_at(const struct ekv_gguf_file *f, size_t i) {
    return i < f->n_kv ? &f->kvs[i] : NULL;
}

const struct ekv_gguf_tensor *ekv_gguf_tensor_at(const struct ekv_gguf_file *f, size_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

bool ekv_gguf_str_eq(struct ekv_gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.ptr, cstr, n) == 0);
}

void ekv_gguf_str_copy(struct ekv_gguf_str s, char *buf, size_t n) {
    if (!n) return;
    size_t len = s.len < n - 1 ? (size_t)s.len : n - 1;
    if (len) memcpy(buf, s.ptr, len);
    buf[len] = '\0';
}

const struct ekv_gguf_kv *ekv_gguf_find_kv(const struct ekv_gguf_file *f, const char *key) {
    for (size_t i = 0; i < f->n_kv; i++)
        if (ekv_gguf_str_eq(f->kvs[i].key, key)) return &f->kvs[i];
    return NULL;
}

const struct ekv_gguf_tensor *ekv_gguf_find_tensor(const struct ekv_gguf_file *f, const char *name) {
    for (size_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

/* ---- typed getters ---- */

static enum ekv_status lookup(const struct ekv_gguf_file *f, const char *key, const struct ekv_gguf_kv **kv) {
    *kv = ekv_gguf_find_kv(f, key);
    if (!*kv) return ekv_err(EKV_ERR_NOT_FOUND, "key '%s' not found", key);
    return EKV_OK;
}

static enum ekv_status wrong_type(const char *key, const char *expected, enum ekv_gguf_type actual) {
    return ekv_err(EKV_ERR_FORMAT, "key '%s': expected %s, found %s", key, expected, ekv_gguf_type_name(actual));
}

static bool is_unsigned(enum ekv_gguf_type t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}
static bool is_signed(enum ekv_gguf_type t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

enum ekv_status ekv_gguf_get_u32(const struct ekv_gguf_file *f, const char *key, uint32_t *out) {
    const struct ekv_gguf_kv *kv;
    enum ekv_status s = lookup(f, key, &kv);
    if (s) return s;
    const struct ekv_gguf_value *v = &kv->value;
    if (is_unsigned(v->type) && v->v.u64 <= UINT32_MAX) {
        *out = (uint32_t)v->v.u64;
        return EKV_OK;
    }
    if (is_signed(v->type) && v->v.i64 >= 0 && v->v.i64 <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)v->v.i64;
        return EKV_OK;
    }
    if (is_unsigned(v->type))
        return ekv_err(EKV_ERR_FORMAT, "key '%s': value %llu does not fit in uint32", key,
                       (unsigned long long)v->v.u64);
    if (is_signed(v->type))
        return ekv_err(EKV_ERR_FORMAT, "key '%s': value %lld does not fit in uint32", key, (long long)v->v.i64);
    return wrong_type(key, "an integer", v->type);
}

enum ekv_status ekv_gguf_get_i64(const struct ekv_gguf_file *f, const char *key, int64_t *out) {
    const struct ekv_gguf_kv *kv;
    enum ekv_status s = lookup(f, key, &kv);
    if (s) return s;
    const struct ekv_gguf_value *v = &kv->value;
    if (is_signed(v->type)) {
        *out = v->v.i64;
        return EKV_OK;
    }
    if (is_unsigned(v->type)) {
        if (v->v.u64 > (uint64_t)INT64_MAX)
            return ekv_err(EKV_ERR_FORMAT, "key '%s': value %llu does not fit in int64", key,
                           (unsigned long long)v->v.u64);
        *out = (int64_t)v->v.u64;
        return EKV_OK;
    }
    return wrong_type(key, "an integer", v->type);
}

enum ekv_status ekv_gguf_get_f32(const struct ekv_gguf_file *f, const char *key, float *out) {
    const struct ekv_gguf_kv *kv;
    enum ekv_status s = lookup(f, key, &kv);
    if (s) return s;
    if (kv->value.type != GGUF_TYPE_FLOAT32 && kv->value.type != GGUF_TYPE_FLOAT64)
        return wrong_type(key, "float32 or float64", kv->value.type);
    *out = (float)kv->value.v.f64;
    return EKV_OK;
}

enum ekv_status ekv_gguf_get_bool(const struct ekv_gguf_file *f, const char *key, bool *out) {
    const struct ekv_gguf_kv *kv;
    enum ekv_status s = lookup(f, key, &kv);
    if (s) return s;
    if (kv->value.type != GGUF_TYPE_BOOL) return wrong_type(key, "bool", kv->value.type);
    *out = kv->value.v.u64 != 0;
    return EKV_OK;
}

enum ekv_status ekv_gguf_get_str(const struct ekv_gguf_file *f, const char *key, struct ekv_gguf_str *out) {
    const struct ekv_gguf_kv *kv;
    enum ekv_status s = lookup(f, key, &kv);
    if (s) return s;
    if (kv->value.type != GGUF_TYPE_STRING) return wrong_type(key, "string", kv->value.type);
    *out = kv->value.v.str;
    return EKV_OK;
}

enum ekv_status ekv_gguf_get_arr(const struct ekv_gguf_file *f, const char *key, enum ekv_gguf_type elem_type,
                             const struct ekv_gguf_value **out) {
    const struct ekv_gguf_kv *kv;
    enum ekv_status s = lookup(f, key, &kv);
    if (s) return s;
    if (kv->value.type != GGUF_TYPE_ARRAY) return wrong_type(key, "array", kv->value.type);
    if (elem_type != GGUF_TYPE_COUNT && kv->value.v.arr.type != elem_type)
        return ekv_err(EKV_ERR_FORMAT, "key '%s': expected an array of %s, found an array of %s", key,
                       ekv_gguf_type_name(elem_type), ekv_gguf_type_name(kv->value.v.arr.type));
    *out = &kv->value;
    return EKV_OK;
}
