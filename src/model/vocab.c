/*
 * vocab.c — building a vocabulary (from GGUF metadata or a llama2.c
 * tokenizer file) and the tokenize / detokenize entry points of vocab.h.
 * The per-fragment tokenizers live in tokenizer_spm.c and tokenizer_bpe.c;
 * this file finds the special tokens in the text, hands the plain-text
 * fragments between them over, and turns ids back into bytes. The token
 * attributes, end-of-generation set and special-token handling follow
 * llama.cpp's llama-vocab so that ids agree with it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/gguf.h"
#include "model/unicode.h"
#include "model/vocab_impl.h"

/* ---- hashing ---- */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv_add(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t hash_str(const char *s, size_t n) { return fnv_add(FNV_OFFSET, s, n); }

static uint64_t hash_pair(const char *a, size_t an, const char *b, size_t bn) {
    return fnv_add(fnv_add(fnv_add(FNV_OFFSET, a, an), " ", 1), b, bn);
}

static enum ekv_status table_new(size_t n_items, int32_t **out, size_t *mask, const char *what) {
    size_t cap = 16;
    while (cap < n_items * 2) {
        if (cap > SIZE_MAX / 4) return ekv_err(EKV_ERR_OVERFLOW, "%s: %zu entries is too many", what, n_items);
        cap *= 2;
    }
    size_t bytes;
    if (!ekv_mul_ok(cap, sizeof(int32_t), &bytes))
        return ekv_err(EKV_ERR_OVERFLOW, "%s: %zu entries is too many", what, n_items);
    int32_t *t = malloc(bytes);
    if (!t) return ekv_err(EKV_ERR_NOMEM, "%s: no memory for a table of %zu entries", what, cap);
    memset(t, 0xff, bytes); /* all -1 */
    *out = t;
    *mask = cap - 1;
    return EKV_OK;
}

static bool tok_text_eq(const struct ekv_vocab *v, int32_t id, const char *s, size_t n) {
    const struct ekv_vocab_token *t = &v->tok[id];
    return t->text_len == n && memcmp(v->text + t->text_off, s, n) == 0;
}

int32_t ekv_vocab_lookup(const struct ekv_vocab *v, const char *s, size_t n) {
    for (size_t i = hash_str(s, n) & v->ht_mask;; i = (i + 1) & v->ht_mask) {
        int32_t id = v->ht[i];
        if (id < 0) return -1;
        if (tok_text_eq(v, id, s, n)) return id;
    }
}

int32_t ekv_vocab_merge_rank(const struct ekv_vocab *v, const char *a, size_t an, const char *b, size_t bn) {
    if (!v->mt) return -1;
    for (size_t i = hash_pair(a, an, b, bn) & v->mt_mask;; i = (i + 1) & v->mt_mask) {
        int32_t r = v->mt[i];
        if (r < 0) return -1;
        const struct ekv_vocab_merge *m = &v->merges[r];
        if (m->a_len == an && m->b_len == bn && memcmp(v->merge_text + m->a_off, a, an) == 0 &&
            memcmp(v->merge_text + m->b_off, b, bn) == 0)
            return r;
    }
}

/* ---- construction ---- */

/* Options the two loaders pass to the common part. */
struct ekv_vocab_opts {
    const char *src;       /* file name for messages */
    bool phi3_strip;       /* llama.cpp's Phi-3 special-token whitespace rules */
};

static enum ekv_status vocab_new(struct ekv_vocab **out) {
    struct ekv_vocab *v = calloc(1, sizeof *v);
    if (!v) return ekv_err(EKV_ERR_NOMEM, "vocabulary: out of memory");
    v->bos = v->eos = v->unk = -1;
    for (int i = 0; i < 256; i++) v->byte_tok[i] = -1;
    *out = v;
    return EKV_OK;
}

void ekv_vocab_free(struct ekv_vocab *v) {
    if (!v) return;
    free(v->tok);
    free(v->text);
    free(v->pieces);
    free(v->ht);
    free(v->merges);
    free(v->merge_text);
    free(v->mt);
    free(v->special);
    free(v);
}

/* Sizes the token arrays: n tokens whose texts take text_bytes in all. */
static enum ekv_status vocab_alloc_tokens(struct ekv_vocab *v, const char *src, size_t n, size_t text_bytes) {
    if (n == 0 || n > INT32_MAX / 4)
        return ekv_err(EKV_ERR_FORMAT, "%s: vocabulary of %zu tokens is out of range", src, n);
    if (text_bytes >= UINT32_MAX)
        return ekv_err(EKV_ERR_FORMAT, "%s: token texts take %zu bytes (at most 4 GiB)", src, text_bytes);
    size_t bytes;
    if (!ekv_mul_ok(n, sizeof *v->tok, &bytes)) return ekv_err(EKV_ERR_OVERFLOW, "%s: vocabulary too large", src);
    v->tok = calloc(1, bytes);
    v->text = malloc(text_bytes ? text_bytes : 1);
    v->pieces = malloc(text_bytes ? text_bytes : 1);
    if (!v->tok || !v->text || !v->pieces)
        return ekv_err(EKV_ERR_NOMEM, "%s: no memory for %zu tokens", src, n);
    v->n_tokens = (int32_t)n;
    return EKV_OK;
}

#define EMPTY_TOKEN_MAX 24 /* room for "[EMPTY_<id>]" */

/* Bytes token text s[0..n) takes once stored (spaces escaped to U+2581 if asked). */
static size_t stored_len(const char *s, size_t n, bool escape_spaces) {
    if (n == 0) return EMPTY_TOKEN_MAX;
    size_t len = n;
    if (escape_spaces)
        for (size_t i = 0; i < n; i++) len += s[i] == ' ' ? 2 : 0;
    return len;
}

/* Stores token id's text at *used (the pool was sized with stored_len). */
static void vocab_put_token(struct ekv_vocab *v, size_t *used, int32_t id, const char *s, size_t n,
                            bool escape_spaces, float score, uint16_t attr) {
    struct ekv_vocab_token *t = &v->tok[id];
    char *dst = v->text + *used;
    size_t len = 0;
    if (n == 0) { /* llama.cpp names empty tokens so that the text -> id map stays one-to-one */
        len = (size_t)snprintf(dst, EMPTY_TOKEN_MAX, "[EMPTY_%d]", (int)id);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (escape_spaces && s[i] == ' ') {
                memcpy(dst + len, "\xE2\x96\x81", 3);
                len += 3;
            } else {
                dst[len++] = s[i];
            }
        }
    }
    t->text_off = (uint32_t)*used;
    t->text_len = (uint32_t)len;
    t->score = score;
    t->attr = attr;
    *used += len;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Byte of a "<0xNN>" text, or -1. */
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Texts of tokens that end generation (llama.cpp's list, minus model-specific exceptions). */
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
};

struct len_id {
    uint32_t len;
    int32_t id;
};

static int cmp_len_desc(const void *pa, const void *pb) {
    const struct len_id *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Decoded bytes of token id when rendered with special = true, into dst. */
static size_t make_piece(const struct ekv_vocab *v, int32_t id, char *dst) {
    const struct ekv_vocab_token *t = &v->tok[id];
    const char *s = v->text + t->text_off;
    size_t n = t->text_len;
    if (t->attr & (TOK_CONTROL | TOK_UNKNOWN | TOK_USER_DEFINED)) {
        memcpy(dst, s, n);
        return n;
    }
    if (t->attr & TOK_NORMAL) {
        size_t len = 0;
        if (v->type == VOCAB_SPM) {
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                    dst[len++] = ' ';
                    i += 3;
                } else {
                    dst[len++] = s[i++];
                }
            }
        } else {
            for (size_t i = 0; i < n;) {
                size_t l;
                uint32_t cp = ekv_utf8_decode(s + i, n - i, &l);
                int b = cp == EKV_CP_INVALID ? -1 : ekv_gpt2_cp_to_byte(cp);
                if (b >= 0) {
                    dst[len++] = (char)b;
                } else { /* outside the byte mapping: keep the character */
                    memcpy(dst + len, s + i, l);
                    len += l;
                }
                i += l;
            }
        }
        return len;
    }
    if (t->attr & TOK_BYTE) {
        dst[0] = (char)byte_token_value(s, n); /* validated at load */
        return 1;
    }
    return 0; /* unused / undefined tokens render as nothing */
}

