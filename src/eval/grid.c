/*
 * grid.c — an evaluation's cells and their results: the policies x budgets
 * grid (`ekv eval --kv-policy ... --kv-budget ...`), the check that every
 * cell makes a sequence before any work, the whole grid run units outer
 * (each full-cache reference built once, the cells in groups that share
 * a unit's prompt and decode steps: ekv_eval_unit_run_group), and a cell's
 * accumulators as report rows. The per-unit protocols are in runner.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "ekv_eval.h"
#include "eval_util.h"

enum ekv_status ekv_eval_cell_report(const struct ekv_eval_cell *c, unsigned m, const char *policy, double budget,
                                     struct ekv_report *rep) {
    return ekv_eval_cell_report_kv(c, m, policy, NULL, budget, rep);
}

enum ekv_status ekv_eval_cell_report_kv(const struct ekv_eval_cell *c, unsigned m, const char *policy,
                                        const char *kv_type, double budget, struct ekv_report *rep) {
    enum ekv_status s = EKV_OK;
    if ((m & EKV_METRIC_PPL) && c->ppl.n_tokens) {
        double v;
        if ((s = ekv_ppl_value(&c->ppl, &v)) == EKV_OK) s = ekv_report_add_kv(rep, policy, kv_type, budget, "ppl", v, c->ppl.n_tokens);
    }
    if (s == EKV_OK && (m & EKV_METRIC_ROUGE) && c->rouge_f.n) {
        s = ekv_report_add_kv(rep, policy, kv_type, budget, "rouge_l_f", ekv_mean_value(&c->rouge_f), c->rouge_f.n);
        if (s == EKV_OK) s = ekv_report_add_kv(rep, policy, kv_type, budget, "rouge_l_p", ekv_mean_value(&c->rouge_p), c->rouge_p.n);
        if (s == EKV_OK) s = ekv_report_add_kv(rep, policy, kv_type, budget, "rouge_l_r", ekv_mean_value(&c->rouge_r), c->rouge_r.n);
    }
    if (s == EKV_OK && (m & EKV_METRIC_KL) && c->kl.n_positions) {
        double kl, top1;
        if ((s = ekv_kl_result(&c->kl, &kl, &top1)) == EKV_OK) s = ekv_report_add_kv(rep, policy, kv_type, budget, "kl", kl, c->kl.n_positions);
        if (s == EKV_OK) s = ekv_report_add_kv(rep, policy, kv_type, budget, "top1", top1, c->kl.n_positions);
    }
    if (s == EKV_OK && (m & EKV_METRIC_ACC) && c->acc.n)
        s = ekv_report_add_kv(rep, policy, kv_type, budget, "acc", ekv_mean_value(&c->acc), c->acc.n);
    if (s == EKV_OK && (m & EKV_METRIC_HITRATE) && c->hit_rate.n) {
        s = ekv_report_add_kv(rep, policy, kv_type, budget, "hit_rate", ekv_mean_value(&c->hit_rate), c->hit_rate.n);
        if (s == EKV_OK) s = ekv_report_add_kv(rep, policy, kv_type, budget, "jaccard", ekv_mean_value(&c->jaccard), c->jaccard.n);
    }
    if (s == EKV_OK && c->kv_frac.n)
        s = ekv_report_add_kv(rep, policy, kv_type, budget, "kv_frac", ekv_mean_value(&c->kv_frac), c->kv_frac.n);
    if (s == EKV_OK && c->kv_bytes.n)
        s = ekv_report_add_kv(rep, policy, kv_type, budget, "kv_bytes", ekv_mean_value(&c->kv_bytes), c->kv_bytes.n);
    if (s == EKV_OK && c->kv_bytes_frac.n)
        s = ekv_report_add_kv(rep, policy, kv_type, budget, "kv_bytes_frac", ekv_mean_value(&c->kv_bytes_frac), c->kv_bytes_frac.n);
    return s;
}

enum ekv_status ekv_eval_grid(char *const *policies, size_t n_policies, const double *budgets, size_t n_budgets,
                              struct ekv_eval_grid_cell **cells, size_t *n_cells) {
    *cells = NULL;
    *n_cells = 0;
    if (!policies || !budgets || n_policies == 0 || n_budgets == 0)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "eval grid: no policy or no budget");
    size_t cap;
    if (!ev_mul_ok(n_policies, n_budgets, &cap)) return ekv_error_set(EKV_ERR_OVERFLOW, "eval grid too large");
    struct ekv_eval_grid_cell *c = calloc(cap, sizeof *c);
    if (!c) return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    size_t n = 0;
    for (size_t p = 0; p < n_policies; p++) {
        int found = 0;
        const size_t nl = strcspn(policies[p], ":+"); /* a spec "name+merge:options" names the policy `name` */
        for (int i = 0; i < ekv_kv_policy_count(); i++)
            found |= strlen(ekv_kv_policy_name(i)) == nl && !strncmp(policies[p], ekv_kv_policy_name(i), nl);
        if (!found || strlen(policies[p]) >= sizeof c->policy) {
            free(c);
            return ekv_error_set(EKV_ERR_INVALID_ARG, "eval grid: unknown policy '%s'", policies[p]);
        }
        bool full = !strcmp(policies[p], "full");
        for (size_t b = 0; b < (full ? 1 : n_budgets); b++) {
            snprintf(c[n].policy, sizeof c[n].policy, "%s", policies[p]);
            c[n].budget = full ? 1.0 : budgets[b];
            n++;
        }
    }
    *cells = c;
    *n_cells = n;
    return EKV_OK;
}

