/*
 * kv.h — the KV cache and the policy interface (docs/architecture.md "The KV cache contract").
 *
 * Storage is per layer and per KV head (GQA-native). Each (layer, head)
 * holds `len` entries in ascending original position: the key after RoPE,
 * the value, the original position, a modality tag, a merge weight (tokens
 * the entry stands for) and the statistics the active policy asked for.
 * Heads and layers may hold different lengths. Capacity follows what is
 * kept: it grows by appends and shrinks after compaction.
 *
 * A policy is a table of function pointers (struct ekv_policy_ops), one
 * file per policy in src/kv/, listed in the registry in policy.c. The
 * engine calls begin() before each forward (a prompt chunk or decode
 * steps), layer() right after each layer's attention has been computed
 * (statistics included) and end() after the last layer. A policy compacts
 * or merges a head's entries through ekv_kv_head_keep / ekv_kv_head_merge.
 */
#ifndef EKV_KV_H
#define EKV_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "ekv.h"
#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kv/store.h"

struct ekv_kv_head {
    int32_t len;      /* entries in use */
    int32_t cap;      /* entries allocated */
    /* storage of keys (RoPE applied) and values in kv->fk / kv->fv's types:
     * private to cache.c, store.c and attend.c; everyone else goes through
     * ekv_kv_head_get/gather/set/scatter */
    struct ekv_kv_store ks;
    struct ekv_kv_store vs;
    int32_t *pos;     /* [cap] original positions, strictly increasing */
    int32_t *mpos;    /* [cap][3] M-RoPE models (kv->rope.sections): the RoPE positions (time,
                         height, width) the key was rotated at; NULL otherwise */
    uint8_t *tag;     /* [cap] enum ekv_tag */
    float *weight;    /* [cap] tokens this entry stands for (1 unless merged) */
    /* statistics, present when kv->stats has the flag (else NULL); all are
     * group means over the R query heads that read this KV head */
    double *colsum;   /* [cap] EKV_STAT_COLSUM: sum over queries of attention */
    int32_t *count;   /* [cap] EKV_STAT_COLSUM: queries summed into colsum */
    double *sumsq;    /* [cap] EKV_STAT_SUMSQ: sum of squared attention */
    float *lastrow;   /* [cap] EKV_STAT_LASTROW: attention of the latest query */
    double *winsum;   /* [cap] EKV_STAT_WINSUM: sum over queries at positions >= kv->win_start */
    float *bincount;  /* [cap] EKV_STAT_BINCOUNT: queries with attention >= 1/visible keys */
    int64_t n_evicted; /* tokens dropped from this head (merged members not counted) */
    int64_t n_merged;  /* tokens merged into another entry of this head */
};

struct ekv_kv_layer {
    struct ekv_kv_head *heads; /* [n_head_kv] */
    /* EKV_STAT_SPARSITY: over query rows at positions >= win_start and all
     * query heads, entries below p * row max, and causal entries seen. */
    double sparse_zero;
    double sparse_total;
    int32_t budget;            /* per-layer cap set by a policy (-1: none) */
};

struct ekv_kv;

/* Where K and V live when a device holds them (engine/backend_vk_kv.c):
 * the cache then keeps positions, tags, weights and statistics on the host
 * with empty stores, and every operation on the rows goes through these
 * calls (kv->dev; NULL = the stores, on the CPU). A policy does not see the
 * difference: ekv_kv_head_keep / merge / get / gather / set / scatter work
 * as on the CPU. Entries are indexed as in the head before the call. */
