/*
 * metrics.c — the numbers `ekv eval` reports, computed from text, logits or
 * index sets so that they can be tested without a model: ROUGE-L (pltrdy
 * `rouge` 1.0.1 semantics and plain sentence-level LCS), perplexity, KL
 * divergence, top-1 agreement, top-k selection, Jaccard and VL-Cache's
 * CacheHitRate. Definitions are in include/ekv_eval.h; docs/policies.md "Evaluation protocols" gives the
 * protocols they serve.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ekv_eval.h"
#include "eval_util.h"

/* Longest text ekv_rouge_l accepts (a generated answer is a few KB); bounds
 * the word tables, which take about 30 bytes per input byte. */
#define ROUGE_MAX_BYTES EKV_ROUGE_MAX_BYTES

/* ------------------------------------------------------------------------ */
/* Words                                                                      */
/* ------------------------------------------------------------------------ */

/* Bytes of the code point at p if Python's str.isspace() holds for it, else
 * 0: ASCII \t\n\v\f\r, space, \x1c-\x1f, and U+0085, U+00A0, U+1680,
 * U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000 in UTF-8. */
static size_t ws_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t left = (size_t)(end - p);
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c == 0xc2 && left >= 2 && (p[1] == 0x85 || p[1] == 0xa0)) return 2;
    if (left < 3) return 0;
    if (c == 0xe1 && p[1] == 0x9a && p[2] == 0x80) return 3;
    if (c == 0xe2 && p[1] == 0x80 &&
        ((p[2] >= 0x80 && p[2] <= 0x8a) || p[2] == 0xa8 || p[2] == 0xa9 || p[2] == 0xaf))
        return 3;
    if (c == 0xe2 && p[1] == 0x81 && p[2] == 0x9f) return 3;
    if (c == 0xe3 && p[1] == 0x80 && p[2] == 0x80) return 3;
    return 0;
}

/* Distinct words of both texts, as (pointer, length) keyed by an open
 * addressing hash table; a word's id is its index in the arrays. */
struct interner {
    const char **ptr;  /* [cap] */
    size_t *len;       /* [cap] */
    size_t n, cap;
    uint32_t *slots;   /* [nslots], id + 1, 0 = empty */
    size_t nslots;
};

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Room for up to max_words distinct words. */
static enum ekv_status interner_init(struct interner *in, size_t max_words) {
    memset(in, 0, sizeof *in);
    size_t ns = 16;
    while (ns < max_words * 2) ns *= 2; /* max_words <= 2 * ROUGE_MAX_BYTES + 2 */
    in->cap = max_words ? max_words : 1;
    in->nslots = ns;
    in->ptr = malloc(in->cap * sizeof *in->ptr);
    in->len = malloc(in->cap * sizeof *in->len);
    in->slots = calloc(ns, sizeof *in->slots);
    if (!in->ptr || !in->len || !in->slots)
        return ekv_error_set(EKV_ERR_NOMEM, "rouge: no memory for %zu words", max_words);
    return EKV_OK;
}

static void interner_free(struct interner *in) {
    free(in->ptr);
    free(in->len);
    free(in->slots);
}

static uint32_t intern(struct interner *in, const char *p, size_t n) {
    size_t mask = in->nslots - 1;
    size_t i = (size_t)fnv1a(p, n) & mask;
    for (;;) {
        uint32_t s = in->slots[i];
        if (s == 0) break;
        uint32_t id = s - 1;
        if (in->len[id] == n && memcmp(in->ptr[id], p, n) == 0) return id;
        i = (i + 1) & mask;
    }
    uint32_t id = (uint32_t)in->n++;
    in->ptr[id] = p;
    in->len[id] = n;
    in->slots[i] = id + 1;
    return id;
}

/* A text as word ids grouped into sentences. */
struct wordseq {
    uint32_t *ids;      /* [n_words] */
    size_t n_words;
    size_t *sent_start; /* [n_sent] index into ids */
    size_t *sent_len;   /* [n_sent] */
    size_t n_sent;
};

static void wordseq_free(struct wordseq *w) {
    free(w->ids);
    free(w->sent_start);
    free(w->sent_len);
}

/* Appends the words of [p, e) to w as one sentence. With empty_word, a
 * segment without words becomes the single word "" (pltrdy's
 * " ".join(s.split()).split(" ")); without it, the sentence is empty. */