enum ekv_status ekv_eval_grid_check(struct ekv_eval_runner *r, const struct ekv_kv_params *base,
                                    const struct ekv_eval_grid_cell *cells, size_t n_cells) {
    if (!r || !base || (!cells && n_cells)) return ekv_error_set(EKV_ERR_INVALID_ARG, "eval grid: NULL argument");
    for (size_t c = 0; c < n_cells; c++) {
        struct ekv_kv_params kv = *base;
        kv.policy = cells[c].policy;
        kv.budget = cells[c].budget;
        struct ekv_seq *seq = NULL;
        enum ekv_status s = ekv_seq_new(r->ctx, &kv, &seq);
        ekv_seq_free(seq);
        if (s != EKV_OK) return ekv_error_prefix(s, "%s at budget %g", cells[c].policy, cells[c].budget);
    }
    return EKV_OK;
}

enum ekv_status ekv_eval_run_grid(struct ekv_eval_runner *r, const struct ekv_kv_params *base,
                                  const struct ekv_eval_grid_cell *cells, size_t n_cells, struct ekv_eval_cell *out,
                                  ekv_eval_progress_fn progress, void *user) {
    if (!r || !base || !cells || !out) return ekv_error_set(EKV_ERR_INVALID_ARG, "eval grid: NULL argument");
    enum ekv_status s0 = ekv_eval_grid_check(r, base, cells, n_cells);
    if (s0 != EKV_OK) return s0;
    for (size_t c = 0; c < n_cells; c++) ekv_eval_cell_init(&out[c]);
    const size_t group = r->cfg.share > 1 ? (size_t)r->cfg.share : 1;
    struct ekv_kv_params *kv = calloc(group, sizeof *kv);
    if (!kv) return ekv_error_set(EKV_ERR_NOMEM, "eval grid: out of memory");
    enum ekv_status s = EKV_OK;
    for (size_t u = 0; u < r->n_units && s == EKV_OK; u++) {
        if ((s = ekv_eval_unit_prepare(r, u)) != EKV_OK) {
            s = ekv_error_prefix(s, "full-cache reference of unit %zu", u);
            break;
        }
        for (size_t c0 = 0; c0 < n_cells && s == EKV_OK; c0 += group) { /* cells in groups sharing a prompt */
            const size_t n = EV_MIN(group, n_cells - c0);
            for (size_t i = 0; i < n; i++) {
                kv[i] = *base;
                kv[i].policy = cells[c0 + i].policy;
                kv[i].budget = cells[c0 + i].budget;
            }
            if ((s = ekv_eval_unit_run_group(r, kv, n, out + c0)) != EKV_OK)
                s = ekv_error_prefix(s, "cells %zu-%zu (%s ...), unit %zu", c0, c0 + n - 1, cells[c0].policy, u);
        }
        if (s == EKV_OK && progress) progress(user, u + 1, r->n_units, u);
    }
    free(kv);
    return s;
}