struct ekv_kv_dev {
    void *user;
    /* Head (il, hk) of len entries keeps the entries with keep[j], in
     * order; a kept entry j with k_of[j] / v_of[j] (arrays may be NULL, as
     * may their elements) gets that row. */
    enum ekv_status (*compact)(void *user, int il, int hk, int32_t len, const uint8_t *keep,
                               const float *const *k_of, const float *const *v_of);
    /* Rows idx[0..n) (valid indices of the head) as floats into k / v
     * [n][head_dim] (either may be NULL). */
    enum ekv_status (*read)(void *user, int il, int hk, int32_t len, const int32_t *idx, int32_t n, float *k,
                            float *v);
    /* A merge (ekv_kv_head_merge's into[] convention): as compact with
     * keep[j] = (into[j] == j), and every kept entry t that others join gets
     * on each side without rows given (k_of / v_of NULL) the mean of its own
     * and its members' rows weighted by w[] (the weights before the merge,
     * or a merging rule's member weights: ekv_kv_head_merge_rule), computed
     * by the device. flags (EKV_KV_DEV_*): K_KEEP, the survivors keep their
     * own keys (key=anchor); K_ROTATE, each member's key is first turned by
     * RoPE from its position (the head's pos, or mpos under M-RoPE) to its
     * survivor's (key=rotate: ekv_rope_shift_cs's angles). Optional: NULL =
     * the means are computed here from rows read back. */
    enum ekv_status (*merge)(void *user, int il, int hk, int32_t len, const int32_t *into, const float *w,
                             unsigned flags, const float *const *k_of, const float *const *v_of);
    /* Overwrites rows idx[0..n) (distinct, valid) with k / v [n][head_dim]
     * (NULL: that side unchanged). */
    enum ekv_status (*write)(void *user, int il, int hk, int32_t len, const int32_t *idx, int32_t n,
                             const float *k, const float *v);
    /* KIVI's residual rule (ekv_store_flush) for head (il, hk) of len
     * entries, the head's stores (which count, with no rows) following.
     * NULL: the cache has no KIVI side. */
    enum ekv_status (*flush)(void *user, int il, int hk, int32_t len);
};

/* struct ekv_kv_dev merge flags */
enum { EKV_KV_DEV_K_KEEP = 1, EKV_KV_DEV_K_ROTATE = 2 };

/* What the current forward is. */
struct ekv_kv_step {
    bool is_prompt;            /* prefill of (a chunk of) a prompt */
    bool last_chunk;           /* prompt: this chunk ends the prompt */
    int64_t pos0;              /* position of the first new token */
    int32_t n_new;             /* positions in this forward */
    int64_t prompt_pos0;       /* prompt: position of its first token */
    int32_t prompt_len;        /* prompt: length of the whole prompt (all chunks) */
    const uint8_t *prompt_tags;/* prompt: [prompt_len] tags of the whole prompt */
    const uint8_t *tags;       /* [n_new] tags of the new positions */
    const int32_t *mpos;       /* [n_new][3] M-RoPE models: the RoPE positions (time, height,
                                  width) of the new rows; NULL = text rows, each at its
                                  position + rope_delta in all three */
    int64_t rope_delta;        /* M-RoPE models: RoPE position minus position of text rows
                                  (<= 0 after images, struct ekv_segment's grid); else 0 */
    bool defer;                /* statistics only: the policy's layer hook does not run (a
                                  prompt read in pieces calls it once the whole block went
                                  through the layer: ekv_kv_layer_policy, engine/prefill.c) */
};

/* The RoPE positions of new row i of a step (what an M-RoPE cache records
 * per entry): the step's mpos row, or for text all three pos0 + i +
 * rope_delta, written to buf. */
static inline const int32_t *ekv_kv_step_mpos(const struct ekv_kv_step *st, int32_t i, int32_t buf[3]) {
    if (st->mpos) return st->mpos + 3 * (size_t)i;
    buf[0] = buf[1] = buf[2] = (int32_t)(st->pos0 + i + st->rope_delta);
    return buf;
}

