/*
 * store.c — one side (keys or values) of a KV head in its storage type
 * (store.h): appends that quantise, reads that dequantise, writes, the
 * compaction behind every eviction and merge, and KIVI's residual rule.
 *
 * Eviction inside a KIVI key group (a scale and zero point per channel
 * over up to G entries): the group keeps the codes of the entries that
 * stay, unchanged — they dequantise to exactly what they did — and just
 * counts fewer entries, so eviction never re-quantises. A group that
 * loses all its entries disappears. Only when two or more adjacent groups
 * together hold at most G entries are they re-quantised as one group (from
 * their dequantised values), so that per-group overhead stays bounded
 * (every pair of neighbours holds more than G entries, i.e. groups are
 * more than half full on average) while an entry is re-quantised only when
 * the groups around it have thinned out. Writes (merges) re-quantise the
 * groups they touch. [CHOICE, issue 11; KIVI has no rule for it: docs/policies.md "KIVI storage"]
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kernels/quant.h"
#include "kv/store.h"

static int bits_of(const struct ekv_store_fmt *f) { return ekv_kv_traits(f->type)->bits; }
static bool is_kivi(const struct ekv_store_fmt *f) { return bits_of(f) != 0; }
static bool is_kivi_k(const struct ekv_store_fmt *f) { return is_kivi(f) && !f->is_v; }
static size_t gbytes(const struct ekv_store_fmt *f, int32_t n) { return ekv_kivi_kgroup_bytes(f->d, n, bits_of(f)); }
/* KIVI keys quantise blocks of this many tail entries */
static int32_t key_block(const struct ekv_store_fmt *f) { return f->r > f->g ? f->r : f->g; }

const char *ekv_store_fmt_init(struct ekv_store_fmt *f, enum ekv_kv_type t, bool is_v, int d, int g, int r) {
    const char *why = ekv_kv_type_check(t, is_v, d, g);
    if (why) return why;
    *f = (struct ekv_store_fmt){.type = t, .is_v = is_v, .d = d, .g = g, .r = r};
    const int bits = ekv_kv_traits(t)->bits;
    if (bits && (r < 0 || r % g != 0)) return "needs kv_residual to be a multiple of kv_group";
    f->row_bytes = bits && !is_v ? (size_t)d * (size_t)bits / 8 : ekv_kv_row_bytes(t, d, g);
    return NULL;
}

uint64_t ekv_store_alloc_bytes(const struct ekv_store_fmt *f, const struct ekv_kv_store *s) {
    return (uint64_t)s->data_cap + (uint64_t)s->tail_cap * 2u * (uint64_t)f->d + (uint64_t)s->gn_cap * sizeof(int32_t);
}

uint64_t ekv_store_used_bytes(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len) {
    return (uint64_t)s->data_used + (uint64_t)(len - s->nq) * 2u * (uint64_t)f->d;
}

uint64_t ekv_store_full_bytes(const struct ekv_store_fmt *f, int64_t n) {
    if (n <= 0) return 0;
    if (!is_kivi(f)) return (uint64_t)n * f->row_bytes;
    int64_t tail, quant;
    if (f->is_v) {
        tail = n < f->r ? n : f->r;
        quant = (uint64_t)(n - tail) * f->row_bytes;
    } else {
        tail = n % key_block(f);
        quant = (uint64_t)((n - tail) / f->g) * gbytes(f, f->g);
    }
    return (uint64_t)quant + (uint64_t)tail * 2u * (uint64_t)f->d;
}

/* Grows *p to at least need bytes (geometrically); *cap updated. */
static enum ekv_status grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return EKV_OK;
    size_t nc = *cap + *cap / 2;
    if (nc < need) nc = need;
    if (nc < 256) nc = 256;
    void *np = realloc(*p, nc);
    if (!np) return ekv_err(EKV_ERR_NOMEM, "kv cache: cannot grow storage to %zu bytes", nc);
    *p = np;
    *cap = nc;
    return EKV_OK;
}

static enum ekv_status grow_tail(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t rows) {
    if (rows <= s->tail_cap) return EKV_OK;
    size_t cap = (size_t)s->tail_cap * 2 * (size_t)f->d, need, row = 2 * (size_t)f->d;
    if (!ekv_mul_ok((size_t)rows, row, &need)) return ekv_err(EKV_ERR_OVERFLOW, "kv cache: residual of %d rows overflows", (int)rows);
    void *p = s->tail;
    enum ekv_status st = grow(&p, &cap, need);
    if (st != EKV_OK) return st;
    s->tail = p;
    s->tail_cap = (int32_t)EKV_MIN(cap / row, (size_t)INT32_MAX);
    return EKV_OK;
}

