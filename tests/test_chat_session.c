/*
 * test_chat_session.c — `ekv run --chat` driven through stdin by a script:
 * each turn feeds exactly what the template adds since the previous answer
 * (the closing of the answer, the new user message, the assistant prefix),
 * the answers equal a reference conversation run here through the C API on
 * one sequence (so the cache is really kept between turns), a compressing
 * policy keeps the cache at its budget as the conversation grows, the
 * model's own template is used when none is named, images go with the
 * first message, and /exit, blank lines and the end of input behave.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "ekv.h"
#include "testutil.h"

#define MAX_TURNS 8

struct turn {
    char fed[1024];
    int tokens[64];
    int n_tokens;
    char stop[16];
    double entries, entries_full, n_seen, fed_positions;
};

/* Runs `ekv run --chat ... --json` with `input` on stdin; parses one JSON
 * line per turn. Returns the number of turns, -1 on failure. */
static int chat(const char *args, const char *input, struct turn *t) {
    char in_path[] = "/tmp/ekv_chat_in_XXXXXX";
    int fd = mkstemp(in_path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    fputs(input, f);
    fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/ekv run --chat --json --temp 0 -t 2 %s < %s 2>/dev/null", EKV_BINARY_DIR, args,
             in_path);
    FILE *p = popen(cmd, "r");
    int n = 0;
    char line[1 << 16];
    while (p && n < MAX_TURNS && fgets(line, sizeof line, p)) {
        cJSON *o = cJSON_Parse(line);
        if (!o) continue;
        struct turn *x = &t[n++];
        memset(x, 0, sizeof *x);
        snprintf(x->fed, sizeof x->fed, "%s", cJSON_GetObjectItem(o, "fed_text")->valuestring);
        snprintf(x->stop, sizeof x->stop, "%s", cJSON_GetObjectItem(o, "stop")->valuestring);
        cJSON *tk;
        cJSON_ArrayForEach(tk, cJSON_GetObjectItem(o, "tokens")) if (x->n_tokens < 64) x->tokens[x->n_tokens++] = tk->valueint;
        x->n_seen = cJSON_GetObjectItem(o, "n_seen")->valuedouble;
        x->fed_positions = cJSON_GetObjectItem(o, "fed_positions")->valuedouble;
        cJSON *kv = cJSON_GetObjectItem(o, "kv");
        x->entries = cJSON_GetObjectItem(kv, "entries")->valuedouble;
        x->entries_full = cJSON_GetObjectItem(kv, "entries_full")->valuedouble;
        cJSON_Delete(o);
    }
    int rc = p ? pclose(p) : -1;
    remove(in_path);
    return rc == 0 ? n : -1;
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* The same conversation through the API: each turn's text tokenized (BOS
 * only on the first), greedy answers of n_predict tokens fed back. */
static void reference(const char *model, const struct turn *t, int n_turns, int n_predict) {
    struct ekv_model *m = NULL;
    struct ekv_context *c = NULL;
    struct ekv_seq *s = NULL;
    struct ekv_prompt *pr = NULL;
    CHECK_OK(ekv_model_load(model, NULL, &m));
    if (m) CHECK_OK(ekv_context_new(m, NULL, &c));
    if (c) CHECK_OK(ekv_seq_new(c, NULL, &s));
    if (!s) goto out;
    struct ekv_model_info mi;
    ekv_model_get_info(m, &mi);
    float *lg = malloc(sizeof(float) * (size_t)mi.n_vocab);
    for (int k = 0; k < n_turns; k++) {
        CHECK_OK(ekv_prompt_new(m, t[k].fed, strlen(t[k].fed), k == 0, &pr));
        CHECK(pr && ekv_prompt_n_positions(pr) == (int64_t)t[k].fed_positions);
        CHECK_OK(ekv_seq_eval_prompt(s, pr, lg));
        ekv_prompt_free(pr);
        pr = NULL;
        int same = 0, n = 0;
        for (; n < n_predict; n++) {
            int tok = argmax(lg, mi.n_vocab);
            if (ekv_token_is_eog(m, tok)) break;
            same += n < t[k].n_tokens && tok == t[k].tokens[n];
            CHECK_OK(ekv_seq_decode(s, tok, lg));
        }
        CHECK_MSG(n == t[k].n_tokens && same == n, "turn %d: %d of %d answer tokens as the reference's %d", k + 1,
                  same, t[k].n_tokens, n);
        CHECK((double)ekv_seq_n_seen(s) == t[k].n_seen);
    }
    free(lg);
out:
    ekv_seq_free(s);
    ekv_context_free(c);
    ekv_model_free(m);
}

