/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader. Each input is parsed
 * with ekv_gguf_open_memory; when it parses, every byte the reader exposes
 * (keys, strings, array payloads, tensor data) is touched and the typed
 * getters are called, so ASan/UBSan report any pointer or size the
 * validation let through. Built only with clang and -DEKV_FUZZ=ON; see
 * README.md in this directory.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

static const size_t k_elem_size[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static unsigned touch(const struct ekv_gguf_value *v) {
    unsigned h = 0;
    if (v->type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < v->v.str.len; i++) h += (unsigned char)v->v.str.ptr[i];
    } else if (v->type == GGUF_TYPE_ARRAY) {
        if (v->v.arr.type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                for (uint64_t j = 0; j < v->v.arr.strs[i].len; j++) h += (unsigned char)v->v.arr.strs[i].ptr[j];
        } else if (v->v.arr.type == GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < v->v.arr.n; i++) h += touch(&v->v.arr.vals[i]);
        } else {
            const uint8_t *p = v->v.arr.data;
            for (uint64_t i = 0; i < v->v.arr.n * k_elem_size[v->v.arr.type]; i++) h += p[i];
        }
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size copy, so reads past the end hit ASan's redzone */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    struct ekv_gguf_file *f = NULL;
    volatile unsigned sink = 0;
    if (ekv_gguf_open_memory(copy, size, &f) == EKV_OK) {
        for (size_t i = 0; i < ekv_gguf_n_kv(f); i++) {
            const struct ekv_gguf_kv *kv = ekv_gguf_kv_at(f, i);
            for (uint64_t j = 0; j < kv->key.len; j++) sink += (unsigned char)kv->key.ptr[j];
            sink += touch(&kv->value);
            char key[256];
            ekv_gguf_str_copy(kv->key, key, sizeof key);
            uint32_t u;
            int64_t i64;
            float fl;
            bool b;
            struct ekv_gguf_str s;
            const struct ekv_gguf_value *arr;
            (void)ekv_gguf_get_u32(f, key, &u);
            (void)ekv_gguf_get_i64(f, key, &i64);
            (void)ekv_gguf_get_f32(f, key, &fl);
            (void)ekv_gguf_get_bool(f, key, &b);
            (void)ekv_gguf_get_str(f, key, &s);
            (void)ekv_gguf_get_arr(f, key, GGUF_TYPE_COUNT, &arr);
            /* the public text view (`ekv info`), into a buffer too small for most values */
            char kt[16], vt[24];
            if (!ekv_gguf_kv_text(f, i, kt, sizeof kt, vt, sizeof vt) || strlen(kt) >= sizeof kt ||
                strlen(vt) >= sizeof vt)
                abort();
        }
        {
            char kt[4], vt[4];
            if (ekv_gguf_kv_text(f, ekv_gguf_n_kv(f), kt, sizeof kt, vt, sizeof vt) || kt[0] || vt[0]) abort();
            struct ekv_gguf_tensor_desc td;
            for (size_t i = 0; ekv_gguf_tensor_describe(f, i, &td); i++) sink += (unsigned)td.nbytes + td.n_dims;
        }
        for (size_t i = 0; i < ekv_gguf_n_tensors(f); i++) {
            const struct ekv_gguf_tensor *t = ekv_gguf_tensor_at(f, i);
            const uint8_t *p = t->data;
            if (p < copy || t->nbytes > size || (size_t)(p - copy) > size - t->nbytes) abort();
            if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
            if (ekv_gguf_find_tensor(f, t->name) == NULL) abort();
        }
        ekv_gguf_close(f);
    }
    (void)sink;
    free(copy);
    return 0;
}

#ifdef EKV_FUZZ_REPLAY
void ekv_fuzz_cleanup(void) {} /* nothing kept between inputs */
#endif
