/*
 * chat.c — chat templates: renders a conversation the way a model family
 * was trained to read it, and recognises the family from a GGUF's
 * `tokenizer.chat_template` by distinctive substrings (as llama.cpp does;
 * there is no Jinja engine here).
 *
 * Conventions every renderer keeps:
 * - The text never starts with BOS: the tokenizer adds it (ekv_prompt_new
 *   with add_bos). BOS/EOS texts inside the history ("</s><s>[INST]") are
 *   written out and become special tokens when parsed.
 * - A family without a system role (llama-2, mistral v1/v3, gemma) folds a
 *   system message into the next user message, as the published templates
 *   do for the first one.
 * - Rendering a conversation and then the same conversation with more
 *   messages gives a text that starts with the first one (when the first
 *   was rendered without the assistant prefix, or the next message is the
 *   assistant's): `ekv run --chat` feeds only the new suffix each turn.
 * The exact strings follow each family's published format (the model's
 * own template, FastChat's for Vicuna/LLaVA, Mistral's cookbook for its
 * versions); where llama.cpp's built-in fallback renders differently the
 * note in docs says so.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "ekv.h"
#include "model/gguf.h"
#include "model/model.h"

#define LLAVA_SYSTEM                                                                                    \
    "A chat between a curious human and an artificial intelligence assistant. The assistant gives " \
    "helpful, detailed, and polite answers to the human's questions."
#define VICUNA_SYSTEM                                                                                  \
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives " \
    "helpful, detailed, and polite answers to the user's questions."
#define CHATML_SYSTEM "You are a helpful assistant."

enum tmpl_id {
    T_NONE, T_LLAVA15, T_CHATML, T_LLAMA2, T_LLAMA3, T_MISTRAL_V1, T_MISTRAL_V3, T_MISTRAL_V3_TEKKEN,
    T_MISTRAL_V7, T_PHI3, T_ZEPHYR, T_GEMMA, T_VICUNA, T_SMOLVLM, T_COUNT
};

static const char *const k_templates[T_COUNT] = {
    [T_NONE] = "none",           [T_LLAVA15] = "llava-1.5",   [T_CHATML] = "chatml",
    [T_LLAMA2] = "llama-2",      [T_LLAMA3] = "llama-3",      [T_MISTRAL_V1] = "mistral-v1",
    [T_MISTRAL_V3] = "mistral-v3", [T_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [T_MISTRAL_V7] = "mistral-v7", [T_PHI3] = "phi-3",        [T_ZEPHYR] = "zephyr",
    [T_GEMMA] = "gemma",         [T_VICUNA] = "vicuna",       [T_SMOLVLM] = "smolvlm",
};

/* llama.cpp's spellings of the same families, accepted as names too. */
static const struct {
    const char *alias;
    enum tmpl_id id;
} k_aliases[] = {{"llama2", T_LLAMA2}, {"llama3", T_LLAMA3}, {"phi3", T_PHI3}, {"llava", T_LLAVA15}};

int ekv_chat_template_count(void) { return T_COUNT; }
const char *ekv_chat_template_name(int i) { return i >= 0 && i < T_COUNT ? k_templates[i] : NULL; }

static int lookup(const char *name) {
    if (!name) return T_NONE;
    for (int i = 0; i < T_COUNT; i++)
        if (!strcmp(name, k_templates[i])) return i;
    for (size_t i = 0; i < EKV_ARRAY_LEN(k_aliases); i++)
        if (!strcmp(name, k_aliases[i].alias)) return (int)k_aliases[i].id;
    return -1;
}

