/*
 * test_gguf_hostile.c — the GGUF reader against malformed and hostile input.
 *
 * A small valid file is built by hand (so the offset of every field is
 * known), then corrupted one field at a time: bad magic and versions, huge
 * counts and lengths, bad dimensions and types, tensor data outside the
 * file, bad alignments, deep nesting, duplicates. Each must fail with a
 * status and a message (and no sanitizer report). The file is also cut at
 * every length and mutated 20,000 times with a fixed-seed PRNG; a mutant that
 * still parses may only expose tensor data and strings inside the buffer.
 * With EKV_HOSTILE_DIR set, the corrupt files are also written there for the
 * CLI tests to reuse.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "model/gguf.h"
#include "testutil.h"

/* ---- a byte builder ---- */

struct buf {
    uint8_t d[4096];
    size_t n;
};

static void b_bytes(struct buf *b, const void *p, size_t n) {
    if (b->n + n > sizeof b->d) abort(); /* test bug */
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void b_le(struct buf *b, uint64_t v, size_t n) {
    uint8_t t[8];
    for (size_t i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    b_bytes(b, t, n);
}
static void b_u32(struct buf *b, uint32_t v) { b_le(b, v, 4); }
static void b_u64(struct buf *b, uint64_t v) { b_le(b, v, 8); }
static void b_str(struct buf *b, const char *s) {
    b_u64(b, strlen(s));
    b_bytes(b, s, strlen(s));
}
static void b_pad(struct buf *b, size_t align) {
    while (b->n % align) b_le(b, 0, 1);
}
static void patch(uint8_t *d, size_t off, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) d[off + i] = (uint8_t)(v >> (8 * i));
}

/* Offsets of the fields of the valid file. */
static struct {
    size_t magic, version, n_tensors, n_kv;
    size_t align_val, str_key, str_len, arr_elem_type, arr_len, nest_len, nest_inner_len;
    size_t kv_type_str;
    size_t t0_name, t0_ndims, t0_ne0, t0_ne1, t0_type, t0_offset;
    size_t t1_name, t1_ndims, t1_ne0, t1_type, t1_offset;
    size_t data, end_of_data;
} off;

static struct buf g_valid;

/* Two tensors (f32 [8,2] and q8_0 [32]) and five keys of different kinds. */
static void build_valid(void) {
    struct buf *b = &g_valid;
    b->n = 0;
    off.magic = b->n; b_u32(b, GGUF_MAGIC);
    off.version = b->n; b_u32(b, 3);
    off.n_tensors = b->n; b_u64(b, 2);
    off.n_kv = b->n; b_u64(b, 5);
    b_str(b, "general.alignment"); b_u32(b, GGUF_TYPE_UINT32);
    off.align_val = b->n; b_u32(b, 32);
    off.str_key = b->n + 8; b_str(b, "k.str");
    off.kv_type_str = b->n; b_u32(b, GGUF_TYPE_STRING);
    off.str_len = b->n; b_str(b, "hello");
    b_str(b, "k.arr"); b_u32(b, GGUF_TYPE_ARRAY);
    off.arr_elem_type = b->n; b_u32(b, GGUF_TYPE_UINT32);
    off.arr_len = b->n; b_u64(b, 3);
    b_u32(b, 1); b_u32(b, 2); b_u32(b, 3);
    b_str(b, "k.nest"); b_u32(b, GGUF_TYPE_ARRAY);
    b_u32(b, GGUF_TYPE_ARRAY);
    off.nest_len = b->n; b_u64(b, 2);
    b_u32(b, GGUF_TYPE_UINT8);
    off.nest_inner_len = b->n; b_u64(b, 2);
    b_le(b, 1, 1); b_le(b, 2, 1);
    b_u32(b, GGUF_TYPE_STRING); b_u64(b, 2); b_str(b, "ab"); b_str(b, "");
    b_str(b, "k.f64"); b_u32(b, GGUF_TYPE_FLOAT64); b_u64(b, 0x3ff0000000000000ull);

    off.t0_name = b->n + 8; b_str(b, "w0");
    off.t0_ndims = b->n; b_u32(b, 2);
    off.t0_ne0 = b->n; b_u64(b, 8);
    off.t0_ne1 = b->n; b_u64(b, 2);
    off.t0_type = b->n; b_u32(b, EKV_F32);
    off.t0_offset = b->n; b_u64(b, 0);
    off.t1_name = b->n + 8; b_str(b, "w1");
    off.t1_ndims = b->n; b_u32(b, 1);
    off.t1_ne0 = b->n; b_u64(b, 32);
    off.t1_type = b->n; b_u32(b, EKV_Q8_0);
    off.t1_offset = b->n; b_u64(b, 64);
    b_pad(b, 32);
    off.data = b->n;
    for (int i = 0; i < 64 + 34; i++) b_le(b, (uint64_t)(i * 3 + 1), 1);
    off.end_of_data = b->n;
    b_pad(b, 32);
}

/* Parses a copy of d[0..n) in an exact-size heap block (ASan sees overreads). */
static enum ekv_status parse_copy(const uint8_t *d, size_t n, struct ekv_gguf_file **out, uint8_t **copy) {
    *copy = malloc(n ? n : 1);
    if (!*copy) abort();
    if (n) memcpy(*copy, d, n);
    ekv_err_clear();
    return ekv_gguf_open_memory(*copy, n, out);
}

static const char *g_hostile_dir;

/* Hostile files go to <dir>/<name>.gguf; the valid one is "valid.ok" so
 * that a glob of *.gguf holds only files that must be rejected. */
static void save(const char *name, const uint8_t *d, size_t n) {
    if (!g_hostile_dir) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s%s", g_hostile_dir, name, strcmp(name, "valid") ? ".gguf" : ".ok");
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(d, 1, n, f) != n) fprintf(stderr, "cannot write %s\n", path);
    if (f) fclose(f);
}