static void add_sentence(struct wordseq *w, struct interner *in, const char *p,
                         const char *e, bool empty_word) {
    const unsigned char *u = (const unsigned char *)p, *ue = (const unsigned char *)e;
    size_t start = w->n_words;
    while (u < ue) {
        size_t k;
        while (u < ue && (k = ws_len(u, ue)) > 0) u += k;
        if (u >= ue) break;
        const unsigned char *ws = u;
        while (u < ue && ws_len(u, ue) == 0) u++;
        w->ids[w->n_words++] = intern(in, (const char *)ws, (size_t)(u - ws));
    }
    if (w->n_words == start && empty_word) w->ids[w->n_words++] = intern(in, p, 0);
    w->sent_start[w->n_sent] = start;
    w->sent_len[w->n_sent] = w->n_words - start;
    w->n_sent++;
}

/* Splits text into word ids: pltrdy mode cuts sentences at '.', dropping
 * zero-length segments; sentence mode makes the whole text one sentence. */
static enum ekv_status tokenize(const char *text, size_t len, bool pltrdy,
                                struct interner *in, struct wordseq *w) {
    memset(w, 0, sizeof *w);
    /* words <= len/1 + segments; segments <= len + 1 */
    size_t max_words = len + 2, max_sent = len + 2;
    w->ids = malloc(max_words * sizeof *w->ids);
    w->sent_start = malloc(max_sent * sizeof *w->sent_start);
    w->sent_len = malloc(max_sent * sizeof *w->sent_len);
    if (!w->ids || !w->sent_start || !w->sent_len)
        return ekv_error_set(EKV_ERR_NOMEM, "rouge: no memory for a %zu-byte text", len);
    if (!pltrdy) {
        add_sentence(w, in, text, text + len, false);
        return EKV_OK;
    }
    const char *p = text, *end = text + len;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *e = dot ? dot : end;
        if (e > p) add_sentence(w, in, p, e, true);
        if (!dot) break;
        p = dot + 1;
    }
    return EKV_OK;
}

/* ------------------------------------------------------------------------ */
/* ROUGE-L                                                                    */
/* ------------------------------------------------------------------------ */

/* Length of the LCS of x and y with two rows. */
static enum ekv_status lcs_length(const uint32_t *x, size_t nx, const uint32_t *y,
                                  size_t ny, size_t *out) {
    uint32_t *prev = calloc(ny + 1, sizeof *prev), *cur = calloc(ny + 1, sizeof *cur);
    if (!prev || !cur) {
        free(prev);
        free(cur);
        return ekv_error_set(EKV_ERR_NOMEM, "rouge: no memory for an LCS row of %zu words", ny);
    }
    for (size_t i = 1; i <= nx; i++) {
        cur[0] = 0;
        for (size_t j = 1; j <= ny; j++) {
            if (x[i - 1] == y[j - 1]) cur[j] = prev[j - 1] + 1;
            else cur[j] = prev[j] > cur[j - 1] ? prev[j] : cur[j - 1];
        }
        uint32_t *t = prev;
        prev = cur;
        cur = t;
    }
    *out = prev[ny];
    free(prev);
    free(cur);
    return EKV_OK;
}

/* Marks (mark[id] |= bit) the words on the LCS path of x (rows) and y
 * (columns) that pltrdy's _recon_lcs walks: from (nx, ny), diagonal when the
 * words match, up when T[i-1][j] > T[i][j-1], left otherwise.
 * table: scratch of (nx+1)*(ny+1) cells. */
static void lcs_mark(const uint32_t *x, size_t nx, const uint32_t *y, size_t ny,
                     uint32_t *table, unsigned char *mark, unsigned char bit) {
    size_t w = ny + 1;
    for (size_t j = 0; j <= ny; j++) table[j] = 0;
    for (size_t i = 1; i <= nx; i++) {
        uint32_t *row = table + i * w, *up = row - w;
        row[0] = 0;
        for (size_t j = 1; j <= ny; j++) {
            if (x[i - 1] == y[j - 1]) row[j] = up[j - 1] + 1;
            else row[j] = up[j] > row[j - 1] ? up[j] : row[j - 1];
        }
    }
    size_t i = nx, j = ny;
    while (i > 0 && j > 0) {
        if (x[i - 1] == y[j - 1]) {
            mark[x[i - 1]] |= bit;
            i--;
            j--;
        } else if (table[(i - 1) * w + j] > table[i * w + j - 1]) {
            i--;
        } else {
            j--;
        }
    }
}

