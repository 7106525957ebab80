/*
 * gguf_write.c — the GGUF writer (always version 3).
 *
 * Synthetic models (`ekv mkmodel`), converted checkpoints and test fixtures
 * are produced here. The writer owns copies of all metadata, lays tensors out
 * at aligned offsets, and streams tensor bytes either from a caller buffer or
 * through a fill callback in 1 MiB chunks, so multi-gigabyte files never sit
 * in memory. Output goes to "<path>.tmp", is flushed and synced, and is then
 * renamed over <path>; on any failure the temporary file is removed, so a
 * reader never sees a partial file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "model/gguf.h"

#define FILL_CHUNK ((size_t)1 << 20)
#define MAX_NESTING 8

struct wkv {
    char *key;              /* NUL-terminated, owned */
    struct ekv_gguf_value val;  /* every pointer inside is owned by the writer */
};

struct wtensor {
    struct ekv_gguf_tensor t;   /* t.name owned; t.offset set at write time */
    const void *data;       /* [t.nbytes] borrowed, or NULL when fill is used */
    ekv_gguf_fill_fn fill;
    void *user;
};

struct ekv_gguf_writer {
    struct wkv *kvs;        /* [n_kv] in insertion order */
    size_t n_kv, cap_kv;
    struct wtensor *ts;     /* [n_t] in insertion order */
    size_t n_t, cap_t;
};

/* ---- owned values ---- */

static void owned_free(struct ekv_gguf_value *v) {
    if (v->type == GGUF_TYPE_STRING) {
        free((void *)v->v.str.ptr);
    } else if (v->type == GGUF_TYPE_ARRAY) {
        free((void *)v->v.arr.data);
        if (v->v.arr.strs)
            for (uint64_t i = 0; i < v->v.arr.n; i++) free((void *)v->v.arr.strs[i].ptr);
        free(v->v.arr.strs);
        if (v->v.arr.vals)
            for (uint64_t i = 0; i < v->v.arr.n; i++) owned_free(&v->v.arr.vals[i]);
        free(v->v.arr.vals);
    }
    memset(v, 0, sizeof *v);
}

static enum ekv_status dup_str(struct ekv_gguf_str src, struct ekv_gguf_str *dst, const char *key) {
    if (src.len > SIZE_MAX - 1 || (src.len && !src.ptr))
        return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': invalid string", key);
    char *p = malloc((size_t)src.len + 1);
    if (!p) return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory for a %llu-byte string", key,
                           (unsigned long long)src.len);
    if (src.len) memcpy(p, src.ptr, (size_t)src.len);
    p[src.len] = '\0';
    dst->ptr = p;
    dst->len = src.len;
    return EKV_OK;
}

/* Deep copy of src into *dst (zeroed first); on error *dst is freed. */
static enum ekv_status copy_value(struct ekv_gguf_value *dst, const struct ekv_gguf_value *src, int depth,
                                  const char *key) {
    enum ekv_status s = EKV_OK;
    memset(dst, 0, sizeof *dst);
    if ((unsigned)src->type >= GGUF_TYPE_COUNT)
        return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': unknown value type %u", key, (unsigned)src->type);
    dst->type = src->type;
    if (ekv_gguf_scalar_size(src->type)) {
        dst->v = src->v;
        return EKV_OK;
    }
    if (src->type == GGUF_TYPE_STRING) return dup_str(src->v.str, &dst->v.str, key);
    /* arrays */
    if (depth >= MAX_NESTING)
        return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': arrays nested deeper than %d levels", key, MAX_NESTING);
    enum ekv_gguf_type et = src->v.arr.type;
    uint64_t n = src->v.arr.n;
    if ((unsigned)et >= GGUF_TYPE_COUNT)
        return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': unknown array element type %u", key, (unsigned)et);
    dst->v.arr.type = et;
    size_t esz = ekv_gguf_scalar_size(et), bytes;
    if (esz) {
        if (n > SIZE_MAX || !ekv_mul_ok((size_t)n, esz, &bytes))
            return ekv_err(EKV_ERR_OVERFLOW, "key '%s': array of %llu elements is too large", key,
                           (unsigned long long)n);
        if (n && !src->v.arr.data) return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': array data is NULL", key);
        void *p = malloc(bytes ? bytes : 1);
        if (!p) return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory for %zu bytes", key, bytes);
        if (bytes) memcpy(p, src->v.arr.data, bytes);
        dst->v.arr.data = p;
        dst->v.arr.n = n;
        return EKV_OK;
    }
    if (n == 0) return EKV_OK;
    size_t elem = et == GGUF_TYPE_STRING ? sizeof(struct ekv_gguf_str) : sizeof(struct ekv_gguf_value);
    if (n > SIZE_MAX / elem)
        return ekv_err(EKV_ERR_OVERFLOW, "key '%s': array of %llu elements is too large", key,
                       (unsigned long long)n);
    if (et == GGUF_TYPE_STRING) {
        if (!src->v.arr.strs) return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': string array is NULL", key);
        dst->v.arr.strs = calloc((size_t)n, sizeof(struct ekv_gguf_str));
        if (!dst->v.arr.strs) return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory for %llu strings", key,
                                             (unsigned long long)n);
        dst->v.arr.n = n;
        for (uint64_t i = 0; i < n && !s; i++) s = dup_str(src->v.arr.strs[i], &dst->v.arr.strs[i], key);
    } else {
        if (!src->v.arr.vals) return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': nested array is NULL", key);
        dst->v.arr.vals = calloc((size_t)n, sizeof(struct ekv_gguf_value));
        if (!dst->v.arr.vals) return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory for %llu arrays", key,
                                             (unsigned long long)n);
        dst->v.arr.n = n;
        for (uint64_t i = 0; i < n && !s; i++) {
            if (src->v.arr.vals[i].type != GGUF_TYPE_ARRAY)
                s = ekv_err(EKV_ERR_INVALID_ARG, "key '%s': element %llu of an array of arrays has type %s", key,
                            (unsigned long long)i, ekv_gguf_type_name(src->v.arr.vals[i].type));
            else
                s = copy_value(&dst->v.arr.vals[i], &src->v.arr.vals[i], depth + 1, key);
        }
    }
    if (s) owned_free(dst);
    return s;
}

