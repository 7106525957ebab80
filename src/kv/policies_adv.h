/*
 * policies_adv.h — the score-based policies that need more than one
 * statistic or act across layers (RoCo, SnapKV, PyramidKV, VL-Cache,
 * Elastic Cache): their ops tables, and the pure selection / schedule
 * functions they are built from, exposed so tests can check them against
 * hand-computed vectors (docs/policies.md "Each policy's exact rule") without running a model.
 */
#ifndef EKV_POLICIES_ADV_H
#define EKV_POLICIES_ADV_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/kv.h"

extern const struct ekv_policy_ops ekv_policy_roco;
extern const struct ekv_policy_ops ekv_policy_snapkv;
extern const struct ekv_policy_ops ekv_policy_pyramidkv;
extern const struct ekv_policy_ops ekv_policy_vlcache;
extern const struct ekv_policy_ops ekv_policy_elastic;

/* ---- RoCo (roco.c) ---- */

/* One RoCo eviction round over n entries (docs/policies.md "roco"): the first
 * `sinks` and the last `window` entries are protected; the candidates are
 * the K lowest-std unprotected entries (ties: lower index first); of those
 * the E with the lowest mean are evicted (ties: lower index first).
 *   mean, std: [n]; keep: [n] out, 1 = kept.
 * K and E are capped at n - sinks - window. Returns the number evicted,
 * -1 when scratch memory cannot be allocated. */
int32_t ekv_roco_select(const double *mean, const double *std, int32_t n, int32_t sinks,
                        int32_t window, int32_t K, int32_t E, uint8_t *keep);

/* ---- SnapKV (snapkv.c), shared with PyramidKV ---- */

/* Compresses every head of layer il to at most `cap` entries, SnapKV style:
 * the trailing entries at positions >= kv->win_start form the observation
 * window and are kept; the rest are ranked by their (group-mean) winsum,
 * pooled along the key axis (kernel `pool` odd, <= 1 = none), and the top
 * (cap - window) are kept. cap <= window keeps the last cap entries. */
enum ekv_status ekv_snapkv_compress_layer(struct ekv_kv *kv, int il, int32_t cap, int32_t pool,
                                          enum ekv_pool_kind kind);

/* Resolves the SnapKV/PyramidKV defaults of kv->params (obs_window 32,
 * pool 7, max pooling) and validates them. */
enum ekv_status ekv_snapkv_configure_params(struct ekv_kv *kv);
/* begin() shared by SnapKV and PyramidKV: WINSUM over the prompt's last
 * obs_window queries, nothing at decode. */
enum ekv_status ekv_snapkv_begin_common(struct ekv_kv *kv, const struct ekv_kv_step *step);

/* ---- decode-time re-selection of SnapKV, PyramidKV, VL-Cache (snapkv.c) ----
 * params.recompress = N > 0: after the prompt, the policy re-selects with its
 * own scores whenever the tokens seen reach a multiple of N (n_seen % N ==
 * 0), so a head holds at most its budget + N entries at any time. The scores
 * are the policy's prompt scores taken over a sliding observation window:
 * winsum over the last wd = min(obs_window (default 32), N) queries before
 * that point (kv->win_start = point - wd), reset when the window opens; the
 * window's wd entries are kept, as SnapKV keeps its prompt window. */

/* Resolves params.recompress (-1 -> 32) and validates it. */
enum ekv_status ekv_recompress_configure(struct ekv_kv *kv);
/* begin() of a decode step: sets kv->win_start and kv->stats (WINSUM while
 * the step holds a query of the coming window, else nothing) and resets
 * winsum when the window opens in this step. N == 0: no statistics. */
void ekv_recompress_begin(struct ekv_kv *kv, const struct ekv_kv_step *step);
/* True when this decode step ends at or crosses a re-selection point. */
bool ekv_recompress_due(const struct ekv_kv *kv, const struct ekv_kv_step *step);

/* ---- PyramidKV (pyramidkv.c) ---- */

/* KVCache-Factory schedule (docs/policies.md "pyramidkv"): per-layer capacities for a
 * prompt of T tokens, uniform capacity C (window included), window w, L
 * layers, steepness beta. caps: [L] out, window included, layer 0 largest.
 * T < C: caps = T (no compression); T < 2(C-w) or L == 1: caps = C. */
void ekv_pyramid_caps(int32_t T, int32_t C, int32_t w, int32_t L, double beta, int32_t *caps);

/* kvpress variant (float arithmetic, round half to even): caps for a
 * compression ratio cr (fraction evicted) and window w, window included;
 * falls back to uniform round(T(1-cr)) when not T >= max >= min >= w. */
void ekv_pyramid_caps_kvpress(int32_t T, double cr, int32_t w, int32_t L, double beta, int32_t *caps);

/* ---- VL-Cache (vlcache.c) ---- */

/* Sparsity-guided layer budgets (VL-Cache Algorithm 1, docs/policies.md "vlcache"):
 * gamma [L] per-layer sparsities, alpha the mean kept fraction, m the token
 * count. beta [L] out: clip((1-gamma_l)/Z * alpha * L, 0.01, 1) with
 * Z = sum(1-gamma); k [L] out (may be NULL): max(1, floor(beta_l * m)). */
void ekv_vlcache_alloc(const double *gamma, int32_t L, double alpha, int64_t m, double *beta,
                       int32_t *k);

/* ---- Elastic Cache (elastic.c) ---- */

/* The fixed eviction point of layer il (cache index), as set at the last
 * prefill; INT32_MIN when none has been set yet. In compat_ref mode it is
 * the reference's raw value (may be negative). */
int32_t ekv_elastic_fixed_point(const struct ekv_kv *kv, int il);

#endif
