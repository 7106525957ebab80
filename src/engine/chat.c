/*
 * chat.c — chat templates and prompts with an image: formats one user turn
 * the way a model was trained to read it (LLaVA-1.5's "USER: <image>\n...
 * ASSISTANT:", ChatML for Qwen2, or the raw text), and tokenizes a prompt
 * around its "<image>" marker so the engine can splice image embeddings
 * there and tag them as image positions.
 */
#include <stdio.h>
#include <string.h>

#include <stdlib.h>

#include "core/util.h"
#include "ekv.h"
#include "model/gguf.h"
#include "model/model.h"

#define LLAVA_SYSTEM                                                                                    \
    "A chat between a curious human and an artificial intelligence assistant. The assistant gives " \
    "helpful, detailed, and polite answers to the human's questions."

static const char *const k_templates[] = {"none", "llava-1.5", "chatml"};

int ekv_chat_template_count(void) { return (int)EKV_ARRAY_LEN(k_templates); }
const char *ekv_chat_template_name(int i) {
    return i >= 0 && i < ekv_chat_template_count() ? k_templates[i] : NULL;
}

/* Appends s to buf (length tracked in *len even past n, for sizing). */
static void put(char *buf, size_t n, size_t *len, const char *s) {
    size_t l = strlen(s);
    if (buf && *len < n) {
        size_t room = n - *len;
        memcpy(buf + *len, s, l < room ? l : room);
    }
    *len += l;
}

