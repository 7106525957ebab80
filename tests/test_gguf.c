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
    struct gguf_file *f = NULL;
    CHECK_OK(gguf_open(tu_src("models/stories260K.gguf"), &f));
    if (!f) return;
    CHECK(gguf_version(f) == 3);
    CHECK(gguf_n_tensors(f) == 48);
    CHECK(gguf_n_kv(f) == 19);
    CHECK(gguf_alignment(f) == 32);
    CHECK(gguf_data_offset(f) % 32 == 0);
    CHECK(gguf_file_size(f) == 1185376);

    struct gguf_str s;
    CHECK_OK(gguf_get_str(f, "general.architecture", &s));
    CHECK(gguf_str_eq(s, "llama"));
    char buf[8];
    gguf_str_copy(s, buf, sizeof buf);
    CHECK(strcmp(buf, "llama") == 0);
    gguf_str_copy(s, buf, 3);
    CHECK(strcmp(buf, "ll") == 0);

    uint32_t u = 0;
    CHECK_OK(gguf_get_u32(f, "llama.embedding_length", &u));
    CHECK(u == 64);
    CHECK_OK(gguf_get_u32(f, "llama.block_count", &u));
    CHECK(u == 5);
    CHECK_OK(gguf_get_u32(f, "llama.attention.head_count_kv", &u));
    CHECK(u == 4);
    CHECK_OK(gguf_get_u32(f, "tokenizer.ggml.padding_token_id", &u));
    CHECK(u == UINT32_MAX);
    int64_t i64 = 0;
    CHECK_OK(gguf_get_i64(f, "llama.feed_forward_length", &i64));
    CHECK(i64 == 172);
    float eps = 0;
    CHECK_OK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps));
    CHECK(eps == 1e-5f);

    /* errors from the getters */
    CHECK(gguf_get_u32(f, "no.such.key", &u) == EKV_ERR_NOT_FOUND);
    CHECK(strstr(ekv_last_error(), "no.such.key") != NULL);
    CHECK(gguf_get_u32(f, "general.name", &u) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "general.name") && strstr(ekv_last_error(), "string"));
    CHECK(gguf_get_str(f, "llama.block_count", &s) == EKV_ERR_FORMAT);
    CHECK(strstr(ekv_last_error(), "uint32") != NULL);
    bool b;
    CHECK(gguf_get_bool(f, "llama.block_count", &b) == EKV_ERR_FORMAT);
    CHECK(gguf_get_f32(f, "llama.block_count", &eps) == EKV_ERR_FORMAT);

    const struct gguf_value *arr = NULL;
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &arr));
    if (arr) {
        CHECK(arr->v.arr.n == 512);
        CHECK(gguf_str_eq(arr->v.arr.strs[0], "<unk>"));
        CHECK(gguf_str_eq(arr->v.arr.strs[1], "<s>"));
        CHECK(gguf_str_eq(arr->v.arr.strs[2], "</s>"));
    }
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_FLOAT32, &arr) == EKV_ERR_FORMAT);
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &arr));
    if (arr) {
        CHECK(arr->v.arr.n == 512);
        const uint8_t *d = arr->v.arr.data;
        CHECK(rd32(d) == 2 && rd32(d + 4) == 3 && rd32(d + 8) == 3);
    }
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_COUNT, &arr));
    if (arr) CHECK(arr->v.arr.type == GGUF_TYPE_FLOAT32 && arr->v.arr.n == 512);

    const struct gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK(t->type == EKV_F32);
        CHECK(t->n_dims == 2);
        CHECK(t->ne[0] == 64 && t->ne[1] == 512 && t->ne[2] == 1 && t->ne[3] == 1);
        CHECK(t->nbytes == 64 * 512 * 4);
        CHECK(t->data != NULL);
    }
    t = gguf_find_tensor(f, "blk.0.ffn_gate.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 172);
    CHECK(gguf_find_tensor(f, "blk.5.attn_q.weight") == NULL);
    /* every tensor lies inside the file and the byte sizes add up */
    size_t total = 0;
    int inside = 1;
    const uint8_t *base = gguf_tensor_at(f, 0)->data - gguf_tensor_at(f, 0)->offset;
    for (size_t i = 0; i < gguf_n_tensors(f); i++) {
        t = gguf_tensor_at(f, i);
        total += t->nbytes;
        if ((size_t)((const uint8_t *)t->data - base) + t->nbytes > gguf_file_size(f) - gguf_data_offset(f))
            inside = 0;
    }
    CHECK(inside);
    CHECK(total > 0 && total <= gguf_file_size(f) - gguf_data_offset(f));
    CHECK(gguf_tensor_at(f, 48) == NULL);
    CHECK(gguf_kv_at(f, 19) == NULL);
    gguf_close(f);

    /* the shared copy is the same file */
    CHECK_OK(gguf_open(tu_shared("models/stories260K.gguf"), &f));
    if (f) CHECK(gguf_n_tensors(f) == 48);
    gguf_close(f);
}

static void test_vocab(void) {
    static const struct { const char *file; uint64_t n_tokens; const char *model; uint64_t n_merges; } vocab[] = {
        {"models/vocab/ggml-vocab-llama-spm.gguf", 32000, "llama", 0},
        {"models/vocab/ggml-vocab-gpt-2.gguf", 50257, "gpt2", 50000},
        {"models/vocab/ggml-vocab-phi-3.gguf", 32064, "llama", 0},
    };
    for (size_t i = 0; i < EKV_ARRAY_LEN(vocab); i++) {
        struct gguf_file *f = NULL;
        CHECK_OK(gguf_open(tu_shared(vocab[i].file), &f));
        if (!f) continue;
        CHECK(gguf_n_tensors(f) == 0);
        const struct gguf_value *arr = NULL;
        CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &arr));
        CHECK_MSG(arr && arr->v.arr.n == vocab[i].n_tokens, "%s", vocab[i].file);
        struct gguf_str s;
        CHECK_OK(gguf_get_str(f, "tokenizer.ggml.model", &s));
        CHECK(gguf_str_eq(s, vocab[i].model));
        if (vocab[i].n_merges) {
            CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &arr));
            CHECK(arr && arr->v.arr.n == vocab[i].n_merges);
            if (arr) CHECK(gguf_str_eq(arr->v.arr.strs[2], "h e"));
        }
        gguf_close(f);
    }
    struct gguf_file *f = NULL;
    CHECK_OK(gguf_open(tu_shared("models/vocab/ggml-vocab-llama-spm.gguf"), &f));
    if (f) {
        bool b = false;
        CHECK_OK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b));
        CHECK(b == true);
        CHECK_OK(gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &b));
        CHECK(b == false);
        gguf_close(f);
    }
}

static void test_open_errors(void) {
    struct gguf_file *f = (struct gguf_file *)1;
    CHECK(gguf_open("/nonexistent/dir/model.gguf", &f) == EKV_ERR_IO);
    CHECK(f == NULL);
    CHECK(strncmp(ekv_last_error(), "/nonexistent/dir/model.gguf", 27) == 0);
    CHECK(gguf_open(tu_src("models"), &f) == EKV_ERR_IO);
    /* a real non-GGUF file: the message starts with the path */
    const char *p = tu_shared("models/stories260K.bin");
    CHECK(gguf_open(p, &f) == EKV_ERR_FORMAT);
    CHECK(strncmp(ekv_last_error(), p, strlen(p)) == 0 && strstr(ekv_last_error(), "magic"));
}

int main(void) {
    test_stories();
    test_vocab();
    test_open_errors();
    return test_finish("test_gguf");
}