static enum ekv_status grow_gn(struct ekv_kv_store *s, int32_t n) {
    if (n <= s->gn_cap) return EKV_OK;
    size_t cap = (size_t)s->gn_cap * sizeof(int32_t);
    void *p = s->gn;
    enum ekv_status st = grow(&p, &cap, (size_t)n * sizeof(int32_t));
    if (st != EKV_OK) return st;
    s->gn = p;
    s->gn_cap = (int32_t)(cap / sizeof(int32_t));
    return EKV_OK;
}

enum ekv_status ekv_store_set_rows(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t cap) {
    size_t bytes;
    if (!ekv_mul_ok((size_t)(cap ? cap : 1), f->row_bytes, &bytes))
        return ekv_err(EKV_ERR_OVERFLOW, "kv cache: %d rows of %zu bytes overflow", (int)cap, f->row_bytes);
    void *np = realloc(s->data, bytes);
    if (!np) {
        if (bytes > s->data_cap) return ekv_err(EKV_ERR_NOMEM, "kv cache: cannot grow a head to %d entries", (int)cap);
        return EKV_OK; /* shrinking: keep the old block */
    }
    s->data = np;
    s->data_cap = bytes;
    return EKV_OK;
}

enum ekv_status ekv_store_reserve(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, int32_t extra) {
    if (!is_kivi(f)) return EKV_OK; /* rows follow the head's capacity (ekv_store_set_rows) */
    return grow_tail(f, s, len - s->nq + extra);
}

void ekv_store_append(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, const float *x) {
    const size_t d = (size_t)f->d;
    if (is_kivi(f)) {
        ekv_kv_f16_from_float(x, s->tail + (size_t)(len - s->nq) * d, f->d);
        return;
    }
    ekv_kv_row_from_float(f->type, x, s->data + (size_t)len * f->row_bytes, f->d);
    s->nq = len + 1;
    s->data_used = (size_t)s->nq * f->row_bytes;
}

struct ekv_kv_view ekv_store_view(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len) {
    return (struct ekv_kv_view){.type = f->type, .d = f->d, .g = f->g, .is_v = f->is_v, .n = len, .nq = s->nq,
                                .data = s->data, .row_bytes = f->row_bytes, .tail = s->tail, .ng = s->ng, .gn = s->gn};
}

void ekv_store_read(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len, int32_t j0, int32_t j1,
                    float *dst) {
    const struct ekv_kv_view v = ekv_store_view(f, s, len);
    ekv_kv_view_rows(&v, j0, j1, dst, NULL, false);
}

/* KIVI keys: re-quantises every group that holds an entry with src_of[j]. */
static enum ekv_status write_kgroups(const struct ekv_store_fmt *f, struct ekv_kv_store *s, const float *const *src_of) {
    const size_t d = (size_t)f->d;
    float *tmp = malloc((size_t)f->g * d * sizeof *tmp);
    if (!tmp) return ekv_err(EKV_ERR_NOMEM, "kv cache: no memory to re-quantise a key group");
    size_t off = 0;
    int32_t first = 0;
    for (int32_t g = 0; g < s->ng; g++) {
        const int32_t n = s->gn[g];
        bool touched = false;
        for (int32_t r = 0; r < n && !touched; r++) touched = src_of[first + r] != NULL;
        if (touched) {
            ekv_kivi_dequant_kgroup(s->data + off, f->d, bits_of(f), 0, n, tmp);
            for (int32_t r = 0; r < n; r++)
                if (src_of[first + r]) memcpy(tmp + (size_t)r * d, src_of[first + r], d * sizeof(float));
            ekv_kivi_quant_kgroup(tmp, n, f->d, bits_of(f), s->data + off);
        }
        off += gbytes(f, n);
        first += n;
    }
    free(tmp);
    return EKV_OK;
}