struct ekv_policy_ops {
    const char *name;
    const char *summary;      /* one line for --help */
    /* EKV_STAT_* flags the policy needs at every forward. ekv_kv_begin sets
     * kv->stats to them before begin(), which may change them per step
     * (e.g. prompt-only statistics). */
    unsigned stats;
    /* The policy has a reference-compatibility mode (params.compat_ref,
     * `--kv-compat ref`); ekv_kv_new refuses compat_ref for the others. */
    bool has_compat_ref;
    /* Fills defaults (-1/NaN fields of kv->params) and validates; optional. */
    enum ekv_status (*configure)(struct ekv_kv *kv);
    /* Allocates kv->pstate; optional. */
    enum ekv_status (*init)(struct ekv_kv *kv);
    void (*destroy)(struct ekv_kv *kv);
    /* Sets dst->pstate to a copy of src->pstate (dst is src's copy in all
     * else; ekv_kv_clone). Required when init() allocates a state. */
    enum ekv_status (*clone)(struct ekv_kv *dst, const struct ekv_kv *src);
    /* Before a forward: set kv->stats, kv->win_start, reset statistics. Optional. */
    enum ekv_status (*begin)(struct ekv_kv *kv, const struct ekv_kv_step *step);
    /* After layer il's attention in this forward. Optional. */
    enum ekv_status (*layer)(struct ekv_kv *kv, int il, const struct ekv_kv_step *step);
    /* After all layers. Optional. */
    enum ekv_status (*end)(struct ekv_kv *kv, const struct ekv_kv_step *step);
    /* Acts only when a prompt has been read: the cache grows by one entry per
     * generated token afterwards (SnapKV, PyramidKV, VL-Cache). Memory
     * projections (ekv_kv_project) need it. */
    bool prompt_only;
    /* RoPE position of the first new token of a forward, when the policy
     * changes it (Elastic Cache's reference mode, docs/policies.md
     * "Positions and the reference mode"); called before begin(). Optional:
     * NULL = the true position step->pos0. */
    int64_t (*rope_pos)(const struct ekv_kv *kv, const struct ekv_kv_step *step);
    /* One option of a policy spec "name:key=value:key=value" (e.g.
     * "elastic-v2:recent=0.5"), called after init() for each pair in
     * order. Optional: NULL = the policy takes no options (a spec with any
     * is refused). */
    enum ekv_status (*option)(struct ekv_kv *kv, const char *key, const char *value);
    /* A saved cache (src/kv/persist.c): write kv->pstate's changing part
     * (the options come back from kv->spec) / read it back into the state
     * init() and the spec's options made, validating every value. Required
     * when init() allocates a state. */
    void (*state_save)(const struct ekv_kv *kv, struct ekv_wbuf *w);
    enum ekv_status (*state_load)(struct ekv_kv *kv, struct ekv_rbuf *r);
    /* Takes "+adakv" (src/kv/adakv.c): the policy ranks a head's entries by
     * a score comparable across the heads of a layer and shares the layer's
     * budget by it (ekv_adakv_caps). */
    bool headwise;
};

/* "+adakv" in a policy spec (src/kv/adakv.c): head-wise budgets. */
struct ekv_kv_adakv {
    bool on;
    double floor; /* ada_floor: share of its own budget every head keeps whatever its scores (0.2) */
};

/* "+merge" in a policy spec (src/kv/merge.c): the policy's evictions
 * become merges into kept entries. */
enum ekv_merge_to { EKV_MERGE_TO_POS, EKV_MERGE_TO_KEY };
/* The key of a merged entry: weighted mean of the cached (rotated) keys,
 * the survivor's own key, or the mean of the keys turned to the survivor's
 * position (elastic-v2's key=, +merge's merge_key=). */
enum ekv_merge_key { EKV_MERGE_KEY_MEAN, EKV_MERGE_KEY_ANCHOR, EKV_MERGE_KEY_ROTATE };
struct ekv_kv_merge {
    bool on;               /* the spec says +merge */
    enum ekv_merge_to to;  /* which kept entry a dropped one joins */
    double sim;            /* merge_to=key: least cosine similarity to join, else dropped */
    enum ekv_merge_key key;
    bool bias;             /* sets kv->logit_bias */
    bool stats;            /* a survivor's additive statistics take its members' */
    bool prompt_only;      /* merge at the prompt's compression only; decode steps evict */
};

