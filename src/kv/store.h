/*
 * store.h — internal to src/kv: one side (keys or values) of one KV head in
 * its storage type (src/kv/store.c). cache.c drives it for appends,
 * writes, eviction and merging; attend.c reads it through a view.
 *
 * Layout (kvquant.h): entries [0, nq) live in `data` — rows of the type,
 * or for KIVI keys packed groups of at most G entries each — and for KIVI
 * the entries [nq, len) are fp16 rows in `tail`, the full-precision
 * residual. Row types never use the tail (nq == len).
 */
#ifndef EKV_KV_STORE_H
#define EKV_KV_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ekv.h"
#include "core/serial.h"
#include "kernels/kvquant.h"

/* What a store needs to know of its cache. */
struct ekv_store_fmt {
    enum ekv_kv_type type;
    bool is_v;
    int d;                /* head_dim */
    int g;                /* KIVI group G */
    int r;                /* KIVI residual R (keys quantise in blocks of max(R, G)) */
    size_t row_bytes;     /* bytes of a row in data (KIVI keys: of a code row) */
};

struct ekv_kv_store {
    uint8_t *data;        /* see the file comment */
    size_t data_cap;      /* bytes allocated */
    size_t data_used;     /* bytes in use */
    int32_t nq;           /* entries in data */
    uint16_t *tail;       /* KIVI: [tail_cap][d] fp16 rows of entries [nq, len) */
    int32_t tail_cap;
    int32_t *gn;          /* KIVI keys: [gn_cap] entries per group, ng in use */
    int32_t ng;
    int32_t gn_cap;
};

/* Fills f for one side of a cache; NULL or a static reason it cannot. */
const char *ekv_store_fmt_init(struct ekv_store_fmt *f, enum ekv_kv_type t, bool is_v, int d, int g, int r);

/* Bytes allocated by s. */
uint64_t ekv_store_alloc_bytes(const struct ekv_store_fmt *f, const struct ekv_kv_store *s);
/* Bytes of K or V data of the len entries held now. */
uint64_t ekv_store_used_bytes(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len);
/* Bytes a store of n entries would hold after the residual rule (a full
 * cache that never evicted). */
uint64_t ekv_store_full_bytes(const struct ekv_store_fmt *f, int64_t n);

/* Makes room so that `extra` appends after len entries cannot fail. */
enum ekv_status ekv_store_reserve(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, int32_t extra);
/* Appends entry len (room reserved). */
void ekv_store_append(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, const float *x);
/* Entries [j0, j1) as floats (reference codecs). */
void ekv_store_read(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len, int32_t j0, int32_t j1,
                    float *dst);
/* Overwrites entries idx[0..n) (distinct, < len; NULL = 0..n-1) with rows
 * src [n][d]; KIVI key groups that hold a written entry are re-quantised
 * once each. */
enum ekv_status ekv_store_write(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, const int32_t *idx,
                                int32_t n, const float *src);
/* Keeps the entries with keep[j] (j < len) in order; a kept entry j with
 * src_of[j] != NULL gets that row (src_of NULL: none). KIVI key groups keep
 * their codes (no re-quantisation) unless they receive a new row or a run
 * of adjacent groups fits in one group (<= G entries): those are
 * re-quantised, once each, as one group with the new rows in place. */
enum ekv_status ekv_store_compact(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len,
                                  const uint8_t *keep, const float *const *src_of);
/* KIVI residual rule after a forward (docs/policies.md "KIVI storage"): keys quantise
 * whole blocks of max(R, G) tail entries, values all but the newest R. */
enum ekv_status ekv_store_flush(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len);
/* Returns memory when much more is allocated than used (cannot fail). */
void ekv_store_shrink(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len);
/* Row types: sets the capacity to cap entries (cap >= len). */
enum ekv_status ekv_store_set_rows(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t cap);
/* dst (uninitialised) becomes a copy of src, capacity included; on failure
 * dst is empty. */
enum ekv_status ekv_store_clone(const struct ekv_store_fmt *f, const struct ekv_kv_store *src, struct ekv_kv_store *dst);
void ekv_store_free(struct ekv_kv_store *s);
/* Appends the len entries of s to w, bytes as they are (saved caches). */
void ekv_store_save(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len, struct ekv_wbuf *w);
/* Reads what ekv_store_save wrote into s: empty for KIVI types, its rows
 * allocated for len entries for row types (ekv_store_set_rows). Every count
 * and size is checked against the type and len; on error s holds what was
 * allocated (ekv_store_free). */
enum ekv_status ekv_store_load(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len, struct ekv_rbuf *r);
/* ---- counts only: what the operations above do to nq and the key groups,
 * for a store whose rows live elsewhere (a GPU cache: data is NULL, and the
 * device executes what these describe) and shared by the operations above */

/* KIVI keys: one group after a compaction, made of the kept entries of the
 * source groups [src0, src1) (n of them, n <= G). requant: re-quantised as
 * one group (several groups joined, or an entry got a new row); else it is
 * source group src0 with its codes and parameters, minus evicted rows. */
struct ekv_kgroup_out {
    int32_t src0, src1, n;
    bool requant;
};
/* The groups after keeping keep[j] of the quantised entries [0, nq) held in
 * groups gn[0, ng) of at most g entries; new_row[j] (may be NULL): kept
 * entry j gets a new row. With join, each maximal run of adjacent groups
 * whose entries fit in one group becomes one (ekv_store_compact); without,
 * groups only shrink (ekv_store_write keeps every entry). out: room for ng;
 * returns how many groups. */
int32_t ekv_store_kgroups_plan(const int32_t *gn, int32_t ng, int32_t g, const uint8_t *keep, const uint8_t *new_row,
                               bool join, struct ekv_kgroup_out *out);
/* Makes the counts of s those of a compaction that kept keep[j] of len
 * entries (keys: groups out[0, n_out) of ekv_store_kgroups_plan). */
enum ekv_status ekv_store_note_compact(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t len,
                                       const uint8_t *keep, const struct ekv_kgroup_out *out, int32_t n_out);
/* The oldest tail entries the residual rule quantises after a forward
 * ending at len entries (ekv_store_flush). */
int32_t ekv_store_flush_count(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len);
/* Makes the counts of s those after quantising its m oldest tail entries. */
enum ekv_status ekv_store_note_flush(const struct ekv_store_fmt *f, struct ekv_kv_store *s, int32_t m);

/* The attention kernels' view of the len entries. */
struct ekv_kv_view ekv_store_view(const struct ekv_store_fmt *f, const struct ekv_kv_store *s, int32_t len);

#endif