enum ekv_status ekv_rouge_kind_parse(const char *s, enum ekv_rouge_kind *out) {
    if (s && strcmp(s, "pltrdy") == 0) *out = EKV_ROUGE_PLTRDY;
    else if (s && strcmp(s, "sentence") == 0) *out = EKV_ROUGE_SENTENCE;
    else return ekv_error_set(EKV_ERR_INVALID_ARG, "rouge kind '%s': expected pltrdy or sentence",
                        s ? s : "(null)");
    return EKV_OK;
}

const char *ekv_rouge_kind_name(enum ekv_rouge_kind kind) {
    return kind == EKV_ROUGE_SENTENCE ? "sentence" : "pltrdy";
}

enum ekv_status ekv_rouge_l(enum ekv_rouge_kind kind, const char *hyp,
                            const char *ref, struct ekv_rouge *out) {
    if (!hyp || !ref || !out) return ekv_error_set(EKV_ERR_INVALID_ARG, "rouge: NULL argument");
    if (kind != EKV_ROUGE_PLTRDY && kind != EKV_ROUGE_SENTENCE)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "rouge: unknown kind %d", (int)kind);
    memset(out, 0, sizeof *out);
    size_t lh = strlen(hyp), lr = strlen(ref);
    if (lh > ROUGE_MAX_BYTES || lr > ROUGE_MAX_BYTES)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "rouge: %s of %zu bytes exceeds the %zu-byte limit",
                       lh > ROUGE_MAX_BYTES ? "hypothesis" : "reference",
                       lh > ROUGE_MAX_BYTES ? lh : lr, ROUGE_MAX_BYTES);
    bool pl = kind == EKV_ROUGE_PLTRDY;
    struct interner in;
    struct wordseq H, R;
    memset(&H, 0, sizeof H);
    memset(&R, 0, sizeof R);
    unsigned char *mark = NULL;
    uint32_t *table = NULL;
    enum ekv_status st = interner_init(&in, lh + lr + 4);
    if (st == EKV_OK) st = tokenize(hyp, lh, pl, &in, &H);
    if (st == EKV_OK) st = tokenize(ref, lr, pl, &in, &R);
    if (st != EKV_OK) goto done;
    if (H.n_words == 0 || R.n_words == 0) {
        st = ekv_error_set(EKV_ERR_INVALID_ARG, "rouge: %s is empty",
                     H.n_words == 0 ? "hypothesis" : "reference");
        goto done;
    }
    if (!pl) {
        size_t cells;
        if (!ev_mul_ok(H.n_words, R.n_words, &cells) || cells > EKV_ROUGE_MAX_CELLS) {
            st = ekv_error_set(EKV_ERR_INVALID_ARG, "rouge: %zu x %zu words exceed the LCS limit of %zu cells",
                         H.n_words, R.n_words, EKV_ROUGE_MAX_CELLS);
            goto done;
        }
        size_t l = 0;
        st = lcs_length(R.ids, R.n_words, H.ids, H.n_words, &l);
        if (st != EKV_OK) goto done;
        out->hyp_len = H.n_words;
        out->ref_len = R.n_words;
        out->overlap = l;
        out->p = (double)l / (double)H.n_words;
        out->r = (double)l / (double)R.n_words;
        out->f = l ? 2.0 * out->p * out->r / (out->p + out->r) : 0.0;
        goto done;
    }
    /* pltrdy: distinct-word counts, union of LCS word sets */
    enum { IN_HYP = 1, IN_REF = 2, IN_UNION = 4 };
    mark = calloc(in.n ? in.n : 1, 1);
    if (!mark) {
        st = ekv_error_set(EKV_ERR_NOMEM, "rouge: no memory for %zu word marks", in.n);
        goto done;
    }
    for (size_t i = 0; i < H.n_words; i++) mark[H.ids[i]] |= IN_HYP;
    for (size_t i = 0; i < R.n_words; i++) mark[R.ids[i]] |= IN_REF;
    size_t max_cells = 0;
    for (size_t a = 0; a < R.n_sent; a++) {
        for (size_t b = 0; b < H.n_sent; b++) {
            size_t cells;
            if (!ev_mul_ok(R.sent_len[a] + 1, H.sent_len[b] + 1, &cells) ||
                cells > EKV_ROUGE_MAX_CELLS) {
                st = ekv_error_set(EKV_ERR_INVALID_ARG,
                             "rouge: sentences of %zu and %zu words exceed the LCS limit of %zu cells",
                             R.sent_len[a], H.sent_len[b], EKV_ROUGE_MAX_CELLS);
                goto done;
            }
            if (cells > max_cells) max_cells = cells;
        }
    }
    table = malloc(max_cells * sizeof *table);
    if (!table) {
        st = ekv_error_set(EKV_ERR_NOMEM, "rouge: no memory for an LCS table of %zu cells", max_cells);
        goto done;
    }
    for (size_t a = 0; a < R.n_sent; a++)
        for (size_t b = 0; b < H.n_sent; b++)
            lcs_mark(R.ids + R.sent_start[a], R.sent_len[a], H.ids + H.sent_start[b],
                     H.sent_len[b], table, mark, IN_UNION);
    size_t n = 0, m = 0, u = 0;
    for (size_t i = 0; i < in.n; i++) {
        n += (mark[i] & IN_HYP) != 0;
        m += (mark[i] & IN_REF) != 0;
        u += (mark[i] & IN_UNION) != 0;
    }
    out->hyp_len = n;
    out->ref_len = m;
    out->overlap = u;
    out->p = (double)u / (double)n;
    out->r = (double)u / (double)m;
    /* same operation order as pltrdy, so results match to the last bit */
    out->f = 2.0 * ((out->p * out->r) / (out->p + out->r + 1e-8));