/* Everything after the tokens are stored: lookup table, attributes, special
 * tokens, byte tokens, pieces, checks. */
static enum ekv_status vocab_finish(struct ekv_vocab *v, const struct ekv_vocab_opts *o) {
    enum ekv_status st = table_new((size_t)v->n_tokens, &v->ht, &v->ht_mask, "vocabulary");
    if (st != EKV_OK) return ekv_err_prefix(st, "%s", o->src);
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const struct ekv_vocab_token *t = &v->tok[id];
        const char *s = v->text + t->text_off;
        size_t i = hash_str(s, t->text_len) & v->ht_mask;
        for (; v->ht[i] >= 0; i = (i + 1) & v->ht_mask) {
            if (tok_text_eq(v, v->ht[i], s, t->text_len))
                return ekv_err(EKV_ERR_FORMAT, "%s: duplicate token '%.*s' (ids %d and %d)", o->src,
                               (int)EKV_MIN(t->text_len, 64u), s, (int)v->ht[i], (int)id);
        }
        v->ht[i] = id;
        if ((t->attr & TOK_BYTE) && byte_token_value(s, t->text_len) < 0)
            return ekv_err(EKV_ERR_FORMAT, "%s: byte token %d is '%.*s', not <0xNN>", o->src, (int)id,
                           (int)EKV_MIN(t->text_len, 64u), s);
    }

    /* end of generation: EOS and the usual end-of-turn texts (made control tokens, as llama.cpp does) */
    for (size_t k = 0; k < EKV_ARRAY_LEN(k_eog_texts); k++) {
        int32_t id = ekv_vocab_lookup(v, k_eog_texts[k], strlen(k_eog_texts[k]));
        if (id >= 0) v->tok[id].attr |= TOK_EOG | TOK_CONTROL;
    }
    if (v->eos >= 0) v->tok[v->eos].attr |= TOK_EOG;

    /* special tokens matched in text, longest first */
    size_t n_sp = 0;
    for (int32_t id = 0; id < v->n_tokens; id++) n_sp += (v->tok[id].attr & TOK_SPECIAL_MASK) != 0;
    if (n_sp) {
        struct len_id *tmp = malloc(n_sp * sizeof *tmp);
        v->special = malloc(n_sp * sizeof *v->special);
        if (!tmp || !v->special) {
            free(tmp);
            return ekv_err(EKV_ERR_NOMEM, "%s: no memory for %zu special tokens", o->src, n_sp);
        }
        size_t k = 0;
        for (int32_t id = 0; id < v->n_tokens; id++)
            if (v->tok[id].attr & TOK_SPECIAL_MASK) tmp[k++] = (struct len_id){v->tok[id].text_len, id};
        qsort(tmp, n_sp, sizeof *tmp, cmp_len_desc);
        for (k = 0; k < n_sp; k++) v->special[k] = tmp[k].id;
        v->n_special = n_sp;
        free(tmp);
    }
    if (o->phi3_strip) { /* Phi-3: special tokens swallow the whitespace after them, except these */
        for (size_t k = 0; k < v->n_special; k++) v->tok[v->special[k]].attr |= TOK_RSTRIP;
        int32_t id = ekv_vocab_lookup(v, "</s>", 4);
        if (id >= 0) v->tok[id].attr |= TOK_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t k = 0; k < EKV_ARRAY_LEN(keep); k++) {
            id = ekv_vocab_lookup(v, keep[k], strlen(keep[k]));
            if (id >= 0) v->tok[id].attr &= (uint16_t)~TOK_RSTRIP;
        }
    }

    /* byte -> token */
    for (int b = 0; b < 256; b++) {
        if (v->type == VOCAB_SPM) {
            char hex[7];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            char one = (char)b;
            int32_t id = ekv_vocab_lookup(v, hex, 6);
            v->byte_tok[b] = id >= 0 ? id : ekv_vocab_lookup(v, &one, 1);
        } else {
            char u[4];
            v->byte_cp[b] = ekv_gpt2_byte_to_cp((uint8_t)b);
            v->byte_tok[b] = ekv_vocab_lookup(v, u, ekv_utf8_encode(v->byte_cp[b], u));
        }
    }

    /* pieces (never longer than the text) */
    size_t used = 0;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        size_t len = make_piece(v, id, v->pieces + used);
        v->tok[id].piece_off = (uint32_t)used;
        v->tok[id].piece_len = (uint32_t)len;
        used += len;
    }

    if (v->add_bos && v->bos < 0)
        return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.add_bos_token is set but there is no BOS token", o->src);
    if (v->add_eos && v->eos < 0)
        return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.add_eos_token is set but there is no EOS token", o->src);
    return EKV_OK;
}