/* Expects parsing d[0..n) to fail with `status` (or any error when
 * status == EKV_OK) and a message containing `needle` (when non-NULL). */
static void expect_fail(const char *name, const uint8_t *d, size_t n, enum ekv_status status, const char *needle) {
    struct ekv_gguf_file *f = NULL;
    uint8_t *copy;
    enum ekv_status s = parse_copy(d, n, &f, &copy);
    CHECK_MSG(s != EKV_OK && f == NULL, "%s: parsed", name);
    CHECK_MSG(ekv_last_error()[0] != '\0', "%s: empty message", name);
    if (status != EKV_OK) CHECK_MSG(s == status, "%s: status %s (%s)", name, ekv_status_str(s), ekv_last_error());
    if (needle)
        CHECK_MSG(strstr(ekv_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", name, ekv_last_error(),
                  needle);
    ekv_gguf_close(f);
    free(copy);
    save(name, d, n);
}

/* A copy of the valid file with one little-endian field replaced. */
static void expect_patched(const char *name, size_t at, uint64_t v, size_t width, enum ekv_status status,
                           const char *needle) {
    uint8_t d[sizeof g_valid.d];
    memcpy(d, g_valid.d, g_valid.n);
    patch(d, at, v, width);
    expect_fail(name, d, g_valid.n, status, needle);
}

static void test_valid(void) {
    struct ekv_gguf_file *f = NULL;
    uint8_t *copy;
    CHECK_OK(parse_copy(g_valid.d, g_valid.n, &f, &copy));
    if (f) {
        CHECK(ekv_gguf_n_kv(f) == 5 && ekv_gguf_n_tensors(f) == 2);
        CHECK(ekv_gguf_data_offset(f) == off.data);
        const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(f, "w1");
        CHECK(t && t->nbytes == 34 && t->data == copy + off.data + 64);
        const struct ekv_gguf_value *arr;
        CHECK_OK(ekv_gguf_get_arr(f, "k.nest", GGUF_TYPE_ARRAY, &arr));
        CHECK(arr && arr->v.arr.n == 2 && arr->v.arr.vals[1].v.arr.type == GGUF_TYPE_STRING &&
              ekv_gguf_str_eq(arr->v.arr.vals[1].v.arr.strs[0], "ab"));
        ekv_gguf_close(f);
    }
    free(copy);
    /* version 2 has the same layout */
    uint8_t d[sizeof g_valid.d];
    memcpy(d, g_valid.d, g_valid.n);
    patch(d, off.version, 2, 4);
    CHECK_OK(parse_copy(d, g_valid.n, &f, &copy));
    if (f) CHECK(ekv_gguf_version(f) == 2);
    ekv_gguf_close(f);
    free(copy);
    /* an empty buffer and a NULL one */
    expect_fail("empty", g_valid.d, 0, EKV_ERR_FORMAT, "truncated");
    CHECK(ekv_gguf_open_memory(NULL, 0, &f) == EKV_ERR_FORMAT);
}

static void test_header(void) {
    expect_patched("bad_magic", off.magic, 0x46554748u, 4, EKV_ERR_FORMAT, "not a GGUF file");
    expect_patched("version_1", off.version, 1, 4, EKV_ERR_UNSUPPORTED, "version 1");
    expect_patched("version_99", off.version, 99, 4, EKV_ERR_UNSUPPORTED, "version 99");
    expect_patched("version_big_endian", off.version, 0x03000000u, 4, EKV_ERR_UNSUPPORTED, "big-endian");
    expect_patched("n_tensors_2e63", off.n_tensors, 1ull << 63, 8, EKV_ERR_FORMAT, "tensor count");
    expect_patched("n_tensors_2e40", off.n_tensors, 1ull << 40, 8, EKV_ERR_FORMAT, "tensor count");
    expect_patched("n_tensors_max", off.n_tensors, UINT64_MAX, 8, EKV_ERR_FORMAT, "tensor count");
    expect_patched("n_kv_2e63", off.n_kv, 1ull << 63, 8, EKV_ERR_FORMAT, "key/value count");
    expect_patched("n_kv_2e40", off.n_kv, 1ull << 40, 8, EKV_ERR_FORMAT, "key/value count");
    /* counts that fit the bound but exceed the real content run into the end */
    expect_patched("n_kv_plus_one", off.n_kv, 6, 8, EKV_OK, NULL);
    expect_patched("n_tensors_plus_one", off.n_tensors, 3, 8, EKV_OK, NULL);
}

static void test_values(void) {
    expect_patched("string_len_2e62", off.str_len, 1ull << 62, 8, EKV_ERR_FORMAT, "string length");
    expect_patched("string_len_max", off.str_len, UINT64_MAX, 8, EKV_ERR_FORMAT, "k.str");
    expect_patched("key_len_2e62", off.str_key - 8, 1ull << 62, 8, EKV_ERR_FORMAT, "string length");
    expect_patched("array_len_2e60", off.arr_len, 1ull << 60, 8, EKV_ERR_FORMAT, "k.arr");
    expect_patched("array_len_max", off.arr_len, UINT64_MAX, 8, EKV_ERR_FORMAT, "cannot fit");
    expect_patched("nested_len_2e60", off.nest_len, 1ull << 60, 8, EKV_ERR_FORMAT, "k.nest");
    expect_patched("nested_inner_len_2e60", off.nest_inner_len, 1ull << 60, 8, EKV_ERR_FORMAT, "k.nest");
    expect_patched("value_type_99", off.kv_type_str, 99, 4, EKV_ERR_FORMAT, "unknown value type 99");
    expect_patched("array_elem_type_13", off.arr_elem_type, 13, 4, EKV_ERR_FORMAT, "unknown array element type");
    expect_patched("alignment_0", off.align_val, 0, 4, EKV_ERR_FORMAT, "general.alignment");
    expect_patched("alignment_3", off.align_val, 3, 4, EKV_ERR_FORMAT, "power of two");
    expect_patched("alignment_2e31", off.align_val, 1u << 31, 4, EKV_ERR_FORMAT, "general.alignment");
    expect_patched("duplicate_key", off.str_key + 2, 'a' | 'r' << 8 | 'r' << 16, 3, EKV_ERR_FORMAT,
                   "duplicate key 'k.arr'");
    /* a valid but large alignment moves the data section past the end */
    expect_patched("alignment_4096", off.align_val, 4096, 4, EKV_ERR_FORMAT, "data section would start");

    /* arrays nested 100 deep, and exactly at the limit (8) */
    for (int depth = 7; depth <= 100; depth += 93) {
        struct buf *b = malloc(sizeof *b);
        if (!b) abort();
        b->n = 0;
        b_u32(b, GGUF_MAGIC); b_u32(b, 3); b_u64(b, 0); b_u64(b, 1);
        b_str(b, "deep"); b_u32(b, GGUF_TYPE_ARRAY);
        for (int i = 0; i < depth; i++) { b_u32(b, GGUF_TYPE_ARRAY); b_u64(b, 1); }
        b_u32(b, GGUF_TYPE_UINT8); b_u64(b, 1); b_le(b, 7, 1);
        if (depth == 100) {
            expect_fail("nested_100", b->d, b->n, EKV_ERR_FORMAT, "nested deeper");
        } else {
            struct ekv_gguf_file *f = NULL;
            uint8_t *copy;
            CHECK_OK(parse_copy(b->d, b->n, &f, &copy)); /* 8 array levels in all */
            ekv_gguf_close(f);
            free(copy);
            b->n = 0;
            b_u32(b, GGUF_MAGIC); b_u32(b, 3); b_u64(b, 0); b_u64(b, 1);
            b_str(b, "deep"); b_u32(b, GGUF_TYPE_ARRAY);
            for (int i = 0; i < depth + 1; i++) { b_u32(b, GGUF_TYPE_ARRAY); b_u64(b, 1); }
            b_u32(b, GGUF_TYPE_UINT8); b_u64(b, 1); b_le(b, 7, 1);
            expect_fail("nested_9", b->d, b->n, EKV_ERR_FORMAT, "nested deeper");
        }
        free(b);
    }
    /* a wide array of empty arrays: many allocations, all bounded by the file size */
    struct buf *b = malloc(sizeof *b);
    if (!b) abort();
    b->n = 0;
    b_u32(b, GGUF_MAGIC); b_u32(b, 3); b_u64(b, 0); b_u64(b, 1);
    b_str(b, "wide"); b_u32(b, GGUF_TYPE_ARRAY); b_u32(b, GGUF_TYPE_ARRAY); b_u64(b, 200);
    for (int i = 0; i < 200; i++) { b_u32(b, GGUF_TYPE_INT64); b_u64(b, 0); }
    struct ekv_gguf_file *f = NULL;
    uint8_t *copy;
    CHECK_OK(parse_copy(b->d, b->n, &f, &copy));
    ekv_gguf_close(f);
    free(copy);
    expect_fail("wide_truncated", b->d, b->n - 1, EKV_ERR_FORMAT, "cannot fit");
    free(b);
}

static void test_tensors(void) {
    expect_patched("n_dims_0", off.t0_ndims, 0, 4, EKV_ERR_FORMAT, "n_dims is 0");
    expect_patched("n_dims_5", off.t0_ndims, 5, 4, EKV_ERR_FORMAT, "n_dims is 5");
    expect_patched("dim_zero", off.t0_ne1, 0, 8, EKV_ERR_FORMAT, "dimension 1");
    expect_patched("dim_negative", off.t0_ne1, (uint64_t)-5, 8, EKV_ERR_FORMAT, "w0");
    uint8_t d[sizeof g_valid.d];
    memcpy(d, g_valid.d, g_valid.n);
    patch(d, off.t0_ne0, 1ull << 40, 8);
    patch(d, off.t0_ne1, 1ull << 40, 8);
    expect_fail("dims_2e40_x_2e40", d, g_valid.n, EKV_ERR_OVERFLOW, "w0");
    memcpy(d, g_valid.d, g_valid.n);
    patch(d, off.t0_ne0, 1ull << 61, 8); /* 2^62 elements, 2^64 bytes */
    expect_fail("bytes_overflow", d, g_valid.n, EKV_ERR_OVERFLOW, "byte size");
    expect_patched("dim_2e40", off.t0_ne1, 1ull << 40, 8, EKV_ERR_FORMAT, "extends past end of file");
    expect_patched("type_200", off.t0_type, 200, 4, EKV_ERR_FORMAT, "tensor 'w0': unknown tensor type id 200");
    expect_patched("type_4", off.t0_type, 4, 4, EKV_ERR_FORMAT, "id 4"); /* a removed GGML type */
    expect_patched("row_not_block_multiple", off.t1_ne0, 31, 8, EKV_ERR_FORMAT, "block size");
    expect_patched("offset_past_end", off.t1_offset, 1u << 20, 8, EKV_ERR_FORMAT,
                   "tensor 'w1': data [offset");
    expect_patched("offset_wraps", off.t1_offset, UINT64_MAX - 31, 8, EKV_ERR_FORMAT, "extends past end");
    expect_patched("offset_misaligned", off.t1_offset, 65, 8, EKV_ERR_FORMAT, "not a multiple of the alignment");
    expect_patched("duplicate_tensor", off.t1_name + 1, '0', 1, EKV_ERR_FORMAT, "duplicate tensor name 'w0'");
    expect_patched("tensor_name_nul", off.t1_name, 0, 1, EKV_ERR_FORMAT, "NUL");
    expect_patched("tensor_name_len_2e62", off.t1_name - 8, 1ull << 62, 8, EKV_ERR_FORMAT, "string length");
    /* the message names the file when opened from disk */
    char path[] = "/tmp/ekv_hostile_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        memcpy(d, g_valid.d, g_valid.n);
        patch(d, off.t1_offset, 1u << 20, 8);
        CHECK(write(fd, d, g_valid.n) == (ssize_t)g_valid.n);
        close(fd);
        struct ekv_gguf_file *f = NULL;
        CHECK(ekv_gguf_open(path, &f) == EKV_ERR_FORMAT);
        char want[256];
        snprintf(want, sizeof want, "%s: tensor 'w1': data [offset %zu, 34 bytes] extends past end of file (size %zu)",
                 path, off.data + (1u << 20), g_valid.n);
        CHECK_MSG(strcmp(ekv_last_error(), want) == 0, "got '%s'", ekv_last_error());
        remove(path);
    }
}

