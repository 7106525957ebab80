/*
 * test_gguf.c — the GGUF reader on real files (stories260K, the vocabulary
 * files in ../shared/models/vocab) and the writer by round trip: every value
 * type and several tensor types are written, re-read and compared byte for
 * byte, and a real vocabulary is copied key by key.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "model/gguf.h"
#include "testutil.h"

static uint32_t rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void test_stories(void) {
    struct ekv_gguf_file *f = NULL;
    CHECK_OK(ekv_gguf_open(tu_src("models/stories260K.gguf"), &f));
    if (!f) return;
    CHECK(ekv_gguf_version(f) == 3);
    CHECK(ekv_gguf_n_tensors(f) == 48);
    CHECK(ekv_gguf_n_kv(f) == 19);
    CHECK(ekv_gguf_alignment(f) == 32);
    CHECK(ekv_gguf_data_offset(f) % 32 == 0);
    CHECK(ekv_gguf_file_size(f) == 1185376);

    struct ekv_gguf_str s;
    CHECK_OK(ekv_gguf_get_str(f, "general.architecture", &s));
    CHECK(ekv_gguf_str_eq(s, "llama"));
    char buf[8];
    ekv_gguf_str_copy(s, buf, sizeof buf);
    CHECK(strcmp(buf, "llama") == 0);
    ekv_gguf_str_copy(s, buf, 3);
    CHECK(strcmp(buf, "ll") == 0);

    uint32_t u = 0;
    CHECK_OK(ekv_gguf_get_u32(f, "llama.embedding_length", &u));
    CHECK(u == 64);
    CHECK_OK(ekv_gguf_get_u32(f, "llama.block_count", &u));
    CHECK(u == 5);
    CHECK_OK(ekv_gguf_get_u32(f, "llama.attention.head_count_kv", &u));
    CHECK(u == 4);
    CHECK_OK(ekv_gguf_get_u32(f, "tokenizer.ggml.padding_token_id", &u));
    CHECK(u == UINT32_MAX);
    int64_t i64 = 0;
    CHECK_OK(ekv_gguf_get_i64(f, "llama.feed_forward_length", &i64));
    CHECK(i64 == 172);
    float eps = 0;
    CHECK_OK(ekv_gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps));
    CHECK(eps == 1e-5f);

    /* errors from the getters */
    CHECK(ekv_gguf_get_u32(f, "no.such.key", &u) == EKV_ERR_NOT_FOUND);
    CHECK(strstr(ekv_last_error(), "no.such.key") != NULL);
    CHECK(ekv_gguf_get_u32(f, "general.name", &u) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "general.name") && strstr(ekv_last_error(), "string"));
    CHECK(ekv_gguf_get_str(f, "llama.block_count", &s) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "uint32") != NULL);
    bool b;
    CHECK(ekv_gguf_get_bool(f, "llama.block_count", &b) == EKV_ERR_FORMAT);
    CHECK(ekv_gguf_get_f32(f, "llama.block_count", &eps) == EKV_ERR_FORMAT);

    const struct ekv_gguf_value *arr = NULL;
    CHECK_OK(ekv_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &arr));
    if (arr) {
        CHECK(arr->v.arr.n == 512);
        CHECK(ekv_gguf_str_eq(arr->v.arr.strs[0], "<unk>"));
        CHECK(ekv_gguf_str_eq(arr->v.arr.strs[1], "<s>"));
        CHECK(ekv_gguf_str_eq(arr->v.arr.strs[2], "</s>"));
    }
    CHECK(ekv_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_FLOAT32, &arr) == EKV_ERR_FORMAT);
    CHECK_OK(ekv_gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &arr));
    if (arr) {
        CHECK(arr->v.arr.n == 512);
        const uint8_t *d = arr->v.arr.data;
        CHECK(rd32(d) == 2 && rd32(d + 4) == 3 && rd32(d + 8) == 3);
    }
    CHECK_OK(ekv_gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_COUNT, &arr));
    if (arr) CHECK(arr->v.arr.type == GGUF_TYPE_FLOAT32 && arr->v.arr.n == 512);

    const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(f, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK(t->type == EKV_F32);
        CHECK(t->n_dims == 2);
        CHECK(t->ne[0] == 64 && t->ne[1] == 512 && t->ne[2] == 1 && t->ne[3] == 1);
        CHECK(t->nbytes == 64 * 512 * 4);
        CHECK(t->data != NULL);
    }
    t = ekv_gguf_find_tensor(f, "blk.0.ffn_gate.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 172);
    CHECK(ekv_gguf_find_tensor(f, "blk.5.attn_q.weight") == NULL);
    /* every tensor lies inside the file and the byte sizes add up */
    size_t total = 0;
    int inside = 1;
    const uint8_t *base = ekv_gguf_tensor_at(f, 0)->data - ekv_gguf_tensor_at(f, 0)->offset;
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        t = ekv_gguf_tensor_at(f, i);
        total += t->nbytes;
        if ((size_t)((const uint8_t *)t->data - base) + t->nbytes > ekv_gguf_file_size(f) - ekv_gguf_data_offset(f))
            inside = 0;
    }
    CHECK(inside);
    CHECK(total > 0 && total <= ekv_gguf_file_size(f) - ekv_gguf_data_offset(f));
    CHECK(ekv_gguf_tensor_at(f, 48) == NULL);
    CHECK(ekv_gguf_kv_at(f, 19) == NULL);
    ekv_gguf_close(f);

    /* the shared copy is the same file */
    CHECK_OK(ekv_gguf_open(tu_shared("models/stories260K.gguf"), &f));
    if (f) CHECK(ekv_gguf_n_tensors(f) == 48);
    ekv_gguf_close(f);
}

