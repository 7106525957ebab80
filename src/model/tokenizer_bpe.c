/*
 * tokenizer_bpe.c — byte-level BPE tokenization of one plain-text fragment
 * ("gpt2" vocabularies: GPT-2, Llama-3, Qwen2 ...), as llama.cpp does it:
 *   1. the pre-tokenizer splits the text into words, by hand-written
 *      matchers equivalent to the models' split regexes (GPT-2, Llama-3,
 *      Qwen2, StarCoder-style digit splitting, llama.cpp's "default");
 *   2. each word's bytes are written with GPT-2's byte -> character mapping;
 *   3. within a word, the adjacent pair with the lowest merge rank is merged
 *      until no listed pair remains (ties: leftmost first);
 *   4. each final symbol is its token (or, failing that, one token per byte).
 * Deviation: llama.cpp replaces invalid UTF-8 bytes with U+FFFD before
 * step 2; we keep the raw byte (any byte has a token), so decoding gives the
 * input back.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/unicode.h"
#include "model/vocab_impl.h"

/* ---- pre-tokenizer ----
 * A pre-tokenizer is a pipeline of stages, as in llama.cpp: each stage cuts
 * every piece the previous one produced, on its own, into smaller pieces
 * (regex matches and the gaps between them). The three model regexes are
 * matched by hand; the helper stages are single character classes. */

enum cls { CLS_END = 0, CLS_LETTER, CLS_NUMBER, CLS_SPACE, CLS_OTHER };

struct cpt {
    uint32_t cp;  /* EKV_CP_INVALID for a stray byte (class OTHER) */
    uint32_t off; /* byte offset in the fragment */
    uint8_t cls;
    bool punct;   /* \p{P} or one of $+<=>^~| (the default pipeline's first stage) */
};

/* The piece being cut: code points [b, e) of c. */
struct splitter {
    const struct cpt *c;
    size_t b, e;
};

static uint8_t classify(uint32_t cp) {
    if (cp == EKV_CP_INVALID) return CLS_OTHER;
    if (ekv_cp_is_letter(cp)) return CLS_LETTER;
    if (ekv_cp_is_number(cp)) return CLS_NUMBER;
    if (ekv_cp_is_whitespace(cp)) return CLS_SPACE;
    return CLS_OTHER;
}

static uint32_t cp_at(const struct splitter *sp, size_t i) { return i < sp->e ? sp->c[i].cp : EKV_CP_INVALID; }
static uint8_t cls_at(const struct splitter *sp, size_t i) { return i < sp->e ? sp->c[i].cls : CLS_END; }
static uint32_t lower_ascii(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; }

