/*
 * vocab_impl.h — the inside of struct ekv_vocab, shared by the loader
 * (vocab.c) and the two tokenizers (tokenizer_spm.c, tokenizer_bpe.c).
 * Nothing outside those files should include it.
 */
#ifndef EKV_VOCAB_IMPL_H
#define EKV_VOCAB_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ekv.h"
#include "model/vocab.h"

enum ekv_vocab_type { VOCAB_SPM = 0, VOCAB_BPE = 1 };

/* BPE pre-tokenizer split (the regexes each one implements are in tokenizer_bpe.c). */
enum ekv_vocab_pre {
    PRE_NONE = 0,
    PRE_GPT2,      /* GPT-2's regex */
    PRE_LLAMA3,    /* Llama-3's regex (digits in threes) */
    PRE_QWEN2,     /* Llama-3's regex with single digits */
    PRE_STARCODER, /* single digits first, then GPT-2's regex (StarCoder, SmolLM, Command-R ...) */
    PRE_DEFAULT,   /* llama.cpp's fallback: punctuation runs, GPT-2, digit runs, digit triples */
};

/* Token attributes (llama.cpp's token types plus strip flags). */
enum {
    TOK_UNDEFINED = 0,
    TOK_NORMAL = 1 << 0,
    TOK_UNKNOWN = 1 << 1,
    TOK_CONTROL = 1 << 2,
    TOK_USER_DEFINED = 1 << 3,
    TOK_UNUSED = 1 << 4,
    TOK_BYTE = 1 << 5,
    TOK_LSTRIP = 1 << 6, /* matching it in text eats whitespace on its left */
    TOK_RSTRIP = 1 << 7, /* ... and on its right */
    TOK_EOG = 1 << 8,
};

/* Tokens found in text by the special-token pass (parse_special or not). */
#define TOK_SPECIAL_MASK (TOK_CONTROL | TOK_USER_DEFINED | TOK_UNKNOWN)

struct ekv_vocab_token {
    uint32_t text_off, text_len;   /* into ekv_vocab.text */
    uint32_t piece_off, piece_len; /* into ekv_vocab.pieces: the bytes it decodes to (special = true) */
    float score;                   /* SentencePiece merge priority (higher first) */
    uint16_t attr;                 /* TOK_* */
};

struct ekv_vocab_merge {
    uint32_t a_off, a_len, b_off, b_len; /* the pair, into ekv_vocab.merge_text */
};

struct ekv_vocab {
    enum ekv_vocab_type type;
    enum ekv_vocab_pre pre;
    int32_t n_tokens;
    struct ekv_vocab_token *tok;  /* [n_tokens] */
    char *text;               /* token texts, concatenated */
    char *pieces;             /* decoded pieces, concatenated */
    int32_t *ht;              /* [ht_mask + 1] open addressing: text -> id, -1 empty */
    size_t ht_mask;

    struct ekv_vocab_merge *merges; /* [n_merges], index = rank */
    int32_t n_merges;
    char *merge_text;
    int32_t *mt;                /* [mt_mask + 1] open addressing: pair -> rank, -1 empty */
    size_t mt_mask;

    int32_t *special;           /* [n_special] ids matched in text, longest text first */
    size_t n_special;

    int32_t byte_tok[256];      /* token for a raw byte (SPM <0xNN>; BPE the mapped character); -1 none */
    uint32_t byte_cp[256];      /* BPE: GPT-2 mapping byte -> code point */

    int32_t bos, eos, unk;      /* -1 if none */
    bool add_bos, add_eos;
    bool add_space_prefix;      /* SPM dummy prefix */
    bool clean_spaces;          /* detokenize: llama.cpp's clean_up_tokenization_spaces */
    bool ignore_merges;         /* BPE: a word that is a token is taken whole (Llama-3) */
};

/* Rank of the merge (a, b), or -1. */
int32_t ekv_vocab_merge_rank(const struct ekv_vocab *v, const char *a, size_t an, const char *b, size_t bn);

/* Growable list of ids. */
struct ekv_tokbuf {
    int32_t *ids;
    size_t n, cap;
};
enum ekv_status ekv_tokbuf_push(struct ekv_tokbuf *b, int32_t id);

/* Max-heap of candidate merges: larger key first, then smaller left index. */
struct merge_cand {
    double key;      /* SPM: score; BPE: -rank */
    int32_t left, right;
    uint32_t size;   /* bytes of the merged text, to detect stale entries */
};
struct ekv_merge_heap {
    struct merge_cand *a;
    size_t n, cap;
};
enum ekv_status ekv_merge_heap_push(struct ekv_merge_heap *h, struct merge_cand c);
struct merge_cand ekv_merge_heap_pop(struct ekv_merge_heap *h); /* h->n > 0 */

/* Symbols under merging: a doubly linked list over a byte string. */
struct merge_sym {
    int32_t prev, next; /* -1 at the ends */
    uint32_t off, n;    /* bytes; n == 0 once merged into its left neighbour */
};

/* Tokenizes one fragment of plain text (no special tokens inside).
 * SPM: add_prefix prepends the dummy space. */
enum ekv_status ekv_spm_tokenize(const struct ekv_vocab *v, const char *text, size_t len, bool add_prefix,
                             struct ekv_tokbuf *out);
enum ekv_status ekv_bpe_tokenize(const struct ekv_vocab *v, const char *text, size_t len, struct ekv_tokbuf *out);

/* The pre-tokenizer split on its own (for tests): calls fn for each word,
 * as a byte range of text, in order. */
typedef enum ekv_status (*bpe_word_fn)(void *user, const char *word, size_t len);
enum ekv_status ekv_bpe_pretokenize(enum ekv_vocab_pre pre, const char *text, size_t len, bpe_word_fn fn, void *user);

#endif