/* Cutting the file anywhere before the end of the last tensor's data fails;
 * the trailing padding after it is optional. */
static void test_truncation(void) {
    size_t failed = 0, parsed = 0, wrong = 0;
    for (size_t cut = 0; cut < g_valid.n; cut++) {
        struct ekv_gguf_file *f = NULL;
        uint8_t *copy;
        enum ekv_status s = parse_copy(g_valid.d, cut, &f, &copy);
        bool should_parse = cut >= off.end_of_data;
        if (s == EKV_OK) parsed++; else failed++;
        if ((s == EKV_OK) != should_parse || (s != EKV_OK && ekv_last_error()[0] == '\0')) {
            wrong++;
            fprintf(stderr, "cut at %zu: %s (%s)\n", cut, ekv_status_str(s), ekv_last_error());
        }
        ekv_gguf_close(f);
        free(copy);
        if (cut == off.t0_ne0 + 3) save("truncated_in_tensor_info", g_valid.d, cut);
        if (cut == off.end_of_data - 1) save("truncated_in_data", g_valid.d, cut);
    }
    CHECK(wrong == 0);
    CHECK(failed == off.end_of_data);
    CHECK(parsed == g_valid.n - off.end_of_data);
}

/* xorshift64*: a fixed-seed PRNG so failures reproduce. */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}