/* Length (in code points, 0 if none) of 's|'t|'re|'ve|'m|'ll|'d at i. */
static size_t match_contraction(const struct splitter *sp, size_t i, bool any_case) {
    if (cp_at(sp, i) != '\'' || i + 1 >= sp->e) return 0;
    uint32_t a = cp_at(sp, i + 1), b = i + 2 < sp->e ? cp_at(sp, i + 2) : 0;
    if (any_case) { a = lower_ascii(a); b = lower_ascii(b); }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Trailing whitespace handling shared by the regexes: \s+(?!\S) then \s+.
 * Returns the end of the run to take at i (i is whitespace). */
static size_t take_spaces(const struct splitter *sp, size_t i) {
    size_t k = i;
    while (cls_at(sp, k) == CLS_SPACE) k++;
    if (k - i > 1 && k < sp->e) return k - 1; /* leave the last one to the next word */
    return k;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Returns the end (code point index) of the word starting at i. */
static size_t next_word_gpt2(const struct splitter *sp, size_t i) {
    size_t k = match_contraction(sp, i, false);
    if (k) return i + k;
    uint32_t cp = cp_at(sp, i);
    uint8_t c = cp == ' ' ? cls_at(sp, i + 1) : cls_at(sp, i);
    if (c == CLS_LETTER || c == CLS_NUMBER || c == CLS_OTHER) {
        size_t j = i + (cp == ' ');
        while (cls_at(sp, j) == c) j++;
        return j;
    }
    if (cls_at(sp, i) == CLS_SPACE) return take_spaces(sp, i);
    return i + 1;
}

/* Llama-3 (digits = 3) and Qwen2 (digits = 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t next_word_llama3(const struct splitter *sp, size_t i, size_t digits) {
    size_t k = match_contraction(sp, i, true);
    if (k) return i + k;
    uint32_t cp = cp_at(sp, i);
    uint8_t c = cls_at(sp, i);
    if (cp != '\r' && cp != '\n' && c != CLS_NUMBER && (c == CLS_LETTER || cls_at(sp, i + 1) == CLS_LETTER)) {
        size_t j = i + 1;
        while (cls_at(sp, j) == CLS_LETTER) j++;
        return j;
    }
    if (c == CLS_NUMBER) {
        size_t j = i;
        while (j - i < digits && cls_at(sp, j) == CLS_NUMBER) j++;
        return j;
    }
    uint8_t c2 = cp == ' ' ? cls_at(sp, i + 1) : c;
    if (c2 == CLS_OTHER) {
        size_t j = i + (cp == ' ');
        while (cls_at(sp, j) == CLS_OTHER) j++;
        while (cp_at(sp, j) == '\r' || cp_at(sp, j) == '\n') j++;
        return j;
    }
    if (c == CLS_SPACE) {
        size_t j = i, last_nl = 0;
        while (cls_at(sp, j) == CLS_SPACE) {
            if (cp_at(sp, j) == '\r' || cp_at(sp, j) == '\n') last_nl = j + 1;
            j++;
        }
        if (last_nl) return last_nl;
        return take_spaces(sp, i);
    }
    return i + 1;
}

static bool is_ascii_digit3(const struct splitter *sp, size_t i) {
    if (i + 3 > sp->e) return false;
    for (size_t k = i; k < i + 3; k++)
        if (sp->c[k].cp < '0' || sp->c[k].cp > '9') return false;
    return true;
}

enum stage { ST_GPT2, ST_LLAMA3, ST_QWEN2, ST_DIGIT, ST_DIGITS, ST_PUNCT, ST_DIGIT3 };

/* End of the piece that starts at i (a match, or the gap up to the next match). */
static size_t stage_next(enum stage st, const struct splitter *sp, size_t i) {
    size_t j = i;
    switch (st) {
    case ST_GPT2: return next_word_gpt2(sp, i);
    case ST_LLAMA3: return next_word_llama3(sp, i, 3);
    case ST_QWEN2: return next_word_llama3(sp, i, 1);
    case ST_DIGIT: /* \p{N} */
        if (cls_at(sp, i) == CLS_NUMBER) return i + 1;
        while (j < sp->e && cls_at(sp, j) != CLS_NUMBER) j++;
        return j;
    case ST_DIGITS: /* \p{N}+ */
        if (cls_at(sp, i) == CLS_NUMBER) {
            while (cls_at(sp, j) == CLS_NUMBER) j++;
        } else {
            while (j < sp->e && cls_at(sp, j) != CLS_NUMBER) j++;
        }
        return j;
    case ST_PUNCT: /* [\p{P}\$\+<=>\^~\|]+ */
        if (sp->c[i].punct) {
            while (j < sp->e && sp->c[j].punct) j++;
        } else {
            while (j < sp->e && !sp->c[j].punct) j++;
        }
        return j;
    case ST_DIGIT3: /* [0-9][0-9][0-9] */
        if (is_ascii_digit3(sp, i)) return i + 3;
        j = i + 1;
        while (j < sp->e && !is_ascii_digit3(sp, j)) j++;
        return j;
    }
    return i + 1;
}

struct pipeline {
    const char *text;
    const struct cpt *c;
    const enum stage *stages;
    size_t n_stages;
    bpe_word_fn fn;
    void *user;
};

static enum ekv_status run_stage(const struct pipeline *p, size_t k, size_t b, size_t e) {
    if (k == p->n_stages) return p->fn(p->user, p->text + p->c[b].off, p->c[e].off - p->c[b].off);
    struct splitter sp = {p->c, b, e};
    for (size_t i = b; i < e;) {
        size_t j = stage_next(p->stages[k], &sp, i);
        if (j <= i || j > e) /* cannot happen: every stage consumes at least one code point */
            return ekv_err(EKV_ERR_INTERNAL, "pre-tokenizer made no progress at byte %u", p->c[i].off);
        enum ekv_status st = run_stage(p, k + 1, i, j);
        if (st != EKV_OK) return st;
        i = j;
    }
    return EKV_OK;
}

enum ekv_status ekv_bpe_pretokenize(enum ekv_vocab_pre pre, const char *text, size_t len, bpe_word_fn fn, void *user) {
    static const enum stage gpt2[] = {ST_GPT2}, llama3[] = {ST_LLAMA3}, qwen2[] = {ST_QWEN2};
    static const enum stage starcoder[] = {ST_DIGIT, ST_GPT2};
    static const enum stage deflt[] = {ST_PUNCT, ST_GPT2, ST_DIGITS, ST_DIGIT3};
    struct pipeline p = {text, NULL, gpt2, 1, fn, user};
    switch (pre) {
    case PRE_LLAMA3: p.stages = llama3; break;
    case PRE_QWEN2: p.stages = qwen2; break;
    case PRE_STARCODER: p.stages = starcoder; p.n_stages = 2; break;
    case PRE_DEFAULT: p.stages = deflt; p.n_stages = 4; break;
    default: break;
    }
    if (len == 0) return EKV_OK;
    if (len >= UINT32_MAX) return ekv_err(EKV_ERR_OVERFLOW, "tokenize: text of %zu bytes is too long", len);
    size_t bytes;
    if (!ekv_mul_ok(len + 1, sizeof(struct cpt), &bytes))
        return ekv_err(EKV_ERR_OVERFLOW, "tokenize: text of %zu bytes is too long", len);
    struct cpt *c = malloc(bytes);
    if (!c) return ekv_err(EKV_ERR_NOMEM, "tokenize: no memory for %zu bytes of text", len);
    size_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t l;
        uint32_t cp = ekv_utf8_decode(text + off, len - off, &l);
        c[n].cp = cp;
        c[n].off = (uint32_t)off;
        c[n].cls = classify(cp);
        c[n].punct = cp != EKV_CP_INVALID && (ekv_cp_is_punct(cp) || (cp > 0 && cp < 0x80 && strchr("$+<=>^~|", (int)cp)));
        n++;
        off += l;
    }
    c[n].off = (uint32_t)len;
    p.c = c;
    enum ekv_status st = run_stage(&p, 0, 0, n);
    free(c);
    return st;
}

/* ---- merges within one word ---- */

struct ekv_bpe_state {
    const struct ekv_vocab *v;
    struct ekv_tokbuf *out;
    char *enc;               /* the word, byte-mapped */
    size_t enc_cap;
    struct merge_sym *sym;
    size_t sym_cap;
    struct ekv_merge_heap heap;
};

static enum ekv_status bpe_try_pair(struct ekv_bpe_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return EKV_OK;
    const struct merge_sym *a = &st->sym[left], *b = &st->sym[right];
    int32_t rank = ekv_vocab_merge_rank(st->v, st->enc + a->off, a->n, st->enc + b->off, b->n);
    if (rank < 0) return EKV_OK;
    struct merge_cand c = {-(double)rank, left, right, a->n + b->n};
    return ekv_merge_heap_push(&st->heap, c);
}

static enum ekv_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return EKV_OK;
    size_t bytes;
    if (!ekv_mul_ok(need, elem, &bytes)) return ekv_err(EKV_ERR_OVERFLOW, "tokenize: word too long");
    void *q = realloc(*p, bytes);
    if (!q) return ekv_err(EKV_ERR_NOMEM, "tokenize: no memory for a word of %zu bytes", need);
    *p = q;
    *cap = need;
    return EKV_OK;
}