struct ekv_kv {
    int32_t n_layer;
    int32_t n_head;       /* query heads */
    int32_t n_head_kv;
    int32_t head_dim;
    struct ekv_kv_layer *layers; /* [n_layer] */
    int64_t n_seen;       /* tokens seen, including the current forward's */
    bool in_prompt;       /* the current forward reads a prompt (ekv_kv_begin) */
    unsigned stats;       /* EKV_STAT_* flags collected by attention */
    unsigned extra_stats; /* EKV_STAT_* flags collected on top of the policy's (set by
                             evaluation code, e.g. LASTROW for cache hit rates); 0 by default */
    int64_t win_start;    /* queries at positions >= win_start feed winsum / sparsity */
    int32_t swa_window;   /* sliding-window attention (Mistral): a query at position p sees
                             the entries at positions > p - swa_window; 0 = all before it */
    bool logit_bias;      /* attention adds log(weight[j]) to the logit of every entry j, so a merged entry
                             is attended like the tokens it stands for (as if its key appeared weight times);
                             set by a policy (elastic-v2:bias=1); false = no bias, no cost */
    struct ekv_rope_params rope; /* the model's RoPE as the cached keys carry it (set by the engine with the
                                    cache, ekv_seq_new; dim 0 = unknown), for policies that move keys between
                                    positions (elastic-v2:key=rotate, ekv_rope_shift_ext) */
    struct ekv_kv_params params;  /* defaults resolved by configure() */
    struct ekv_kv_merge merge;    /* "+merge" (on = false without it) */
    struct ekv_kv_adakv adakv;    /* "+adakv" (on = false without it) */
    char policy_name[32];
    char spec[256];       /* the policy spec as given ("name" or "name:key=value:..."), for saved caches */
    const struct ekv_policy_ops *ops;
    void *pstate;         /* policy-owned */
    uint64_t bytes_alloc; /* bytes allocated for entries + statistics */
    uint64_t peak_bytes_alloc;
    struct ekv_store_fmt fk, fv; /* storage of keys and values (params.type_k / type_v resolved) */
    const struct ekv_kv_dev *dev; /* the device that holds K and V, or NULL (the stores); row types only */
    /* Tests: called by ekv_kv_layer_policy before the policy's layer hook,
     * when layer il's statistics of the forward are complete (may read or
     * replace them: tests/test_gpu_policy.c feeds a GPU run's statistics to
     * the CPU's policy). NULL = none. */
    void (*layer_hook)(struct ekv_kv *kv, int il, void *user);
    void *layer_hook_user;
    /* A prompt read once for several caches (ekv_seq_eval_shared): for the
     * forwards of that prompt, the caches that follow this one. Each has
     * this cache's shape and storage formats and held what this one held
     * before the forward (the engine checks: all are empty); each gets the
     * same new entries, the statistics its own policy asks for from this
     * cache's attention probabilities (ekv_attn_row_stats), and its own
     * begin / layer / end hooks, so it ends as if it had read the prompt
     * alone, bit for bit. NULL / 0 otherwise (never copied or saved). */
    struct ekv_kv *const *shadows;
    int32_t n_shadows;
};

/* ---- cache (src/kv/cache.c) ---- */

/* New empty cache for the given shape with the named policy (params->policy
 * NULL or "full" = full cache). Validates parameters (budget in (0,1], ...). */
enum ekv_status ekv_kv_new(int32_t n_layer, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                           const struct ekv_kv_params *params, struct ekv_kv **out);
void ekv_kv_free(struct ekv_kv *kv);
/* *out gets a copy of src that goes on exactly as src would: entries,
 * storage, statistics, counters, parameters and the policy's state
 * (ops->clone). The copy has no device (kv->dev NULL: its owner attaches
 * its own rows) and no layer hook. The caller owns *out (ekv_kv_free). */
enum ekv_status ekv_kv_clone(const struct ekv_kv *src, struct ekv_kv **out);

/* An empty head (len 0, cap 0, as ekv_kv_new leaves it) gets room for cap
 * entries and exactly the statistics arrays of stat_flags (zeroed): what a
 * saved cache's head held (src/kv/persist.c). */
enum ekv_status ekv_kv_head_alloc(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t cap, unsigned stat_flags);

/* Makes room for `extra` more entries in every head of layer il (keeps the
 * statistics arrays required by kv->stats). */
