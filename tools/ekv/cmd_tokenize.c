/*
 * cmd_tokenize.c — `ekv tokenize`: a text's token ids under a model's
 * tokenizer, as llama.cpp's llama-tokenize prints them ("id -> 'piece'"
 * lines, or --ids), plus --json with each token's byte offset in the
 * detokenised text, which scripts use to cut texts at exact token
 * boundaries (data/longctx/make_longctx.py).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *const CMD = "tokenize";

static const struct cli_help k_help = {
    "usage: ekv tokenize [-m FILE] (-p TEXT | -f FILE) [--ids | --json] [--no-bos]",
    "Prints the tokens of a text under the model's tokenizer, one 'id -> 'piece'' line\n"
    "per token (as llama.cpp's llama-tokenize), or the ids only, or JSON with each token's\n"
    "byte offset (scripts use it to cut texts at exact token boundaries).",
    NULL,
};

static char *read_stream(FILE *fp, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
        if (n + 1 == cap) {
            char *nb = cap > ((size_t)1 << 30) ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf) return NULL;
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Prints a piece as a quoted string with escapes (plain output). */
static void print_piece(const char *p, size_t n) {
    putchar('\'');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\'') fputs("\\'", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c < 32 || c == 127) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('\'');
}

enum out_mode { OUT_PLAIN, OUT_IDS, OUT_JSON };

static int print_tokens(const struct ekv_model *m, const int32_t *ids, size_t n, enum out_mode mode, bool count) {
    char piece[256];
    uint64_t off = 0;
    if (mode == OUT_IDS) putchar('[');
    if (mode == OUT_JSON) printf("{\"n_tokens\": %zu, \"ids\": [", n);
    for (size_t i = 0; i < n && mode != OUT_PLAIN; i++) printf("%s%d", i ? ", " : "", ids[i]);
    if (mode == OUT_IDS) printf("]\n");
    if (mode == OUT_JSON) printf("], \"offsets\": [");
    for (size_t i = 0; i < n && mode != OUT_IDS; i++) {
        size_t len = 0;
        enum ekv_status s = ekv_token_to_piece(m, ids[i], true, piece, sizeof piece, &len);
        if (s != EKV_OK) return cli_fail(CMD, s);
        if (mode == OUT_JSON) {
            printf("%s%llu", i ? ", " : "", (unsigned long long)off);
        } else {
            printf("%6d -> ", ids[i]);
            print_piece(piece, len);
            putchar('\n');
        }
        off += len;
    }
    if (mode == OUT_JSON) printf("], \"n_bytes\": %llu}\n", (unsigned long long)off);
    else if (count) printf("Total number of tokens: %zu\n", n);
    return 0;
}

static int tokenize_main(int argc, char **argv) {
    struct cli_params p;
    cli_params_init(&p, CLI_TOKENIZE);
    int prc = cli_parse(CMD, argc, argv, &p, &k_help);
    if (prc) return prc == 2 ? 0 : prc;
    const char *prompt = p.prompt, *file = p.prompt_file, *model_path = p.model, *tok_path = p.tokenizer;
    const enum out_mode mode = p.json ? OUT_JSON : p.tok_ids ? OUT_IDS : OUT_PLAIN;
    const bool bos = !p.tok_no_bos, special = p.tok_parse_special, count = p.tok_show_count;
    if (p.json && p.tok_ids) return cli_usage_error(CMD, "--ids and --json exclude each other");
    if (!prompt == !file) return cli_usage_error(CMD, "give exactly one of -p TEXT and -f FILE");
    char *text = NULL;
    size_t len = 0;
    if (file && !strcmp(file, "-")) {
        text = read_stream(stdin, &len);
        if (!text) return cli_usage_error(CMD, "cannot read standard input");
    } else if (file) {
        text = cli_read_file(CMD, file, &len);
        if (!text) return 1;
    } else {
        len = strlen(prompt);
    }
    const char *src = text ? text : prompt;
    struct ekv_model_params mp = ekv_model_default_params();
    mp.tokenizer_path = tok_path;
    struct ekv_model *m = NULL;
    enum ekv_status s = ekv_model_load(model_path ? model_path : cli_default_model(), &mp, &m);
    int rc = 1;
    int32_t *ids = NULL;
    size_t n = 0, cap = len + 16;
    if (s != EKV_OK) {
        rc = cli_fail(CMD, s);
        goto done;
    }
    ids = malloc(cap * sizeof *ids);
    if (!ids) {
        rc = cli_usage_error(CMD, "out of memory for %zu tokens", cap);
        goto done;
    }
    s = ekv_tokenize(m, src, len, bos, special, ids, cap, &n);
    if (s != EKV_OK) {
        rc = cli_fail(CMD, s);
        goto done;
    }
    rc = print_tokens(m, ids, n, mode, count);
done:
    free(ids);
    free(text);
    ekv_model_free(m);
    return rc;
}

const struct ekv_cmd ekv_cmd_tokenize = {
    .name = "tokenize",
    .summary = "print the token ids of a text (llama-tokenize)",
    .main = tokenize_main,
};