static void test_vocab(void) {
    static const struct { const char *file; uint64_t n_tokens; const char *model; uint64_t n_merges; } vocab[] = {
        {"models/vocab/ggml-vocab-llama-spm.gguf", 32000, "llama", 0},
        {"models/vocab/ggml-vocab-gpt-2.gguf", 50257, "gpt2", 50000},
        {"models/vocab/ggml-vocab-phi-3.gguf", 32064, "llama", 0},
    };
    for (size_t i = 0; i < EKV_ARRAY_LEN(vocab); i++) {
        struct ekv_gguf_file *f = NULL;
        CHECK_OK(ekv_gguf_open(tu_shared(vocab[i].file), &f));
        if (!f) continue;
        CHECK(ekv_gguf_n_tensors(f) == 0);
        const struct ekv_gguf_value *arr = NULL;
        CHECK_OK(ekv_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &arr));
        CHECK_MSG(arr && arr->v.arr.n == vocab[i].n_tokens, "%s", vocab[i].file);
        struct ekv_gguf_str s;
        CHECK_OK(ekv_gguf_get_str(f, "tokenizer.ggml.model", &s));
        CHECK(ekv_gguf_str_eq(s, vocab[i].model));
        if (vocab[i].n_merges) {
            CHECK_OK(ekv_gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &arr));
            CHECK(arr && arr->v.arr.n == vocab[i].n_merges);
            if (arr) CHECK(ekv_gguf_str_eq(arr->v.arr.strs[2], "h e"));
        }
        ekv_gguf_close(f);
    }
    struct ekv_gguf_file *f = NULL;
    CHECK_OK(ekv_gguf_open(tu_shared("models/vocab/ggml-vocab-llama-spm.gguf"), &f));
    if (f) {
        bool b = false;
        CHECK_OK(ekv_gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b));
        CHECK(b == true);
        CHECK_OK(ekv_gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &b));
        CHECK(b == false);
        ekv_gguf_close(f);
    }
}

static void test_open_errors(void) {
    struct ekv_gguf_file *f = (struct ekv_gguf_file *)1;
    CHECK(ekv_gguf_open("/nonexistent/dir/model.gguf", &f) == EKV_ERR_IO);
    CHECK(f == NULL);
    CHECK(strncmp(ekv_last_error(), "/nonexistent/dir/model.gguf", 27) == 0);
    CHECK(ekv_gguf_open(tu_src("models"), &f) == EKV_ERR_IO);
    /* a real non-GGUF file: the message starts with the path */
    const char *p = tu_shared("models/stories260K.bin");
    CHECK(ekv_gguf_open(p, &f) == EKV_ERR_FORMAT);
    CHECK(strncmp(ekv_last_error(), p, strlen(p)) == 0 && strstr(ekv_last_error(), "magic"));
}

/* ---- writer round trips ---- */

static char g_dir[64];

static const char *tmp_path(const char *name) {
    static char bufs[4][128];
    static int slot;
    char *b = bufs[slot++ & 3];
    snprintf(b, 128, "%s/%s", g_dir, name);
    return b;
}

static bool file_exists(const char *p) { return access(p, F_OK) == 0; }

static bool values_equal(const struct ekv_gguf_value *a, const struct ekv_gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        return a->v.i64 == b->v.i64;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64:
        return memcmp(&a->v.f64, &b->v.f64, 8) == 0;
    case GGUF_TYPE_STRING:
        return a->v.str.len == b->v.str.len && memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len) == 0;
    case GGUF_TYPE_ARRAY: {
        if (a->v.arr.type != b->v.arr.type || a->v.arr.n != b->v.arr.n) return false;
        uint64_t n = a->v.arr.n;
        if (a->v.arr.type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < n; i++) {
                struct ekv_gguf_str x = a->v.arr.strs[i], y = b->v.arr.strs[i];
                if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len) != 0) return false;
            }
            return true;
        }
        if (a->v.arr.type == GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < n; i++)
                if (!values_equal(&a->v.arr.vals[i], &b->v.arr.vals[i])) return false;
            return true;
        }
        static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        return n == 0 || memcmp(a->v.arr.data, b->v.arr.data, n * sz[a->v.arr.type]) == 0;
    }
    default:
        return a->v.u64 == b->v.u64;
    }
}

/* Fill callback: byte i of the tensor is (i * 7 + seed) & 0xff. */
static enum ekv_status fill_pattern(void *user, const struct ekv_gguf_tensor *t, uint64_t offset, void *dst,
                                    size_t n) {
    unsigned seed = *(const unsigned *)user;
    uint8_t *d = dst;
    (void)t;
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)((offset + i) * 7 + seed);
    return EKV_OK;
}

static int g_fill_calls;
static enum ekv_status fill_fail(void *user, const struct ekv_gguf_tensor *t, uint64_t offset, void *dst,
                                 size_t n) {
    (void)user; (void)t; (void)offset;
    memset(dst, 0, n);
    return ++g_fill_calls >= 2 ? ekv_err(EKV_ERR_IO, "synthetic fill failure") : EKV_OK;
}