static enum ekv_status unknown(const char *name) {
    char list[512];
    size_t o = 0;
    for (int i = 0; i < T_COUNT && o < sizeof list; i++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", k_templates[i]);
    return ekv_err(EKV_ERR_NOT_FOUND, "unknown chat template '%s' (known: %s)", name, list);
}

/* ---- output buffer: length tracked past the end, for sizing ---- */

struct out {
    char *buf;
    size_t n, len;
};

static void put_n(struct out *o, const char *s, size_t l) {
    if (o->buf && o->len < o->n) {
        size_t room = o->n - o->len;
        memcpy(o->buf + o->len, s, l < room ? l : room);
    }
    o->len += l;
}

static void put(struct out *o, const char *s) { put_n(o, s, strlen(s)); }

/* s without leading and trailing ASCII whitespace (Jinja's |trim, Python's strip()). */
static void put_trim(struct out *o, const char *s) {
    size_t a = 0, b = strlen(s);
    while (a < b && isspace((unsigned char)s[a])) a++;
    while (b > a && isspace((unsigned char)s[b - 1])) b--;
    put_n(o, s + a, b - a);
}

static bool is_role(const struct ekv_chat_msg *m, const char *r) { return !strcmp(m->role, r); }

/* ---- the families ---- */

/* ChatML (Qwen2, SmolLM): <|im_start|>role\ncontent<|im_end|>\n; Qwen2's
 * default system message when the conversation has none. */
static void render_chatml(struct out *o, const struct ekv_chat_msg *m, size_t n, bool add) {
    if (n == 0 || !is_role(&m[0], "system")) put(o, "<|im_start|>system\n" CHATML_SYSTEM "<|im_end|>\n");
    for (size_t i = 0; i < n; i++) {
        put(o, "<|im_start|>");
        put(o, m[i].role);
        put(o, "\n");
        put(o, m[i].content);
        put(o, "<|im_end|>\n");
    }
    if (add) put(o, "<|im_start|>assistant\n");
}

/* SmolVLM / Idefics3 (llama.cpp's "smolvlm"): <|im_start|> once (the
 * model's BOS), then "User: u<end_of_utterance>\n", "Assistant: a<end_of_utterance>\n",
 * a system text followed by a blank line; the turn opens with "Assistant:". */
static void render_smolvlm(struct out *o, const struct ekv_chat_msg *m, size_t n, bool add) {
    put(o, "<|im_start|>");
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "system")) {
            put(o, m[i].content);
            put(o, "\n\n");
            continue;
        }
        put(o, is_role(&m[i], "user") ? "User: " : "Assistant: ");
        put(o, m[i].content);
        put(o, "<end_of_utterance>\n");
    }
    if (add) put(o, "Assistant:");
}

/* Llama-2-chat (Meta's template): [INST] <<SYS>>\ns\n<</SYS>>\n\nu [/INST] a </s><s>[INST] u2 [/INST];
 * the system text joins the first user message, both stripped together. */
static void render_llama2(struct out *o, const struct ekv_chat_msg *m, size_t n) {
    const char *sys = NULL;
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "system")) {
            sys = m[i].content;
        } else if (is_role(&m[i], "user")) {
            put(o, first ? "[INST] " : "<s>[INST] ");
            if (sys) {
                put(o, "<<SYS>>\n");
                put(o, sys);
                put(o, "\n<</SYS>>\n\n");
                /* strip() of the joined text: only the user text's end can change,
                 * and a system text's leading spaces (rare) are kept */
                size_t l = strlen(m[i].content);
                while (l > 0 && isspace((unsigned char)m[i].content[l - 1])) l--;
                put_n(o, m[i].content, l);
            } else {
                put_trim(o, m[i].content);
            }
            sys = NULL;
            put(o, " [/INST]");
            first = false;
        } else {
            put(o, " ");
            put_trim(o, m[i].content);
            put(o, " </s>");
        }
    }
}

