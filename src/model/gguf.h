/*
 * gguf.h — reading and writing GGUF files (v2 and v3).
 *
 * The reader maps the file (or borrows a caller's buffer), validates every
 * size it reads against the bytes that remain, and exposes metadata and
 * tensor descriptions that point into the mapping. A truncated, corrupted or
 * hostile file yields EKV_ERR_FORMAT (or EKV_ERR_OVERFLOW / EKV_ERR_NOMEM)
 * with a message naming the offending key or tensor; it never crashes and
 * never allocates more than a small multiple of the file size.
 *
 * The writer builds a file with metadata and tensors; tensor data can be
 * produced by a callback so multi-gigabyte files are streamed. It writes to
 * "<path>.tmp" and renames on success, so no partial file is left behind.
 */
#ifndef EKV_GGUF_H
#define EKV_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "ekv.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum ekv_gguf_type {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12, GGUF_TYPE_COUNT
};

const char *ekv_gguf_type_name(enum ekv_gguf_type t);
/* Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types. */
size_t ekv_gguf_scalar_size(enum ekv_gguf_type t);

/* A string inside the mapped file: NOT NUL-terminated. */
struct ekv_gguf_str {
    uint64_t len;
    const char *ptr;
};

struct ekv_gguf_value {
    enum ekv_gguf_type type;
    union {
        uint64_t u64;        /* UINT8..UINT64 (zero-extended), BOOL (0/1) */
        int64_t i64;         /* INT8..INT64 (sign-extended) */
        double f64;          /* FLOAT32, FLOAT64 */
        struct ekv_gguf_str str; /* STRING */
        struct {
            enum ekv_gguf_type type;        /* element type */
            uint64_t n;                 /* element count */
            const void *data;           /* scalar elements: raw little-endian bytes in the file,
                                           possibly unaligned (read them with memcpy) */
            struct ekv_gguf_str *strs;      /* STRING elements: n entries (owned by the ekv_gguf_file) */
            struct ekv_gguf_value *vals;    /* ARRAY elements: n nested values (owned) */
        } arr;
    } v;
};

struct ekv_gguf_kv {
    struct ekv_gguf_str key;
    struct ekv_gguf_value value;
};

struct ekv_gguf_tensor {
    char *name;                 /* NUL-terminated copy (owned by the ekv_gguf_file) */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];  /* ne[0] is the innermost (row) dimension; unused dims are 1 */
    enum ekv_dtype type;
    uint64_t offset;            /* from the start of the data section */
    size_t nbytes;
    const void *data;           /* points into the mapping */
};

struct ekv_gguf_file;

/* Opens and validates a GGUF file (memory-mapped). *out owned by the caller. */
enum ekv_status ekv_gguf_open(const char *path, struct ekv_gguf_file **out);
/* Same, over a caller-owned buffer that must outlive the ekv_gguf_file (tests, fuzzing). */
enum ekv_status ekv_gguf_open_memory(const void *data, size_t size, struct ekv_gguf_file **out);
void ekv_gguf_close(struct ekv_gguf_file *f);

uint32_t ekv_gguf_version(const struct ekv_gguf_file *f);
uint32_t ekv_gguf_alignment(const struct ekv_gguf_file *f);
size_t ekv_gguf_file_size(const struct ekv_gguf_file *f);
size_t ekv_gguf_data_offset(const struct ekv_gguf_file *f);
/* The file's bytes [0, ekv_gguf_file_size) as mapped (or borrowed). */
const void *ekv_gguf_bytes(const struct ekv_gguf_file *f);

size_t ekv_gguf_n_kv(const struct ekv_gguf_file *f);
const struct ekv_gguf_kv *ekv_gguf_kv_at(const struct ekv_gguf_file *f, size_t i);
const struct ekv_gguf_kv *ekv_gguf_find_kv(const struct ekv_gguf_file *f, const char *key);

/* Typed getters. Integer getters accept any integer type whose value fits
 * (else EKV_ERR_FORMAT naming the key); float getters accept FLOAT32/64.
 * Missing keys give EKV_ERR_NOT_FOUND (message names the key). */