/* The exact bytes of a tiny file, computed by hand from the format. */
static void test_writer_exact_bytes(void) {
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!w) return;
    CHECK_OK(ekv_gguf_writer_set_u32(w, "a", 7));
    float one = 1.0f;
    int64_t ne[1] = {1};
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "t", EKV_F32, 1, ne, &one, NULL, NULL));
    const char *p = tmp_path("tiny.gguf");
    CHECK_OK(ekv_gguf_writer_write(w, p));
    ekv_gguf_writer_free(w);
    static const uint8_t expect[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0, /* magic, version */
        1, 0, 0, 0, 0, 0, 0, 0,         /* n_tensors */
        1, 0, 0, 0, 0, 0, 0, 0,         /* n_kv */
        1, 0, 0, 0, 0, 0, 0, 0, 'a',    /* key "a" (offset 24) */
        4, 0, 0, 0, 7, 0, 0, 0,         /* uint32 7 (offset 33) */
        1, 0, 0, 0, 0, 0, 0, 0, 't',    /* name "t" (offset 41) */
        1, 0, 0, 0,                     /* n_dims (offset 50) */
        1, 0, 0, 0, 0, 0, 0, 0,         /* ne[0] */
        0, 0, 0, 0,                     /* type f32 */
        0, 0, 0, 0, 0, 0, 0, 0,         /* offset 0 (infos end at 74) */
    };
    size_t len = 0;
    uint8_t *got = (uint8_t *)tu_read_file(p, &len);
    /* header+kv+info = 74 bytes, padded to 96, then 4 data bytes padded to 32 */
    CHECK(len == 96 + 32);
    if (got && len == 128) {
        CHECK(memcmp(got, expect, 74) == 0);
        int zeros = 1;
        for (size_t i = 74; i < 96; i++) zeros &= got[i] == 0;
        for (size_t i = 100; i < 128; i++) zeros &= got[i] == 0;
        CHECK(zeros);
        CHECK(memcmp(got + 96, &one, 4) == 0);
    }
    free(got);
    CHECK(!file_exists(tmp_path("tiny.gguf.tmp")));
    remove(p);
}

/* The round trip's fixtures: arrays of every scalar type (3 elements each),
 * nested arrays, the tensors' bytes. */
static const uint8_t a_u8[] = {1, 2, 255};
static const int8_t a_i8[] = {-1, 0, 127};
static const uint16_t a_u16[] = {1, 65535, 3};
static const int16_t a_i16[] = {-32768, 2, 3};
static const uint32_t a_u32[] = {0, 0xdeadbeefu, 9};
static const int32_t a_i32[] = {-7, 8, INT32_MIN};
static const float a_f32[] = {0.5f, -2.0f, 1e30f};
static const uint8_t a_bool[] = {1, 0, 1};
static const uint64_t a_u64[] = {UINT64_MAX, 1, 2};
static const int64_t a_i64[] = {INT64_MIN, -1, 5};
static const double a_f64[] = {3.5, -0.0, 1e300};
static const struct { const char *key; enum ekv_gguf_type t; const void *d; size_t bytes; } rt_arrs[] = {
    {"a.u8", GGUF_TYPE_UINT8, a_u8, sizeof a_u8},     {"a.i8", GGUF_TYPE_INT8, a_i8, sizeof a_i8},
    {"a.u16", GGUF_TYPE_UINT16, a_u16, sizeof a_u16}, {"a.i16", GGUF_TYPE_INT16, a_i16, sizeof a_i16},
    {"a.u32", GGUF_TYPE_UINT32, a_u32, sizeof a_u32}, {"a.i32", GGUF_TYPE_INT32, a_i32, sizeof a_i32},
    {"a.f32", GGUF_TYPE_FLOAT32, a_f32, sizeof a_f32}, {"a.bool", GGUF_TYPE_BOOL, a_bool, sizeof a_bool},
    {"a.u64", GGUF_TYPE_UINT64, a_u64, sizeof a_u64}, {"a.i64", GGUF_TYPE_INT64, a_i64, sizeof a_i64},
    {"a.f64", GGUF_TYPE_FLOAT64, a_f64, sizeof a_f64},
};

struct rt_nested { /* [[1, 2], [3], []] of int32, and [[["x"]]] three levels deep */
    struct ekv_gguf_value inner[3], outer, l3, l2, l1;
    struct ekv_gguf_str xs;
};

static void rt_nested_init(struct rt_nested *n) {
    static const int32_t n1[] = {1, 2}, n2[] = {3};
    memset(n->inner, 0, sizeof n->inner);
    for (int i = 0; i < 3; i++) { n->inner[i].type = GGUF_TYPE_ARRAY; n->inner[i].v.arr.type = GGUF_TYPE_INT32; }
    n->inner[0].v.arr.n = 2; n->inner[0].v.arr.data = n1;
    n->inner[1].v.arr.n = 1; n->inner[1].v.arr.data = n2;
    memset(&n->outer, 0, sizeof n->outer);
    n->outer.type = GGUF_TYPE_ARRAY;
    n->outer.v.arr.type = GGUF_TYPE_ARRAY;
    n->outer.v.arr.n = 3;
    n->outer.v.arr.vals = n->inner;
    n->xs = (struct ekv_gguf_str){1, "x"};
    memset(&n->l3, 0, sizeof n->l3); memset(&n->l2, 0, sizeof n->l2); memset(&n->l1, 0, sizeof n->l1);
    n->l3.type = GGUF_TYPE_ARRAY; n->l3.v.arr.type = GGUF_TYPE_STRING; n->l3.v.arr.n = 1; n->l3.v.arr.strs = &n->xs;
    n->l2.type = GGUF_TYPE_ARRAY; n->l2.v.arr.type = GGUF_TYPE_ARRAY; n->l2.v.arr.n = 1; n->l2.v.arr.vals = &n->l3;
    n->l1.type = GGUF_TYPE_ARRAY; n->l1.v.arr.type = GGUF_TYPE_ARRAY; n->l1.v.arr.n = 1; n->l1.v.arr.vals = &n->l2;
}

static void rt_tensor_data(float f32d[24], uint8_t q4[54]) {
    for (int i = 0; i < 24; i++) f32d[i] = (float)i * 0.25f - 2.0f;
    for (size_t i = 0; i < 54; i++) q4[i] = (uint8_t)(i * 13 + 1);
}

/* Writes the round trip's file to p: scalars, arrays, nested arrays,
 * tensors, and checks what the writer refuses. */
static void rt_write(const char *p, const struct rt_nested *n) {
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!w) return;
    struct ekv_gguf_value v;
