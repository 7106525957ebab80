/*
 * fuzz_chat.c — libFuzzer target for chat templates: template detection on
 * arbitrary text (ekv_chat_template_detect, what a GGUF's
 * tokenizer.chat_template goes through), and rendering of arbitrary
 * conversations with every built-in template (ekv_chat_apply,
 * ekv_chat_format). Input: byte 0 picks the template (or none), byte 1 the
 * flags; the rest is fields split at NUL bytes: the first is the Jinja text
 * to detect and the system prompt, each further one a message whose first
 * byte picks its role. Beyond "no crash": the size asked for first is the
 * size written, NUL-terminated. fuzz_replay.c replays the corpus in every
 * build (README.md).
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

void ekv_fuzz_cleanup(void) {}

#define MAX_MSG 16

static void render(const char *tmpl, const struct ekv_chat_msg *msgs, size_t n, bool add_assistant) {
    size_t need = 0;
    enum ekv_status st = ekv_chat_apply(tmpl, msgs, n, add_assistant, NULL, 0, &need);
    if (st != EKV_OK && st != EKV_ERR_INVALID_ARG) return; /* refused (e.g. a role the template cannot place) */
    char *buf = malloc(need + 1);
    if (!buf) return;
    size_t got = 0;
    st = ekv_chat_apply(tmpl, msgs, n, add_assistant, buf, need + 1, &got);
    CHECK(st == EKV_OK && got == need && buf[got] == '\0');
    free(buf);
}

static void format1(const char *tmpl, const char *system, const char *user, bool with_image) {
    size_t need = 0;
    enum ekv_status st = ekv_chat_format(tmpl, system, user, with_image, NULL, 0, &need);
    if (st != EKV_OK && st != EKV_ERR_INVALID_ARG) return;
    char *buf = malloc(need + 1);
    if (!buf) return;
    size_t got = 0;
    st = ekv_chat_format(tmpl, system, user, with_image, buf, need + 1, &got);
    CHECK(st == EKV_OK && got == need && buf[got] == '\0');
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int n_t = ekv_chat_template_count();
    const int ti = data[0] % (n_t + 1);
    const char *tmpl = ti < n_t ? ekv_chat_template_name(ti) : NULL;
    const unsigned flags = data[1];
    char *text = malloc(size - 1); /* the fields, NUL-terminated */
    if (!text) return 0;
    memcpy(text, data + 2, size - 2);
    text[size - 2] = '\0';
    const char *field[MAX_MSG + 1] = {text};
    size_t nf = 0;
    for (char *p = text; nf < MAX_MSG + 1 && p <= text + (size - 2); p += strlen(p) + 1) field[nf++] = p;
    const char *found = ekv_chat_template_detect(field[0]);
    if (found) {
        bool known = false;
        for (int i = 0; i < n_t; i++) known |= !strcmp(found, ekv_chat_template_name(i));
        CHECK(known);
    }
    static const char *k_roles[3] = {"system", "user", "assistant"};
    struct ekv_chat_msg msgs[MAX_MSG];
    size_t nm = 0;
    for (size_t i = 1; i < nf; i++) {
        const char *f = field[i];
        msgs[nm].role = k_roles[(unsigned char)f[0] % 3];
        msgs[nm].content = f[0] ? f + 1 : f;
        nm++;
    }
    render(tmpl, msgs, nm, flags & 1);
    format1(tmpl, (flags & 2) ? field[0] : NULL, nf > 1 ? field[1] : "", flags & 4);
    free(text);
    return 0;
}