/* Llama 3: <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> (content trimmed). */
static void render_llama3(struct out *o, const struct ekv_chat_msg *m, size_t n, bool add) {
    for (size_t i = 0; i < n; i++) {
        put(o, "<|start_header_id|>");
        put(o, m[i].role);
        put(o, "<|end_header_id|>\n\n");
        put_trim(o, m[i].content);
        put(o, "<|eot_id|>");
    }
    if (add) put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Mistral v1, v3, v3-tekken (Mistral's cookbook): the spaces around [INST]
 * and [/INST] and before the answer are what tells the versions apart;
 * v3 strips the answer. A system message opens the next user turn. */
static void render_mistral(struct out *o, const struct ekv_chat_msg *m, size_t n, enum tmpl_id t) {
    const char *lead = t == T_MISTRAL_V1 ? " " : "", *trail = t == T_MISTRAL_V3_TEKKEN ? "" : " ";
    bool in_turn = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_turn) {
            put(o, lead);
            put(o, "[INST]");
            put(o, trail);
            in_turn = true;
        }
        if (is_role(&m[i], "system")) {
            put(o, m[i].content);
            put(o, "\n\n");
        } else if (is_role(&m[i], "user")) {
            put(o, m[i].content);
            put(o, lead);
            put(o, "[/INST]");
        } else {
            put(o, trail);
            if (t == T_MISTRAL_V3) put_trim(o, m[i].content);
            else put(o, m[i].content);
            put(o, "</s>");
            in_turn = false;
        }
    }
}

/* Mistral v7: [SYSTEM_PROMPT] s[/SYSTEM_PROMPT][INST] u[/INST] a</s>. */
static void render_mistral_v7(struct out *o, const struct ekv_chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "system")) {
            put(o, "[SYSTEM_PROMPT] ");
            put(o, m[i].content);
            put(o, "[/SYSTEM_PROMPT]");
        } else if (is_role(&m[i], "user")) {
            put(o, "[INST] ");
            put(o, m[i].content);
            put(o, "[/INST]");
        } else {
            put(o, " ");
            put(o, m[i].content);
            put(o, "</s>");
        }
    }
}

/* Phi-3 (<|role|>\ncontent<|end|>\n) and Zephyr (<|role|>\ncontent<|endoftext|>\n). */
static void render_tagged(struct out *o, const struct ekv_chat_msg *m, size_t n, bool add, const char *end) {
    for (size_t i = 0; i < n; i++) {
        put(o, "<|");
        put(o, m[i].role);
        put(o, "|>\n");
        put(o, m[i].content);
        put(o, end);
    }
    if (add) put(o, "<|assistant|>\n");
}

/* Gemma: <start_of_turn>user\n...<end_of_turn>\n, the assistant is "model",
 * contents trimmed; no system role: its text opens the next user turn. */
static void render_gemma(struct out *o, const struct ekv_chat_msg *m, size_t n, bool add) {
    const char *sys = NULL;
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "system")) {
            sys = m[i].content;
            continue;
        }
        bool user = is_role(&m[i], "user");
        put(o, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (sys && user) {
            put_trim(o, sys);
            put(o, "\n\n");
            sys = NULL;
        }
        put_trim(o, m[i].content);
        put(o, "<end_of_turn>\n");
    }
    if (add) put(o, "<start_of_turn>model\n");
}

/* Vicuna v1.1 and LLaVA-1.5 (FastChat's "two separators" style):
 * "SYSTEM USER: u ASSISTANT: a</s>USER: u2 ASSISTANT:"; the default system
 * text when the conversation has none; a later system message is text of
 * its own followed by the first separator. */
static void render_vicuna(struct out *o, const struct ekv_chat_msg *m, size_t n, bool add, const char *dflt) {
    size_t i = 0;
    if (n > 0 && is_role(&m[0], "system")) put(o, m[i++].content);
    else put(o, dflt);
    put(o, " ");
    for (; i < n; i++) {
        if (is_role(&m[i], "user")) {
            put(o, "USER: ");
            put(o, m[i].content);
            put(o, " ");
        } else if (is_role(&m[i], "assistant")) {
            put(o, "ASSISTANT: ");
            put(o, m[i].content);
            put(o, "</s>");
        } else {
            put(o, m[i].content);
            put(o, " ");
        }
    }
    if (add) put(o, "ASSISTANT:");
}

