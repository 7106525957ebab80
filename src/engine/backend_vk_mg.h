/*
 * backend_vk_mg.h — internal to the GPU's compressed caches: the state of
 * one sequence's compressed device cache (struct ekv_vk_mg), shared by
 * backend_vk_policy.c (its life, capacity and forwards) and
 * backend_vk_plan.c (what a policy does to the rows: plans run by
 * kv_merge.comp and kv_compact.comp, rows read back).
 */
#ifndef EKV_ENGINE_BACKEND_VK_MG_H
#define EKV_ENGINE_BACKEND_VK_MG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend_vk.h"
#include "kv/kv.h"

#define MG_HI 0x80000000u   /* a plan's source is a staged row */
#define MG_NONE 0xffffffffu /* attn_stats: statistic not collected */
#define MG_PEND 32          /* decode rows whose statistics may wait (deferred statistics) */
enum { SL_COLSUM, SL_SUMSQ, SL_LAST, SL_WIN, SL_BIN, SL_COUNT };
/* attn_stats.comp's output: increments to st, summed into acc, or acc + increments to st */
enum { MG_ACC_NONE, MG_ACC_ADD, MG_ACC_FINAL };

/* One head's plan for one side: n runs from `first` on. */
struct mg_plan {
    int32_t il, hk, side;
    uint32_t first, n;
};

/* A merged entry's mean, computed on the device (kv_merge.comp) into stage
 * row `row` of its side from n (entry, weight) members from `first` on. */
struct mg_mean {
    int32_t il, hk, side;
    uint32_t row, first, n;
};

struct ekv_vk_mg {
    struct ekv_vk_ctx *g;
    struct ekv_seq *seq;
    struct ekv_vk_seq *s;
    struct ekv_kv_dev dev;
    struct ekv_vk_buf meta;    /* host-visible [n_layer][meta_words] u32: L0 [H], has_bias, the layer's bias address */
    uint32_t meta_words;
    /* with logit biases (elastic-v2:bias=1): [n_layer] device buffers [H][cap] f32 of log(weight), 0 past each
     * head's entries; planned like a side of one-word rows ("side" 2), so the host writes only what changes */
    struct ekv_vk_buf *bias;
    /* with a sliding window: [n_layer] device buffers [H][cap] u32 of each entry's position (rope_store writes
     * new entries'; planned like the biases, "side" 3, moves only) */
    struct ekv_vk_buf *posb;
    int32_t *L0;               /* [n_layer][H] entries of each head before the part */
    int32_t *maxlen;           /* [n_layer] the longest head after the part */
    /* the statistics of the forward: [n_layer][n_slot][H][st_cap] f32, then zeros [n_layer][H][nblk] u32 */
    struct ekv_vk_buf st;
    uint32_t st_cap, nblk, n_slot;
    uint32_t slot[SL_COUNT];
    bool sparsity, any_stats;
    uint64_t zeros_off;        /* words */
    /* statistics summed on the device between the steps a policy reads them
     * (SnapKV, PyramidKV, VL-Cache read theirs every --kv-recompress steps:
     * ekv_kv_stats_read_after): acc [n_layer][acc_nslot][H][acc_cap] f32,
     * device memory, all zero unless acc_pending; acc_host: a host copy
     * (acc_sync) taken when the layout must change while sums are pending */
    struct ekv_vk_buf acc, acc_host;
    uint32_t acc_cap, acc_nslot, acc_slot[SL_COUNT];
    uint32_t acc_mode;         /* this forward: MG_ACC_* */
    bool acc_pending;          /* acc holds sums not yet in the host cache */
    bool acc_pending_prev;     /* acc_pending before this forward (an aborted forward restores it) */
    bool acc_fold_old;         /* this forward copies acc to acc_host: fold it first */
    bool acc_new;              /* acc was made in this forward (its zeroing is in the recording) */
    uint64_t n_summed;         /* forwards whose statistics stayed on the device (MG_ACC_ADD) */
    /* deferred statistics: a decode step summed on the device (MG_ACC_*) does not
     * run attn_stats; rope_store and attn_combine keep its roped query row and
     * row sums in slot n_pend of pend ([n_layer][MG_PEND][q width] f32, then
     * [n_layer][MG_PEND][n_head][2] f32), and one attn_stats pass over the
     * slots runs when the policy reads them, the ring is full, or the cache is
     * about to change (pend_record): the keys are read once per window, not
     * once per step. pmeta ([n_layer][meta_words], host-visible): meta as it
     * was at the first pending row (its heads' lengths before it). Pending rows
     * imply acc_pending; the cache only grows while rows are pending. */
    struct ekv_vk_buf pend, pmeta;
    int32_t n_pend, n_pend_prev; /* rows pending; before this forward (an aborted forward restores it) */
    int64_t pend_pos0;         /* position of the first pending row */
    bool pend_on;              /* this forward keeps its row in slot n_pend */
    bool pend_pass;            /* ... and runs the pass over slots [0, n_pend] */
    bool pend_flushed;         /* this forward's recording already holds a pass (no new run may start) */
    bool no_defer;             /* tests: every step runs its own pass (ekv_vk_mg_set_defer) */
    uint64_t n_deferred;       /* decode rows whose statistics waited in the ring */
    struct ekv_kv_step step;   /* the part's step (its pointers live as long as the forward) */
    int32_t n_rows, wrow;
    bool in_fwd;
    enum ekv_status after_st;  /* ekv_vk_mg_after: the policy hooks' status */
    bool moved;                /* the cache moved to other buffers in the open recording */
    /* plans not yet run, with their pairs and staged rows (per side) */
    struct mg_plan *plans;
    int32_t n_plans;
    size_t cap_plans;
    uint32_t *pairs;           /* [3 * n_pairs] runs: first destination, first source, rows (head-relative;
                                  a source with MG_HI is a stage row, MG_ZERO zeros) */
    size_t n_pairs, cap_pairs;
    struct mg_mean *means;     /* merges the device averages */
    size_t n_means, cap_means;
    uint32_t *members;         /* [3 * n_members] entry, weight (float bits), rotation row (MG_NONE: none) */
    size_t n_members, cap_members;
    /* key=rotate: the {cos, sin} rows members' keys turn by ([n_rot][rot_w] f32,
     * ekv_rope_shift_cs), one per distinct delta (rot_keys [n_rot][3], found
     * through rot_hash [rot_hcap] of row + 1, 0 empty) */
    float *rots;
    size_t n_rot, cap_rot;
    int64_t *rot_keys;
    size_t cap_rot_keys;
    uint32_t *rot_hash;
    size_t rot_hcap;
    uint32_t rot_w;
    uint32_t *stage[4];        /* [rows][srw[side]] words; side 2: the biases (side 3, positions: never staged) */
    size_t n_stage[4], cap_stage[4];
    uint32_t srw[4], rw[4], sph[4];
    uint8_t *pending;          /* [n_layer][H] a plan of the head waits */
    /* a head read back: rows [0, rc_len) of (rc_il, rc_hk) as floats */
    int32_t rc_il, rc_hk, rc_len;
    float *rc_k, *rc_v;
    size_t rc_cap;             /* floats per side */
    uint8_t *rc_raw;           /* download scratch */
    size_t rc_raw_cap;
    uint64_t n_read_back;      /* heads read back so far */
};