/* ---- GGUF ---- */

static bool kv_present(const struct ekv_gguf_file *f, const char *key) { return ekv_gguf_find_kv(f, key) != NULL; }

/* Optional special-token id: -1 / 0xFFFFFFFF or absent mean none (keeps *id). */
static enum ekv_status read_token_id(const struct ekv_gguf_file *f, const char *src, const char *key, int32_t n_tokens,
                                     bool required_in_range, int32_t *id) {
    if (!kv_present(f, key)) return EKV_OK;
    int64_t x;
    enum ekv_status st = ekv_gguf_get_i64(f, key, &x);
    if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
    if (x < 0 || x == (int64_t)UINT32_MAX) {
        *id = -1;
        return EKV_OK;
    }
    if (x >= n_tokens) {
        if (required_in_range)
            return ekv_err(EKV_ERR_FORMAT, "%s: %s = %lld is outside the vocabulary of %d tokens", src, key,
                           (long long)x, (int)n_tokens);
        *id = -1; /* an id we never use: ignore it, as llama.cpp does */
        return EKV_OK;
    }
    *id = (int32_t)x;
    return EKV_OK;
}

static enum ekv_status read_bool(const struct ekv_gguf_file *f, const char *src, const char *key, bool *b) {
    if (!kv_present(f, key)) return EKV_OK;
    enum ekv_status st = ekv_gguf_get_bool(f, key, b);
    return st == EKV_OK ? st : ekv_err_prefix(st, "%s", src);
}

/* tokenizer.ggml.pre -> split and flags (llama.cpp's table, for the splits we implement). */
struct pre_entry {
    const char *name;
    enum ekv_vocab_pre pre;
    bool clean_spaces, ignore_merges, add_bos;
};

static const struct pre_entry k_pre_table[] = {
    {"default", PRE_DEFAULT, true, false, false},
    {"gpt-2", PRE_GPT2, true, false, false},
    {"phi-2", PRE_GPT2, true, false, false},
    {"jina-es", PRE_GPT2, true, false, false},
    {"jina-de", PRE_GPT2, true, false, false},
    {"gigachat", PRE_GPT2, true, false, false},
    {"jina-v2-es", PRE_GPT2, true, false, false},
    {"jina-v2-de", PRE_GPT2, true, false, false},
    {"a.x-4.0", PRE_GPT2, true, false, false},
    {"mellum", PRE_GPT2, true, false, false},
    {"modern-bert", PRE_GPT2, true, false, false},
    {"exaone4", PRE_GPT2, true, false, false},
    {"mpt", PRE_GPT2, true, false, false},
    {"olmo", PRE_GPT2, true, false, false},
    {"jais", PRE_GPT2, true, false, false},
    {"trillion", PRE_GPT2, false, false, false},
    {"granite-docling", PRE_GPT2, false, false, false},
    {"starcoder", PRE_STARCODER, true, false, false},
    {"refact", PRE_STARCODER, true, false, false},
    {"codeshell", PRE_STARCODER, true, false, false},
    {"exaone", PRE_STARCODER, true, false, false},
    {"minerva-7b", PRE_STARCODER, true, false, false},
    {"mellum2", PRE_STARCODER, true, false, false},
    {"command-r", PRE_STARCODER, false, false, false},
    {"smollm", PRE_STARCODER, false, false, false},
    {"llama3", PRE_LLAMA3, true, true, true},
    {"llama-v3", PRE_LLAMA3, true, true, true},
    {"llama-bpe", PRE_LLAMA3, true, true, true},
    {"falcon3", PRE_LLAMA3, true, true, true},
    {"falcon-h1", PRE_LLAMA3, true, true, true},
    {"pixtral", PRE_LLAMA3, true, true, true},
    {"midm-2.0", PRE_LLAMA3, true, true, true},
    {"lfm2", PRE_LLAMA3, true, true, true},
    {"jina-v5-nano", PRE_LLAMA3, true, true, true},
    {"dbrx", PRE_LLAMA3, true, false, false},
    {"smaug-bpe", PRE_LLAMA3, true, false, false},
    {"qwen2", PRE_QWEN2, false, false, false},
    {"deepseek-r1-qwen", PRE_QWEN2, false, false, false},
    {"kormo", PRE_QWEN2, false, false, false},
    {"f2llmv2", PRE_QWEN2, false, false, false},
    {"megrez", PRE_QWEN2, true, false, false},
    {"stablelm2", PRE_QWEN2, true, false, false},
};