/* Raw text: contents one per line (an empty first system message left out). */
static void render_none(struct out *o, const struct ekv_chat_msg *m, size_t n) {
    size_t i = n > 0 && is_role(&m[0], "system") && !m[0].content[0] ? 1 : 0;
    for (bool first = true; i < n; i++, first = false) {
        if (!first) put(o, "\n");
        put(o, m[i].content);
    }
}

static void render(enum tmpl_id t, const struct ekv_chat_msg *m, size_t n, bool add, struct out *o) {
    switch (t) {
    case T_NONE: render_none(o, m, n); break;
    case T_LLAVA15: render_vicuna(o, m, n, add, LLAVA_SYSTEM); break;
    case T_VICUNA: render_vicuna(o, m, n, add, VICUNA_SYSTEM); break;
    case T_CHATML: render_chatml(o, m, n, add); break;
    case T_LLAMA2: render_llama2(o, m, n); break;
    case T_LLAMA3: render_llama3(o, m, n, add); break;
    case T_MISTRAL_V1:
    case T_MISTRAL_V3:
    case T_MISTRAL_V3_TEKKEN: render_mistral(o, m, n, t); break;
    case T_MISTRAL_V7: render_mistral_v7(o, m, n); break;
    case T_PHI3: render_tagged(o, m, n, add, "<|end|>\n"); break;
    case T_ZEPHYR: render_tagged(o, m, n, add, "<|endoftext|>\n"); break;
    case T_GEMMA: render_gemma(o, m, n, add); break;
    case T_SMOLVLM: render_smolvlm(o, m, n, add); break;
    case T_COUNT: break;
    }
}

/* ---- public calls ---- */

static bool role_ok(const char *r) {
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant"));
}

static enum ekv_status finish(const struct out *o, size_t *n_out) {
    *n_out = o->len;
    if (!o->buf) return EKV_OK;
    if (o->len >= o->n)
        return ekv_err(EKV_ERR_INVALID_ARG, "chat prompt needs %zu bytes, buffer has %zu", o->len + 1, o->n);
    o->buf[o->len] = 0;
    return EKV_OK;
}

enum ekv_status ekv_chat_apply(const char *tmpl, const struct ekv_chat_msg *msgs, size_t n_msgs, bool add_assistant,
                               char *buf, size_t n, size_t *n_out) {
    if (!n_out || (n_msgs > 0 && !msgs))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_chat_apply: messages and n_out are required");
    int t = lookup(tmpl);
    if (t < 0) return unknown(tmpl);
    for (size_t i = 0; i < n_msgs; i++) {
        if (!role_ok(msgs[i].role))
            return ekv_err(EKV_ERR_INVALID_ARG, "chat message %zu: role '%s' is not system, user or assistant", i,
                           msgs[i].role ? msgs[i].role : "(null)");
        if (!msgs[i].content) return ekv_err(EKV_ERR_INVALID_ARG, "chat message %zu: content is NULL", i);
    }
    struct out o = {.buf = buf, .n = n};
    render((enum tmpl_id)t, msgs, n_msgs, add_assistant, &o);
    return finish(&o, n_out);
}

