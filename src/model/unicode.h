/*
 * unicode.h — the little Unicode the tokenizers need: UTF-8 decoding that
 * never fails (bad bytes come back one at a time, flagged), encoding, the
 * letter / number / whitespace classes the BPE pre-tokenizers split on, and
 * GPT-2's reversible byte <-> printable-character mapping.
 */
#ifndef EKV_UNICODE_H
#define EKV_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Returned by ekv_utf8_decode for a byte that does not start a well-formed sequence. */
#define EKV_CP_INVALID 0xFFFFFFFFu

/* Bytes a UTF-8 sequence occupies judging by its lead byte only (1..4; a
 * continuation byte counts as 1). SentencePiece splits text this way. */
size_t ekv_utf8_lead_len(uint8_t c);

/* Decodes the code point at s[0..n) (n >= 1). On a malformed or truncated
 * sequence returns EKV_CP_INVALID with *len = 1. Overlong forms and
 * surrogates are accepted (as llama.cpp does); values above U+10FFFF are not. */
uint32_t ekv_utf8_decode(const char *s, size_t n, size_t *len);

/* Encodes cp (<= U+10FFFF) into out; returns the byte count (1..4), 0 if cp is out of range. */
size_t ekv_utf8_encode(uint32_t cp, char out[4]);

/* Character classes of the pre-tokenizer regexes (Unicode 14 general
 * categories; code points assigned later count as neither letter nor number). */
bool ekv_cp_is_letter(uint32_t cp);     /* \p{L} */
bool ekv_cp_is_number(uint32_t cp);     /* \p{N} */
bool ekv_cp_is_whitespace(uint32_t cp); /* \s (Unicode White_Space) */
bool ekv_cp_is_punct(uint32_t cp);      /* \p{P} */

/* GPT-2 byte-level mapping: byte b is written as the code point
 * ekv_gpt2_byte_to_cp(b) (printable bytes map to themselves); the inverse
 * returns -1 for code points outside the mapping. */
uint32_t ekv_gpt2_byte_to_cp(uint8_t b);
int ekv_gpt2_cp_to_byte(uint32_t cp);

#endif