/* ---- building ---- */

enum ekv_status ekv_gguf_writer_new(struct ekv_gguf_writer **out) {
    if (!out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_gguf_writer_new: NULL argument");
    *out = calloc(1, sizeof **out);
    if (!*out) return ekv_err(EKV_ERR_NOMEM, "no memory for a GGUF writer");
    return EKV_OK;
}

void ekv_gguf_writer_free(struct ekv_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        owned_free(&w->kvs[i].val);
    }
    free(w->kvs);
    for (size_t i = 0; i < w->n_t; i++) free(w->ts[i].t.name);
    free(w->ts);
    free(w);
}

/* Stores a copy of v under key, replacing an earlier value of that key. */
static enum ekv_status set_value(struct ekv_gguf_writer *w, const char *key, const struct ekv_gguf_value *v) {
    if (!w || !key || !v) return ekv_err(EKV_ERR_INVALID_ARG, "gguf writer: NULL argument");
    if (!key[0]) return ekv_err(EKV_ERR_INVALID_ARG, "gguf writer: empty key");
    struct ekv_gguf_value copy;
    enum ekv_status s = copy_value(&copy, v, 0, key);
    if (s) return s;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            owned_free(&w->kvs[i].val);
            w->kvs[i].val = copy;
            return EKV_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        struct wkv *p = realloc(w->kvs, cap * sizeof *p);
        if (!p) {
            owned_free(&copy);
            return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory", key);
        }
        w->kvs = p;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        owned_free(&copy);
        return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory", key);
    }
    w->kvs[w->n_kv].key = k;
    w->kvs[w->n_kv].val = copy;
    w->n_kv++;
    return EKV_OK;
}

enum ekv_status ekv_gguf_writer_set_value(struct ekv_gguf_writer *w, const char *key, const struct ekv_gguf_value *v) {
    return set_value(w, key, v);
}

enum ekv_status ekv_gguf_writer_set_u32(struct ekv_gguf_writer *w, const char *key, uint32_t v) {
    struct ekv_gguf_value x = {.type = GGUF_TYPE_UINT32, .v.u64 = v};
    return set_value(w, key, &x);
}

enum ekv_status ekv_gguf_writer_set_i32(struct ekv_gguf_writer *w, const char *key, int32_t v) {
    struct ekv_gguf_value x = {.type = GGUF_TYPE_INT32, .v.i64 = v};
    return set_value(w, key, &x);
}

enum ekv_status ekv_gguf_writer_set_u64(struct ekv_gguf_writer *w, const char *key, uint64_t v) {
    struct ekv_gguf_value x = {.type = GGUF_TYPE_UINT64, .v.u64 = v};
    return set_value(w, key, &x);
}