enum ekv_status ekv_chat_format(const char *tmpl, const char *system, const char *user, bool with_image, char *buf,
                                size_t n, size_t *n_out) {
    if (!user || !n_out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_chat_format: user text and n_out are required");
    int t = lookup(tmpl);
    if (t < 0) return unknown(tmpl);
    char *joined = NULL;
    if (with_image && !strstr(user, EKV_IMAGE_MARKER)) {
        size_t ml = strlen(EKV_IMAGE_MARKER "\n"), ul = strlen(user);
        if (!(joined = malloc(ml + ul + 1))) return ekv_err(EKV_ERR_NOMEM, "out of memory");
        memcpy(joined, EKV_IMAGE_MARKER "\n", ml);
        memcpy(joined + ml, user, ul + 1);
    }
    struct ekv_chat_msg m[2] = {{"system", system}, {"user", joined ? joined : user}};
    struct out o = {.buf = buf, .n = n};
    if (system) render((enum tmpl_id)t, m, 2, true, &o);
    else render((enum tmpl_id)t, m + 1, 1, true, &o);
    free(joined);
    return finish(&o, n_out);
}

/* Family of a Jinja chat template, by the substrings llama.cpp looks for
 * (llm_chat_detect_template), restricted to the families above; a text
 * that is itself a template name is that template. */
const char *ekv_chat_template_detect(const char *j) {
    if (!j) return NULL;
    int named = lookup(j);
    if (named >= 0 && strcmp(j, "none")) return k_templates[named];
#define HAS(s) (strstr(j, s) != NULL)
    if (HAS("<|im_start|>")) {
        /* Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) look like ChatML but are not */
        if (HAS("<end_of_utterance>")) return k_templates[T_SMOLVLM];
        return HAS("<|im_sep|>") ? NULL : k_templates[T_CHATML];
    }
    if (!strncmp(j, "mistral", 7) || HAS("[INST]")) {
        if (HAS("[SYSTEM_PROMPT]")) return k_templates[T_MISTRAL_V7];
        if (HAS("' [INST] ' + system_message") || HAS("[AVAILABLE_TOOLS]")) {
            if (HAS(" [INST]")) return k_templates[T_MISTRAL_V1];
            if (HAS("\"[INST]\"")) return k_templates[T_MISTRAL_V3_TEKKEN];
            return k_templates[T_MISTRAL_V3];
        }
        return k_templates[T_LLAMA2];
    }
    if (HAS("<|assistant|>") && HAS("<|end|>")) return k_templates[T_PHI3];
    if (HAS("<|user|>") && HAS("<|endoftext|>")) return k_templates[T_ZEPHYR];
    if (HAS("<start_of_turn>")) return k_templates[T_GEMMA];
    if (HAS("USER: ") && HAS("ASSISTANT: ")) return k_templates[T_VICUNA];
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) return k_templates[T_LLAMA3];
#undef HAS
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
    if (!m || !text || (!tokens && n_max > 0) || !n_out || !image_at)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_tokenize_prompt: model, text, tokens, n_out and image_at are required");
    *image_at = -1;
    const char *mark = find_marker(text, len);
    if (!mark) return ekv_tokenize(m, text, len, true, true, tokens, n_max, n_out);
    const size_t ml = strlen(EKV_IMAGE_MARKER);
    const char *rest = mark + ml;
    size_t a_len = (size_t)(mark - text), rest_len = len - a_len - ml, na = 0, nb = 0;
    if (find_marker(rest, rest_len))
        return ekv_err(EKV_ERR_UNSUPPORTED, "the prompt has more than one %s marker: use ekv_prompt_new for several images",
                       EKV_IMAGE_MARKER);
    /* the text before the image starts the prompt (BOS); the text after it continues it */
    enum ekv_status s = ekv_tokenize(m, text, a_len, true, true, tokens, n_max, &na);
    const bool fits = s == EKV_OK;
    if (!fits && !(s == EKV_ERR_INVALID_ARG && na > n_max)) return s;
    /* a buffer too small: the whole count still goes to *n_out (as ekv_tokenize's rule) */
    s = ekv_tokenize(m, rest, rest_len, false, true, fits && tokens ? tokens + na : NULL, fits ? n_max - na : 0, &nb);
    *n_out = na + nb;
    if (!fits && (s == EKV_OK || (s == EKV_ERR_INVALID_ARG && nb > 0)))
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_tokenize_prompt: %zu tokens do not fit %zu", na + nb, n_max);
    if (s != EKV_OK) return s;
    *image_at = (int32_t)na;
    return EKV_OK;
}