static enum ekv_status set_pre(struct ekv_vocab *v, const char *src, const struct ekv_gguf_file *f) {
    struct ekv_gguf_str pre = {7, "default"}; /* llama.cpp's fallback when the key is missing */
    if (kv_present(f, "tokenizer.ggml.pre")) {
        enum ekv_status st = ekv_gguf_get_str(f, "tokenizer.ggml.pre", &pre);
        if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
    }
    for (size_t i = 0; i < EKV_ARRAY_LEN(k_pre_table); i++) {
        const struct pre_entry *e = &k_pre_table[i];
        if (!ekv_gguf_str_eq(pre, e->name)) continue;
        v->pre = e->pre;
        v->clean_spaces = e->clean_spaces;
        v->ignore_merges = e->ignore_merges;
        v->add_bos = e->add_bos; /* tokenizer.ggml.add_bos_token, read later, overrides */
        return EKV_OK;
    }
    return ekv_err(EKV_ERR_UNSUPPORTED,
                   "%s: BPE pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported "
                   "(supported: default, gpt-2, llama3, qwen2, smollm, starcoder and their aliases)",
                   src, (int)EKV_MIN(pre.len, (uint64_t)64), pre.ptr);
}

static enum ekv_status load_merges(struct ekv_vocab *v, const char *src, const struct ekv_gguf_file *f) {
    const char *key = "tokenizer.ggml.merges";
    const struct ekv_gguf_value *arr;
    enum ekv_status st = ekv_gguf_get_arr(f, key, GGUF_TYPE_STRING, &arr);
    if (st == EKV_ERR_NOT_FOUND)
        return ekv_err(EKV_ERR_FORMAT, "%s: BPE vocabulary without %s", src, key);
    if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
    uint64_t n = arr->v.arr.n;
    if (n > (uint64_t)INT32_MAX / 4) return ekv_err(EKV_ERR_FORMAT, "%s: %s has %llu entries", src, key, (unsigned long long)n);
    size_t bytes = 0;
    for (uint64_t i = 0; i < n; i++)
        if (!ekv_add_ok(bytes, (size_t)arr->v.arr.strs[i].len, &bytes))
            return ekv_err(EKV_ERR_OVERFLOW, "%s: %s too large", src, key);
    if (bytes >= UINT32_MAX) return ekv_err(EKV_ERR_FORMAT, "%s: %s takes %zu bytes", src, key, bytes);
    v->merges = calloc(n ? (size_t)n : 1, sizeof *v->merges);
    v->merge_text = malloc(bytes ? bytes : 1);
    if (!v->merges || !v->merge_text) return ekv_err(EKV_ERR_NOMEM, "%s: no memory for %llu merges", src, (unsigned long long)n);
    st = table_new((size_t)n, &v->mt, &v->mt_mask, "merges");
    if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
    size_t used = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct ekv_gguf_str s = arr->v.arr.strs[i];
        /* "left right", split at the first space after the first byte */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', (size_t)s.len - 1) : NULL;
        if (!sp) continue; /* llama.cpp keeps it as an empty pair that never matches */
        size_t an = (size_t)(sp - s.ptr), bn = (size_t)s.len - an - 1;
        memcpy(v->merge_text + used, s.ptr, (size_t)s.len);
        struct ekv_vocab_merge m = {(uint32_t)used, (uint32_t)an, (uint32_t)(used + an + 1), (uint32_t)bn};
        used += (size_t)s.len;
        /* the rank is the position in the list; a repeated pair keeps its first rank */
        const char *a = v->merge_text + m.a_off, *b = v->merge_text + m.b_off;
        size_t h = hash_pair(a, an, b, bn) & v->mt_mask;
        bool dup = false;
        for (; v->mt[h] >= 0; h = (h + 1) & v->mt_mask) {
            const struct ekv_vocab_merge *o = &v->merges[v->mt[h]];
            if (o->a_len == an && o->b_len == bn && memcmp(v->merge_text + o->a_off, a, an) == 0 &&
                memcmp(v->merge_text + o->b_off, b, bn) == 0) {
                dup = true;
                break;
            }
        }
        /* merges[] is indexed by rank, so a skipped entry still takes its slot */
        v->merges[i] = m;
        if (!dup) v->mt[h] = (int32_t)i;
    }
    v->n_merges = (int32_t)n;
    return EKV_OK;
}