/* Touches every byte a parsed file exposes, so ASan flags any bad pointer. */
static unsigned touch_value(const struct ekv_gguf_value *v) {
    unsigned h = 0;
    if (v->type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < v->v.str.len; i++) h += (unsigned char)v->v.str.ptr[i];
    } else if (v->type == GGUF_TYPE_ARRAY) {
        static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        if (v->v.arr.type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                for (uint64_t j = 0; j < v->v.arr.strs[i].len; j++) h += (unsigned char)v->v.arr.strs[i].ptr[j];
        } else if (v->v.arr.type == GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < v->v.arr.n; i++) h += touch_value(&v->v.arr.vals[i]);
        } else {
            const uint8_t *p = v->v.arr.data;
            for (uint64_t i = 0; i < v->v.arr.n * sz[v->v.arr.type]; i++) h += p[i];
        }
    }
    return h;
}

static void test_mutations(void) {
    static const uint64_t interesting[] = {0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 31, 32, 33, 64, 200, 255, 65535,
                                           1ull << 31, 1ull << 32, 1ull << 40, 1ull << 60, 1ull << 62,
                                           1ull << 63, UINT64_MAX, UINT64_MAX - 31};
    size_t n_ok = 0, n_bad_ptr = 0, n_no_msg = 0;
    unsigned sink = 0;
    const int iterations = 20000;
    for (int it = 0; it < iterations; it++) {
        uint8_t d[sizeof g_valid.d];
        size_t n = g_valid.n;
        memcpy(d, g_valid.d, n);
        int k = 1 + (int)(rnd() % 4);
        for (int m = 0; m < k; m++) {
            uint64_t r = rnd();
            size_t at = (size_t)(rnd() % n);
            switch (r % 5) {
            case 0: d[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
            case 1: d[at] = (uint8_t)rnd(); break;
            case 2:
                if (at + 8 <= n) patch(d, at, interesting[rnd() % EKV_ARRAY_LEN(interesting)], 8);
                break;
            case 3:
                if (at + 4 <= n) patch(d, at, interesting[rnd() % EKV_ARRAY_LEN(interesting)], 4);
                break;
            case 4:
                if (at + 8 <= n) patch(d, at, rnd(), 8);
                break;
            }
        }
        if (rnd() % 8 == 0) n = (size_t)(rnd() % (n + 1));
        struct ekv_gguf_file *f = NULL;
        uint8_t *copy;
        enum ekv_status s = parse_copy(d, n, &f, &copy);
        if (s != EKV_OK) {
            n_no_msg += ekv_last_error()[0] == '\0';
        } else {
            n_ok++;
            for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
                const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
                const uint8_t *p = t->data;
                if (p < copy || p > copy + n || t->nbytes > (size_t)(copy + n - p) || t->nbytes == 0) {
                    n_bad_ptr++;
                } else {
                    sink += p[0] + p[t->nbytes - 1];
                }
                sink += (unsigned)strlen(t->name);
            }
            for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) {
                const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(f, i);
                for (uint64_t j = 0; j < kv->key.len; j++) sink += (unsigned char)kv->key.ptr[j];
                sink += touch_value(&kv->value);
            }
            uint32_t u;
            struct ekv_gguf_str str;
            const struct ekv_gguf_value *arr;
            (void)ekv_gguf_get_u32(f, "general.alignment", &u);
            (void)ekv_gguf_get_str(f, "k.str", &str);
            (void)ekv_gguf_get_arr(f, "k.nest", GGUF_TYPE_COUNT, &arr);
        }
        ekv_gguf_close(f);
        free(copy);
    }
    printf("mutations: %d runs, %zu parsed, sink %u\n", iterations, n_ok, sink);
    CHECK(n_bad_ptr == 0);
    CHECK(n_no_msg == 0);
    /* both outcomes occur, so the loop exercises the parser past the header */
    CHECK(n_ok > 100 && n_ok < (size_t)iterations - 100);
}

int main(void) {
    g_hostile_dir = getenv("EKV_HOSTILE_DIR");
    if (g_hostile_dir && !g_hostile_dir[0]) g_hostile_dir = NULL;
    build_valid();
    save("valid", g_valid.d, g_valid.n);
    test_valid();
    test_header();
    test_values();
    test_tensors();
    test_truncation();
    test_mutations();
    return test_finish("test_gguf_hostile");
}