enum ekv_status ekv_gguf_writer_set_f32(struct ekv_gguf_writer *w, const char *key, float v) {
    struct ekv_gguf_value x = {.type = GGUF_TYPE_FLOAT32, .v.f64 = v};
    return set_value(w, key, &x);
}

enum ekv_status ekv_gguf_writer_set_bool(struct ekv_gguf_writer *w, const char *key, bool v) {
    struct ekv_gguf_value x = {.type = GGUF_TYPE_BOOL, .v.u64 = v ? 1 : 0};
    return set_value(w, key, &x);
}

enum ekv_status ekv_gguf_writer_set_str(struct ekv_gguf_writer *w, const char *key, const char *v) {
    if (!v) return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': NULL string", key ? key : "(null)");
    struct ekv_gguf_value x = {.type = GGUF_TYPE_STRING, .v.str = {strlen(v), v}};
    return set_value(w, key, &x);
}

enum ekv_status ekv_gguf_writer_set_arr(struct ekv_gguf_writer *w, const char *key, enum ekv_gguf_type elem_type,
                                    const void *data, uint64_t n) {
    if (!ekv_gguf_scalar_size(elem_type))
        return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': ekv_gguf_writer_set_arr needs a scalar element type, not %s",
                       key ? key : "(null)", ekv_gguf_type_name(elem_type));
    struct ekv_gguf_value x = {.type = GGUF_TYPE_ARRAY};
    x.v.arr.type = elem_type;
    x.v.arr.n = n;
    x.v.arr.data = data;
    return set_value(w, key, &x);
}

enum ekv_status ekv_gguf_writer_set_arr_str(struct ekv_gguf_writer *w, const char *key, const char *const *strs,
                                        uint64_t n) {
    if (n && !strs) return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': NULL string array", key ? key : "(null)");
    if (n > SIZE_MAX / sizeof(struct ekv_gguf_str))
        return ekv_err(EKV_ERR_OVERFLOW, "key '%s': too many strings", key ? key : "(null)");
    struct ekv_gguf_str *tmp = n ? malloc((size_t)n * sizeof *tmp) : NULL;
    if (n && !tmp) return ekv_err(EKV_ERR_NOMEM, "key '%s': no memory", key ? key : "(null)");
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            free(tmp);
            return ekv_err(EKV_ERR_INVALID_ARG, "key '%s': string %llu is NULL", key ? key : "(null)",
                           (unsigned long long)i);
        }
        tmp[i].len = strlen(strs[i]);
        tmp[i].ptr = strs[i];
    }
    struct ekv_gguf_value x = {.type = GGUF_TYPE_ARRAY};
    x.v.arr.type = GGUF_TYPE_STRING;
    x.v.arr.n = n;
    x.v.arr.strs = tmp;
    enum ekv_status s = set_value(w, key, &x);
    free(tmp);
    return s;
}

enum ekv_status ekv_gguf_writer_copy_kv(struct ekv_gguf_writer *w, const struct ekv_gguf_kv *kv) {
    if (!w || !kv) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_gguf_writer_copy_kv: NULL argument");
    if (kv->key.len == 0 || kv->key.len > 65535 || memchr(kv->key.ptr, '\0', (size_t)kv->key.len))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_gguf_writer_copy_kv: key is empty, too long or contains NUL");
    char *key = malloc((size_t)kv->key.len + 1);
    if (!key) return ekv_err(EKV_ERR_NOMEM, "ekv_gguf_writer_copy_kv: no memory");
    ekv_gguf_str_copy(kv->key, key, (size_t)kv->key.len + 1);
    enum ekv_status s = set_value(w, key, &kv->value);
    free(key);
    return s;
}