enum ekv_status ekv_vocab_from_gguf(const struct ekv_gguf_file *f, const char *path_for_messages, struct ekv_vocab **out) {
    const char *src = path_for_messages ? path_for_messages : "GGUF";
    if (!f || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vocab_from_gguf: NULL argument");
    *out = NULL;

    struct ekv_gguf_str model;
    enum ekv_status st = ekv_gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (st == EKV_ERR_NOT_FOUND) return ekv_err(EKV_ERR_FORMAT, "%s: no tokenizer (tokenizer.ggml.model is missing)", src);
    if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
    enum ekv_vocab_type type;
    if (ekv_gguf_str_eq(model, "llama")) type = VOCAB_SPM;
    else if (ekv_gguf_str_eq(model, "gpt2")) type = VOCAB_BPE;
    else
        return ekv_err(EKV_ERR_UNSUPPORTED, "%s: tokenizer model '%.*s' (tokenizer.ggml.model) is not supported "
                       "(supported: llama, gpt2)", src, (int)EKV_MIN(model.len, (uint64_t)64), model.ptr);

    const struct ekv_gguf_value *toks, *scores = NULL, *types = NULL;
    st = ekv_gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks);
    if (st == EKV_ERR_NOT_FOUND) return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing", src);
    if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > (uint64_t)INT32_MAX / 4)
        return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", src, (unsigned long long)n);
    if (kv_present(f, "tokenizer.ggml.scores")) {
        st = ekv_gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_COUNT, &scores);
        if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
        if (scores->v.arr.type != GGUF_TYPE_FLOAT32 && scores->v.arr.type != GGUF_TYPE_INT32)
            return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.scores holds %s, not float32", src,
                           ekv_gguf_type_name(scores->v.arr.type));
        if (scores->v.arr.n != n)
            return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.scores has %llu entries for %llu tokens", src,
                           (unsigned long long)scores->v.arr.n, (unsigned long long)n);
    }
    if (kv_present(f, "tokenizer.ggml.token_type")) {
        st = ekv_gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_COUNT, &types);
        if (st != EKV_OK) return ekv_err_prefix(st, "%s", src);
        if (types->v.arr.type != GGUF_TYPE_INT32)
            return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.token_type holds %s, not int32", src,
                           ekv_gguf_type_name(types->v.arr.type));
        if (types->v.arr.n != n)
            return ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", src,
                           (unsigned long long)types->v.arr.n, (unsigned long long)n);
    }

    struct ekv_vocab *v;
    st = vocab_new(&v);
    if (st != EKV_OK) return st;
    v->type = type;

    size_t text_bytes = 0;
    for (uint64_t i = 0; i < n && st == EKV_OK; i++) {
        struct ekv_gguf_str s = toks->v.arr.strs[i];
        if (!ekv_add_ok(text_bytes, stored_len(s.ptr, (size_t)s.len, false), &text_bytes))
            st = ekv_err(EKV_ERR_OVERFLOW, "%s: tokenizer.ggml.tokens too large", src);
    }
    if (st == EKV_OK) st = vocab_alloc_tokens(v, src, (size_t)n, text_bytes);
    size_t used = 0;
    for (uint64_t i = 0; i < n && st == EKV_OK; i++) {
        struct ekv_gguf_str s = toks->v.arr.strs[i];
        float score = 0.0f;
        if (scores && scores->v.arr.type == GGUF_TYPE_FLOAT32) {
            memcpy(&score, (const char *)scores->v.arr.data + 4 * i, 4);
        } else if (scores) {
            int32_t x;
            memcpy(&x, (const char *)scores->v.arr.data + 4 * i, 4);
            score = (float)x;
        }
        uint16_t attr = TOK_NORMAL;
        if (types) {
            int32_t t;
            memcpy(&t, (const char *)types->v.arr.data + 4 * i, 4);
            switch (t) {
            case 0: attr = TOK_UNDEFINED; break;
            case 1: attr = TOK_NORMAL; break;
            case 2: attr = TOK_UNKNOWN; break;
            case 3: attr = TOK_CONTROL; break;
            case 4: attr = TOK_USER_DEFINED; break;
            case 5: attr = TOK_UNUSED; break;
            case 6: attr = TOK_BYTE; break;
            default:
                st = ekv_err(EKV_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%llu] = %d is not a token type (0..6)",
                             src, (unsigned long long)i, (int)t);
            }
        }
        if (st == EKV_OK) vocab_put_token(v, &used, (int32_t)i, s.ptr, (size_t)s.len, false, score, attr);
    }

    if (st == EKV_OK && type == VOCAB_SPM) {
        /* llama.cpp's defaults for SentencePiece models */
        v->bos = n > 1 ? 1 : -1;
        v->eos = n > 2 ? 2 : -1;
        v->unk = 0;
        v->add_bos = true;
        v->add_space_prefix = true;
        v->pre = PRE_NONE;
    } else if (st == EKV_OK) {
        st = set_pre(v, src, f);
        if (st == EKV_OK) st = load_merges(v, src, f);
    }
    if (st == EKV_OK) st = read_token_id(f, src, "tokenizer.ggml.bos_token_id", v->n_tokens, true, &v->bos);
    if (st == EKV_OK) st = read_token_id(f, src, "tokenizer.ggml.eos_token_id", v->n_tokens, true, &v->eos);
    if (st == EKV_OK) st = read_token_id(f, src, "tokenizer.ggml.unknown_token_id", v->n_tokens, true, &v->unk);
    int32_t eot = -1, eom = -1, pad = -1;
    if (st == EKV_OK) st = read_token_id(f, src, "tokenizer.ggml.eot_token_id", v->n_tokens, true, &eot);
    if (st == EKV_OK) st = read_token_id(f, src, "tokenizer.ggml.eom_token_id", v->n_tokens, true, &eom);
    if (st == EKV_OK) st = read_token_id(f, src, "tokenizer.ggml.padding_token_id", v->n_tokens, false, &pad);
    if (st == EKV_OK) st = read_bool(f, src, "tokenizer.ggml.add_bos_token", &v->add_bos);
    if (st == EKV_OK) st = read_bool(f, src, "tokenizer.ggml.add_eos_token", &v->add_eos);
    if (st == EKV_OK) st = read_bool(f, src, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
    if (st == EKV_OK && eot >= 0) v->tok[eot].attr |= TOK_EOG;
    if (st == EKV_OK && eom >= 0) v->tok[eom].attr |= TOK_EOG;
    if (st == EKV_OK && v->type == VOCAB_BPE) v->add_space_prefix = false; /* SentencePiece only */

    struct ekv_vocab_opts o = {src, false};
    if (st == EKV_OK && kv_present(f, "general.name")) {
        struct ekv_gguf_str name;
        if (ekv_gguf_get_str(f, "general.name", &name) == EKV_OK) {
            char low[256];
            size_t k = (size_t)EKV_MIN(name.len, (uint64_t)sizeof low - 1);
            for (size_t i = 0; i < k; i++) {
                char c = name.ptr[i];
                low[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
            }
            low[k] = '\0';
            o.phi3_strip = strstr(low, "phi-3") || strstr(low, "phi3");
        }
        ekv_err_clear();
    }
    if (st == EKV_OK) st = vocab_finish(v, &o);
    if (st != EKV_OK) {
        ekv_vocab_free(v);
        return st;
    }
    *out = v;
    return EKV_OK;
}

/* ---- llama2.c tokenizer file ---- */

static int32_t rd_i32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t x;
    memcpy(&x, &u, 4);
    return x;
}

