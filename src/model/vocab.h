/*
 * vocab.h — a model's vocabulary and its tokenizer, behind one opaque
 * handle. Two tokenizer families are supported, with llama.cpp's token ids:
 *   "llama" — SentencePiece BPE (score-ordered merges, U+2581 for spaces,
 *             dummy-prefix space, <0xNN> byte fallback);
 *   "gpt2"  — byte-level BPE (GPT-2 byte mapping, ranked merges) with the
 *             pre-tokenizer split tokenizer.ggml.pre names: GPT-2, Llama-3,
 *             Qwen2, StarCoder/SmolLM (digits apart), llama.cpp's "default"
 *             (and their aliases in llama.cpp's table; others are refused).
 * A vocabulary comes from GGUF metadata (tokenizer.ggml.*) or from a
 * llama2.c tokenizer file (tok512.bin / tokenizer.bin). It is read-only after
 * loading, so one vocabulary may serve several threads.
 *
 * Buffer conventions (shared with ekv_tokenize & co. in ekv.h): a function
 * writing into a caller buffer that is too small returns EKV_ERR_INVALID_ARG
 * and sets *n_out to the size needed; what fits is written.
 */
#ifndef EKV_VOCAB_H
#define EKV_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ekv.h"

struct ekv_gguf_file;
struct ekv_vocab;

/* Builds the vocabulary described by f's tokenizer.ggml.* keys. The result
 * does not reference f (f may be closed afterwards). path_for_messages names
 * the file in error messages (may be NULL). Unknown tokenizer models or
 * pre-tokenizers give EKV_ERR_UNSUPPORTED naming them; inconsistent arrays,
 * duplicate tokens or out-of-range ids give EKV_ERR_FORMAT naming the key. */
enum ekv_status ekv_vocab_from_gguf(const struct ekv_gguf_file *f, const char *path_for_messages,
                                    struct ekv_vocab **out);

/* Reads a llama2.c tokenizer file: int32 max_token_length, then n_vocab
 * records of (float32 score, int32 len, len bytes). Builds the same
 * SentencePiece vocabulary llama.cpp's converter writes to GGUF (spaces as
 * U+2581; id 0 unknown, 1 and 2 control (BOS/EOS), "<0xNN>" byte tokens). */
enum ekv_status ekv_vocab_from_llama2c(const char *tok_path, int32_t n_vocab, struct ekv_vocab **out);

void ekv_vocab_free(struct ekv_vocab *v);

int32_t ekv_vocab_n_tokens(const struct ekv_vocab *v);
int32_t ekv_vocab_bos(const struct ekv_vocab *v); /* -1 if none */
int32_t ekv_vocab_eos(const struct ekv_vocab *v); /* -1 if none */
/* End-of-generation: EOS, EOT and tokens such as <|im_end|>, <|end|>, <|endoftext|>. */
bool ekv_vocab_is_eog(const struct ekv_vocab *v, int32_t tok);
/* Whether tokenizing with add_special prepends BOS. */
bool ekv_vocab_add_bos(const struct ekv_vocab *v);
/* "llama" (SentencePiece) or "gpt2" (byte-level BPE). */
const char *ekv_vocab_type_name(const struct ekv_vocab *v);
/* Raw text of a token as stored in the vocabulary (NOT NUL-terminated;
 * SentencePiece spaces still U+2581); NULL if tok is out of range. */
const char *ekv_vocab_token_text(const struct ekv_vocab *v, int32_t tok, size_t *len);
/* Id of the token whose stored text is s[0..n), or -1. */
int32_t ekv_vocab_lookup(const struct ekv_vocab *v, const char *s, size_t n);

/* Tokenizes len bytes of text (need not be NUL-terminated or valid UTF-8).
 * add_special: prepend BOS (append EOS) as the vocabulary asks.
 * parse_special: text of control tokens ("<s>", "<|im_start|>") becomes
 * those tokens; user-defined tokens are always matched, as in llama.cpp.
 * Writes min(count, n_max) ids to tokens (may be NULL when n_max is 0) and
 * the count to *n_out. */
enum ekv_status ekv_vocab_tokenize(const struct ekv_vocab *v, const char *text, size_t len,
                                   bool add_special, bool parse_special, int32_t *tokens,
                                   size_t n_max, size_t *n_out);

/* The bytes one token stands for: U+2581 becomes a space, byte tokens their
 * byte, GPT-2 byte mapping is undone; control and unknown tokens give ""
 * unless special. No terminator; the length goes to *n_out. */
enum ekv_status ekv_vocab_token_to_piece(const struct ekv_vocab *v, int32_t tok, bool special,
                                         char *buf, size_t n, size_t *n_out);

/* Concatenates the pieces of toks into buf, NUL-terminated when there is
 * room; *n_out = length without the terminator.
 * remove_leading_space (SentencePiece vocabularies that add a dummy prefix):
 * drops the one space the tokenizer inserted at the start of the text and
 * after every special token it matched, so that for text without
 * RSTRIP/LSTRIP special tokens detokenize(tokenize(s)) == s once a BOS added
 * by add_special is stripped (special = true); with special = false the
 * result is s without the special tokens' text. Byte-level BPE vocabularies
 * apply llama.cpp's clean-up of spaces before punctuation when the
 * vocabulary asks for it (GPT-2 does; Qwen2 does not). */
enum ekv_status ekv_vocab_detokenize(const struct ekv_vocab *v, const int32_t *toks, size_t n_toks,
                                     bool special, bool remove_leading_space, char *buf, size_t n,
                                     size_t *n_out);

#endif