enum ekv_status ekv_kv_reserve(struct ekv_kv *kv, int il, int32_t extra);
/* Allocates any statistics arrays newly required by kv->stats (zeroed) and
 * frees those whose flag is no longer in kv->stats (memory follows what the
 * policy uses). ekv_kv_begin calls it after the policy's begin(). */
enum ekv_status ekv_kv_ensure_stats(struct ekv_kv *kv);

/* Appends one entry at the end of a head (capacity must be reserved);
 * statistics start at zero, weight 1. With kv->dev, k and v are not read
 * (the device wrote the rows) and may be NULL. */
void ekv_kv_head_append(struct ekv_kv *kv, struct ekv_kv_head *h, const float *k, const float *v,
                        int32_t pos, uint8_t tag, const int32_t *mpos);
/* Whether the cache's keys carry M-RoPE (three position components per
 * entry, h->mpos). */
static inline bool ekv_kv_mrope(const struct ekv_kv *kv) {
    return ekv_rope_is_multi(&kv->rope);
}

/* Keeps entries with keep[j] != 0 (j < h->len), in order; the rest are
 * evicted (counted in n_evicted by their weight). Shrinks capacity when
 * much is freed. */
enum ekv_status ekv_kv_head_keep(struct ekv_kv *kv, struct ekv_kv_head *h, const uint8_t *keep);
/* Keeps the n entries at the given ascending indices. */
enum ekv_status ekv_kv_head_keep_idx(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *idx,
                                     int32_t n);
/* Merges entries: into[j] is the index of the entry that j joins (into[j]
 * == j for an entry that survives, -1 to drop j). Survivors get the
 * weight-weighted mean of K and V over themselves and their members, the sum
 * of weights, and the sum of additive statistics; members count as merged.
 * K and V are read dequantised and the survivors' means re-quantised as the
 * storage type needs (ekv_kv_head_scatter). */
enum ekv_status ekv_kv_head_merge(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into);
/* ekv_kv_head_merge with the survivors' new K and/or V given by the caller
 * instead of the weighted mean (a merging policy's own rule, e.g. keys
 * averaged after undoing RoPE): a survivor t that receives members gets row
 * t of k_set / v_set ([h->len][head_dim], indexed BEFORE compaction; rows of
 * other entries are not read). NULL k_set or v_set = the weighted mean for
 * that side. Weights, statistics and counters as ekv_kv_head_merge. */
enum ekv_status ekv_kv_head_merge_set(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into,
                                      const float *k_set, const float *v_set);
/* A merge whose means a device computes (kv->dev->merge): member weights
 * wm[len] (the mean of a side is sum wm[j] x row j / sum wm[j] over a
 * survivor and its members) and flags EKV_KV_DEV_*; the survivors' weights,
 * statistics and counters as ekv_kv_head_merge. For merge.c's rules. */
enum ekv_status ekv_kv_head_merge_dev(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into, const float *wm,
                                      unsigned flags);

/* A boolean option value of a policy spec: 1/on/true or 0/off/false into
 * *out; false for anything else (src/kv/policy.c). */
bool ekv_kv_option_bool(const char *v, bool *out);

/* ---- merging (src/kv/merge.c) ---- */

/* +merge's defaults: merge_to=key, merge_sim=0.7, merge_key=mean, merge_bias=1,
 * merge_stats=1, merge_at=all. */
/* +adakv (src/kv/adakv.c): its option (ada_floor=F), and the per-head
 * caps of one layer: head h keeps its prot[h] protected entries and
 * caps[h] - prot[h] of its m[h] candidates, ranked by score[h][0..m[h])
 * (higher first, ties: lower index). cap is the base policy's per-head
 * target. The caps sum to min(n_head_kv * cap, the layer's entries); each
 * head keeps at least floor(ada_floor * (cap - prot[h])) candidates (at
 * most m[h]); the rest go to the best scores of the whole layer. */
struct ekv_kv_adakv ekv_kv_adakv_defaults(void); /* on, ada_floor 0.2 */
/* The error for +adakv on a policy without ops->headwise, naming those with it. */
enum ekv_status ekv_kv_adakv_refused(void);
enum ekv_status ekv_kv_adakv_option(struct ekv_kv_adakv *a, const char *key, const char *value);
enum ekv_status ekv_adakv_caps(const struct ekv_kv *kv, int32_t cap, const int32_t *prot, const int32_t *m,
                               const double *const *score, int32_t *caps);