enum ekv_status ekv_chat_format(const char *tmpl, const char *system, const char *user, bool with_image, char *buf,
                                size_t n, size_t *n_out) {
    if (!user || !n_out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_chat_format: user text and n_out are required");
    if (!tmpl) tmpl = "none";
    bool has_marker = strstr(user, EKV_IMAGE_MARKER) != NULL;
    const char *img = with_image && !has_marker ? EKV_IMAGE_MARKER "\n" : "";
    size_t len = 0;
    if (!strcmp(tmpl, "none")) {
        if (system && system[0]) {
            put(buf, n, &len, system);
            put(buf, n, &len, "\n");
        }
        put(buf, n, &len, img);
        put(buf, n, &len, user);
    } else if (!strcmp(tmpl, "llava-1.5")) {
        put(buf, n, &len, system ? system : LLAVA_SYSTEM);
        put(buf, n, &len, " USER: ");
        put(buf, n, &len, img);
        put(buf, n, &len, user);
        put(buf, n, &len, " ASSISTANT:");
    } else if (!strcmp(tmpl, "chatml")) {
        put(buf, n, &len, "<|im_start|>system\n");
        put(buf, n, &len, system ? system : "You are a helpful assistant.");
        put(buf, n, &len, "<|im_end|>\n<|im_start|>user\n");
        put(buf, n, &len, img);
        put(buf, n, &len, user);
        put(buf, n, &len, "<|im_end|>\n<|im_start|>assistant\n");
    } else {
        return ekv_err(EKV_ERR_NOT_FOUND, "unknown chat template '%s' (known: none, llava-1.5, chatml)", tmpl);
    }
    *n_out = len;
    if (!buf) return EKV_OK;
    if (len >= n) return ekv_err(EKV_ERR_INVALID_ARG, "chat prompt needs %zu bytes, buffer has %zu", len + 1, n);
    buf[len] = 0;
    return EKV_OK;
}

static bool role_ok(const char *r) {
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant"));
}

/* One conversation in the given template; roles are already checked. */
static enum ekv_status chat_render(const char *tmpl, const struct ekv_chat_msg *msgs, size_t n_msgs,
                                   bool add_assistant, char *buf, size_t n, size_t *len) {
    const bool has_sys = n_msgs > 0 && !strcmp(msgs[0].role, "system");
    if (!strcmp(tmpl, "none")) {
        /* contents one per line; a single system + user pair reads exactly
         * as ekv_chat_format's "system\nuser" */
        for (size_t i = 0; i < n_msgs; i++) {
            if (i) put(buf, n, len, "\n");
            put(buf, n, len, msgs[i].content);
        }
    } else if (!strcmp(tmpl, "llava-1.5")) {
        /* LLaVA's conv_vicuna_v1: "SYSTEM USER: q ASSISTANT: a</s>USER: ..." */
        put(buf, n, len, has_sys ? msgs[0].content : LLAVA_SYSTEM);
        for (size_t i = has_sys ? 1 : 0; i < n_msgs; i++) {
            if (!strcmp(msgs[i].role, "user")) {
                put(buf, n, len, " USER: ");
                put(buf, n, len, msgs[i].content);
            } else if (!strcmp(msgs[i].role, "assistant")) {
                put(buf, n, len, " ASSISTANT: ");
                put(buf, n, len, msgs[i].content);
                put(buf, n, len, "</s>");
            } else {
                put(buf, n, len, " ");
                put(buf, n, len, msgs[i].content);
            }
        }
        if (add_assistant) put(buf, n, len, " ASSISTANT:");
    } else if (!strcmp(tmpl, "chatml")) {
        if (!has_sys) put(buf, n, len, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
        for (size_t i = 0; i < n_msgs; i++) {
            put(buf, n, len, "<|im_start|>");
            put(buf, n, len, msgs[i].role);
            put(buf, n, len, "\n");
            put(buf, n, len, msgs[i].content);
            put(buf, n, len, "<|im_end|>\n");
        }
        if (add_assistant) put(buf, n, len, "<|im_start|>assistant\n");
    } else {
        return ekv_err(EKV_ERR_NOT_FOUND, "unknown chat template '%s' (known: none, llava-1.5, chatml)", tmpl);
    }
    return EKV_OK;
}

enum ekv_status ekv_chat_apply(const char *tmpl, const struct ekv_chat_msg *msgs, size_t n_msgs, bool add_assistant,
                               char *buf, size_t n, size_t *n_out) {
    if (!n_out || (n_msgs > 0 && !msgs))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_chat_apply: messages and n_out are required");
    for (size_t i = 0; i < n_msgs; i++) {
        if (!role_ok(msgs[i].role))
            return ekv_err(EKV_ERR_INVALID_ARG, "chat message %zu: role '%s' is not system, user or assistant", i,
                           msgs[i].role ? msgs[i].role : "(null)");
        if (!msgs[i].content) return ekv_err(EKV_ERR_INVALID_ARG, "chat message %zu: content is NULL", i);
    }
    size_t len = 0;
    enum ekv_status s = chat_render(tmpl ? tmpl : "none", msgs, n_msgs, add_assistant, buf, n, &len);
    if (s != EKV_OK) return s;
    *n_out = len;
    if (!buf) return EKV_OK;
    if (len >= n) return ekv_err(EKV_ERR_INVALID_ARG, "chat prompt needs %zu bytes, buffer has %zu", len + 1, n);
    buf[len] = 0;
    return EKV_OK;
}

const char *ekv_chat_template_detect(const char *jinja) {
    if (!jinja) return NULL;
    if (strstr(jinja, "<|im_start|>")) return "chatml";
    return NULL;
}

const char *ekv_model_chat_template(const struct ekv_model *model) {
    if (!model || !model->gguf) return NULL;
    struct ekv_gguf_str js;
    if (ekv_gguf_get_str(model->gguf, "tokenizer.chat_template", &js) != EKV_OK) return NULL;
    char *text = malloc((size_t)js.len + 1);
    if (!text) return NULL;
    memcpy(text, js.ptr, (size_t)js.len);
    text[js.len] = 0;
    const char *name = ekv_chat_template_detect(text);
    free(text);
    return name;
}

static const char *find_marker(const char *p, size_t n) {
    const size_t ml = strlen(EKV_IMAGE_MARKER);
    for (size_t i = 0; i + ml <= n; i++)
        if (!memcmp(p + i, EKV_IMAGE_MARKER, ml)) return p + i;
    return NULL;
}

enum ekv_status ekv_tokenize_prompt(const struct ekv_model *m, const char *text, size_t len, int32_t *tokens,
                                    size_t n_max, size_t *n_out, int32_t *image_at) {
    if (!m || !text || !tokens || !n_out || !image_at)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_tokenize_prompt: model, text, tokens, n_out and image_at are required");
    *image_at = -1;
    const char *mark = find_marker(text, len);
    if (!mark) return ekv_tokenize(m, text, len, true, true, tokens, n_max, n_out);
    const size_t ml = strlen(EKV_IMAGE_MARKER);
    const char *rest = mark + ml;
    size_t a_len = (size_t)(mark - text), rest_len = len - a_len - ml, na = 0, nb = 0;
    if (find_marker(rest, rest_len))
        return ekv_err(EKV_ERR_UNSUPPORTED, "the prompt has more than one %s marker; one image per prompt is supported",
                       EKV_IMAGE_MARKER);
    /* the text before the image starts the prompt (BOS); the text after it continues it */
    enum ekv_status s = ekv_tokenize(m, text, a_len, true, true, tokens, n_max, &na);
    if (s != EKV_OK) return s;
    s = ekv_tokenize(m, rest, rest_len, false, true, tokens + na, n_max - na, &nb);
    *n_out = na + nb;
    if (s != EKV_OK) return s;
    *image_at = (int32_t)na;
    return EKV_OK;
}
