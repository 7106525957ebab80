/*
 * policy.c — the registry of KV-cache policies (adding a policy is one file
 * plus one line in the table below), the public parameter defaults and
 * policy listing of include/ekv.h. The selection helpers the policies share
 * (top-k, pooling, option values) are in select.c; each policy's own
 * parameters, defaults and checks are in its file (configure()).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "kv/kv.h"

extern const struct ekv_policy_ops ekv_policy_full;
extern const struct ekv_policy_ops ekv_policy_random;
extern const struct ekv_policy_ops ekv_policy_local;
extern const struct ekv_policy_ops ekv_policy_h2o;
extern const struct ekv_policy_ops ekv_policy_scissorhands;
extern const struct ekv_policy_ops ekv_policy_tova;
extern const struct ekv_policy_ops ekv_policy_roco;
extern const struct ekv_policy_ops ekv_policy_snapkv;
extern const struct ekv_policy_ops ekv_policy_pyramidkv;
extern const struct ekv_policy_ops ekv_policy_vlcache;
extern const struct ekv_policy_ops ekv_policy_elastic;
extern const struct ekv_policy_ops ekv_policy_elastic_v2;

static const struct ekv_policy_ops *const g_policies[] = {
    &ekv_policy_full,      &ekv_policy_random,    &ekv_policy_local,     &ekv_policy_h2o,
    &ekv_policy_scissorhands, &ekv_policy_tova,   &ekv_policy_roco,      &ekv_policy_snapkv,
    &ekv_policy_pyramidkv, &ekv_policy_vlcache,   &ekv_policy_elastic,   &ekv_policy_elastic_v2,
};

const struct ekv_policy_ops *ekv_policy_find(const char *name) {
    if (!name) return NULL;
    const size_t n = strcspn(name, ":+"); /* "name", "name+merge", "name:options" */
    for (size_t i = 0; i < EKV_ARRAY_LEN(g_policies); i++)
        if (strlen(g_policies[i]->name) == n && strncmp(g_policies[i]->name, name, n) == 0) return g_policies[i];
    return NULL;
}

int ekv_policy_count(void) { return (int)EKV_ARRAY_LEN(g_policies); }

const struct ekv_policy_ops *ekv_policy_at(int i) {
    if (i < 0 || i >= ekv_policy_count()) return NULL;
    return g_policies[i];
}

int ekv_kv_policy_count(void) { return ekv_policy_count(); }

const char *ekv_kv_policy_name(int i) {
    const struct ekv_policy_ops *o = ekv_policy_at(i);
    return o ? o->name : NULL;
}

const char *ekv_kv_policy_summary(int i) {
    const struct ekv_policy_ops *o = ekv_policy_at(i);
    return o ? (o->summary ? o->summary : "") : NULL;
}

/* Defaults: the full cache. Integer knobs are -1 and real knobs NaN, which
 * each policy's configure() replaces by its default (docs/policies.md "Each policy's exact rule"). pool_kind
 * has no "unset" value in its enum: it defaults to EKV_POOL_MAX (SnapKV's
 * LongBench configuration, k = 7 maxpool), and a policy that wants another
 * default must be given pool_kind explicitly. */
struct ekv_kv_params ekv_kv_default_params(void) {
    struct ekv_kv_params p;
    memset(&p, 0, sizeof p);
    p.policy = "full";
    p.budget = 1.0;
    p.max_tokens = 0;
    p.sinks = -1;
    p.window = -1;
    p.obs_window = -1;
    p.pool = -1;
    p.pool_kind = EKV_POOL_MAX;
    p.distance = -1;
    p.chunk = -1;
    p.beta = NAN;
    p.sparsity_p = NAN;
    p.recent_ratio = NAN;
    p.recompress = -1;
    p.seed = 0;
    p.compat_ref = false;
    p.type_k = EKV_KV_DEFAULT;
    p.type_v = EKV_KV_DEFAULT;
    p.kv_group = -1;
    p.kv_residual = -1;
    return p;
}