enum ekv_status ekv_gguf_writer_add_tensor(struct ekv_gguf_writer *w, const char *name, enum ekv_dtype type,
                                       uint32_t n_dims, const int64_t *ne, const void *data,
                                       ekv_gguf_fill_fn fill, void *user) {
    if (!w || !name || !ne) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_gguf_writer_add_tensor: NULL argument");
    if (!name[0]) return ekv_err(EKV_ERR_INVALID_ARG, "gguf writer: empty tensor name");
    if (!data == !fill)
        return ekv_err(EKV_ERR_INVALID_ARG, "tensor '%s': give exactly one of data and fill", name);
    if (!ekv_dtype_valid((uint32_t)type))
        return ekv_err(EKV_ERR_INVALID_ARG, "tensor '%s': unknown type id %u", name, (unsigned)type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return ekv_err(EKV_ERR_INVALID_ARG, "tensor '%s': n_dims %u (must be 1 to %d)", name, n_dims,
                       GGUF_MAX_DIMS);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->ts[i].t.name, name) == 0)
            return ekv_err(EKV_ERR_INVALID_ARG, "tensor '%s' added twice", name);
    struct wtensor wt;
    memset(&wt, 0, sizeof wt);
    int64_t rows = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) wt.t.ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return ekv_err(EKV_ERR_INVALID_ARG, "tensor '%s': dimension %u is %lld (must be >= 1)", name, d,
                           (long long)ne[d]);
        wt.t.ne[d] = ne[d];
        if (d > 0 && __builtin_mul_overflow(rows, ne[d], &rows))
            return ekv_err(EKV_ERR_OVERFLOW, "tensor '%s': element count overflows", name);
    }
    int64_t elems;
    if (__builtin_mul_overflow(rows, ne[0], &elems))
        return ekv_err(EKV_ERR_OVERFLOW, "tensor '%s': element count overflows", name);
    size_t row_bytes;
    const struct ekv_dtype_info *ti = ekv_dtype_get((uint32_t)type);
    if ((uint64_t)ne[0] % ti->block_size)
        return ekv_err(EKV_ERR_INVALID_ARG, "tensor '%s': row length %lld is not a multiple of the %s block size %u",
                       name, (long long)ne[0], ti->name, ti->block_size);
    if (!ekv_dtype_row_bytes(type, ne[0], &row_bytes) || !ekv_mul_ok(row_bytes, (size_t)rows, &wt.t.nbytes))
        return ekv_err(EKV_ERR_OVERFLOW, "tensor '%s': byte size overflows", name);
    wt.t.n_dims = n_dims;
    wt.t.type = type;
    wt.t.data = data;
    wt.data = data;
    wt.fill = fill;
    wt.user = user;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        struct wtensor *p = realloc(w->ts, cap * sizeof *p);
        if (!p) return ekv_err(EKV_ERR_NOMEM, "tensor '%s': no memory", name);
        w->ts = p;
        w->cap_t = cap;
    }
    wt.t.name = strdup(name);
    if (!wt.t.name) return ekv_err(EKV_ERR_NOMEM, "tensor '%s': no memory", name);
    w->ts[w->n_t++] = wt;
    return EKV_OK;
}

/* ---- serialisation ---- */

struct out {
    FILE *fp;
    const char *path; /* the temporary file, for messages */
    enum ekv_status s;
};

static void put(struct out *o, const void *p, size_t n) {
    if (o->s || n == 0) return;
    if (fwrite(p, 1, n, o->fp) != n)
        o->s = ekv_err(EKV_ERR_IO, "%s: write failed: %s", o->path, strerror(errno));
}

static void put_le(struct out *o, uint64_t v, size_t n) {
    uint8_t b[8];
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(o, b, n);
}

static void put_str(struct out *o, struct ekv_gguf_str s) {
    put_le(o, s.len, 8);
    put(o, s.ptr, (size_t)s.len);
}

static void put_zeros(struct out *o, size_t n) {
    static const uint8_t zeros[64];
    while (n && !o->s) {
        size_t k = EKV_MIN(n, sizeof zeros);
        put(o, zeros, k);
        n -= k;
    }
}

/* Writes the payload of v (its type was written by the caller). */
static void put_value(struct out *o, const struct ekv_gguf_value *v) {
    size_t esz = ekv_gguf_scalar_size(v->type);
    if (esz) {
        uint64_t bits = v->v.u64;
        if (v->type == GGUF_TYPE_FLOAT32) {
            float f = (float)v->v.f64;
            uint32_t b32;
            memcpy(&b32, &f, 4);
            bits = b32;
        } else if (v->type == GGUF_TYPE_FLOAT64) {
            memcpy(&bits, &v->v.f64, 8);
        } else if (v->type == GGUF_TYPE_BOOL) {
            bits = v->v.u64 != 0;
        }
        put_le(o, bits, esz); /* signed values: two's complement low bytes */
        return;
    }
    if (v->type == GGUF_TYPE_STRING) {
        put_str(o, v->v.str);
        return;
    }
    put_le(o, (uint64_t)v->v.arr.type, 4);
    put_le(o, v->v.arr.n, 8);
    size_t ae = ekv_gguf_scalar_size(v->v.arr.type);
    if (ae) {
        put(o, v->v.arr.data, (size_t)v->v.arr.n * ae); /* raw little-endian elements */
    } else if (v->v.arr.type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < v->v.arr.n; i++) put_str(o, v->v.arr.strs[i]);
    } else {
        for (uint64_t i = 0; i < v->v.arr.n; i++) put_value(o, &v->v.arr.vals[i]);
    }
}

