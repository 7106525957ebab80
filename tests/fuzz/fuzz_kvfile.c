/*
 * fuzz_kvfile.c — libFuzzer target for saved caches (ekv_seq_load_mem,
 * src/engine/seqfile.c + src/kv/persist.c): arbitrary bytes as a saved
 * sequence of the bundled stories260K model, or of a tiny-qwen2vl model
 * (M-RoPE: every entry's three RoPE positions and the sequence's offset
 * are in the file) that the target writes with ekv_mkmodel_write when it
 * starts; the file's fingerprint picks the model. Before loading, the target
 * recomputes the header's and every section's CRC-32C over the mutated
 * bytes (unless the input's last byte is odd), so that mutations reach the
 * parsers behind the checksums instead of all stopping at them. A file
 * that loads must save again, load again from those bytes, and take a
 * prompt piece and a decode step (the loaded cache is used, not only
 * parsed). fuzz_replay.c replays the corpus in every build (README.md).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "ekv.h"

static struct ekv_model *g_model, *g_mrope;
static struct ekv_context *g_ctx, *g_ctx_mrope;

void ekv_fuzz_cleanup(void) {
    ekv_context_free(g_ctx);
    ekv_model_free(g_model);
    ekv_context_free(g_ctx_mrope);
    ekv_model_free(g_mrope);
    g_ctx = g_ctx_mrope = NULL;
    g_model = g_mrope = NULL;
}

static struct ekv_context *new_ctx(const struct ekv_model *m) {
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 1;
    cp.n_ctx = 256;
    cp.device = "cpu";
    struct ekv_context *c = NULL;
    if (ekv_context_new(m, &cp, &c) != EKV_OK) abort();
    return c;
}

/* The two models: stories260K from the repository; tiny-qwen2vl (f16,
 * seed 3, the bytes `ekv mkmodel --preset tiny-qwen2vl --type f16 --seed 3`
 * writes, so the seeds' fingerprint matches) written to a temporary file. */
static void init_models(void) {
    if (ekv_model_load(EKV_SOURCE_DIR "/models/stories260K.gguf", NULL, &g_model) != EKV_OK) abort();
    g_ctx = new_ctx(g_model);
    char lm[] = "/tmp/ekv-fuzz-kvfile-XXXXXX";
    const int fd = mkstemp(lm);
    if (fd < 0) abort();
    close(fd);
    char mm[64];
    snprintf(mm, sizeof mm, "%s.mmproj", lm);
    struct ekv_mkmodel_params mp = ekv_mkmodel_default_params();
    mp.preset = "tiny-qwen2vl";
    mp.type = "f16";
    mp.seed = 3;
    if (ekv_mkmodel_write(&mp, lm, mm, NULL) != EKV_OK || ekv_model_load(lm, NULL, &g_mrope) != EKV_OK) abort();
    unlink(lm); /* the model keeps its mapping */
    unlink(mm);
    g_ctx_mrope = new_ctx(g_mrope);
}

static uint32_t crc32c(const uint8_t *p, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static uint32_t rd32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static void wr32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* The checksums the format asks for, over whatever the bytes are now. */
static void fix_crcs(uint8_t *d, size_t n) {
    if (n < 48) return;
    wr32(d + 44, crc32c(d, 44));
    size_t at = 48;
    while (n - at >= 24) {
        const uint64_t size = (uint64_t)rd32(d + at + 8) | (uint64_t)rd32(d + at + 12) << 32;
        if (size > n - at - 24) break;
        wr32(d + at + 16, crc32c(d + at + 24, (size_t)size));
        wr32(d + at + 20, crc32c(d + at, 16));
        at += 24 + (size_t)size;
    }
}

static void use(struct ekv_context *ctx, struct ekv_seq *s) {
    void *buf = NULL;
    size_t n = 0;
    if (ekv_seq_save_mem(s, NULL, 0, &buf, &n) != EKV_OK) abort(); /* what loads, saves */
    struct ekv_seq *again = NULL;
    if (ekv_seq_load_mem(ctx, buf, n, &again, NULL, NULL) != EKV_OK) abort(); /* and loads again */
    free(buf);
    ekv_seq_free(again);
    const int32_t toks[2] = {5, 9};
    if (ekv_seq_n_seen(s) + 3 <= ekv_context_n_ctx(ctx) && ekv_seq_prefill(s, toks, 2, NULL) == EKV_OK)
        (void)ekv_seq_decode(s, toks[0], NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_model) init_models();
    /* the model the file says it was saved for (header bytes 16..23) */
    uint64_t fp = 0;
    for (int i = 0; i < 8 && size >= 24; i++) fp |= (uint64_t)data[16 + i] << (8 * i);
    struct ekv_context *ctx = fp == ekv_model_fingerprint(g_mrope) ? g_ctx_mrope : g_ctx;
    uint8_t *d = malloc(size ? size : 1);
    if (!d) return 0;
    memcpy(d, data, size);
    if (size && !(d[size - 1] & 1)) fix_crcs(d, size);
    struct ekv_seq *s = NULL;
    int32_t *tok = NULL, nt = 0;
    if (ekv_seq_load_mem(ctx, d, size, &s, &tok, &nt) == EKV_OK) {
        use(ctx, s);
        ekv_seq_free(s);
    }
    free(tok);
    free(d);
    return 0;
}