#define SETV(key, T, field, val) do { memset(&v, 0, sizeof v); v.type = T; v.v.field = val; \
        CHECK_OK(ekv_gguf_writer_set_value(w, key, &v)); } while (0)
    SETV("s.u8", GGUF_TYPE_UINT8, u64, 200);
    SETV("s.i8", GGUF_TYPE_INT8, i64, -100);
    SETV("s.u16", GGUF_TYPE_UINT16, u64, 60000);
    SETV("s.i16", GGUF_TYPE_INT16, i64, -30000);
    CHECK_OK(ekv_gguf_writer_set_u32(w, "s.u32", 4000000000u));
    CHECK_OK(ekv_gguf_writer_set_i32(w, "s.i32", -2000000000));
    CHECK_OK(ekv_gguf_writer_set_f32(w, "s.f32", 3.25f));
    CHECK_OK(ekv_gguf_writer_set_bool(w, "s.bool", true));
    CHECK_OK(ekv_gguf_writer_set_u64(w, "s.u64", (1ull << 63) + 5));
    SETV("s.i64", GGUF_TYPE_INT64, i64, -(INT64_C(1) << 62));
    SETV("s.f64", GGUF_TYPE_FLOAT64, f64, -1.0 / 3.0);
    CHECK_OK(ekv_gguf_writer_set_str(w, "s.str", "h\xc3\xa9llo w\xc3\xb6rld"));
    CHECK_OK(ekv_gguf_writer_set_str(w, "s.empty", ""));
    CHECK_OK(ekv_gguf_writer_set_u32(w, "s.replaced", 1));
    CHECK_OK(ekv_gguf_writer_set_str(w, "s.replaced", "second"));
#undef SETV
    /* arrays of every scalar type, 3 elements each */
    for (size_t i = 0; i < EKV_ARRAY_LEN(rt_arrs); i++)
        CHECK_OK(ekv_gguf_writer_set_arr(w, rt_arrs[i].key, rt_arrs[i].t, rt_arrs[i].d, 3));
    CHECK_OK(ekv_gguf_writer_set_arr(w, "a.empty", GGUF_TYPE_UINT8, NULL, 0));
    CHECK(ekv_gguf_writer_set_arr(w, "a.bad", GGUF_TYPE_STRING, a_u8, 1) == EKV_ERR_INVALID_ARG);
    const char *strs[] = {"a", "", "ccc"};
    CHECK_OK(ekv_gguf_writer_set_arr_str(w, "a.str", strs, 3));
    CHECK_OK(ekv_gguf_writer_set_value(w, "a.nested", &n->outer));
    CHECK_OK(ekv_gguf_writer_set_value(w, "a.deep", &n->l1));

    float f32d[8 * 3];
    uint8_t q4[18 * 3];
    rt_tensor_data(f32d, q4);
    /* tensors: f32 and q4_0 from buffers, f16 and q8_0 and a >1 MiB f32 through fill */
    unsigned seed_f16 = 3, seed_q8 = 11, seed_big = 5;
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "t.f32", EKV_F32, 2, (const int64_t[]){8, 3}, f32d, NULL, NULL));
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "t.f16", EKV_F16, 2, (const int64_t[]){32, 2}, NULL, fill_pattern,
                                    &seed_f16));
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "t.q8_0", EKV_Q8_0, 3, (const int64_t[]){64, 2, 2}, NULL, fill_pattern,
                                    &seed_q8));
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "t.q4_0", EKV_Q4_0, 1, (const int64_t[]){96}, q4, NULL, NULL));
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "t.big", EKV_F32, 4, (const int64_t[]){1024, 100, 3, 1}, NULL,
                                    fill_pattern, &seed_big));
    /* invalid tensors are refused */
    CHECK(ekv_gguf_writer_add_tensor(w, "t.f32", EKV_F32, 1, (const int64_t[]){1}, f32d, NULL, NULL) ==
          EKV_ERR_INVALID_ARG);
    CHECK(ekv_gguf_writer_add_tensor(w, "t.odd", EKV_Q8_0, 1, (const int64_t[]){33}, q4, NULL, NULL) ==
          EKV_ERR_INVALID_ARG);
    CHECK(ekv_gguf_writer_add_tensor(w, "t.five", EKV_F32, 5, (const int64_t[]){1, 1, 1, 1, 1}, f32d, NULL, NULL) ==
          EKV_ERR_INVALID_ARG);
    CHECK(ekv_gguf_writer_add_tensor(w, "t.zero", EKV_F32, 1, (const int64_t[]){0}, f32d, NULL, NULL) ==
          EKV_ERR_INVALID_ARG);
    CHECK(ekv_gguf_writer_add_tensor(w, "t.none", EKV_F32, 1, (const int64_t[]){1}, NULL, NULL, NULL) ==
          EKV_ERR_INVALID_ARG);
    CHECK(ekv_gguf_writer_add_tensor(w, "t.type", (enum ekv_dtype)4, 1, (const int64_t[]){1}, f32d, NULL, NULL) ==
          EKV_ERR_INVALID_ARG);
    CHECK(ekv_gguf_writer_add_tensor(w, "t.huge", EKV_F32, 2, (const int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40},
                                 f32d, NULL, NULL) == EKV_ERR_OVERFLOW);

    CHECK_OK(ekv_gguf_writer_write(w, p));
    ekv_gguf_writer_free(w);
}

