/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizers: arbitrary bytes
 * through ekv_tokenize (with and without BOS, with and without special-token
 * parsing), ekv_tokenize_prompt (text around an image marker), and back
 * through ekv_detokenize and ekv_token_to_piece, on both vocabulary kinds the
 * repository ships: SentencePiece (models/stories260K.gguf) and GPT-2
 * byte-level BPE (models/ekv-ref-28m-q8_0.gguf). The first byte picks the
 * model and the flags. Beyond "no crash": the count asked for first is the
 * count written, every id is in the vocabulary, the sizes the decoders
 * report are the sizes they write. Built with clang and -DEKV_FUZZ=ON;
 * fuzz_replay.c replays the corpus in every build (README.md).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"

#define CHECK(c)                                                                                                   \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

static struct ekv_model *g_model[2];
static bool g_loaded;

void ekv_fuzz_cleanup(void) {
    for (int i = 0; i < 2; i++) ekv_model_free(g_model[i]), g_model[i] = NULL;
}

static void load(void) {
    g_loaded = true;
    if (ekv_model_load(EKV_SOURCE_DIR "/models/stories260K.gguf", NULL, &g_model[0]) != EKV_OK) abort();
    if (ekv_model_load(EKV_SOURCE_DIR "/models/ekv-ref-28m-q8_0.gguf", NULL, &g_model[1]) != EKV_OK) abort();
}

/* tokens back to text: the whole sequence, then each piece */
static void decode(const struct ekv_model *m, const int32_t *tok, size_t n, bool special) {
    size_t need = 0;
    enum ekv_status st = ekv_detokenize(m, tok, n, special, n % 2 == 0, NULL, 0, &need);
    CHECK(st == EKV_OK || st == EKV_ERR_INVALID_ARG);
    char *buf = malloc(need + 1);
    if (!buf) return;
    size_t got = 0;
    CHECK(ekv_detokenize(m, tok, n, special, n % 2 == 0, buf, need + 1, &got) == EKV_OK && got == need);
    CHECK(buf[got] == '\0');
    free(buf);
    for (size_t i = 0; i < n; i++) {
        char piece[8];
        size_t pn = 0;
        st = ekv_token_to_piece(m, tok[i], special, piece, sizeof piece, &pn);
        if (st == EKV_ERR_INVALID_ARG && pn > sizeof piece) {
            char *p = malloc(pn);
            size_t pn2 = 0;
            if (p) CHECK(ekv_token_to_piece(m, tok[i], special, p, pn, &pn2) == EKV_OK && pn2 == pn);
            free(p);
        } else {
            CHECK(st == EKV_OK && pn <= sizeof piece);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_loaded) load();
    if (size < 1) return 0;
    const unsigned flags = data[0];
    const struct ekv_model *m = g_model[flags & 1];
    const bool add_special = flags & 2, parse_special = flags & 4, special = flags & 8, prompt = flags & 16;
    const size_t len = size - 1;
    char *text = malloc(len ? len : 1); /* exact size: a read past the end hits the redzone */
    if (!text) return 0;
    memcpy(text, data + 1, len);
    struct ekv_model_info info;
    ekv_model_get_info(m, &info);
    const int32_t n_vocab = info.n_vocab;
    size_t n = 0;
    int32_t image_at = -2;
    enum ekv_status st = prompt ? ekv_tokenize_prompt(m, text, len, NULL, 0, &n, &image_at)
                                : ekv_tokenize(m, text, len, add_special, parse_special, NULL, 0, &n);
    if (st == EKV_OK || st == EKV_ERR_INVALID_ARG) {
        int32_t *tok = malloc((n ? n : 1) * sizeof *tok);
        size_t n2 = 0;
        if (tok) {
            st = prompt ? ekv_tokenize_prompt(m, text, len, tok, n, &n2, &image_at)
                        : ekv_tokenize(m, text, len, add_special, parse_special, tok, n, &n2);
            CHECK(st == EKV_OK && n2 == n);
            for (size_t i = 0; i < n; i++) CHECK(tok[i] >= 0 && tok[i] < n_vocab);
            if (prompt) CHECK(image_at >= -1 && image_at <= (int32_t)n);
            decode(m, tok, n, special);
            free(tok);
        }
    }
    free(text);
    return 0;
}