static float rd_f32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static enum ekv_status read_whole_file(const char *path, unsigned char **data, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return ekv_err(EKV_ERR_IO, "%s: cannot open tokenizer file", path);
    enum ekv_status st = EKV_OK;
    long end = -1;
    if (fseek(fp, 0, SEEK_END) == 0) end = ftell(fp);
    if (end < 0 || fseek(fp, 0, SEEK_SET) != 0) st = ekv_err(EKV_ERR_IO, "%s: cannot determine the file size", path);
    else if ((unsigned long)end > (1ul << 30)) st = ekv_err(EKV_ERR_FORMAT, "%s: %ld bytes is too large for a tokenizer file", path, end);
    unsigned char *buf = NULL;
    if (st == EKV_OK) {
        buf = malloc(end > 0 ? (size_t)end : 1);
        if (!buf) st = ekv_err(EKV_ERR_NOMEM, "%s: no memory for %ld bytes", path, end);
        else if (end > 0 && fread(buf, 1, (size_t)end, fp) != (size_t)end)
            st = ekv_err(EKV_ERR_IO, "%s: read error", path);
    }
    fclose(fp);
    if (st != EKV_OK) {
        free(buf);
        return st;
    }
    *data = buf;
    *size = (size_t)end;
    return EKV_OK;
}

enum ekv_status ekv_vocab_from_llama2c(const char *tok_path, int32_t n_vocab, struct ekv_vocab **out) {
    if (!tok_path || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_vocab_from_llama2c: NULL argument");
    *out = NULL;
    if (n_vocab < 3 || n_vocab > INT32_MAX / 4)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: vocabulary size %d is out of range (3 .. %d)", tok_path,
                       (int)n_vocab, INT32_MAX / 4);
    unsigned char *d = NULL;
    size_t size = 0;
    enum ekv_status st = read_whole_file(tok_path, &d, &size);
    if (st != EKV_OK) return st;

    /* pass 1: validate the layout and size the text pool */
    size_t pos = 4, text_bytes = 0;
    int32_t max_len = size >= 4 ? rd_i32(d) : -1;
    if (size < 4) st = ekv_err(EKV_ERR_FORMAT, "%s: truncated (%zu bytes, no header)", tok_path, size);
    else if (max_len <= 0 || max_len > (1 << 20))
        st = ekv_err(EKV_ERR_FORMAT, "%s: max_token_length %d is out of range", tok_path, (int)max_len);
    for (int32_t i = 0; i < n_vocab && st == EKV_OK; i++) {
        if (size - pos < 8) {
            st = ekv_err(EKV_ERR_FORMAT, "%s: truncated at token %d of %d (offset %zu)", tok_path, (int)i,
                         (int)n_vocab, pos);
            break;
        }
        int32_t len = rd_i32(d + pos + 4);
        if (len < 0 || len > max_len) {
            st = ekv_err(EKV_ERR_FORMAT, "%s: token %d has length %d (max_token_length %d)", tok_path, (int)i,
                         (int)len, (int)max_len);
            break;
        }
        pos += 8;
        if (size - pos < (size_t)len) {
            st = ekv_err(EKV_ERR_FORMAT, "%s: truncated inside token %d of %d (offset %zu)", tok_path, (int)i,
                         (int)n_vocab, pos);
            break;
        }
        text_bytes += stored_len((const char *)d + pos, (size_t)len, true);
        pos += (size_t)len;
    }
    if (st == EKV_OK && pos != size)
        st = ekv_err(EKV_ERR_FORMAT, "%s: %zu bytes left after %d tokens (tokenizer for another vocabulary size?)",
                     tok_path, size - pos, (int)n_vocab);

    struct ekv_vocab *v = NULL;
    if (st == EKV_OK) st = vocab_new(&v);
    if (st == EKV_OK) st = vocab_alloc_tokens(v, tok_path, (size_t)n_vocab, text_bytes);
    if (st == EKV_OK) {
        /* pass 2: store, typed as llama.cpp's llama2.c converter types them */
        v->type = VOCAB_SPM;
        v->unk = 0;
        v->bos = 1;
        v->eos = 2;
        v->add_bos = true;
        v->add_space_prefix = true;
        size_t used = 0;
        pos = 4;
        for (int32_t i = 0; i < n_vocab; i++) {
            float score = rd_f32(d + pos);
            size_t len = (size_t)rd_i32(d + pos + 4);
            const char *s = (const char *)d + pos + 8;
            pos += 8 + len;
            uint16_t attr = TOK_NORMAL;
            if (i == 0) {
                attr = TOK_UNKNOWN;
            } else if (i <= 2) {
                /* llama2.c's export writes BOS/EOS as "\n<s>\n" and "\n</s>\n" */
                attr = TOK_CONTROL;
                while (len > 0 && s[0] == '\n') { s++; len--; }
                while (len > 0 && s[len - 1] == '\n') len--;
            }
            else if (byte_token_value(s, len) >= 0) attr = TOK_BYTE;
            vocab_put_token(v, &used, i, s, len, true, score, attr);
        }
        struct ekv_vocab_opts o = {tok_path, false};
        st = vocab_finish(v, &o);
    }
    free(d);
    if (st != EKV_OK) {
        ekv_vocab_free(v);
        return st;
    }
    *out = v;
    return EKV_OK;
}