/* +adakv for the policies that keep each head's last `window` entries and
 * the best older ones by score[h] [len] (H2O, ScissorHands, VL-Cache): layer il with
 * per-head target `target`, through ekv_adakv_caps and
 * ekv_kv_head_keep_recent_top. */
enum ekv_status ekv_adakv_recent_top(struct ekv_kv *kv, int il, int32_t target, int32_t window,
                                     const double *const *score);

struct ekv_kv_merge ekv_kv_merge_defaults(void);
/* One "merge_*" option of a spec into m; EKV_ERR_INVALID_ARG names a bad key or value. */
enum ekv_status ekv_kv_merge_option(struct ekv_kv_merge *m, const char *key, const char *value);
/* ekv_kv_head_merge (into[] convention) with the merged key by `key` and,
 * when score is not NULL, member weights weight[j] x max(score[j], 0) in
 * groups whose scores sum above 0 (elastic-v2's value=attn). MEAN without
 * scores is ekv_kv_head_merge itself; ROTATE needs kv->rope. */
enum ekv_status ekv_kv_head_merge_rule(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *into,
                                       enum ekv_merge_key key, const double *score);
/* +merge: the entries with keep[j] == 0 join kept entries by kv->merge
 * (called by ekv_kv_head_keep when kv->merge.on and something is dropped). */
enum ekv_status ekv_kv_merge_dropped(struct ekv_kv *kv, struct ekv_kv_head *h, const uint8_t *keep);

/* ---- entry access (src/kv/cache.c) ----
 * The ONLY way for code outside cache.c / attend.c (policies, tests, eval)
 * to read or write cached keys and values: the storage behind a head is
 * private and becomes typed (f16, q8_0, q4_0, KIVI groups; issue 11), so
 * never touch the stores h->ks / h->vs. Reads give floats (dequantised); writes take
 * floats and quantise as the storage type needs. Positions, tags, weights
 * and statistics stay plain arrays of the head.
 *
 * Writes into a grouped layout (KIVI keys: one scale and zero point per
 * channel over a group of G entries) re-quantise each touched group once,
 * from its dequantised rows with the new rows in place, so the group's
 * other rows may move by up to one quantisation step; write all the rows
 * of a merge in one ekv_kv_head_scatter call rather than row by row. */

/* Entry j's key and/or value (either pointer may be NULL) as head_dim
 * floats. EKV_ERR_INVALID_ARG if j is not in [0, h->len). */
enum ekv_status ekv_kv_head_get(const struct ekv_kv *kv, const struct ekv_kv_head *h, int32_t j, float *k,
                                float *v);
/* Entries idx[0..n) (any order, repeats allowed; idx NULL = entries
 * 0..n-1) into k / v [n][head_dim]; either may be NULL. */
enum ekv_status ekv_kv_head_gather(const struct ekv_kv *kv, const struct ekv_kv_head *h, const int32_t *idx,
                                   int32_t n, float *k, float *v);
/* Overwrites entry j's key and/or value (NULL: that side unchanged). */
enum ekv_status ekv_kv_head_set(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t j, const float *k,
                                const float *v);
/* Overwrites entries idx[0..n) (distinct; idx NULL = entries 0..n-1) with
 * rows of k / v [n][head_dim] (NULL: that side unchanged). Validates every
 * index before writing anything. */
enum ekv_status ekv_kv_head_scatter(struct ekv_kv *kv, struct ekv_kv_head *h, const int32_t *idx, int32_t n,
                                    const float *k, const float *v);
/* Applies the storage's end-of-forward rule to every head of layer il
 * (KIVI: quantise the residual beyond R, docs/policies.md "KIVI storage"); a no-op for the
 * other types. ekv_kv_layer_forward calls it after the policy's layer(). */
enum ekv_status ekv_kv_flush(struct ekv_kv *kv, int il);
/* Bytes of K/V data held now (all layers and heads), in the real sizes of
 * the storage types. */