/* The header, the scalars and the typed getters of the written file. */
static void rt_check_scalars(const struct ekv_gguf_file *f) {
    CHECK(ekv_gguf_version(f) == 3);
    CHECK(ekv_gguf_alignment(f) == 32);
    CHECK(ekv_gguf_n_kv(f) == 14 + 15); /* scalars + strings, arrays */
    CHECK(ekv_gguf_n_tensors(f) == 5);
    /* keys keep insertion order; the replaced key kept its place */
    CHECK(ekv_gguf_str_eq(ekv_gguf_kv_at(f, 0)->key, "s.u8"));
    CHECK(ekv_gguf_str_eq(ekv_gguf_kv_at(f, 13)->key, "s.replaced"));
    const struct ekv_gguf_kv *kv;
    kv = ekv_gguf_find_kv(f, "s.u8");   CHECK(kv && kv->value.type == GGUF_TYPE_UINT8 && kv->value.v.u64 == 200);
    kv = ekv_gguf_find_kv(f, "s.i8");   CHECK(kv && kv->value.type == GGUF_TYPE_INT8 && kv->value.v.i64 == -100);
    kv = ekv_gguf_find_kv(f, "s.u16");  CHECK(kv && kv->value.type == GGUF_TYPE_UINT16 && kv->value.v.u64 == 60000);
    kv = ekv_gguf_find_kv(f, "s.i16");  CHECK(kv && kv->value.type == GGUF_TYPE_INT16 && kv->value.v.i64 == -30000);
    kv = ekv_gguf_find_kv(f, "s.u32");  CHECK(kv && kv->value.type == GGUF_TYPE_UINT32 && kv->value.v.u64 == 4000000000u);
    kv = ekv_gguf_find_kv(f, "s.i32");  CHECK(kv && kv->value.type == GGUF_TYPE_INT32 && kv->value.v.i64 == -2000000000);
    kv = ekv_gguf_find_kv(f, "s.f32");  CHECK(kv && kv->value.type == GGUF_TYPE_FLOAT32 && kv->value.v.f64 == 3.25);
    kv = ekv_gguf_find_kv(f, "s.bool"); CHECK(kv && kv->value.type == GGUF_TYPE_BOOL && kv->value.v.u64 == 1);
    kv = ekv_gguf_find_kv(f, "s.u64");
    CHECK(kv && kv->value.type == GGUF_TYPE_UINT64 && kv->value.v.u64 == (1ull << 63) + 5);
    kv = ekv_gguf_find_kv(f, "s.i64");
    CHECK(kv && kv->value.type == GGUF_TYPE_INT64 && kv->value.v.i64 == -(INT64_C(1) << 62));
    kv = ekv_gguf_find_kv(f, "s.f64");  CHECK(kv && kv->value.type == GGUF_TYPE_FLOAT64 && kv->value.v.f64 == -1.0 / 3.0);
    struct ekv_gguf_str s;
    CHECK_OK(ekv_gguf_get_str(f, "s.str", &s));
    CHECK(ekv_gguf_str_eq(s, "h\xc3\xa9llo w\xc3\xb6rld"));
    CHECK_OK(ekv_gguf_get_str(f, "s.empty", &s));
    CHECK(s.len == 0);
    CHECK_OK(ekv_gguf_get_str(f, "s.replaced", &s));
    CHECK(ekv_gguf_str_eq(s, "second"));

    /* getters convert integers that fit and refuse the rest */
    uint32_t u;
    int64_t i64;
    float fl;
    bool b;
    CHECK_OK(ekv_gguf_get_u32(f, "s.u8", &u)); CHECK(u == 200);
    CHECK_OK(ekv_gguf_get_u32(f, "s.u16", &u)); CHECK(u == 60000);
    CHECK_OK(ekv_gguf_get_u32(f, "s.u32", &u)); CHECK(u == 4000000000u);
    CHECK(ekv_gguf_get_u32(f, "s.i8", &u) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "s.i8") && strstr(ekv_last_error(), "-100"));
    CHECK(ekv_gguf_get_u32(f, "s.u64", &u) == EKV_ERR_FORMAT);
    CHECK(ekv_gguf_get_u32(f, "s.bool", &u) == EKV_ERR_FORMAT);
    CHECK_OK(ekv_gguf_get_i64(f, "s.i16", &i64)); CHECK(i64 == -30000);
    CHECK_OK(ekv_gguf_get_i64(f, "s.i64", &i64)); CHECK(i64 == -(INT64_C(1) << 62));
    CHECK_OK(ekv_gguf_get_i64(f, "s.u32", &i64)); CHECK(i64 == 4000000000);
    CHECK(ekv_gguf_get_i64(f, "s.u64", &i64) == EKV_ERR_FORMAT);
    CHECK(ekv_gguf_get_i64(f, "s.f32", &i64) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "s.f32") && strstr(ekv_last_error(), "integer") &&
          strstr(ekv_last_error(), "float32"));
    CHECK_OK(ekv_gguf_get_f32(f, "s.f32", &fl)); CHECK(fl == 3.25f);
    CHECK_OK(ekv_gguf_get_f32(f, "s.f64", &fl)); CHECK(fl == (float)(-1.0 / 3.0));
    CHECK_OK(ekv_gguf_get_bool(f, "s.bool", &b)); CHECK(b);
    CHECK(ekv_gguf_get_bool(f, "nope", &b) == EKV_ERR_NOT_FOUND);

}

