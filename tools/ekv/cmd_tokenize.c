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

static void help(void) {
    printf("usage: ekv tokenize [-m FILE] (-p TEXT | -f FILE) [--ids | --json] [--no-bos]\n\n"
           "Prints the tokens of a text under the model's tokenizer.\n\n"
           "  -m, --model FILE      GGUF or llama2.c model (default: bundled models/stories260K.gguf)\n"
           "      --tokenizer FILE  tokenizer .bin for llama2.c checkpoints\n"
           "  -p, --prompt TEXT     text to tokenize\n"
           "  -f, --file FILE       read the text from a file ('-' = standard input)\n"
           "      --ids             print only the ids, as [1, 2, 3]\n"
           "      --json            print {\"n_tokens\": N, \"ids\": [...], \"offsets\": [...]}: offsets[i]\n"
           "                        is the byte offset of token i in the detokenised text (the\n"
           "                        concatenation of the pieces; for byte-level BPE the input itself)\n"
           "      --no-bos          do not add BOS even when the vocabulary asks for it\n"
           "      --parse-special   text of special tokens (\"<|endoftext|>\") becomes those tokens\n"
           "      --show-count      print the number of tokens at the end (plain and --ids output)\n"
           "  -h, --help            this help\n");
}

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
    const char *model_path = NULL, *tok_path = NULL, *prompt = NULL, *file = NULL;
    enum out_mode mode = OUT_PLAIN;
    bool bos = true, special = false, count = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help();
            return 0;
        } else if (!strcmp(a, "--ids")) {
            mode = OUT_IDS;
        } else if (!strcmp(a, "--json")) {
            mode = OUT_JSON;
        } else if (!strcmp(a, "--no-bos")) {
            bos = false;
        } else if (!strcmp(a, "--parse-special")) {
            special = true;
        } else if (!strcmp(a, "--show-count")) {
            count = true;
        } else {
            const char **dst = !strcmp(a, "-m") || !strcmp(a, "--model")    ? &model_path
                               : !strcmp(a, "--tokenizer")                  ? &tok_path
                               : !strcmp(a, "-p") || !strcmp(a, "--prompt") ? &prompt
                               : !strcmp(a, "-f") || !strcmp(a, "--file")   ? &file
                                                                            : NULL;
            if (!dst) return cli_usage_error(CMD, "unknown option '%s' (see ekv tokenize --help)", a);
            if (!v) return cli_usage_error(CMD, "%s needs a value", a);
            *dst = v;
            i++;
        }
    }
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