static enum ekv_status bpe_word(void *user, const char *word, size_t len) {
    struct ekv_bpe_state *st = user;
    const struct ekv_vocab *v = st->v;
    /* byte-map: each byte becomes a 1- or 2-byte UTF-8 character */
    size_t need;
    if (!ekv_mul_ok(len, 2, &need)) return ekv_err(EKV_ERR_OVERFLOW, "tokenize: word too long");
    enum ekv_status s = grow((void **)&st->enc, &st->enc_cap, need, 1);
    if (s == EKV_OK) s = grow((void **)&st->sym, &st->sym_cap, len, sizeof *st->sym);
    if (s != EKV_OK) return s;
    size_t elen = 0;
    int32_t n_sym = 0;
    for (size_t i = 0; i < len; i++) {
        char u[4];
        size_t ul = ekv_utf8_encode(v->byte_cp[(unsigned char)word[i]], u);
        st->sym[n_sym].off = (uint32_t)elen;
        st->sym[n_sym].n = (uint32_t)ul;
        st->sym[n_sym].prev = n_sym - 1;
        st->sym[n_sym].next = i + 1 == len ? -1 : n_sym + 1;
        n_sym++;
        memcpy(st->enc + elen, u, ul);
        elen += ul;
    }
    if (v->ignore_merges) {
        int32_t id = ekv_vocab_lookup(v, st->enc, elen);
        if (id >= 0) return ekv_tokbuf_push(st->out, id);
    }

    st->heap.n = 0;
    for (int32_t i = 1; i < n_sym && s == EKV_OK; i++) s = bpe_try_pair(st, i - 1, i);
    while (s == EKV_OK && st->heap.n > 0) {
        struct merge_cand c = ekv_merge_heap_pop(&st->heap);
        struct merge_sym *l = &st->sym[c.left], *r = &st->sym[c.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != c.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) st->sym[r->next].prev = c.left;
        s = bpe_try_pair(st, l->prev, c.left);
        if (s == EKV_OK) s = bpe_try_pair(st, c.left, l->next);
    }

    for (int32_t i = 0; s == EKV_OK && i != -1 && n_sym > 0; i = st->sym[i].next) {
        const char *t = st->enc + st->sym[i].off;
        int32_t id = ekv_vocab_lookup(v, t, st->sym[i].n);
        if (id >= 0) {
            s = ekv_tokbuf_push(st->out, id);
            continue;
        }
        /* not a token: one token per byte of the mapped text, where such exist (as llama.cpp) */
        for (uint32_t k = 0; k < st->sym[i].n && s == EKV_OK; k++) {
            int32_t b = ekv_vocab_lookup(v, t + k, 1);
            if (b >= 0) s = ekv_tokbuf_push(st->out, b);
        }
    }
    return s;
}

enum ekv_status ekv_bpe_tokenize(const struct ekv_vocab *v, const char *text, size_t len, struct ekv_tokbuf *out) {
    struct ekv_bpe_state st = {v, out, NULL, 0, NULL, 0, {NULL, 0, 0}};
    enum ekv_status s = ekv_bpe_pretokenize(v->pre, text, len, bpe_word, &st);
    free(st.enc);
    free(st.sym);
    free(st.heap.a);
    return s;
}