enum ekv_status ekv_store_write(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, const int32_t *idx,
                                int32_t n, const float *src) {
    const size_t d = (size_t)f->d;
    const float **src_of = NULL; /* KIVI keys: [nq] new row of each quantised entry, or NULL */
    if (is_kivi_k(f) && s->nq > 0) {
        src_of = calloc((size_t)s->nq, sizeof *src_of);
        if (!src_of) return ekv_err(EKV_ERR_NOMEM, "kv cache: no memory to write %d entries", (int)n);
    }
    bool any_group = false;
    for (int32_t t = 0; t < n; t++) {
        const int32_t j = idx ? idx[t] : t;
        const float *x = src + (size_t)t * d;
        if (j >= s->nq) {
            ekv_kv_f16_from_float(x, s->tail + (size_t)(j - s->nq) * d, f->d);
        } else if (src_of) {
            src_of[j] = x;
            any_group = true;
        } else if (is_kivi(f)) {
            ekv_kivi_quant_vrow(x, f->d, f->g, bits_of(f), s->data + (size_t)j * f->row_bytes);
        } else {
            ekv_kv_row_from_float(f->type, x, s->data + (size_t)j * f->row_bytes, f->d);
        }
    }
    enum ekv_status st = any_group ? write_kgroups(f, s, src_of) : EKV_OK;
    free(src_of);
    (void)len;
    return st;
}

/* Packs rows [0, n) of `base` (row bytes rb) with keep[j]; returns the count kept. */
static int32_t compact_rows(uint8_t *base, size_t rb, int32_t n, const uint8_t *keep) {
    int32_t w = 0;
    for (int32_t j = 0; j < n; j++) {
        if (!keep[j]) continue;
        if (w != j) memcpy(base + (size_t)w * rb, base + (size_t)j * rb, rb);
        w++;
    }
    return w;
}

int32_t ekv_store_kgroups_plan(const int32_t *gn, int32_t ng, int32_t g, const uint8_t *keep, const uint8_t *new_row,
                               bool join, struct ekv_kgroup_out *out) {
    int32_t no = 0, first = 0;
    for (int32_t x = 0; x < ng; x++) {
        const int32_t n = gn[x];
        int32_t k = 0;
        bool dirty = false;
        for (int32_t r = 0; r < n; r++)
            if (keep[first + r]) {
                k++;
                dirty = dirty || (new_row && new_row[first + r]);
            }
        first += n;
        if (k == 0) continue; /* an emptied group vanishes */
        if (join && no > 0 && out[no - 1].n + k <= g) { /* the run so far takes this group too */
            out[no - 1].src1 = x + 1;
            out[no - 1].n += k;
            out[no - 1].requant = true;
        } else {
            out[no++] = (struct ekv_kgroup_out){.src0 = x, .src1 = x + 1, .n = k, .requant = dirty};
        }
    }
    return no;
}

enum ekv_status ekv_store_note_compact(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len,
                                       const uint8_t *keep, const struct ekv_kgroup_out *out, int32_t n_out) {
    (void)len;
    if (is_kivi_k(f)) {
        int32_t q = 0;
        size_t used = 0;
        for (int32_t o = 0; o < n_out; o++) {
            s->gn[o] = out[o].n; /* o <= out[o].src0: each count is read before it is written over */
            q += out[o].n;
            used += gbytes(f, out[o].n);
        }
        s->ng = n_out;
        s->nq = q;
        s->data_used = used;
        return EKV_OK;
    }
    int32_t q = 0;
    for (int32_t j = 0; j < s->nq; j++) q += keep[j] != 0;
    s->nq = q;
    s->data_used = (size_t)q * f->row_bytes;
    return EKV_OK;
}

/* KIVI keys: the groups out[] of ekv_store_kgroups_plan made in place,
 * front to back: a group that keeps its codes moves its parameters and kept
 * rows down; a re-quantised one reads its entries (dequantised, or their
 * new rows src_of[j]) before it is written, and what it writes ends before
 * the next group's sources begin (it holds at most the rows they held). */