done:
    free(table);
    free(mark);
    wordseq_free(&H);
    wordseq_free(&R);
    interner_free(&in);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Perplexity, KL, top-1                                                      */
/* ------------------------------------------------------------------------ */

/* log-sum-exp of logits in double; rejects NaN and +inf. */
static enum ekv_status logsumexp(const float *x, size_t n, double *lse) {
    if (!x || n == 0) return ekv_error_set(EKV_ERR_INVALID_ARG, "logits: empty vector");
    double mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) || (isinf(x[i]) && x[i] > 0))
            return ekv_error_set(EKV_ERR_INVALID_ARG, "logits: value %g at index %zu", (double)x[i], i);
        if (x[i] > mx) mx = x[i];
    }
    if (mx == -INFINITY) return ekv_error_set(EKV_ERR_INVALID_ARG, "logits: every value is -inf");
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
    *lse = mx + log(s);
    return EKV_OK;
}

enum ekv_status ekv_nll_from_logits(const float *logits, size_t n_vocab,
                                    int32_t target, double *nll) {
    if (target < 0 || (size_t)target >= n_vocab)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "perplexity: target token %d outside vocabulary of %zu",
                       (int)target, n_vocab);
    double lse = 0.0;
    enum ekv_status st = logsumexp(logits, n_vocab, &lse);
    if (st != EKV_OK) return st;
    double v = lse - (double)logits[target];
    *nll = v < 0.0 ? 0.0 : v; /* rounding when p(target) ~ 1 */
    return EKV_OK;
}

void ekv_ppl_init(struct ekv_ppl_acc *acc) { memset(acc, 0, sizeof *acc); }

enum ekv_status ekv_ppl_add_nll(struct ekv_ppl_acc *acc, double nll) {
    if (isnan(nll) || nll < 0.0)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "perplexity: token NLL %g is not a non-negative number", nll);
    acc->nll_sum += nll;
    acc->n_tokens++;
    return EKV_OK;
}

enum ekv_status ekv_ppl_add_logits(struct ekv_ppl_acc *acc, const float *logits,
                                   size_t n_vocab, int32_t target, double *nll_out) {
    double nll = 0.0;
    enum ekv_status st = ekv_nll_from_logits(logits, n_vocab, target, &nll);
    if (st != EKV_OK) return st;
    if (nll_out) *nll_out = nll;
    return ekv_ppl_add_nll(acc, nll);
}

void ekv_ppl_merge(struct ekv_ppl_acc *dst, const struct ekv_ppl_acc *src) {
    dst->nll_sum += src->nll_sum;
    dst->n_tokens += src->n_tokens;
}