uint64_t ekv_kv_bytes(const struct ekv_kv *kv);
/* Bytes of K/V data a full cache (no eviction) of n tokens would hold. */
uint64_t ekv_kv_bytes_full(const struct ekv_kv *kv, int64_t n);

/* The first j in [from, len) with keep[j] != 0 (kept) or keep[j] == 0
 * (!kept), len when there is none: runs of a keep mask at memchr speed. */
int32_t ekv_keep_next(const uint8_t *keep, int32_t from, int32_t len, bool kept);

/* Zeroes the statistics arrays of every head. */
void ekv_kv_reset_stats(struct ekv_kv *kv, unsigned which);

/* The budget rule every policy uses (docs/policies.md "The budget").
 *
 * ekv_kv_budget_tokens: the uniform cap of entries per layer and KV head
 * now, min(ceil(budget * n_seen - 1e-9), max_tokens when > 0), at least 1.
 * The 1e-9 keeps budget 1.0 (and any product that is an integer up to
 * rounding) from rounding up.
 *
 * ekv_kv_budget_frac: the kept fraction in effect, min(budget,
 * max_tokens / n_seen when max_tokens > 0) (VL-Cache's alpha).
 *
 * ekv_kv_target: entries to keep now for layer il: min(len, B), at least 1,
 * where len is the longest head of the layer and B the layer budget when a
 * policy set one (kv->layers[il].budget >= 0, PyramidKV and VL-Cache; then
 * capped by max_tokens when > 0) and ekv_kv_budget_tokens otherwise. */
int64_t ekv_kv_budget_tokens(const struct ekv_kv *kv);
/* The same rule for parameters alone (ekv_kv_project): T(n) for n tokens
 * seen, at least 1 for n > 0, 0 for n <= 0. */
int64_t ekv_kv_budget_rule(const struct ekv_kv_params *p, int64_t n);
double ekv_kv_budget_frac(const struct ekv_kv *kv);
int32_t ekv_kv_target(const struct ekv_kv *kv, int il);

/* Prompt tokens per block-wise prefill chunk (params.chunk > 0), or 0 for
 * the whole prompt at once. The engine splits prompts with it. */
int32_t ekv_kv_prompt_chunk(const struct ekv_kv *kv);

/* RoPE position of the first new token of the coming forward: step->pos0,
 * unless the policy moves it (ops->rope_pos). Call before ekv_kv_begin. */
int64_t ekv_kv_rope_pos(const struct ekv_kv *kv, const struct ekv_kv_step *step);

/* ---- saved caches (src/kv/persist.c) ----
 * A cache as bytes: a head part (policy spec and resolved parameters,
 * tokens seen, statistics flags, the policy's state) and one part per
 * layer (every head's entries, statistics and K/V in their storage types,
 * bit for bit). Loaded, the cache goes on exactly as the saved one would.
 * The caller frames and checksums the parts (src/engine/seqfile.c). */
enum ekv_status ekv_kv_save_head(const struct ekv_kv *kv, struct ekv_wbuf *w);
enum ekv_status ekv_kv_save_layer(const struct ekv_kv *kv, int il, struct ekv_wbuf *w);
/* A new cache of the given shape from a head part (*out owned by the
 * caller; its layers empty until ekv_kv_load_layer); EKV_ERR_FORMAT with
 * the reason for anything inconsistent. */
enum ekv_status ekv_kv_load_head(int32_t n_layer, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                 struct ekv_rbuf *r, struct ekv_kv **out);
/* Layer il of a cache from ekv_kv_load_head (its heads still empty). */
enum ekv_status ekv_kv_load_layer(struct ekv_kv *kv, int il, struct ekv_rbuf *r);
/* Recomputes the bytes allocated from the heads (the peak at least that). */
void ekv_kv_recount(struct ekv_kv *kv);

/* ---- one forward through the cache (src/kv/attend.c) ---- */

/* Starts a forward: kv->n_seen = step->pos0 + step->n_new, policy begin(),
 * statistics arrays ensured. */