static enum ekv_status apply_kgroups(const struct ekv_store_fmt *f, struct ekv_kv_store *s, const uint8_t *keep,
                                     const float *const *src_of, const struct ekv_kgroup_out *out, int32_t n_out) {
    const size_t d = (size_t)f->d, hdr = d * 4, rb = f->row_bytes;
    bool any = false;
    for (int32_t o = 0; o < n_out && !any; o++) any = out[o].requant;
    float *tmp = any ? malloc((size_t)f->g * d * sizeof *tmp) : NULL;
    if (any && !tmp) return ekv_err(EKV_ERR_NOMEM, "kv cache: no memory to re-pack key groups");
    size_t off = 0, w_off = 0;
    int32_t sg = 0, first = 0;
    for (int32_t o = 0; o < n_out; o++) {
        const struct ekv_kgroup_out *q = &out[o];
        for (; sg < q->src0; sg++) off += gbytes(f, s->gn[sg]), first += s->gn[sg];
        if (!q->requant) {
            const int32_t n = s->gn[sg];
            if (w_off != off) memmove(s->data + w_off, s->data + off, hdr);
            int32_t rw = 0;
            for (int32_t r = 0; r < n; r++) {
                if (!keep[first + r]) continue;
                uint8_t *dst = s->data + w_off + hdr + (size_t)rw * rb;
                const uint8_t *src = s->data + off + hdr + (size_t)r * rb;
                if (dst != src) memmove(dst, src, rb);
                rw++;
            }
            off += gbytes(f, n), first += n, sg++;
        } else {
            int32_t t = 0;
            for (; sg < q->src1; sg++) {
                const int32_t n = s->gn[sg];
                for (int32_t r = 0; r < n; r++) {
                    if (!keep[first + r]) continue;
                    const float *x = src_of ? src_of[first + r] : NULL;
                    if (x) memcpy(tmp + (size_t)t * d, x, d * sizeof(float));
                    else ekv_kivi_dequant_kgroup(s->data + off, f->d, bits_of(f), r, r + 1, tmp + (size_t)t * d);
                    t++;
                }
                off += gbytes(f, n), first += n;
            }
            ekv_kivi_quant_kgroup(tmp, q->n, f->d, bits_of(f), s->data + w_off);
        }
        w_off += gbytes(f, q->n);
    }
    free(tmp);
    return EKV_OK;
}

enum ekv_status ekv_store_compact(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len,
                                  const uint8_t *keep, const float *const *src_of) {
    const int32_t nq = s->nq;
    const size_t d = (size_t)f->d;
    if (!is_kivi(f)) {
        s->nq = compact_rows(s->data, f->row_bytes, len, keep);
        s->data_used = (size_t)s->nq * f->row_bytes;
    } else {
        (void)compact_rows((uint8_t *)s->tail, 2 * d, len - nq, keep + nq);
        if (f->is_v) {
            s->nq = compact_rows(s->data, f->row_bytes, nq, keep);
            s->data_used = (size_t)s->nq * f->row_bytes;
        } else {
            struct ekv_kgroup_out *out = malloc((size_t)(s->ng ? s->ng : 1) * sizeof *out);
            uint8_t *new_row = src_of && nq > 0 ? malloc((size_t)nq) : NULL;
            if (!out || (src_of && nq > 0 && !new_row)) {
                free(out), free(new_row);
                return ekv_err(EKV_ERR_NOMEM, "kv cache: no memory to compact %d keys", (int)nq);
            }
            for (int32_t j = 0; new_row && j < nq; j++) new_row[j] = src_of[j] != NULL;
            const int32_t n_out = ekv_store_kgroups_plan(s->gn, s->ng, f->g, keep, new_row, true, out);
            enum ekv_status st = apply_kgroups(f, s, keep, src_of, out, n_out);
            if (st == EKV_OK) st = ekv_store_note_compact(f, s, len, keep, out, n_out);
            free(out), free(new_row);
            if (st != EKV_OK) return st;
        }
    }
    if (!src_of) return EKV_OK;
    /* new rows of the survivors outside KIVI key groups, at their new indices */
    int32_t w = 0;
    for (int32_t j = 0; j < len; j++) {
        if (!keep[j]) continue;
        const float *x = src_of[j];
        if (x && !(is_kivi_k(f) && w < s->nq)) (void)ekv_store_write(f, s, w + 1, &w, 1, x);
        w++;
    }
    return EKV_OK;
}

int32_t ekv_store_flush_count(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len) {
    if (!is_kivi(f)) return 0;
    const int32_t tail = len - s->nq;
    if (f->is_v) return tail > f->r ? tail - f->r : 0;
    return (tail / key_block(f)) * key_block(f);
}

enum ekv_status ekv_store_note_flush(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t m) {
    if (m <= 0) return EKV_OK;
    if (f->is_v) {
        s->data_used += (size_t)m * f->row_bytes;
    } else {
        enum ekv_status st = grow_gn(s, s->ng + m / f->g);
        if (st != EKV_OK) return st;
        for (int32_t t = 0; t < m; t += f->g) s->gn[s->ng++] = f->g;
        s->data_used += (size_t)(m / f->g) * gbytes(f, f->g);
    }
    s->nq += m;
    return EKV_OK;
}