static void rt_check_arrays(const struct ekv_gguf_file *f, const struct rt_nested *n) {
    const struct ekv_gguf_value *arr;
    for (size_t i = 0; i < EKV_ARRAY_LEN(rt_arrs); i++) {
        CHECK_OK(ekv_gguf_get_arr(f, rt_arrs[i].key, rt_arrs[i].t, &arr));
        CHECK_MSG(arr && arr->v.arr.n == 3 && memcmp(arr->v.arr.data, rt_arrs[i].d, rt_arrs[i].bytes) == 0, "%s",
                  rt_arrs[i].key);
    }
    CHECK_OK(ekv_gguf_get_arr(f, "a.empty", GGUF_TYPE_UINT8, &arr));
    CHECK(arr && arr->v.arr.n == 0);
    CHECK(ekv_gguf_find_kv(f, "a.bad") == NULL);
    CHECK_OK(ekv_gguf_get_arr(f, "a.str", GGUF_TYPE_STRING, &arr));
    CHECK(arr && arr->v.arr.n == 3 && ekv_gguf_str_eq(arr->v.arr.strs[0], "a") && arr->v.arr.strs[1].len == 0 &&
          ekv_gguf_str_eq(arr->v.arr.strs[2], "ccc"));
    CHECK_OK(ekv_gguf_get_arr(f, "a.nested", GGUF_TYPE_ARRAY, &arr));
    CHECK(arr && values_equal(arr, &n->outer));
    if (arr && arr->v.arr.n == 3) {
        const struct ekv_gguf_value *e = arr->v.arr.vals;
        CHECK(e[0].v.arr.type == GGUF_TYPE_INT32 && e[0].v.arr.n == 2 && e[1].v.arr.n == 1 && e[2].v.arr.n == 0);
        int32_t x;
        memcpy(&x, (const uint8_t *)e[0].v.arr.data + 4, 4);
        CHECK(x == 2);
    }
    CHECK_OK(ekv_gguf_get_arr(f, "a.deep", GGUF_TYPE_ARRAY, &arr));
    CHECK(arr && values_equal(arr, &n->l1));
    if (arr) CHECK(ekv_gguf_str_eq(arr->v.arr.vals[0].v.arr.vals[0].v.arr.strs[0], "x"));

}

static void rt_check_tensors(const struct ekv_gguf_file *f) {
    float f32d[8 * 3];
    uint8_t q4[18 * 3];
    rt_tensor_data(f32d, q4);
    /* tensors: geometry, aligned offsets, and every byte */
    const struct ekv_gguf_tensor *t;
    t = ekv_gguf_find_tensor(f, "t.f32");
    CHECK(t && t->type == EKV_F32 && t->n_dims == 2 && t->ne[0] == 8 && t->ne[1] == 3 && t->nbytes == 96 &&
          memcmp(t->data, f32d, 96) == 0);
    t = ekv_gguf_find_tensor(f, "t.q4_0");
    CHECK(t && t->type == EKV_Q4_0 && t->n_dims == 1 && t->ne[0] == 96 && t->nbytes == 54 &&
          memcmp(t->data, q4, 54) == 0);
    static const struct { const char *name; enum ekv_dtype type; size_t nbytes; unsigned seed; } filled[] = {
        {"t.f16", EKV_F16, 32 * 2 * 2, 3}, {"t.q8_0", EKV_Q8_0, 34 * 2 * 2 * 2, 11},
        {"t.big", EKV_F32, 1024 * 100 * 3 * 4, 5},
    };
    for (size_t i = 0; i < EKV_ARRAY_LEN(filled); i++) {
        t = ekv_gguf_find_tensor(f, filled[i].name);
        CHECK(t && t->type == filled[i].type && t->nbytes == filled[i].nbytes);
        if (!t || t->nbytes != filled[i].nbytes) continue;
        size_t bad = 0;
        for (size_t j = 0; j < t->nbytes; j++)
            bad += ((const uint8_t *)t->data)[j] != (uint8_t)(j * 7 + filled[i].seed);
        CHECK_MSG(bad == 0, "%s: %zu bytes differ", filled[i].name, bad);
    }
    t = ekv_gguf_find_tensor(f, "t.q8_0");
    CHECK(t && t->n_dims == 3 && t->ne[2] == 2 && t->ne[3] == 1);
    t = ekv_gguf_find_tensor(f, "t.big");
    CHECK(t && t->n_dims == 4 && t->ne[1] == 100 && t->ne[2] == 3 && t->ne[3] == 1);
    uint64_t expect_off = 0;
    for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
        t = ekv_gguf_tensor_at(f, i);
        CHECK(t->offset == expect_off);
        CHECK((ekv_gguf_data_offset(f) + t->offset) % 32 == 0);
        expect_off += (t->nbytes + 31) / 32 * 32;
    }
    CHECK(ekv_gguf_file_size(f) == ekv_gguf_data_offset(f) + expect_off);
}

static void test_round_trip(void) {
    struct rt_nested n;
    rt_nested_init(&n);
    const char *p = tmp_path("round.gguf");
    rt_write(p, &n);
    struct ekv_gguf_file *f = NULL;
    CHECK_OK(ekv_gguf_open(p, &f));
    if (!f) return;
    rt_check_scalars(f);
    rt_check_arrays(f, &n);
    rt_check_tensors(f);
    ekv_gguf_close(f);

    /* the same data through ekv_gguf_open_memory */
    size_t len = 0;
    char *buf = tu_read_file(p, &len);
    CHECK(buf != NULL);
    if (buf) {
        CHECK_OK(ekv_gguf_open_memory(buf, len, &f));
        if (f) {
            const struct ekv_gguf_tensor *t = ekv_gguf_find_tensor(f, "t.f32");
            CHECK(t && (const char *)t->data >= buf && (const char *)t->data + t->nbytes <= buf + len);
            ekv_gguf_close(f);
        }
        free(buf);
    }
    remove(p);
}