/* ---- queries ---- */

int32_t ekv_vocab_n_tokens(const struct ekv_vocab *v) { return v ? v->n_tokens : 0; }
int32_t ekv_vocab_bos(const struct ekv_vocab *v) { return v ? v->bos : -1; }
int32_t ekv_vocab_eos(const struct ekv_vocab *v) { return v ? v->eos : -1; }
bool ekv_vocab_add_bos(const struct ekv_vocab *v) { return v && v->add_bos; }
const char *ekv_vocab_type_name(const struct ekv_vocab *v) {
    return v && v->type == VOCAB_BPE ? "gpt2" : "llama";
}

bool ekv_vocab_is_eog(const struct ekv_vocab *v, int32_t tok) {
    return v && tok >= 0 && tok < v->n_tokens && (v->tok[tok].attr & TOK_EOG);
}

const char *ekv_vocab_token_text(const struct ekv_vocab *v, int32_t tok, size_t *len) {
    if (!v || tok < 0 || tok >= v->n_tokens) return NULL;
    if (len) *len = v->tok[tok].text_len;
    return v->text + v->tok[tok].text_off;
}

/* ---- tokenize ---- */

struct frag {
    int32_t tok;   /* >= 0: a special token; -1: text[off .. off + len) */
    size_t off, len;
};

struct fraglist {
    struct frag *a;
    size_t n, cap;
};

static enum ekv_status frag_push(struct fraglist *l, struct frag f) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        size_t bytes;
        if (!ekv_mul_ok(cap, sizeof *l->a, &bytes)) return ekv_err(EKV_ERR_OVERFLOW, "tokenize: too many fragments");
        struct frag *p = realloc(l->a, bytes);
        if (!p) return ekv_err(EKV_ERR_NOMEM, "tokenize: no memory for %zu fragments", cap);
        l->a = p;
        l->cap = cap;
    }
    l->a[l->n++] = f;
    return EKV_OK;
}

static bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* First occurrence of needle in hay, or SIZE_MAX. */
static size_t find_bytes(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn == 0 || nn > hn) return SIZE_MAX;
    const char *p = hay, *end = hay + (hn - nn) + 1;
    while (p < end) {
        p = memchr(p, needle[0], (size_t)(end - p));
        if (!p) return SIZE_MAX;
        if (memcmp(p, needle, nn) == 0) return (size_t)(p - hay);
        p++;
    }
    return SIZE_MAX;
}

/* Splits the text fragments of *cur around every occurrence of special token id. */
static enum ekv_status split_on(const struct ekv_vocab *v, const char *text, int32_t id, struct fraglist *cur,
                                struct fraglist *next) {
    const struct ekv_vocab_token *t = &v->tok[id];
    const char *tt = v->text + t->text_off;
    next->n = 0;
    enum ekv_status st = EKV_OK;
    for (size_t k = 0; k < cur->n && st == EKV_OK; k++) {
        struct frag f = cur->a[k];
        if (f.tok >= 0) {
            st = frag_push(next, f);
            continue;
        }
        size_t pos = f.off, end = f.off + f.len;
        while (st == EKV_OK && pos < end) {
            size_t m = find_bytes(text + pos, end - pos, tt, t->text_len);
            if (m == SIZE_MAX) break;
            m += pos;
            size_t left_end = m;
            if (t->attr & TOK_LSTRIP)
                while (left_end > pos && is_c_space(text[left_end - 1])) left_end--;
            if (left_end > pos) st = frag_push(next, (struct frag){-1, pos, left_end - pos});
            if (st == EKV_OK) st = frag_push(next, (struct frag){id, 0, 0});
            pos = m + t->text_len;
            if (t->attr & TOK_RSTRIP)
                while (pos < end && is_c_space(text[pos])) pos++;
        }
        if (st == EKV_OK && pos < end) st = frag_push(next, (struct frag){-1, pos, end - pos});
    }
    if (st == EKV_OK) {
        struct fraglist tmp = *cur;
        *cur = *next;
        *next = tmp;
    }
    return st;
}