enum ekv_status ekv_store_flush(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len) {
    const int32_t m = ekv_store_flush_count(f, s, len); /* oldest tail entries to quantise */
    if (m <= 0) return EKV_OK;
    const size_t d = (size_t)f->d;
    const int32_t tail = len - s->nq;
    const int32_t rows = f->is_v ? 1 : f->g; /* entries per quantisation unit */
    const size_t unit = f->is_v ? f->row_bytes : gbytes(f, f->g);
    void *p = s->data;
    enum ekv_status st = grow(&p, &s->data_cap, s->data_used + (size_t)(m / rows) * unit);
    if (st == EKV_OK) s->data = p;
    if (st == EKV_OK && !f->is_v) st = grow_gn(s, s->ng + m / rows); /* before anything changes */
    float *tmp = st == EKV_OK ? malloc((size_t)rows * d * sizeof *tmp) : NULL;
    if (st == EKV_OK && !tmp) st = ekv_err(EKV_ERR_NOMEM, "kv cache: no memory to quantise the residual");
    if (st != EKV_OK) return st;
    for (int32_t t = 0; t < m; t += rows) {
        uint8_t *dst = s->data + s->data_used + (size_t)(t / rows) * unit;
        ekv_dequant_f16(s->tail + (size_t)t * d, tmp, (int64_t)rows * (int64_t)d);
        if (f->is_v) ekv_kivi_quant_vrow(tmp, f->d, f->g, bits_of(f), dst);
        else ekv_kivi_quant_kgroup(tmp, rows, f->d, bits_of(f), dst);
    }
    free(tmp);
    memmove(s->tail, s->tail + (size_t)m * d, (size_t)(tail - m) * d * sizeof(uint16_t));
    return ekv_store_note_flush(f, s, m); /* cannot fail: gn has room */
}

void ekv_store_shrink(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len) {
    if (!is_kivi(f)) return;
    if (s->data_cap > 2 * s->data_used + 4096) {
        const size_t nc = s->data_used + s->data_used / 4 + 1024;
        void *np = realloc(s->data, nc);
        if (np) {
            s->data = np;
            s->data_cap = nc;
        }
    }
    const int32_t tl = len - s->nq;
    if ((int64_t)s->tail_cap > 2 * (int64_t)tl + 64) {
        const int32_t nc = tl + tl / 4 + 16;
        void *np = realloc(s->tail, (size_t)nc * 2 * (size_t)f->d);
        if (np) {
            s->tail = np;
            s->tail_cap = nc;
        }
    }
    if ((int64_t)s->gn_cap > 2 * (int64_t)s->ng + 64) {
        const int32_t nc = s->ng + s->ng / 4 + 16;
        void *np = realloc(s->gn, (size_t)nc * sizeof(int32_t));
        if (np) {
            s->gn = np;
            s->gn_cap = nc;
        }
    }
}

enum ekv_status ekv_store_clone(const struct ekv_store_fmt *f, const struct ekv_kv_store *src, struct ekv_kv_store *dst) {
    memset(dst, 0, sizeof *dst);
    const size_t tail_bytes = (size_t)src->tail_cap * 2u * (size_t)f->d; /* sizes the store allocated before */
    const size_t gn_bytes = (size_t)src->gn_cap * sizeof(int32_t);
    if (src->data_cap && !(dst->data = malloc(src->data_cap))) goto nomem;
    if (tail_bytes && !(dst->tail = malloc(tail_bytes))) goto nomem;
    if (gn_bytes && !(dst->gn = malloc(gn_bytes))) goto nomem;
    if (src->data_cap) memcpy(dst->data, src->data, src->data_cap);
    if (tail_bytes) memcpy(dst->tail, src->tail, tail_bytes);
    if (gn_bytes) memcpy(dst->gn, src->gn, gn_bytes);
    dst->data_cap = src->data_cap;
    dst->data_used = src->data_used;
    dst->nq = src->nq;
    dst->tail_cap = src->tail_cap;
    dst->ng = src->ng;
    dst->gn_cap = src->gn_cap;
    return EKV_OK;
nomem:
    ekv_store_free(dst);
    return ekv_err(EKV_ERR_NOMEM, "kv cache: out of memory copying a store of %zu bytes", src->data_cap);
}