enum ekv_status ekv_ppl_mean_nll(const struct ekv_ppl_acc *acc, double *mean_nll) {
    if (acc->n_tokens == 0) return ekv_error_set(EKV_ERR_INVALID_ARG, "perplexity: no token was scored");
    *mean_nll = acc->nll_sum / (double)acc->n_tokens;
    return EKV_OK;
}

enum ekv_status ekv_ppl_value(const struct ekv_ppl_acc *acc, double *ppl) {
    double m = 0.0;
    enum ekv_status st = ekv_ppl_mean_nll(acc, &m);
    if (st == EKV_OK) *ppl = exp(m);
    return st;
}

enum ekv_status ekv_kl_from_logits(const float *logits_p, const float *logits_q,
                                   size_t n_vocab, double *kl) {
    double lp = 0.0, lq = 0.0;
    enum ekv_status st = logsumexp(logits_p, n_vocab, &lp);
    if (st != EKV_OK) return ekv_error_prefix(st, "KL, first distribution");
    st = logsumexp(logits_q, n_vocab, &lq);
    if (st != EKV_OK) return ekv_error_prefix(st, "KL, second distribution");
    double s = 0.0;
    for (size_t i = 0; i < n_vocab; i++) {
        if (isinf(logits_p[i])) continue; /* p_i = 0 */
        double a = (double)logits_p[i] - lp;
        if (isinf(logits_q[i])) {
            s = INFINITY;
            break;
        }
        double b = (double)logits_q[i] - lq;
        s += exp(a) * (a - b);
    }
    *kl = s < 0.0 ? 0.0 : s;
    return EKV_OK;
}

enum ekv_status ekv_argmax(const float *logits, size_t n_vocab, size_t *idx) {
    if (!logits || n_vocab == 0) return ekv_error_set(EKV_ERR_INVALID_ARG, "argmax: empty vector");
    size_t best = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        if (isnan(logits[i])) return ekv_error_set(EKV_ERR_INVALID_ARG, "argmax: NaN at index %zu", i);
        if (logits[i] > logits[best]) best = i;
    }
    *idx = best;
    return EKV_OK;
}

void ekv_kl_init(struct ekv_kl_acc *acc) { memset(acc, 0, sizeof *acc); }

enum ekv_status ekv_kl_add(struct ekv_kl_acc *acc, const float *logits_full,
                           const float *logits_policy, size_t n_vocab) {
    double kl = 0.0;
    size_t a = 0, b = 0;
    enum ekv_status st = ekv_kl_from_logits(logits_full, logits_policy, n_vocab, &kl);
    if (st == EKV_OK) st = ekv_argmax(logits_full, n_vocab, &a);
    if (st == EKV_OK) st = ekv_argmax(logits_policy, n_vocab, &b);
    if (st != EKV_OK) return st;
    acc->kl_sum += kl;
    acc->n_positions++;
    acc->top1_agree += a == b;
    return EKV_OK;
}

/* ---- paired bootstrap ---- */

static uint64_t boot_next(uint64_t *x) { /* splitmix64 */
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The 2.5 % and 97.5 % points of the n resampled statistics r (sorted here). */
static void boot_ends(double *r, size_t n, double *lo, double *hi) {
    qsort(r, n, sizeof *r, cmp_double);
    *lo = r[(size_t)floor(0.025 * (double)(n - 1))];
    *hi = r[(size_t)ceil(0.975 * (double)(n - 1))];
}

enum ekv_status ekv_bootstrap_ppl_ratio(const double *nll_a, const double *nll_b, const size_t *tok, size_t n,
                                        size_t resamples, uint64_t seed, double *ratio, double *lo, double *hi) {
    if (!nll_a || !nll_b || !tok || !ratio || !lo || !hi || n == 0 || resamples == 0)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "bootstrap: %zu units, %zu resamples", n, resamples);
    double da = 0, db = 0, t = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(nll_a[i]) || !isfinite(nll_b[i]) || nll_a[i] < 0 || nll_b[i] < 0)
            return ekv_error_set(EKV_ERR_INVALID_ARG, "bootstrap: unit %zu has NLL %g / %g", i, nll_a[i], nll_b[i]);
        da += nll_a[i], db += nll_b[i], t += (double)tok[i];
    }
    if (t <= 0) return ekv_error_set(EKV_ERR_INVALID_ARG, "bootstrap: no scored token in %zu units", n);
    *ratio = exp((da - db) / t);
    double *r = malloc(resamples * sizeof *r);
    if (!r) return ekv_error_set(EKV_ERR_NOMEM, "bootstrap: %zu resamples", resamples);
    uint64_t x = seed;
    for (size_t k = 0; k < resamples; k++) {
        double sa, sb, st;
        do {
            sa = sb = st = 0;
            for (size_t j = 0; j < n; j++) {
                const size_t i = (size_t)(boot_next(&x) % n);
                sa += nll_a[i], sb += nll_b[i], st += (double)tok[i];
            }
        } while (st <= 0);
        r[k] = exp((sa - sb) / st);
    }
    boot_ends(r, resamples, lo, hi);
    free(r);
    return EKV_OK;
}