static enum ekv_status writer_alignment(const struct ekv_gguf_writer *w, size_t *align) {
    *align = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0) continue;
        const struct ekv_gguf_value *v = &w->kvs[i].val;
        uint64_t a;
        switch (v->type) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
            a = v->v.u64;
            break;
        case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
            a = v->v.i64 > 0 ? (uint64_t)v->v.i64 : 0;
            break;
        default:
            return ekv_err(EKV_ERR_INVALID_ARG, "general.alignment must be an integer, not %s",
                           ekv_gguf_type_name(v->type));
        }
        if (a == 0 || (a & (a - 1)) || a > (1u << 30))
            return ekv_err(EKV_ERR_INVALID_ARG, "general.alignment must be a power of two from 1 to 2^30");
        *align = (size_t)a;
    }
    return EKV_OK;
}

static enum ekv_status write_body(struct ekv_gguf_writer *w, struct out *o, size_t align) {
    /* Lay out the data section first so overflow is caught before writing. */
    size_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        struct ekv_gguf_tensor *t = &w->ts[i].t;
        size_t padded;
        t->offset = off;
        if (!ekv_add_ok(t->nbytes, align - 1, &padded) || !ekv_add_ok(off, padded / align * align, &off))
            return ekv_err(EKV_ERR_OVERFLOW, "tensor '%s': data section size overflows", t->name);
    }
    put_le(o, GGUF_MAGIC, 4);
    put_le(o, 3, 4);
    put_le(o, w->n_t, 8);
    put_le(o, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        struct ekv_gguf_str k = {strlen(w->kvs[i].key), w->kvs[i].key};
        put_str(o, k);
        put_le(o, (uint64_t)w->kvs[i].val.type, 4);
        put_value(o, &w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const struct ekv_gguf_tensor *t = &w->ts[i].t;
        struct ekv_gguf_str nm = {strlen(t->name), t->name};
        put_str(o, nm);
        put_le(o, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) put_le(o, (uint64_t)t->ne[d], 8);
        put_le(o, (uint64_t)t->type, 4);
        put_le(o, t->offset, 8);
    }
    if (o->s) return o->s;
    long tell = ftell(o->fp);
    if (tell < 0) return ekv_err(EKV_ERR_IO, "%s: ftell failed: %s", o->path, strerror(errno));
    uint64_t pos = (uint64_t)tell;
    put_zeros(o, (size_t)((align - pos % align) % align));

    uint8_t *buf = NULL;
    for (size_t i = 0; i < w->n_t && !o->s; i++) {
        const struct wtensor *wt = &w->ts[i];
        if (wt->data) {
            put(o, wt->data, wt->t.nbytes);
        } else {
            if (!buf && !(buf = malloc(FILL_CHUNK))) {
                o->s = ekv_err(EKV_ERR_NOMEM, "no memory for a %zu-byte fill buffer", FILL_CHUNK);
                break;
            }
            for (size_t done = 0; done < wt->t.nbytes && !o->s; ) {
                size_t n = EKV_MIN(FILL_CHUNK, wt->t.nbytes - done);
                enum ekv_status s = wt->fill(wt->user, &wt->t, done, buf, n);
                if (s) {
                    o->s = ekv_err_prefix(s, "tensor '%s'", wt->t.name);
                    break;
                }
                put(o, buf, n);
                done += n;
            }
        }
        put_zeros(o, (align - wt->t.nbytes % align) % align);
    }
    free(buf);
    return o->s;
}

enum ekv_status ekv_gguf_writer_write(struct ekv_gguf_writer *w, const char *path) {
    if (!w || !path) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_gguf_writer_write: NULL argument");
    size_t align;
    enum ekv_status s = writer_alignment(w, &align);
    if (s) return ekv_err_prefix(s, "%s", path);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return ekv_err(EKV_ERR_NOMEM, "%s: no memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    struct out o = {fopen(tmp, "wb"), tmp, EKV_OK};
    if (!o.fp) {
        s = ekv_err(EKV_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    s = write_body(w, &o, align);
    if (!s && (fflush(o.fp) != 0 || fsync(fileno(o.fp)) != 0))
        s = ekv_err(EKV_ERR_IO, "%s: flush failed: %s", tmp, strerror(errno));
    if (fclose(o.fp) != 0 && !s) s = ekv_err(EKV_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!s && rename(tmp, path) != 0)
        s = ekv_err(EKV_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    if (s) remove(tmp);
    free(tmp);
    return s;
}
