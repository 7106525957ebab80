/*
 * fuzz_model.c — libFuzzer target for model construction: arbitrary bytes
 * as a model file through ekv_model_load (GGUF or llama2.c checkpoint, told
 * apart by the first bytes, as `ekv run -m` loads them: metadata and tensor
 * infos that parse but lie — shapes, types, offsets, vocabularies, chat
 * templates, RoPE metadata — must be refused with an error, never read
 * past). A model that loads and is small is then run: a context on the CPU,
 * a sequence, a prompt of two tokens and one decode step, so a shape the
 * loader let through that the kernels cannot take shows. The input goes to
 * an anonymous in-memory file (memfd) loaded by its /proc path; llama2.c
 * checkpoints get a 262-token tokenizer (written once at start: <unk>, <s>,
 * </s>, the 256 bytes, 3 words). fuzz_replay.c replays the corpus in every
 * build (README.md).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_memfd.h"
#include "ekv.h"

static char g_tok[64]; /* the llama2.c tokenizer file, "" until written */

void ekv_fuzz_cleanup(void) {
    if (g_tok[0]) unlink(g_tok);
    g_tok[0] = '\0';
}

static void put_token(FILE *f, const char *s, float score) {
    const int32_t n = (int32_t)strlen(s);
    fwrite(&score, 4, 1, f);
    fwrite(&n, 4, 1, f);
    fwrite(s, 1, (size_t)n, f);
}

static void write_tokenizer(void) {
    snprintf(g_tok, sizeof g_tok, "/tmp/ekv-fuzz-tok-XXXXXX");
    const int fd = mkstemp(g_tok);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) abort();
    const int32_t max_len = 8;
    fwrite(&max_len, 4, 1, f);
    put_token(f, "<unk>", 0.0f);
    put_token(f, "<s>", 0.0f);
    put_token(f, "</s>", 0.0f);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        put_token(f, s, 0.0f);
    }
    put_token(f, " the", -1.0f);
    put_token(f, " a", -2.0f);
    put_token(f, "\xe2\x96\x81", -3.0f);
    if (fclose(f) != 0) abort();
}

static void run_model(const struct ekv_model *m) {
    struct ekv_model_info in;
    ekv_model_get_info(m, &in);
    /* only small models are run: a large one would take seconds per input */
    if ((int64_t)in.n_embd * in.n_layer > 4096 || (int64_t)in.n_vocab * in.n_embd > (1 << 22)) return;
    struct ekv_context_params cp = ekv_context_default_params();
    cp.n_threads = 1;
    cp.n_ctx = 8;
    cp.device = "cpu";
    struct ekv_context *ctx = NULL;
    if (ekv_context_new(m, &cp, &ctx) != EKV_OK) return;
    struct ekv_kv_params kp = ekv_kv_default_params();
    struct ekv_seq *seq = NULL;
    float *logits = malloc(sizeof(float) * (size_t)(in.n_vocab > 0 ? in.n_vocab : 1));
    if (logits && ekv_seq_new(ctx, &kp, &seq) == EKV_OK) {
        const int32_t toks[2] = {1 % in.n_vocab, 2 % in.n_vocab};
        if (ekv_seq_prefill(seq, toks, 2, logits) == EKV_OK) (void)ekv_seq_decode(seq, toks[0], logits);
    }
    ekv_seq_free(seq);
    free(logits);
    ekv_context_free(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok[0]) write_tokenizer();
    char path[64];
    const int fd = fuzz_memfd("ekv-fuzz-model", data, size, path);
    if (fd < 0) return 0;
    struct ekv_model_params mp = ekv_model_default_params();
    mp.tokenizer_path = g_tok;
    mp.no_repack = size > 0 && (data[size - 1] & 1);
    struct ekv_model *m = NULL;
    if (ekv_model_load(path, &mp, &m) == EKV_OK) {
        run_model(m);
        ekv_model_free(m);
    }
    close(fd);
    return 0;
}