enum ekv_status ekv_gguf_get_u32(const struct ekv_gguf_file *f, const char *key, uint32_t *out);
enum ekv_status ekv_gguf_get_i64(const struct ekv_gguf_file *f, const char *key, int64_t *out);
enum ekv_status ekv_gguf_get_f32(const struct ekv_gguf_file *f, const char *key, float *out);
enum ekv_status ekv_gguf_get_bool(const struct ekv_gguf_file *f, const char *key, bool *out);
/* String value: *out points into the mapping (not NUL-terminated). */
enum ekv_status ekv_gguf_get_str(const struct ekv_gguf_file *f, const char *key, struct ekv_gguf_str *out);
/* Array value with the given element type (GGUF_TYPE_COUNT = any). */
enum ekv_status ekv_gguf_get_arr(const struct ekv_gguf_file *f, const char *key, enum ekv_gguf_type elem_type,
                             const struct ekv_gguf_value **out);
/* Copies a string value into buf as a NUL-terminated string (truncates). */
void ekv_gguf_str_copy(struct ekv_gguf_str s, char *buf, size_t n);
bool ekv_gguf_str_eq(struct ekv_gguf_str s, const char *cstr);

size_t ekv_gguf_n_tensors(const struct ekv_gguf_file *f);
const struct ekv_gguf_tensor *ekv_gguf_tensor_at(const struct ekv_gguf_file *f, size_t i);
const struct ekv_gguf_tensor *ekv_gguf_find_tensor(const struct ekv_gguf_file *f, const char *name);

/* ---- writer ---- */

struct ekv_gguf_writer;

/* Produces `n` bytes of tensor data starting at byte `offset` of the tensor
 * into `dst`; returns EKV_OK or an error (which aborts the write). */
typedef enum ekv_status (*ekv_gguf_fill_fn)(void *user, const struct ekv_gguf_tensor *t, uint64_t offset,
                                        void *dst, size_t n);

enum ekv_status ekv_gguf_writer_new(struct ekv_gguf_writer **out);
void ekv_gguf_writer_free(struct ekv_gguf_writer *w);

/* Metadata setters copy their arguments. Setting a key twice replaces it. */
enum ekv_status ekv_gguf_writer_set_u32(struct ekv_gguf_writer *w, const char *key, uint32_t v);
enum ekv_status ekv_gguf_writer_set_i32(struct ekv_gguf_writer *w, const char *key, int32_t v);
enum ekv_status ekv_gguf_writer_set_u64(struct ekv_gguf_writer *w, const char *key, uint64_t v);
enum ekv_status ekv_gguf_writer_set_f32(struct ekv_gguf_writer *w, const char *key, float v);
enum ekv_status ekv_gguf_writer_set_bool(struct ekv_gguf_writer *w, const char *key, bool v);
enum ekv_status ekv_gguf_writer_set_str(struct ekv_gguf_writer *w, const char *key, const char *v);
/* Array of scalars (elem_type not STRING/ARRAY), n elements of raw LE data. */
enum ekv_status ekv_gguf_writer_set_arr(struct ekv_gguf_writer *w, const char *key, enum ekv_gguf_type elem_type,
                                    const void *data, uint64_t n);
enum ekv_status ekv_gguf_writer_set_arr_str(struct ekv_gguf_writer *w, const char *key,
                                        const char *const *strs, uint64_t n);
/* Stores a deep copy of any value (every scalar type, strings, arrays of
 * scalars, of strings and of arrays up to 8 levels). */
enum ekv_status ekv_gguf_writer_set_value(struct ekv_gguf_writer *w, const char *key, const struct ekv_gguf_value *v);
/* Copies one key/value (any type, nested arrays included) from a reader. */
enum ekv_status ekv_gguf_writer_copy_kv(struct ekv_gguf_writer *w, const struct ekv_gguf_kv *kv);

/* Adds a tensor. Either `data` (borrowed until ekv_gguf_writer_write returns)
 * or `fill` supplies its bytes. ne has n_dims entries, ne[0] innermost. */
enum ekv_status ekv_gguf_writer_add_tensor(struct ekv_gguf_writer *w, const char *name, enum ekv_dtype type,
                                       uint32_t n_dims, const int64_t *ne, const void *data,
                                       ekv_gguf_fill_fn fill, void *user);

/* Writes a GGUF v3 file atomically (tmp + rename). */
enum ekv_status ekv_gguf_writer_write(struct ekv_gguf_writer *w, const char *path);

#endif