enum ekv_status ekv_kv_begin(struct ekv_kv *kv, const struct ekv_kv_step *step);

/* Layer il of the current forward: appends the n_new keys/values (positions
 * pos0.., tags from step->tags), computes causal attention of the n_new
 * queries over the layer's entries (row i sees entries with position <=
 * pos0 + i) collecting kv->stats, then calls the policy's layer().
 *   q:   [n_new][n_head][head_dim]    queries, RoPE applied
 *   k:   [n_new][n_head_kv][head_dim] keys, RoPE applied
 *   v:   [n_new][n_head_kv][head_dim]
 *   out: [n_new][n_head][head_dim]    attention output
 * Work is split over KV heads on the pool (which may be NULL). */
enum ekv_status ekv_kv_layer_forward(struct ekv_kv *kv, struct ekv_pool *pool, int il,
                                     const struct ekv_kv_step *step, const float *q, const float *k,
                                     const float *v, float *out);

/* One sequence's share of a batched layer step (ekv_kv_layer_forward_batch):
 * its cache, step and rows in the layouts of ekv_kv_layer_forward. */
struct ekv_kv_part {
    struct ekv_kv *kv;
    const struct ekv_kv_step *step;
    const float *q, *k, *v; /* [n_new][...] as above */
    float *out;
};

/* ekv_kv_layer_forward for n sequences (distinct caches) at once: appends
 * and checks each, runs the attention of every (sequence, KV head) pair as
 * one job on the pool, then each policy's layer hook in order. Results equal
 * n separate calls. */
enum ekv_status ekv_kv_layer_forward_batch(struct ekv_pool *pool, int il, const struct ekv_kv_part *parts, int n);

/* The policy's layer hook for layer il, on its own: what ekv_kv_layer_forward
 * runs after the attention unless step->defer is set. */
enum ekv_status ekv_kv_layer_policy(struct ekv_kv *kv, int il, const struct ekv_kv_step *step);

/* The first of the head's first n entries at a position >= min_pos (n when
 * none is): the first entry a query sees under a sliding window. */
int32_t ekv_kv_head_first_at(const struct ekv_kv_head *h, int32_t n, int64_t min_pos);

/* Ends a forward: policy end(). */
enum ekv_status ekv_kv_end(struct ekv_kv *kv, const struct ekv_kv_step *step);
/* Whether anything may read the statistics after this step's forward: the
 * policy's hooks (a prompt_only policy reads them at the end of a prompt
 * and at its re-selection points only: params.recompress), or a layer
 * hook. False lets a backend keep summing them where they are computed. */
bool ekv_kv_stats_read_after(const struct ekv_kv *kv, const struct ekv_kv_step *step);

/* ---- policy helpers (src/kv/policy.c) ---- */

/* Registry lookup by name; NULL if unknown. A policy spec "name:options"
 * finds the policy `name`. */
const struct ekv_policy_ops *ekv_policy_find(const char *name);
int ekv_policy_count(void);
const struct ekv_policy_ops *ekv_policy_at(int i);

/* Indices of the k largest scores among n (ties: lower index first, per
 * docs/policies.md "Ties"), written to out in ascending index order. Entries with
 * mask[j] == 0 are not candidates when mask is not NULL. Returns how many
 * were written (min(k, candidates)). */
int32_t ekv_topk(const double *score, int32_t n, int32_t k, const uint8_t *mask, int32_t *out);

/* 1-D pooling with odd kernel, padding kernel/2, stride 1: avg counts the
 * zero padding (divides by kernel), max pads with -inf. out: [n]. */
void ekv_pool1d(const double *in, int32_t n, int32_t kernel, enum ekv_pool_kind kind, double *out);

/* Reduces h to `target` entries when it holds more: the last `window`
 * entries (clamped to [0, target]) plus the top (target - window) of the
 * older entries by score [h->len] (ekv_topk's tie rule). Used by H2O and
 * ScissorHands; nothing happens when h->len <= target. */
enum ekv_status ekv_kv_head_keep_recent_top(struct ekv_kv *kv, struct ekv_kv_head *h, int32_t target,
                                            int32_t window, const double *score);

#endif