enum ekv_status ekv_bootstrap_mean_diff(const double *a, const double *b, size_t n, size_t resamples, uint64_t seed,
                                        double *diff, double *lo, double *hi) {
    if (!a || !b || !diff || !lo || !hi || n == 0 || resamples == 0)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "bootstrap: %zu units, %zu resamples", n, resamples);
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return ekv_error_set(EKV_ERR_INVALID_ARG, "bootstrap: unit %zu has values %g / %g", i, a[i], b[i]);
        d += a[i] - b[i];
    }
    *diff = d / (double)n;
    double *r = malloc(resamples * sizeof *r);
    if (!r) return ekv_error_set(EKV_ERR_NOMEM, "bootstrap: %zu resamples", resamples);
    uint64_t x = seed;
    for (size_t k = 0; k < resamples; k++) {
        double s = 0;
        for (size_t j = 0; j < n; j++) {
            const size_t i = (size_t)(boot_next(&x) % n);
            s += a[i] - b[i];
        }
        r[k] = s / (double)n;
    }
    boot_ends(r, resamples, lo, hi);
    free(r);
    return EKV_OK;
}

void ekv_kl_merge(struct ekv_kl_acc *dst, const struct ekv_kl_acc *src) {
    dst->kl_sum += src->kl_sum;
    dst->n_positions += src->n_positions;
    dst->top1_agree += src->top1_agree;
}

enum ekv_status ekv_kl_result(const struct ekv_kl_acc *acc, double *mean_kl, double *top1) {
    if (acc->n_positions == 0) return ekv_error_set(EKV_ERR_INVALID_ARG, "KL: no position was scored");
    if (mean_kl) *mean_kl = acc->kl_sum / (double)acc->n_positions;
    if (top1) *top1 = (double)acc->top1_agree / (double)acc->n_positions;
    return EKV_OK;
}

/* ------------------------------------------------------------------------ */
/* Index sets                                                                 */
/* ------------------------------------------------------------------------ */

struct scored {
    float s;
    uint32_t i;
};

static int cmp_scored(const void *pa, const void *pb) {
    const struct scored *a = pa, *b = pb;
    if (a->s > b->s) return -1;
    if (a->s < b->s) return 1;
    return (a->i > b->i) - (a->i < b->i);
}

static int cmp_u32(const void *pa, const void *pb) {
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return (a > b) - (a < b);
}

enum ekv_status ekv_topk_indices(const float *scores, size_t n, size_t k, uint32_t *out) {
    if (k > n) return ekv_error_set(EKV_ERR_INVALID_ARG, "top-k: k = %zu exceeds n = %zu", k, n);
    if (n > UINT32_MAX) return ekv_error_set(EKV_ERR_INVALID_ARG, "top-k: n = %zu too large", n);
    if (k == 0) return EKV_OK;
    if (!scores || !out) return ekv_error_set(EKV_ERR_INVALID_ARG, "top-k: NULL argument");
    struct scored *v = malloc(n * sizeof *v);
    if (!v) return ekv_error_set(EKV_ERR_NOMEM, "top-k: no memory for %zu scores", n);
    for (size_t i = 0; i < n; i++) {
        if (isnan(scores[i])) {
            free(v);
            return ekv_error_set(EKV_ERR_INVALID_ARG, "top-k: NaN score at index %zu", i);
        }
        v[i].s = scores[i];
        v[i].i = (uint32_t)i;
    }
    qsort(v, n, sizeof *v, cmp_scored);
    for (size_t i = 0; i < k; i++) out[i] = v[i].i;
    free(v);
    qsort(out, k, sizeof *out, cmp_u32);
    return EKV_OK;
}