enum ekv_status ekv_vocab_tokenize(const struct ekv_vocab *v, const char *text, size_t len, bool add_special,
                                   bool parse_special, int32_t *tokens, size_t n_max, size_t *n_out) {
    if (!v || !n_out || (!text && len) || (!tokens && n_max))
        return ekv_err(EKV_ERR_INVALID_ARG, "tokenize: NULL argument");
    *n_out = 0;
    struct fraglist cur = {NULL, 0, 0}, next = {NULL, 0, 0};
    struct ekv_tokbuf out = {NULL, 0, 0};
    enum ekv_status st = EKV_OK;
    if (len > 0) st = frag_push(&cur, (struct frag){-1, 0, len});
    for (size_t k = 0; k < v->n_special && st == EKV_OK; k++) {
        int32_t id = v->special[k];
        if (!parse_special && (v->tok[id].attr & (TOK_CONTROL | TOK_UNKNOWN))) continue;
        st = split_on(v, text, id, &cur, &next);
    }

    if (st == EKV_OK && add_special && v->add_bos) st = ekv_tokbuf_push(&out, v->bos);
    bool prev_special = true; /* SPM: the text after a special token (or at the start) gets the dummy prefix */
    for (size_t k = 0; k < cur.n && st == EKV_OK; k++) {
        const struct frag *f = &cur.a[k];
        if (f->tok >= 0) {
            st = ekv_tokbuf_push(&out, f->tok);
            prev_special = true;
        } else if (v->type == VOCAB_SPM) {
            st = ekv_spm_tokenize(v, text + f->off, f->len, v->add_space_prefix && prev_special, &out);
            prev_special = false;
        } else {
            st = ekv_bpe_tokenize(v, text + f->off, f->len, &out);
        }
    }
    if (st == EKV_OK && add_special && v->add_eos) st = ekv_tokbuf_push(&out, v->eos);

    if (st == EKV_OK) {
        *n_out = out.n;
        if (n_max && out.n) memcpy(tokens, out.ids, EKV_MIN(out.n, n_max) * sizeof *tokens);
        if (out.n > n_max)
            st = ekv_err(EKV_ERR_INVALID_ARG, "tokenize: %zu tokens do not fit in a buffer of %zu", out.n, n_max);
    }
    free(cur.a);
    free(next.a);
    free(out.ids);
    return st;
}

/* ---- detokenize ---- */

static enum ekv_status check_token(const struct ekv_vocab *v, int32_t tok) {
    if (tok < 0 || tok >= v->n_tokens)
        return ekv_err(EKV_ERR_INVALID_ARG, "token id %d is outside the vocabulary of %d tokens", (int)tok,
                       (int)v->n_tokens);
    return EKV_OK;
}

/* The piece of tok as rendered (empty for control/unknown unless special). */
static const char *piece_of(const struct ekv_vocab *v, int32_t tok, bool special, size_t *len) {
    const struct ekv_vocab_token *t = &v->tok[tok];
    if (!special && (t->attr & (TOK_CONTROL | TOK_UNKNOWN))) {
        *len = 0;
        return "";
    }
    *len = t->piece_len;
    return v->pieces + t->piece_off;
}

enum ekv_status ekv_vocab_token_to_piece(const struct ekv_vocab *v, int32_t tok, bool special, char *buf, size_t n,
                                         size_t *n_out) {
    if (!v || !n_out || (!buf && n)) return ekv_err(EKV_ERR_INVALID_ARG, "token_to_piece: NULL argument");
    *n_out = 0;
    enum ekv_status st = check_token(v, tok);
    if (st != EKV_OK) return st;
    size_t len;
    const char *p = piece_of(v, tok, special, &len);
    *n_out = len;
    if (len > n) {
        if (n) memcpy(buf, p, n);
        return ekv_err(EKV_ERR_INVALID_ARG, "token_to_piece: piece of %zu bytes does not fit in %zu", len, n);
    }
    if (len) memcpy(buf, p, len);
    return EKV_OK;
}

/* llama.cpp's clean_up_tokenization_spaces, in place; returns the new length. */
static size_t clean_spaces(char *t, size_t n) {
    if (n < 2) return n;
    /* " ?" " !" " ." " ," lose the space */
    size_t w = 1;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) w--;
        t[w++] = x;
    }
    n = w;
    /* " ' " becomes "'" (the dropped right space reads as '\0' for the next check) */
    w = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
            w--;
            t[++i] = '\0';
        }
        t[w++] = x;
    }
    n = w;
    /* " 's" " 'm" " 're" " 've" lose the space */
    w = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            char x1 = t[i + 1], x2 = i + 2 < n ? t[i + 2] : '\0';
            if (x1 == 's' || x1 == 'm' || (i + 2 < n && ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e'))))
                w--;
        }
        t[w++] = x;
    }
    return w;
}

enum ekv_status ekv_vocab_detokenize(const struct ekv_vocab *v, const int32_t *toks, size_t n_toks, bool special,
                                     bool remove_leading_space, char *buf, size_t n, size_t *n_out) {
    if (!v || !n_out || (!toks && n_toks) || (!buf && n))
        return ekv_err(EKV_ERR_INVALID_ARG, "detokenize: NULL argument");
    *n_out = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_toks; i++) {
        enum ekv_status st = check_token(v, toks[i]);
        if (st != EKV_OK) return st;
        size_t len;
        piece_of(v, toks[i], special, &len);
        if (!ekv_add_ok(total, len, &total)) return ekv_err(EKV_ERR_OVERFLOW, "detokenize: text too long");
    }
    char *tmp = malloc(total ? total : 1);
    if (!tmp) return ekv_err(EKV_ERR_NOMEM, "detokenize: no memory for %zu bytes", total);
    bool strip = remove_leading_space && v->add_space_prefix;
    bool strip_next = strip;
    size_t len = 0;
    for (size_t i = 0; i < n_toks; i++) {
        size_t pl;
        const char *p = piece_of(v, toks[i], special, &pl);
        if (strip_next && pl > 0 && p[0] == ' ') {
            p++;
            pl--;
        }
        memcpy(tmp + len, p, pl);
        len += pl;
        /* the tokenizer put a dummy space after each special token it matched */
        strip_next = strip && (v->tok[toks[i]].attr & TOK_SPECIAL_MASK);
    }
    if (v->clean_spaces) len = clean_spaces(tmp, len);
    *n_out = len;
    enum ekv_status st = EKV_OK;
    if (len > n) {
        if (n) memcpy(buf, tmp, n);
        st = ekv_err(EKV_ERR_INVALID_ARG, "detokenize: %zu bytes do not fit in a buffer of %zu", len, n);
    } else {
        if (len) memcpy(buf, tmp, len);
        if (len < n) buf[len] = '\0';
    }
    free(tmp);
    return st;
}