static void test_writer_alignment_and_failure(void) {
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!w) return;
    CHECK_OK(ekv_gguf_writer_set_u32(w, "general.alignment", 64));
    uint8_t d[40] = {0};
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "x", EKV_I8, 1, (const int64_t[]){40}, d, NULL, NULL));
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "y", EKV_I8, 1, (const int64_t[]){3}, d, NULL, NULL));
    char p[128]; /* tmp_path's buffers rotate: keep our own copy for the remove() at the end */
    snprintf(p, sizeof p, "%s", tmp_path("align.gguf"));
    CHECK_OK(ekv_gguf_writer_write(w, p));
    struct ekv_gguf_file *f = NULL;
    CHECK_OK(ekv_gguf_open(p, &f));
    if (f) {
        CHECK(ekv_gguf_alignment(f) == 64);
        CHECK(ekv_gguf_data_offset(f) % 64 == 0);
        CHECK(ekv_gguf_tensor_at(f, 1)->offset == 64);
        CHECK(ekv_gguf_file_size(f) == ekv_gguf_data_offset(f) + 128);
        ekv_gguf_close(f);
    }
    /* a bad alignment is refused at write time and leaves the old file alone */
    CHECK_OK(ekv_gguf_writer_set_u32(w, "general.alignment", 48));
    CHECK(ekv_gguf_writer_write(w, p) == EKV_ERR_INVALID_ARG);
    CHECK(strstr(ekv_last_error(), "general.alignment") != NULL);
    ekv_gguf_writer_free(w);

    /* a failing fill callback: error returned, no file, no tmp left, old file intact */
    size_t old_len = 0;
    char *old = tu_read_file(p, &old_len);
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!w) { free(old); return; }
    CHECK_OK(ekv_gguf_writer_add_tensor(w, "z", EKV_F32, 2, (const int64_t[]){1024, 1024}, NULL, fill_fail, NULL));
    g_fill_calls = 0;
    CHECK(ekv_gguf_writer_write(w, p) == EKV_ERR_IO);
    CHECK(strstr(ekv_last_error(), "tensor 'z'") && strstr(ekv_last_error(), "synthetic fill failure"));
    CHECK(g_fill_calls == 2); /* 4 MiB in 1 MiB chunks: failed on the second */
    CHECK(!file_exists(tmp_path("align.gguf.tmp")));
    size_t new_len = 0;
    char *now = tu_read_file(p, &new_len);
    CHECK(old && now && old_len == new_len && memcmp(old, now, old_len) == 0);
    free(old);
    free(now);
    /* a fresh path: nothing is created at all */
    g_fill_calls = 0;
    CHECK(ekv_gguf_writer_write(w, tmp_path("never.gguf")) == EKV_ERR_IO);
    CHECK(!file_exists(tmp_path("never.gguf")) && !file_exists(tmp_path("never.gguf.tmp")));
    /* an unwritable directory */
    CHECK(ekv_gguf_writer_write(w, "/nonexistent/dir/x.gguf") == EKV_ERR_IO);
    ekv_gguf_writer_free(w);
    remove(p);
}

/* Copies every key of a real vocabulary into a new file and compares. */
static void test_copy_vocab(void) {
    struct ekv_gguf_file *src = NULL;
    CHECK_OK(ekv_gguf_open(tu_shared("models/vocab/ggml-vocab-llama-spm.gguf"), &src));
    if (!src) return;
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!w) { ekv_gguf_close(src); return; }
    for (size_t i = 0; i < ekv_gguf_n_kv(src); i++) CHECK_OK(ekv_gguf_writer_copy_kv(w, ekv_gguf_kv_at(src, i)));
    const char *p = tmp_path("vocab.gguf");
    CHECK_OK(ekv_gguf_writer_write(w, p));
    ekv_gguf_writer_free(w);
    struct ekv_gguf_file *dst = NULL;
    CHECK_OK(ekv_gguf_open(p, &dst));
    if (dst) {
        CHECK(ekv_gguf_n_kv(dst) == ekv_gguf_n_kv(src) && ekv_gguf_n_kv(src) == 22);
        size_t same = 0;
        for (size_t i = 0; i < ekv_gguf_n_kv(src) && i < ekv_gguf_n_kv(dst); i++) {
            const struct ekv_gguf_kv *a = ekv_gguf_kv_at(src, i), *b = ekv_gguf_kv_at(dst, i);
            same += a->key.len == b->key.len && memcmp(a->key.ptr, b->key.ptr, a->key.len) == 0 &&
                    values_equal(&a->value, &b->value);
        }
        CHECK(same == ekv_gguf_n_kv(src));
        /* same bytes; the writer adds padding up to the (empty) data section */
        size_t la = 0, lb = 0;
        char *fa = tu_read_file(tu_shared("models/vocab/ggml-vocab-llama-spm.gguf"), &la);
        char *fb = tu_read_file(p, &lb);
        CHECK(fa && fb && lb == (la + 31) / 32 * 32 && memcmp(fa, fb, la) == 0);
        free(fa);
        free(fb);
        ekv_gguf_close(dst);
    }
    ekv_gguf_close(src);
    remove(p);
}

/* The public text view of `ekv info` (gguf_info.c): each value as one line,
 * strings escaped and cut at 80 bytes, arrays as "[TYPE x N]" with up to 4
 * strings, keys cut at 200 bytes; every output cut to its buffer. */