/* Sorted, de-duplicated copy of a; *m receives its size. */
static enum ekv_status sorted_set(const uint32_t *a, size_t n, uint32_t **out, size_t *m) {
    *out = NULL;
    *m = 0;
    if (n == 0) return EKV_OK;
    if (!a) return ekv_error_set(EKV_ERR_INVALID_ARG, "set: NULL array of %zu elements", n);
    uint32_t *c = malloc(n * sizeof *c);
    if (!c) return ekv_error_set(EKV_ERR_NOMEM, "set: no memory for %zu elements", n);
    memcpy(c, a, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_u32);
    size_t w = 1;
    for (size_t i = 1; i < n; i++)
        if (c[i] != c[w - 1]) c[w++] = c[i];
    *out = c;
    *m = w;
    return EKV_OK;
}

enum ekv_status ekv_jaccard(const uint32_t *a, size_t na, const uint32_t *b, size_t nb,
                            double *out) {
    uint32_t *sa, *sb;
    size_t ma, mb;
    enum ekv_status st = sorted_set(a, na, &sa, &ma);
    if (st != EKV_OK) return st;
    st = sorted_set(b, nb, &sb, &mb);
    if (st != EKV_OK) {
        free(sa);
        return st;
    }
    size_t i = 0, j = 0, inter = 0;
    while (i < ma && j < mb) {
        if (sa[i] == sb[j]) {
            inter++;
            i++;
            j++;
        } else if (sa[i] < sb[j]) {
            i++;
        } else {
            j++;
        }
    }
    size_t uni = ma + mb - inter;
    *out = uni ? (double)inter / (double)uni : 1.0;
    free(sa);
    free(sb);
    return EKV_OK;
}

enum ekv_status ekv_kept_agreement(const float *attn_full, size_t n,
                                   const uint32_t *kept, size_t n_kept, size_t k,
                                   double *hit_rate, double *jaccard, double *mass) {
    if (n == 0 || !attn_full) return ekv_error_set(EKV_ERR_INVALID_ARG, "hit rate: empty attention row");
    if (n_kept > n) return ekv_error_set(EKV_ERR_INVALID_ARG, "hit rate: %zu kept of %zu positions", n_kept, n);
    if (n_kept && !kept) return ekv_error_set(EKV_ERR_INVALID_ARG, "hit rate: NULL kept set");
    if (k == 0) k = n_kept;
    if (k > n) return ekv_error_set(EKV_ERR_INVALID_ARG, "hit rate: k = %zu exceeds %zu positions", k, n);
    unsigned char *in = calloc(n, 1);
    uint32_t *top = malloc((k ? k : 1) * sizeof *top);
    enum ekv_status st = EKV_OK;
    if (!in || !top) {
        st = ekv_error_set(EKV_ERR_NOMEM, "hit rate: no memory for %zu positions", n);
        goto done;
    }
    double tot = 0.0, kept_mass = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!(attn_full[i] >= 0.0f) || isinf(attn_full[i])) {
            st = ekv_error_set(EKV_ERR_INVALID_ARG, "hit rate: attention %g at position %zu",
                         (double)attn_full[i], i);
            goto done;
        }
        tot += attn_full[i];
    }
    for (size_t i = 0; i < n_kept; i++) {
        if (kept[i] >= n || in[kept[i]]) {
            st = ekv_error_set(EKV_ERR_INVALID_ARG, "hit rate: kept position %u %s", (unsigned)kept[i],
                         kept[i] >= n ? "out of range" : "listed twice");
            goto done;
        }
        in[kept[i]] = 1;
        kept_mass += attn_full[kept[i]];
    }
    st = ekv_topk_indices(attn_full, n, k, top);
    if (st != EKV_OK) goto done;
    size_t inter = 0;
    for (size_t i = 0; i < k; i++) inter += in[top[i]];
    if (hit_rate) *hit_rate = k ? (double)inter / (double)k : 1.0;
    if (jaccard) {
        size_t uni = n_kept + k - inter;
        *jaccard = uni ? (double)inter / (double)uni : 1.0;
    }
    if (mass) *mass = tot > 0.0 ? kept_mass / tot : 0.0;
done:
    free(in);
    free(top);
    return st;
}