static int run(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int main(void) {
    struct turn t[MAX_TURNS];
    const char *model = tu_src("models/stories260K.gguf");
    char args[2048];

    /* chatml by name: turn 2 feeds the closing of answer 1 and the new turn, nothing else */
    snprintf(args, sizeof args, "-m %s --chat-template chatml -n 10", model);
    int n = chat(args, "Tell me a story.\n\nAnd then?\nThe end.\n", t);
    CHECK_MSG(n == 3, "%d turns", n); /* the blank line is no turn */
    if (n == 3) {
        CHECK(!strcmp(t[0].fed, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                                "Tell me a story.<|im_end|>\n<|im_start|>assistant\n"));
        CHECK(!strcmp(t[1].fed, "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n"));
        CHECK(!strcmp(t[2].fed, "<|im_end|>\n<|im_start|>user\nThe end.<|im_end|>\n<|im_start|>assistant\n"));
        CHECK(t[1].n_seen > t[0].n_seen && t[2].n_seen > t[1].n_seen);
        CHECK(t[0].entries == t[0].entries_full); /* full cache */
        reference(model, t, 3, 10);
    }

    /* llama-2 with a system prompt and -p as the first message; /exit ends */
    snprintf(args, sizeof args, "-m %s --chat-template llama-2 --system 'Be kind.' -p 'Hi there' -n 6", model);
    n = chat(args, "Who are you?\n/exit\nnot read\n", t);
    CHECK_MSG(n == 2, "%d turns", n);
    if (n == 2) {
        CHECK(!strcmp(t[0].fed, "[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi there [/INST]"));
        CHECK(!strcmp(t[1].fed, " </s><s>[INST] Who are you? [/INST]"));
        reference(model, t, 2, 6);
    }

    /* a compressing policy keeps compressing as the conversation grows */
    snprintf(args, sizeof args, "-m %s --chat-template gemma -n 16 --kv-policy elastic --kv-budget 0.5", model);
    n = chat(args, "One.\nTwo.\nThree.\nFour.\n", t);
    CHECK_MSG(n == 4, "%d turns", n);
    for (int k = 0; k < n; k++)
        CHECK_MSG(t[k].entries <= 0.5 * t[k].entries_full + 5 * 4 * 2 && t[k].entries < t[k].entries_full,
                  "turn %d: %g of %g entries", k + 1, t[k].entries, t[k].entries_full);
    if (n == 4) CHECK(t[3].entries > t[0].entries); /* it keeps a fraction, not a fixed set */

    /* the model's own template when none is named: tiny-llama3 carries Llama 3's */
    char dir[] = "/tmp/ekv_chats_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char cmd[4096], lm[512], mm[512];
    snprintf(lm, sizeof lm, "%s/l3.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-llama3 -o %s >/dev/null", EKV_BINARY_DIR, lm);
    CHECK(run(cmd) == 0);
    snprintf(args, sizeof args, "-m %s -n 4", lm);
    n = chat(args, "Hello\n", t);
    CHECK(n == 1 && !strcmp(t[0].fed, "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                                      "<|start_header_id|>assistant<|end_header_id|>\n\n"));

    /* images go with the first message: 16 image positions for tiny-vlm */
    snprintf(lm, sizeof lm, "%s/vlm.gguf", dir);
    snprintf(mm, sizeof mm, "%s/vlm-mmproj.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s/ekv mkmodel --preset tiny-vlm --seed 7 -o %s --mmproj-out %s >/dev/null",
             EKV_BINARY_DIR, lm, mm);
    CHECK(run(cmd) == 0);
    snprintf(args, sizeof args, "-m %s --mmproj %s --image %s --chat-template llava-1.5 -n 4", lm, mm,
             tu_src("data/images/astronaut_crop.jpg"));
    n = chat(args, "What is this?\nAnd now?\n", t);
    CHECK_MSG(n == 2, "%d turns", n);
    if (n == 2) {
        CHECK(strstr(t[0].fed, "USER: <image>\nWhat is this? ASSISTANT:") != NULL);
        struct ekv_model *m = NULL;
        CHECK_OK(ekv_model_load(lm, NULL, &m));
        int32_t ids[512];
        size_t nt = 0;
        /* the fed positions are the text tokens plus 16 image embeddings */
        char text[1024];
        snprintf(text, sizeof text, "%s", t[0].fed);
        char *mark = strstr(text, "<image>");
        if (mark) memmove(mark, mark + 7, strlen(mark + 7) + 1);
        size_t a = (size_t)(mark - text), na = 0, nb = 0;
        CHECK_OK(ekv_tokenize(m, text, a, true, true, ids, 512, &na));
        CHECK_OK(ekv_tokenize(m, text + a, strlen(text + a), false, true, ids, 512, &nb));
        nt = na + nb;
        CHECK_MSG(t[0].fed_positions == (double)nt + 16, "%g fed, %zu text tokens", t[0].fed_positions, nt);
        CHECK(!strcmp(t[1].fed, "</s>USER: And now? ASSISTANT:"));
        ekv_model_free(m);
    }
    /* an image marker in a later turn is refused */
    snprintf(args, sizeof args, "-m %s --mmproj %s --image %s -n 2", lm, mm, tu_src("data/images/astronaut_crop.jpg"));
    CHECK(chat(args, "First\nsee <image>\n", t) == -1);
    /* errors: -f with --chat */
    snprintf(cmd, sizeof cmd, "%s/ekv run --chat -f /dev/null </dev/null >/dev/null 2>&1", EKV_BINARY_DIR);
    CHECK(run(cmd) == 1);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(run(cmd) == 0);
    return test_finish("test_chat_session");
}
