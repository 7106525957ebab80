/*
 * gguf_info.c — the public, read-only view of a GGUF file (include/ekv.h:
 * ekv_gguf_get_header, ekv_gguf_kv_text, ekv_gguf_tensor_describe) that
 * `ekv info` prints: metadata values rendered as one line of text each, so
 * that front ends need not know the reader's internal structures
 * (model/gguf.h). Text is cut to the caller's buffer, never overrun.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "model/gguf.h"

/* A bounded text buffer: appends cut at its end, always NUL-terminated. */
struct tbuf {
    char *p;
    size_t n, len;
};

static void tb_put(struct tbuf *b, const char *fmt, ...) {
    if (b->n == 0 || b->len + 1 >= b->n) return;
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(b->p + b->len, b->n - b->len, fmt, ap);
    va_end(ap);
    if (w > 0) b->len = b->len + (size_t)w < b->n ? b->len + (size_t)w : b->n - 1;
}

static void tb_str(struct tbuf *b, struct ekv_gguf_str s) {
    const uint64_t n = s.len > 80 ? 80 : s.len;
    tb_put(b, "\"");
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '\n') tb_put(b, "\\n");
        else if (ch < 32) tb_put(b, "\\x%02x", ch);
        else tb_put(b, "%c", ch);
    }
    tb_put(b, "\"%s", s.len > 80 ? "..." : "");
}

static void tb_scalar(struct tbuf *b, const struct ekv_gguf_value *v) {
    switch (v->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        tb_put(b, "%" PRIu64, v->v.u64);
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        tb_put(b, "%" PRId64, v->v.i64);
        break;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: tb_put(b, "%g", v->v.f64); break;
    case GGUF_TYPE_BOOL: tb_put(b, "%s", v->v.u64 ? "true" : "false"); break;
    case GGUF_TYPE_STRING: tb_str(b, v->v.str); break;
    default: tb_put(b, "?"); break;
    }
}

void ekv_gguf_get_header(const struct ekv_gguf_file *f, struct ekv_gguf_header *h) {
    *h = (struct ekv_gguf_header){0};
    if (!f) return;
    h->version = ekv_gguf_version(f);
    h->alignment = ekv_gguf_alignment(f);
    h->n_kv = ekv_gguf_n_kv(f);
    h->n_tensors = ekv_gguf_n_tensors(f);
    h->data_offset = ekv_gguf_data_offset(f);
    h->file_size = ekv_gguf_file_size(f);
}

bool ekv_gguf_kv_text(const struct ekv_gguf_file *f, size_t i, char *key, size_t key_n, char *buf, size_t n) {
    struct tbuf kb = {key, key_n, 0}, vb = {buf, n, 0};
    if (key_n) key[0] = '\0';
    if (n) buf[0] = '\0';
    if (!f || i >= ekv_gguf_n_kv(f)) return false;
    const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(f, i);
    tb_put(&kb, "%.*s", (int)(kv->key.len > 200 ? 200 : kv->key.len), kv->key.ptr);
    if (kv->value.type != GGUF_TYPE_ARRAY) {
        tb_scalar(&vb, &kv->value);
        return true;
    }
    tb_put(&vb, "[%s x %" PRIu64 "]", ekv_gguf_type_name(kv->value.v.arr.type), kv->value.v.arr.n);
    if (kv->value.v.arr.type == GGUF_TYPE_STRING && kv->value.v.arr.strs) {
        const uint64_t m = kv->value.v.arr.n < 4 ? kv->value.v.arr.n : 4;
        for (uint64_t j = 0; j < m; j++) {
            tb_put(&vb, " ");
            tb_str(&vb, kv->value.v.arr.strs[j]);
        }
        if (kv->value.v.arr.n > 4) tb_put(&vb, " ...");
    }
    return true;
}

bool ekv_gguf_tensor_describe(const struct ekv_gguf_file *f, size_t i, struct ekv_gguf_tensor_desc *out) {
    if (!f || i >= ekv_gguf_n_tensors(f)) return false;
    const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
    *out = (struct ekv_gguf_tensor_desc){.name = t->name, .type = ekv_dtype_name(t->type), .n_dims = t->n_dims,
                                         .nbytes = t->nbytes};
    for (int d = 0; d < 4; d++) out->ne[d] = t->ne[d];
    return true;
}
