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

/* One head's plan for one side: n runs from `first` on, in a phase of the
 * submission (a head touched again opens the sequence's next phase, which
 * runs after it: ekv_vk_mg_head_touch). */
struct mg_plan {
    int32_t il, hk, side, phase;
    uint32_t first, n;
};

/* The sides a cache plans (kv_compact.comp's segments): K and V rows (KIVI:
 * codes, values with their parameters), the logit biases, the positions,
 * and of compressed KIVI sides the residuals, the key groups' parameters
 * and the group table (backend_vk_kivi.c). */
enum { MG_K, MG_V, MG_BIAS, MG_POS, MG_KRES, MG_VRES, MG_KPAR, MG_KGIX, MG_SIDES };

/* KIVI quantisation on the device (kivi_pack.comp) of layer il's side
 * (MG_K or MG_V): n members from `first`, codes into stage rows crow.. of
 * the side, a key group's parameters into MG_KPAR's stage row prow. */
struct mg_pack {
    int32_t il, hk, side, phase;
    uint32_t n, first, crow, prow;
};

/* A merged entry's mean, computed on the device (kv_merge.comp) into stage
 * row `row` of its side from n (entry, weight) members from `first` on. */
struct mg_mean {
    int32_t il, hk, side, phase;
    uint32_t row, first, n;
    /* a compressed KIVI side: row is a row of frows; r16 a stage row of the
     * side's residual that also gets the mean in fp16 (MG_NONE: none); nq:
     * the head's quantised entries as the members are read */
    uint32_t r16, nq;
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
    uint32_t *stage[MG_SIDES]; /* [rows][srw[side]] words (MG_POS: never staged) */
    size_t n_stage[MG_SIDES], cap_stage[MG_SIDES];
    uint32_t srw[MG_SIDES], rw[MG_SIDES], sph[MG_SIDES];
    /* KIVI quantisation of the plans (compressed KIVI sides): units, their
     * members (kivi_pack.comp's codes) and the float rows members give */
    struct mg_pack *packs;
    size_t n_packs, cap_packs;
    uint32_t *pmembers;
    size_t n_pmembers, cap_pmembers;
    float *frows;              /* [n_frows][D] */
    size_t n_frows, cap_frows;
    int32_t *pending;          /* [n_layer][H] 1 + the last phase with a plan of the head (0: none) */
    int32_t phase;             /* the phase new plans go to */
    /* a head read back: rows [0, rc_len) of (rc_il, rc_hk) as floats */
    int32_t rc_il, rc_hk, rc_len;
    float *rc_k, *rc_v;
    size_t rc_cap;             /* floats per side */
    uint8_t *rc_raw;           /* download scratch */
    size_t rc_raw_cap;
    uint64_t n_read_back;      /* heads read back so far */
};

/* The cache side (K or V) a plan side belongs to (MG_K or MG_V only for the rest). */
static inline struct ekv_vk_side *mg_side_of(struct ekv_vk_mg *m, int side) {
    return side == MG_V || side == MG_VRES ? &m->s->v : &m->s->k;
}
static inline bool mg_side_on(const struct ekv_vk_mg *m, int side) {
    switch (side) {
    case MG_K: case MG_V: return true;
    case MG_BIAS: return m->bias != NULL;
    case MG_POS: return m->posb != NULL;
    case MG_KRES: return m->s->k.managed;
    case MG_VRES: return m->s->v.managed;
    default: return m->s->k.managed; /* MG_KPAR, MG_KGIX */
    }
}
/* The buffer of a side of layer il, and the word its rows start at. */
static inline struct ekv_vk_buf *mg_side_buf(struct ekv_vk_mg *m, int side, int il) {
    switch (side) {
    case MG_BIAS: return &m->bias[il];
    case MG_POS: return &m->posb[il];
    default: return &mg_side_of(m, side)->buf[il];
    }
}
static inline uint64_t mg_side_word0(struct ekv_vk_mg *m, int side) {
    switch (side) {
    case MG_KRES: return m->s->k.r0;
    case MG_VRES: return m->s->v.r0;
    case MG_KPAR: return m->s->k.p0;
    case MG_KGIX: return m->s->k.x0;
    default: return 0;
    }
}
/* Rows of one head in a side (head h's row j is h * this + j). */
static inline uint32_t mg_side_hstride(struct ekv_vk_mg *m, int side) {
    switch (side) {
    case MG_KRES: return m->s->k.tc;
    case MG_VRES: return m->s->v.tc;
    case MG_KPAR: return m->s->k.ngc;
    default: return (uint32_t)m->s->cap;
    }
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
/* Plans (backend_vk_plan.c, for backend_vk_kivi.c): rows dst.. <- src..
 * (n; src MG_HI | stage row, or MG_ZERO) added to the plan begun at run
 * `first`; the runs that compact a head of len entries to keep[] (*kept: how
 * many); the plan of head (il, hk) of a side from run `first` on; a head
 * about to get a plan (its earlier plan runs first); a stage row of a side
 * (zeros, which the device or the caller fills), its source code. */
enum ekv_status ekv_vk_mg_add_run(struct ekv_vk_mg *m, size_t first, uint32_t dst, uint32_t src, uint32_t n);
enum ekv_status ekv_vk_mg_add_pair(struct ekv_vk_mg *m, size_t first, uint32_t dst, uint32_t src);
enum ekv_status ekv_vk_mg_keep_runs(struct ekv_vk_mg *m, size_t first, const uint8_t *keep, int32_t len, uint32_t *kept);
enum ekv_status ekv_vk_mg_add_plan(struct ekv_vk_mg *m, int il, int hk, int side, size_t first);
enum ekv_status ekv_vk_mg_head_touch(struct ekv_vk_mg *m, int il, int hk);
enum ekv_status ekv_vk_mg_stage_blank(struct ekv_vk_mg *m, int side, uint32_t *code);

/* Compressed KIVI sides (backend_vk_kivi.c): what a compaction (keep[],
 * new rows of[]), a write (rows x of entries idx[]) and the residual rule do
 * to one side of head (il, hk), as plans and KIVI units, the host cache's
 * store counts following; a side read back as floats [len][D]. */
enum ekv_status ekv_vk_kivi_compact(struct ekv_vk_mg *m, int side, int il, int hk, int32_t len, const uint8_t *keep,
                                    const float *const *of, const int32_t *mean_of);
/* A float row for a mean kv_merge.comp computes (m->means[mean_of[j]]
 * for survivor j in ekv_vk_kivi_compact, which puts it in place); *row:
 * MG_HI | its row of frows. */
enum ekv_status ekv_vk_kivi_mean_row(struct ekv_vk_mg *m, uint32_t *row);
enum ekv_status ekv_vk_kivi_write(struct ekv_vk_mg *m, int side, int il, int hk, int32_t len, const int32_t *idx,
                                  int32_t n, const float *x);
enum ekv_status ekv_vk_kivi_flush(void *user, int il, int hk, int32_t len);
enum ekv_status ekv_vk_kivi_read(struct ekv_vk_mg *m, int side, int il, int hk, int32_t len, float *out);
/* Copies recorded into the open recording: the first lens[il][h] entries of
 * each head of a compressed KIVI side from its buffers to nb (a layout of
 * other capacity or residual slots, ns). */
void ekv_vk_kivi_copy_side(struct ekv_vk_mg *m, int side, const struct ekv_vk_side *nsd, const struct ekv_vk_seq *ns,
                           const int32_t *lens);

/* Fills m->dev with the calls that act on the device's rows. */
void ekv_vk_mg_dev_init(struct ekv_vk_mg *m);

#endif
