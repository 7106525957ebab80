/*
 * budget.c — the budget rule every policy keeps, in one place: the target
 * T(n) = min(n, ceil(budget * n), max_tokens), at least 1, for n tokens
 * seen (ekv_kv_budget_rule, also used by ekv_kv_project for a cache that
 * does not exist yet), the fraction in effect, and a layer's target when a
 * policy set its own per-layer budget (PyramidKV, VL-Cache).
 * docs/policies.md "The budget" states the rule.
 */
#include <math.h>
#include <stdint.h>

#include "kv/kv.h"

int64_t ekv_kv_budget_rule(const struct ekv_kv_params *p, int64_t n) {
    if (n <= 0) return 0;
    /* the -1e-9 keeps budget * n that is an integer up to rounding (budget
     * 1.0 in particular) from rounding up */
    const double c = ceil(p->budget * (double)n - 1e-9);
    int64_t t = c > (double)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)c;
    if (t > n) t = n;
    if (p->max_tokens > 0 && p->max_tokens < t) t = p->max_tokens;
    return t < 1 ? 1 : t;
}

int64_t ekv_kv_budget_tokens(const struct ekv_kv *kv) {
    if (!kv) return 1;
    const int64_t t = ekv_kv_budget_rule(&kv->params, kv->n_seen);
    return t < 1 ? 1 : t;
}

double ekv_kv_budget_frac(const struct ekv_kv *kv) {
    if (!kv) return 1.0;
    double a = kv->params.budget;
    if (kv->params.max_tokens > 0 && kv->n_seen > 0 && (double)kv->params.max_tokens < a * (double)kv->n_seen)
        a = (double)kv->params.max_tokens / (double)kv->n_seen;
    return a;
}

int32_t ekv_kv_target(const struct ekv_kv *kv, int il) {
    if (!kv || il < 0 || il >= kv->n_layer) return 1;
    const struct ekv_kv_layer *L = &kv->layers[il];
    int64_t t = 0;
    for (int hk = 0; hk < kv->n_head_kv; hk++)
        if (L->heads[hk].len > t) t = L->heads[hk].len;
    /* a per-layer budget set by the policy (PyramidKV, VL-Cache) replaces
     * the uniform cap: lower layers may keep more */
    int64_t c = ekv_kv_budget_tokens(kv);
    if (L->budget >= 0) {
        c = L->budget;
        if (kv->params.max_tokens > 0 && kv->params.max_tokens < c) c = kv->params.max_tokens;
    }
    if (c < t) t = c;
    if (t < 1) t = 1;
    return (int32_t)t;
}
