/*
 * test_chat.c — chat templates: each family renders a conversation to the
 * exact string its published format defines (expected texts written by
 * hand from the formats: the models' own templates, FastChat's for Vicuna
 * and LLaVA, Mistral's cookbook for its versions), the incremental
 * property `ekv run --chat` relies on, role and argument checks, detection
 * of the family from real template texts, and the special tokens of the
 * templates tokenized as special tokens: known ids in the vocabulary files
 * of ../shared/models/vocab (Phi-3, LLaMA SPM, GPT-2), and the control
 * tokens of ChatML, Llama 3 and Gemma in a vocabulary written here.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ekv.h"
#include "model/gguf.h"
#include "model/vocab.h"
#include "testutil.h"

static int render_eq(const char *tmpl, const struct ekv_chat_msg *m, size_t n, bool add_assistant,
                     const char *want) {
    char buf[2048];
    size_t len = 0, need = 0;
    if (ekv_chat_apply(tmpl, m, n, add_assistant, NULL, 0, &need) != EKV_OK) return 0;
    if (ekv_chat_apply(tmpl, m, n, add_assistant, buf, sizeof buf, &len) != EKV_OK) return 0;
    if (len != need || strcmp(buf, want) != 0) {
        fprintf(stderr, "template %s gave:\n[%s]\nwant:\n[%s]\n", tmpl, buf, want);
        return 0;
    }
    return 1;
}

static const struct ekv_chat_msg conv[] = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

static void families(void) {
    /* SmolVLM (llama.cpp's "smolvlm" rendering of the Idefics3 template) */
    CHECK(render_eq("smolvlm", conv, 4, true,
                    "<|im_start|>Be brief.\n\nUser: Hi<end_of_utterance>\nAssistant: Hello!<end_of_utterance>\n"
                    "User: 2+2?<end_of_utterance>\nAssistant:"));
    CHECK(render_eq("smolvlm", conv + 1, 1, false, "<|im_start|>User: Hi<end_of_utterance>\n"));
    CHECK(render_eq("chatml", conv, 4, true,
                    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n"));
    /* no system message: Qwen2's default one */
    CHECK(render_eq("chatml", conv + 1, 1, true,
                    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    /* Llama-2-chat: system inside the first [INST], BOS before later turns, answers padded by spaces */
    CHECK(render_eq("llama-2", conv, 4, true,
                    "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] 2+2? [/INST]"));
    CHECK(render_eq("llama-2", conv + 1, 1, false, "[INST] Hi [/INST]"));
    const struct ekv_chat_msg padded[] = {{"user", "  Hi \n"}, {"assistant", " Hello! "}};
    CHECK(render_eq("llama-2", padded, 2, false, "[INST] Hi [/INST] Hello! </s>"));
    CHECK(render_eq("llama-3", conv, 4, true,
                    "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    CHECK(render_eq("llama-3", padded, 1, false, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"));
    /* Mistral: v1 " [INST] u [/INST] a</s>", v3 "[INST] u[/INST] a</s>", tekken no spaces, v7 system block */
    CHECK(render_eq("mistral-v1", conv, 4, true, " [INST] Be brief.\n\nHi [/INST] Hello!</s> [INST] 2+2? [/INST]"));
    CHECK(render_eq("mistral-v3", conv, 4, true, "[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] 2+2?[/INST]"));
    CHECK(render_eq("mistral-v3", padded, 2, false, "[INST]   Hi \n[/INST] Hello!</s>"));
    CHECK(render_eq("mistral-v3-tekken", conv, 4, true, "[INST]Be brief.\n\nHi[/INST]Hello!</s>[INST]2+2?[/INST]"));
    CHECK(render_eq("mistral-v7", conv, 4, true,
                    "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello!</s>[INST] 2+2?[/INST]"));
    CHECK(render_eq("phi-3", conv, 4, true,
                    "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
                    "<|user|>\n2+2?<|end|>\n<|assistant|>\n"));
    CHECK(render_eq("zephyr", conv, 4, true,
                    "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n<|assistant|>\n"
                    "Hello!<|endoftext|>\n<|user|>\n2+2?<|endoftext|>\n<|assistant|>\n"));
    /* Gemma: no system role (it opens the first user turn), the assistant is "model", contents trimmed */
    CHECK(render_eq("gemma", conv, 4, true,
                    "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                    "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"));
    CHECK(render_eq("gemma", padded, 2, false, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"));
    /* FastChat's two-separator style: " " after the system and user turns, "</s>" after answers */
    CHECK(render_eq("llava-1.5", conv, 4, true, "Be brief. USER: Hi ASSISTANT: Hello!</s>USER: 2+2? ASSISTANT:"));
    CHECK(render_eq("vicuna", conv + 1, 1, true,
                    "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                    "helpful, detailed, and polite answers to the user's questions. USER: Hi ASSISTANT:"));
    CHECK(render_eq("vicuna", conv, 3, false, "Be brief. USER: Hi ASSISTANT: Hello!</s>"));
    CHECK(render_eq("none", conv, 2, false, "Be brief.\nHi"));
    /* llama.cpp's spellings are names too */
    CHECK(render_eq("llama3", conv + 1, 1, false, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"));
    CHECK(render_eq("phi3", conv + 1, 1, true, "<|user|>\nHi<|end|>\n<|assistant|>\n"));
}

/* What `ekv run --chat` feeds: the conversation so far rendered with the
 * assistant prefix is a prefix of the conversation with the answer. */
static void incremental(void) {
    for (int t = 0; t < ekv_chat_template_count(); t++) {
        const char *name = ekv_chat_template_name(t);
        char a[2048], b[2048];
        size_t la = 0, lb = 0;
        CHECK_OK(ekv_chat_apply(name, conv, 2, true, a, sizeof a, &la));
        CHECK_OK(ekv_chat_apply(name, conv, 4, true, b, sizeof b, &lb));
        CHECK_MSG(lb > la && !memcmp(a, b, la), "template %s: turn 2 does not extend turn 1", name);
        /* the answer follows the prefix (after spaces the template inserts) */
        size_t i = la;
        while (i < lb && (b[i] == ' ' || b[i] == '\n')) i++;
        CHECK_MSG(!strncmp(b + i, "Hello!", 6), "template %s: the answer does not follow the prompt", name);
    }
}

static void single_turn_and_errors(void) {
    char a[512], b[512];
    size_t la = 0, lb = 0;
    CHECK_OK(ekv_chat_format("llava-1.5", "S", "Q", true, a, sizeof a, &la));
    const struct ekv_chat_msg one[] = {{"system", "S"}, {"user", "<image>\nQ"}};
    CHECK_OK(ekv_chat_apply("llava-1.5", one, 2, true, b, sizeof b, &lb));
    CHECK(la == lb && !strcmp(a, b) && !strcmp(a, "S USER: <image>\nQ ASSISTANT:"));
    CHECK_OK(ekv_chat_format("gemma", NULL, "Q", false, a, sizeof a, &la));
    CHECK(!strcmp(a, "<start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>model\n"));
    CHECK_OK(ekv_chat_format("none", "", "Q", false, a, sizeof a, &la));
    CHECK(!strcmp(a, "Q"));

    size_t n = 0;
    const struct ekv_chat_msg bad_role[] = {{"tool", "x"}};
    CHECK(ekv_chat_apply("chatml", bad_role, 1, true, NULL, 0, &n) == EKV_ERR_INVALID_ARG);
    const struct ekv_chat_msg null_content[] = {{"user", NULL}};
    CHECK(ekv_chat_apply("chatml", null_content, 1, true, NULL, 0, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_chat_apply("no-such", conv, 1, true, NULL, 0, &n) == EKV_ERR_NOT_FOUND &&
          strstr(ekv_last_error(), "mistral-v7"));
    CHECK(ekv_chat_apply("chatml", conv, 4, true, a, 10, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_chat_format("no-such", NULL, "Q", false, a, sizeof a, &n) == EKV_ERR_NOT_FOUND);
    /* every listed name renders */
    for (int t = 0; t < ekv_chat_template_count(); t++)
        CHECK_OK(ekv_chat_apply(ekv_chat_template_name(t), conv, 4, true, NULL, 0, &n));
    CHECK(ekv_chat_template_name(ekv_chat_template_count()) == NULL && ekv_chat_template_name(-1) == NULL);
}

/* Excerpts of real chat templates as GGUF files carry them. */
static void detection(void) {
    static const struct {
        const char *jinja, *want;
    } cases[] = {
        /* Qwen2-Instruct */
        {"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
         "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
         "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}",
         "chatml"},
        /* Llama-2-chat */
        {"{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}{% endif %}"
         "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
         "'\\n<</SYS>>\\n\\n' + message['content'] %}{% endif %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
         "llama-2"},
        /* Mistral-7B-Instruct-v0.2 (current) */
        {"{%- if loop.first and system_message is defined %}{{- ' [INST] ' + system_message + '\\n\\n' + "
         "message['content'] + ' [/INST]' }}{%- else %}{{- ' [INST] ' + message['content'] + ' [/INST]' }}",
         "mistral-v1"},
        /* Mistral-7B-Instruct-v0.3 */
        {"{%- if tools is not none %}{{- \"[AVAILABLE_TOOLS] [\" }}{%- endif %}{{- \"[INST] \" + message[\"content\"] + "
         "\"[/INST]\" }}",
         "mistral-v3"},
        /* Mistral-Nemo (tekken) */
        {"{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}", "mistral-v3-tekken"},
        /* Mistral-Small-24B-Instruct-2501 */
        {"{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- '[INST]' + message['content'] + '[/INST]' }}",
         "mistral-v7"},
        /* Meta-Llama-3-8B-Instruct */
        {"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
         "trim + '<|eot_id|>' %}",
         "llama-3"},
        /* Phi-3-mini */
        {"{% for message in messages %}{% if message['role'] == 'user' %}{{'<|user|>' + '\n' + message['content'] + "
         "'<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% endif %}{% endfor %}",
         "phi-3"},
        /* StableLM-2-Zephyr */
        {"{% for message in messages %}{{'<|' + message['role'] + '|>\n' + message['content'] + '<|endoftext|>' + '\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|user|>\n' }}{% endif %}",
         "zephyr"},
        /* gemma-2b-it */
        {"{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}", "gemma"},
        /* Vicuna-1.1 style */
        {"{% if message['role'] == 'user' %}{{ 'USER: ' + message['content'] + ' ' }}{% else %}{{ 'ASSISTANT: ' + "
         "message['content'] + eos_token }}{% endif %}",
         "vicuna"},
        /* names are templates too */
        {"chatml", "chatml"},
        {"llama3", "llama-3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = ekv_chat_template_detect(cases[i].jinja);
        CHECK_MSG(got && !strcmp(got, cases[i].want), "case %zu: detected %s, want %s", i, got ? got : "(none)",
                  cases[i].want);
    }
    /* SmolVLM looks like ChatML but is its own family; Phi-4 is not one of these; nor plain text */
    const char *smol = ekv_chat_template_detect("<|im_start|>{% for message in messages %}{{message['role'] | "
                                                "capitalize}}:<end_of_utterance>\n{% endfor %}");
    CHECK(smol && !strcmp(smol, "smolvlm"));
    CHECK(ekv_chat_template_detect("{{'<|im_start|>' + role + '<|im_sep|>'}}") == NULL);
    CHECK(ekv_chat_template_detect("plain text") == NULL);
    CHECK(ekv_chat_template_detect("") == NULL);
    CHECK(ekv_chat_template_detect(NULL) == NULL);
}

/* ---- special tokens ---- */

static struct ekv_vocab *load_vocab(const char *rel, struct ekv_gguf_file **f) {
    const char *path = tu_shared(rel);
    struct ekv_vocab *v = NULL;
    *f = NULL;
    if (ekv_gguf_open(path, f) != EKV_OK) return NULL;
    if (ekv_vocab_from_gguf(*f, path, &v) != EKV_OK) return NULL;
    return v;
}

/* Tokenizes a rendered conversation with special tokens parsed. */
static size_t render_tokens(struct ekv_vocab *v, const char *tmpl, const struct ekv_chat_msg *m, size_t n,
                            int32_t *ids, size_t cap) {
    char buf[2048];
    size_t len = 0, got = 0;
    if (ekv_chat_apply(tmpl, m, n, true, buf, sizeof buf, &len) != EKV_OK) return 0;
    if (ekv_vocab_tokenize(v, buf, len, true, true, ids, cap, &got) != EKV_OK) return 0;
    return got;
}

static size_t count(const int32_t *ids, size_t n, int32_t id) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ids[i] == id;
    return c;
}

static void shared_vocab_tokens(void) {
    struct ekv_gguf_file *f1, *f2, *f3;
    struct ekv_vocab *phi3 = load_vocab("models/vocab/ggml-vocab-phi-3.gguf", &f1);
    struct ekv_vocab *spm = load_vocab("models/vocab/ggml-vocab-llama-spm.gguf", &f2);
    struct ekv_vocab *gpt2 = load_vocab("models/vocab/ggml-vocab-gpt-2.gguf", &f3);
    CHECK(phi3 && spm && gpt2);
    int32_t ids[512];
    if (phi3) {
        /* Phi-3: <|system|> 32006, <|end|> 32007, <|user|> 32010, <|assistant|> 32001 */
        size_t n = render_tokens(phi3, "phi-3", conv, 4, ids, 512);
        CHECK(n > 10 && ids[0] == 1 && ids[1] == 32006);
        CHECK(count(ids, n, 32006) == 1 && count(ids, n, 32010) == 2 && count(ids, n, 32001) == 2 &&
              count(ids, n, 32007) == 4);
        CHECK(ids[n - 1] == 32001);
        /* without parse_special the same text is plain text */
        char buf[1024];
        size_t len = 0, got = 0;
        CHECK_OK(ekv_chat_apply("phi-3", conv, 4, true, buf, sizeof buf, &len));
        CHECK_OK(ekv_vocab_tokenize(phi3, buf, len, true, false, ids, 512, &got));
        CHECK(count(ids, got, 32006) + count(ids, got, 32010) + count(ids, got, 32001) + count(ids, got, 32007) == 0);
    }
    if (spm) {
        /* Llama-2 and Mistral: </s> 2 and <s> 1 inside the history; [INST] stays text */
        size_t n = render_tokens(spm, "llama-2", conv, 4, ids, 512);
        CHECK(n > 10 && ids[0] == 1 && count(ids, n, 1) == 2 && count(ids, n, 2) == 1);
        size_t k = 0;
        while (k < n && ids[k] != 2) k++;
        CHECK(k + 1 < n && ids[k + 1] == 1);
        n = render_tokens(spm, "mistral-v3", conv, 4, ids, 512);
        CHECK(n > 10 && count(ids, n, 1) == 1 && count(ids, n, 2) == 1);
    }
    if (gpt2) {
        /* Zephyr's <|endoftext|> is GPT-2's 50256 */
        size_t n = render_tokens(gpt2, "zephyr", conv, 4, ids, 512);
        CHECK(n > 10 && count(ids, n, 50256) == 4);
    }
    ekv_vocab_free(phi3);
    ekv_vocab_free(spm);
    ekv_vocab_free(gpt2);
    ekv_gguf_close(f1);
    ekv_gguf_close(f2);
    ekv_gguf_close(f3);
}

/* ChatML, Llama 3 and Gemma have no vocabulary file here: a small SPM
 * vocabulary with their control tokens (type 3) shows they come out as
 * single tokens, and only with parse_special. */
static void written_vocab_tokens(void) {
    static const char *const ctl[] = {"<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
                                      "<|eot_id|>", "<start_of_turn>", "<end_of_turn>"};
    enum { NB = 256, NC = 7, NV = 3 + NB + NC + 1 };
    char *toks[NV];
    char pool[NV][24];
    float scores[NV];
    int32_t types[NV];
    for (int i = 0; i < NV; i++) {
        toks[i] = pool[i];
        scores[i] = 0.0f;
        if (i == 0) { strcpy(pool[i], "<unk>"); types[i] = 2; }
        else if (i == 1) { strcpy(pool[i], "<s>"); types[i] = 3; }
        else if (i == 2) { strcpy(pool[i], "</s>"); types[i] = 3; }
        else if (i < 3 + NB) { snprintf(pool[i], 24, "<0x%02X>", i - 3); types[i] = 6; }
        else if (i < 3 + NB + NC) { snprintf(pool[i], 24, "%s", ctl[i - 3 - NB]); types[i] = 3; }
        else { strcpy(pool[i], "\xe2\x96\x81"); types[i] = 1; scores[i] = -1.0f; }
    }
    struct ekv_gguf_writer *w = NULL;
    char path[] = "/tmp/ekv_chat_vocab_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    CHECK_OK(ekv_gguf_writer_new(&w));
    CHECK_OK(ekv_gguf_writer_set_str(w, "general.architecture", "llama"));
    CHECK_OK(ekv_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    CHECK_OK(ekv_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, NV));
    CHECK_OK(ekv_gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, NV));
    CHECK_OK(ekv_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, NV));
    CHECK_OK(ekv_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    CHECK_OK(ekv_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
    CHECK_OK(ekv_gguf_writer_write(w, path));
    ekv_gguf_writer_free(w);
    struct ekv_gguf_file *f = NULL;
    struct ekv_vocab *v = NULL;
    CHECK_OK(ekv_gguf_open(path, &f));
    if (f) CHECK_OK(ekv_vocab_from_gguf(f, path, &v));
    if (v) {
        int32_t ids[1024];
        const int32_t im_start = 3 + NB, im_end = im_start + 1, sh = im_start + 2, eh = im_start + 3,
                      eot = im_start + 4, sot = im_start + 5, eot_g = im_start + 6;
        size_t n = render_tokens(v, "chatml", conv, 4, ids, 1024);
        CHECK(n > 0 && ids[1] == im_start && count(ids, n, im_start) == 5 && count(ids, n, im_end) == 4);
        n = render_tokens(v, "llama-3", conv, 4, ids, 1024);
        CHECK(n > 0 && ids[1] == sh && count(ids, n, sh) == 5 && count(ids, n, eh) == 5 && count(ids, n, eot) == 4);
        n = render_tokens(v, "gemma", conv, 4, ids, 1024);
        CHECK(n > 0 && ids[1] == sot && count(ids, n, sot) == 4 && count(ids, n, eot_g) == 3);
        /* the end-of-turn tokens end generation */
        CHECK(ekv_vocab_is_eog(v, im_end) && ekv_vocab_is_eog(v, eot) && ekv_vocab_is_eog(v, eot_g));
        CHECK(!ekv_vocab_is_eog(v, im_start) && !ekv_vocab_is_eog(v, sot));
    }
    ekv_vocab_free(v);
    ekv_gguf_close(f);
    remove(path);
}

int main(void) {
    families();
    incremental();
    single_turn_and_errors();
    detection();
    if (access(tu_shared("models/vocab/ggml-vocab-phi-3.gguf"), R_OK) == 0) shared_vocab_tokens();
    else printf("test_chat: vocabulary tests skipped: ../shared absent\n");
    written_vocab_tokens();
    return test_finish("test_chat");
}