static inline struct ekv_vk_side *mg_side_of(struct ekv_vk_mg *m, int side) { return side ? &m->s->v : &m->s->k; }
/* Sides a cache plans: K, V, the logit biases (2), the positions (3). */
static inline bool mg_side_on(const struct ekv_vk_mg *m, int side) {
    return side < 2 || (side == 2 && m->bias) || (side == 3 && m->posb);
}
/* The buffer of a side of layer il. */
static inline struct ekv_vk_buf *mg_side_buf(struct ekv_vk_mg *m, int side, int il) {
    return side == 0 ? &m->s->k.buf[il] : side == 1 ? &m->s->v.buf[il] : side == 2 ? &m->bias[il] : &m->posb[il];
}
#define MG_ZERO 0xffffffffu /* kv_compact.comp: write 0 */

/* Grows a malloc'd array to hold `need` elements of `elem` bytes (doubling). */
enum ekv_status ekv_vk_mg_grow(void **p, size_t *cap, size_t need, size_t elem);
/* Makes a device buffer hold `bytes` (no recording may be open). */
enum ekv_status ekv_vk_mg_buf_fit(struct ekv_vk *vk, struct ekv_vk_buf *b, size_t bytes, bool host, const char *what);
/* Runs the plans made so far (one submission). */
enum ekv_status ekv_vk_mg_flush(struct ekv_vk_mg *m);
/* Runs the plans of n caches of one context in one submission. */
enum ekv_status ekv_vk_mg_flush_all(struct ekv_vk_ctx *g, struct ekv_vk_mg *const *ms, int32_t n);
/* Words of one row of a side's type in the device layout, and its fp16 scales. */
void ekv_vk_mg_side_shape(enum ekv_kv_type t, uint32_t D, uint32_t *rw, uint32_t *sph);
/* Fills m->dev with the calls that act on the device's rows. */
void ekv_vk_mg_dev_init(struct ekv_vk_mg *m);

#endif
