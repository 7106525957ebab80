/*
 * tokenizer_spm.c — SentencePiece-BPE tokenization of one plain-text
 * fragment, as llama.cpp does it for "llama" vocabularies:
 *   1. spaces become U+2581 ("▁"), with one more in front (dummy prefix)
 *      when the caller asks;
 *   2. the text is split into UTF-8 characters (by lead byte);
 *   3. repeatedly, the adjacent pair whose concatenation is a token with the
 *      highest score is merged (ties: leftmost first);
 *   4. each final symbol is its token, or else one <0xNN> byte token per byte.
 * Also home of the helpers both tokenizers share (id list, merge heap).
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/unicode.h"
#include "model/vocab_impl.h"

/* ---- shared helpers ---- */

enum ekv_status ekv_tokbuf_push(struct ekv_tokbuf *b, int32_t id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        size_t bytes;
        if (!ekv_mul_ok(cap, sizeof *b->ids, &bytes))
            return ekv_err(EKV_ERR_OVERFLOW, "token list: %zu ids overflow", cap);
        int32_t *p = realloc(b->ids, bytes);
        if (!p) return ekv_err(EKV_ERR_NOMEM, "token list: cannot grow to %zu ids", cap);
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return EKV_OK;
}

/* a is served before b */
static bool cand_before(const struct merge_cand *a, const struct merge_cand *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

enum ekv_status ekv_merge_heap_push(struct ekv_merge_heap *h, struct merge_cand c) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        size_t bytes;
        if (!ekv_mul_ok(cap, sizeof *h->a, &bytes))
            return ekv_err(EKV_ERR_OVERFLOW, "merge queue: %zu entries overflow", cap);
        struct merge_cand *p = realloc(h->a, bytes);
        if (!p) return ekv_err(EKV_ERR_NOMEM, "merge queue: cannot grow to %zu entries", cap);
        h->a = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = c;
    return EKV_OK;
}

struct merge_cand ekv_merge_heap_pop(struct ekv_merge_heap *h) {
    struct merge_cand top = h->a[0];
    struct merge_cand last = h->a[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const struct merge_cand *bc = &last;
        if (l < n && cand_before(&h->a[l], bc)) { best = l; bc = &h->a[l]; }
        if (l + 1 < n && cand_before(&h->a[l + 1], bc)) best = l + 1;
        if (best == i) break;
        h->a[i] = h->a[best];
        i = best;
    }
    if (n > 0) h->a[i] = last;
    return top;
}

/* ---- SentencePiece ---- */

static const char k_space_mark[3] = {'\xE2', '\x96', '\x81'}; /* U+2581 */

struct ekv_spm_state {
    const struct ekv_vocab *v;
    const char *s;            /* escaped text */
    struct merge_sym *sym;    /* [n_sym] */
    struct ekv_merge_heap heap;
};

static enum ekv_status spm_try_pair(struct ekv_spm_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return EKV_OK;
    const struct merge_sym *a = &st->sym[left], *b = &st->sym[right];
    /* adjacent symbols are contiguous in the text */
    int32_t id = ekv_vocab_lookup(st->v, st->s + a->off, (size_t)a->n + b->n);
    if (id < 0) return EKV_OK;
    struct merge_cand c = {st->v->tok[id].score, left, right, a->n + b->n};
    return ekv_merge_heap_push(&st->heap, c);
}

static enum ekv_status spm_emit_bytes(const struct ekv_vocab *v, const char *s, size_t n, struct ekv_tokbuf *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = v->byte_tok[(unsigned char)s[i]];
        if (id < 0) id = v->unk; /* no byte token: the best we can say */
        if (id < 0) continue;
        enum ekv_status st = ekv_tokbuf_push(out, id);
        if (st != EKV_OK) return st;
    }
    return EKV_OK;
}

enum ekv_status ekv_spm_tokenize(const struct ekv_vocab *v, const char *text, size_t len, bool add_prefix,
                             struct ekv_tokbuf *out) {
    /* 1. escape: every ' ' becomes 3 bytes; the dummy prefix adds 3 */
    size_t n_spaces = 0;
    for (size_t i = 0; i < len; i++) n_spaces += text[i] == ' ';
    size_t elen, extra;
    if (!ekv_mul_ok(n_spaces, 2, &extra) || !ekv_add_ok(len, extra + (add_prefix ? 3 : 0), &elen) ||
        elen > UINT32_MAX)
        return ekv_err(EKV_ERR_OVERFLOW, "tokenize: text of %zu bytes is too long", len);
    if (elen == 0) return EKV_OK;

    enum ekv_status st = EKV_OK;
    char *s = malloc(elen);
    size_t sym_bytes;
    struct merge_sym *sym = NULL;
    if (s && ekv_mul_ok(elen, sizeof *sym, &sym_bytes)) sym = malloc(sym_bytes);
    if (!s || !sym) {
        free(s);
        free(sym);
        return ekv_err(EKV_ERR_NOMEM, "tokenize: no memory for %zu bytes of text", len);
    }
    size_t j = 0;
    if (add_prefix) { memcpy(s, k_space_mark, 3); j = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(s + j, k_space_mark, 3); j += 3; }
        else s[j++] = text[i];
    }

    /* 2. one symbol per UTF-8 character (judged by its lead byte) */
    int32_t n_sym = 0;
    for (size_t off = 0; off < elen;) {
        size_t cl = ekv_utf8_lead_len((unsigned char)s[off]);
        if (cl > elen - off) cl = elen - off;
        sym[n_sym].off = (uint32_t)off;
        sym[n_sym].n = (uint32_t)cl;
        sym[n_sym].prev = n_sym - 1;
        off += cl;
        sym[n_sym].next = off == elen ? -1 : n_sym + 1;
        n_sym++;
    }

    /* 3. merge best-scoring pairs */
    struct ekv_spm_state ss = {v, s, sym, {NULL, 0, 0}};
    for (int32_t i = 1; i < n_sym && st == EKV_OK; i++) st = spm_try_pair(&ss, i - 1, i);
    while (st == EKV_OK && ss.heap.n > 0) {
        struct merge_cand c = ekv_merge_heap_pop(&ss.heap);
        struct merge_sym *l = &sym[c.left], *r = &sym[c.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != c.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = c.left;
        st = spm_try_pair(&ss, l->prev, c.left);
        if (st == EKV_OK) st = spm_try_pair(&ss, c.left, l->next);
    }

    /* 4. emit */
    for (int32_t i = 0; st == EKV_OK && i != -1 && n_sym > 0; i = sym[i].next) {
        int32_t id = ekv_vocab_lookup(v, s + sym[i].off, sym[i].n);
        if (id >= 0) st = ekv_tokbuf_push(out, id);
        else st = spm_emit_bytes(v, s + sym[i].off, sym[i].n, out);
    }

    free(ss.heap.a);
    free(sym);
    free(s);
    return st;
}
