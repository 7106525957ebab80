/*
 * test_chat.c — chat templates: whole conversations rendered to the exact
 * strings each template family defines (expected texts written by hand from
 * the templates' published formats), role and argument checks, and the
 * detection of a template family from a GGUF chat_template text.
 */
#include <string.h>

#include "ekv.h"
#include "testutil.h"

static int render_eq(const char *tmpl, const struct ekv_chat_msg *m, size_t n, bool add_assistant,
                     const char *want) {
    char buf[1024];
    size_t len = 0, need = 0;
    if (ekv_chat_apply(tmpl, m, n, add_assistant, NULL, 0, &need) != EKV_OK) return 0;
    if (ekv_chat_apply(tmpl, m, n, add_assistant, buf, sizeof buf, &len) != EKV_OK) return 0;
    if (len != need || strcmp(buf, want) != 0) {
        fprintf(stderr, "template %s gave:\n[%s]\nwant:\n[%s]\n", tmpl, buf, want);
        return 0;
    }
    return 1;
}

int main(void) {
    const struct ekv_chat_msg conv[] = {
        {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
    CHECK(render_eq("chatml", conv, 4, true,
                    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n"));
    /* no system message: chatml's default one */
    CHECK(render_eq("chatml", conv + 1, 1, true,
                    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    CHECK(render_eq("llava-1.5", conv, 4, true, "Be brief. USER: Hi ASSISTANT: Hello!</s> USER: 2+2? ASSISTANT:"));
    CHECK(render_eq("none", conv, 2, false, "Be brief.\nHi"));

    /* the single-turn call and the conversation call agree */
    char a[512], b[512];
    size_t la = 0, lb = 0;
    CHECK_OK(ekv_chat_format("llava-1.5", "S", "Q", true, a, sizeof a, &la));
    const struct ekv_chat_msg one[] = {{"system", "S"}, {"user", "<image>\nQ"}};
    CHECK_OK(ekv_chat_apply("llava-1.5", one, 2, true, b, sizeof b, &lb));
    CHECK(la == lb && !strcmp(a, b));

    /* bad input */
    size_t n = 0;
    const struct ekv_chat_msg bad_role[] = {{"tool", "x"}};
    CHECK(ekv_chat_apply("chatml", bad_role, 1, true, NULL, 0, &n) == EKV_ERR_INVALID_ARG);
    const struct ekv_chat_msg null_content[] = {{"user", NULL}};
    CHECK(ekv_chat_apply("chatml", null_content, 1, true, NULL, 0, &n) == EKV_ERR_INVALID_ARG);
    CHECK(ekv_chat_apply("no-such", conv, 1, true, NULL, 0, &n) == EKV_ERR_NOT_FOUND);
    CHECK(ekv_chat_apply("chatml", conv, 4, true, a, 10, &n) == EKV_ERR_INVALID_ARG);

    /* detection from a Jinja text */
    CHECK(ekv_chat_template_detect("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}") != NULL &&
          !strcmp(ekv_chat_template_detect("{{'<|im_start|>'}}"), "chatml"));
    CHECK(ekv_chat_template_detect("plain text") == NULL);
    CHECK(ekv_chat_template_detect(NULL) == NULL);
    return test_finish("test_chat");
}