void ekv_store_free(struct ekv_kv_store *s) {
    free(s->data);
    free(s->tail);
    free(s->gn);
    memset(s, 0, sizeof *s);
}

/* ---- saved caches (src/kv/persist.c) ----
 * A store is written as: nq, ng (KIVI keys, else 0), gn[ng], the byte count
 * of data in use and those bytes as they are in memory (quantised blocks
 * keep their codes: loading gives back the same bits), then the residual
 * tail's (len - nq) fp16 rows. */
void ekv_store_save(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len, struct ekv_wbuf *w) {
    const int32_t ng = is_kivi_k(f) ? s->ng : 0;
    ekv_wbuf_u32(w, (uint32_t)s->nq);
    ekv_wbuf_u32(w, (uint32_t)ng);
    ekv_wbuf_i32s(w, s->gn, (size_t)ng);
    ekv_wbuf_u64(w, (uint64_t)s->data_used);
    ekv_wbuf_put(w, s->data, s->data_used);
    ekv_wbuf_u16s(w, s->tail, (size_t)(len - s->nq) * (size_t)f->d);
}

enum ekv_status ekv_store_load(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, struct ekv_rbuf *r) {
    const char *side = f->is_v ? "values" : "keys";
    const int32_t nq = ekv_rbuf_i32(r), ng = ekv_rbuf_i32(r);
    if (r->bad) return ekv_err(EKV_ERR_FORMAT, "%s: truncated", side);
    if (nq < 0 || nq > len || (!is_kivi(f) && nq != len))
        return ekv_err(EKV_ERR_FORMAT, "%s: %d quantised entries of %d", side, (int)nq, (int)len);
    if (ng < 0 || ng > nq || (!is_kivi_k(f) && ng != 0))
        return ekv_err(EKV_ERR_FORMAT, "%s: %d groups for %d entries", side, (int)ng, (int)nq);
    if (!ekv_rbuf_has_n(r, (size_t)ng, 4)) return ekv_err(EKV_ERR_FORMAT, "%s: truncated group sizes", side);
    enum ekv_status st = grow_gn(s, ng);
    if (st != EKV_OK) return st;
    ekv_rbuf_i32s(r, s->gn, (size_t)ng);
    s->ng = ng;
    uint64_t want = 0; /* the bytes the entries need in this type */
    if (is_kivi_k(f)) {
        int64_t sum = 0;
        for (int32_t i = 0; i < ng; i++) {
            if (s->gn[i] < 1 || s->gn[i] > f->g)
                return ekv_err(EKV_ERR_FORMAT, "keys: group %d holds %d entries (1..%d)", (int)i, (int)s->gn[i], f->g);
            sum += s->gn[i];
            want += gbytes(f, s->gn[i]);
        }
        if (sum != nq) return ekv_err(EKV_ERR_FORMAT, "keys: groups hold %lld entries, not %d", (long long)sum, (int)nq);
    } else {
        want = (uint64_t)nq * f->row_bytes;
    }
    const uint64_t used = ekv_rbuf_u64(r);
    if (r->bad || used != want)
        return ekv_err(EKV_ERR_FORMAT, "%s: %llu data bytes, %llu expected", side, (unsigned long long)used,
                       (unsigned long long)want);
    if (!ekv_rbuf_has(r, (size_t)used)) return ekv_err(EKV_ERR_FORMAT, "%s: truncated data", side);
    if (is_kivi(f)) {
        void *p = s->data;
        st = grow(&p, &s->data_cap, (size_t)used);
        if (st != EKV_OK) return st;
        s->data = p;
    } else if (s->data_cap < used) {
        return ekv_err(EKV_ERR_INTERNAL, "%s: rows not allocated", side);
    }
    ekv_rbuf_get(r, s->data, (size_t)used);
    s->data_used = (size_t)used;
    s->nq = nq;
    const size_t tail = (size_t)(len - nq) * (size_t)f->d;
    if (!ekv_rbuf_has_n(r, tail, 2)) return ekv_err(EKV_ERR_FORMAT, "%s: truncated residual", side);
    if (len > nq) {
        st = grow_tail(f, s, len - nq);
        if (st != EKV_OK) return st;
        ekv_rbuf_u16s(r, s->tail, tail);
    }
    return EKV_OK;
}