static void test_text_view(void) {
    struct ekv_gguf_writer *w = NULL;
    CHECK_OK(ekv_gguf_writer_new(&w));
    if (!w) return;
    char longkey[300], longstr[120];
    memset(longkey, 'k', sizeof longkey - 1), longkey[sizeof longkey - 1] = '\0';
    memset(longstr, 's', sizeof longstr - 1), longstr[sizeof longstr - 1] = '\0';
    const char *strs[] = {"a", "", "c\nd", "e", "f", "g"};
    static const float fl[] = {1.5f, 2.0f};
    CHECK_OK(ekv_gguf_writer_set_u32(w, "t.u32", 4000000000u));
    CHECK_OK(ekv_gguf_writer_set_i32(w, "t.i32", -7));
    CHECK_OK(ekv_gguf_writer_set_f32(w, "t.f32", 0.25f));
    CHECK_OK(ekv_gguf_writer_set_bool(w, "t.bool", false));
    CHECK_OK(ekv_gguf_writer_set_str(w, "t.str", "x\ny\x01z"));
    CHECK_OK(ekv_gguf_writer_set_str(w, "t.long", longstr));
    CHECK_OK(ekv_gguf_writer_set_arr_str(w, "t.strs", strs, 6));
    CHECK_OK(ekv_gguf_writer_set_arr(w, "t.floats", GGUF_TYPE_FLOAT32, fl, 2));
    CHECK_OK(ekv_gguf_writer_set_u32(w, longkey, 1));
    char path[512];
    snprintf(path, sizeof path, "%s/text_view.gguf", g_dir);
    CHECK_OK(ekv_gguf_writer_write(w, path));
    ekv_gguf_writer_free(w);
    struct ekv_gguf_file *f = NULL;
    CHECK_OK(ekv_gguf_open(path, &f));
    if (!f) return;
    struct ekv_gguf_header h;
    ekv_gguf_get_header(f, &h);
    CHECK(h.n_kv == 9 && h.n_tensors == 0 && h.version == 3 && h.file_size > h.data_offset - 1);
    static const char *const want[][2] = {
        {"t.u32", "4000000000"}, {"t.i32", "-7"}, {"t.f32", "0.25"}, {"t.bool", "false"},
        {"t.str", "\"x\\ny\\x01z\""}, {"t.long", NULL}, {"t.strs", "[string x 6] \"a\" \"\" \"c\\nd\" \"e\" ..."},
        {"t.floats", "[float32 x 2]"}, {NULL, "1"}};
    char key[256], val[1024];
    for (size_t i = 0; i < 9; i++) {
        CHECK(ekv_gguf_kv_text(f, i, key, sizeof key, val, sizeof val));
        if (want[i][0]) CHECK_MSG(!strcmp(key, want[i][0]), "key %zu: '%s'", i, key);
        else CHECK_MSG(strlen(key) == 200 && key[199] == 'k', "long key cut to %zu bytes, not 200", strlen(key));
        if (want[i][1]) CHECK_MSG(!strcmp(val, want[i][1]), "%s: '%s', not '%s'", key, val, want[i][1]);
        else CHECK_MSG(strlen(val) == 85 && !strcmp(val + 81, "\"...") && val[0] == '"', "long string: '%s'", val);
    }
    char small[6];
    CHECK(ekv_gguf_kv_text(f, 4, key, 3, small, sizeof small) && !strcmp(key, "t.") && !strcmp(small, "\"x\\ny"));
    CHECK(!ekv_gguf_kv_text(f, 9, key, sizeof key, val, sizeof val) && !key[0] && !val[0]);
    CHECK(ekv_gguf_kv_text(f, 0, key, 0, val, 0)); /* zero-size buffers: nothing written */
    struct ekv_gguf_tensor_desc td;
    CHECK(!ekv_gguf_tensor_describe(f, 0, &td));
    ekv_gguf_close(f);
    ekv_gguf_close(NULL);
    remove(path);
}

/* ekv_mkmodel_write (src/model/mkmodel.c): options refused by name with no
 * file left; a vision preset whose tower cannot be written leaves no half
 * of the pair; the presets list ends with NULL. */
static void test_mkmodel_api(void) {
    char lm[512], mm[512], bad[600];
    snprintf(lm, sizeof lm, "%s/mk.gguf", g_dir);
    snprintf(mm, sizeof mm, "%s/mk.mmproj.gguf", g_dir);
    snprintf(bad, sizeof bad, "%s/no/such/dir/mm.gguf", g_dir);
    struct ekv_mkmodel_params p = ekv_mkmodel_default_params();
    CHECK(ekv_mkmodel_write(&p, lm, NULL, NULL) == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), "preset"));
    static const struct { const char *preset, *type, *mmproj, *scaling; float factor; const char *word; } refused[] = {
        {"nosuch", "f16", NULL, NULL, 0.0f, "nosuch"}, {"tiny-llama3", "q5_k", NULL, NULL, 0.0f, "q5_k"},
        {"tiny-llama3", "f16", "x.gguf", NULL, 0.0f, "vision"}, {"tiny-llama3", "f16", NULL, NULL, 2.0f, "scaling"}};
    for (size_t i = 0; i < EKV_ARRAY_LEN(refused); i++) {
        p = ekv_mkmodel_default_params();
        p.preset = refused[i].preset, p.type = refused[i].type, p.rope_factor = refused[i].factor;
        p.rope_scaling = refused[i].scaling;
        const enum ekv_status st = ekv_mkmodel_write(&p, lm, refused[i].mmproj, NULL);
        CHECK_MSG(st == EKV_ERR_INVALID_ARG && strstr(ekv_last_error(), refused[i].word) && access(lm, F_OK) != 0,
                  "case %zu: %s: %s", i, ekv_status_str(st), ekv_last_error());
    }
    p = ekv_mkmodel_default_params();
    p.preset = "tiny-vlm";
    CHECK(ekv_mkmodel_write(&p, lm, bad, NULL) != EKV_OK);
    CHECK_MSG(access(lm, F_OK) != 0, "the language model stayed after its vision tower failed");
    struct ekv_mkmodel_result r = {0};
    CHECK_OK(ekv_mkmodel_write(&p, lm, NULL, &r)); /* the tower goes beside it */
    CHECK(r.n_tensors > 0 && r.n_tensors_mmproj > 0 && access(mm, F_OK) == 0);
    struct ekv_model *m = NULL;
    CHECK_OK(ekv_model_load(lm, NULL, &m));
    ekv_model_free(m);
    remove(lm), remove(mm);
    int32_t n = 0, vision = 0;
    bool v = false;
    const char *desc = NULL;
    for (; ekv_mkmodel_preset(n, &desc, &v); n++) vision += v && desc && desc[0];
    CHECK(n >= 10 && vision >= 2 && !ekv_mkmodel_preset(-1, NULL, NULL) && !ekv_mkmodel_preset(n, NULL, NULL));
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ekv_test_gguf_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_stories();
    test_vocab();
    test_open_errors();
    test_writer_exact_bytes();
    test_round_trip();
    test_writer_alignment_and_failure();
    test_copy_vocab();
    test_text_view();
    test_mkmodel_api();
    rmdir(g_dir);
    return test_finish("test_gguf");
}
