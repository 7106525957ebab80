/*
 * group.c — a unit's cells run together (ekv_eval_unit_run_group): their
 * prompt read once (ekv_seq_eval_shared), the teacher-forced answer fed to
 * all of them one token at a time in one batch (ekv_decode_batch), the
 * greedy answers decoded in one batch per step, each cell scored by the
 * same code as a cell run alone (runner.c). The unit's full-cache reference
 * joins its first group when it waits for one (r->ref_pending): as member
 * 0 its logits of each step are stored before the cells' KL reads them,
 * and its greedy answer is known before theirs are scored. A shared prompt
 * and batched decode give every sequence the bits it would have alone, so
 * the results are ekv_eval_unit_run's; the cost is one prompt forward for
 * the group and one read of the weights per step for all its sequences.
 */
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "ekv_eval.h"
#include "eval_util.h"
#include "runner_int.h"

/* One cell of the group. */
struct member {
    bool is_ref;             /* the full-cache reference (member 0), not a cell */
    size_t idx;              /* its index in the caller's cells */
    struct ekv_ev_cell cc;   /* its scoring state */
    struct ekv_seq *seq;     /* after the shared prompt: the teacher-forced run */
    struct ekv_seq *gseq;    /* the greedy run (the copy taken after the prompt, or seq) */
    float *glg;              /* [n_vocab] the greedy run's latest logits */
    int32_t *gen;            /* [n_predict] its answer */
    int32_t n_gen;
    bool active;
};

/* Scratch of a group of n: sequences and tokens of one batch, its logits. */
struct batch {
    struct ekv_seq **seqs;   /* [n] */
    int32_t *toks;           /* [n] */
    size_t *who;             /* [n] member of each batch row */
    float *L;                /* [n][n_vocab] */
};

/* Every member's teacher-forced answer: token 0 scored from the prompt's
 * logits P, then answer token k - 1 fed to all as one batch and token k
 * scored, k = 1 .. a - 2 (as run_scored does for one sequence). */
static enum ekv_status group_scored(struct ekv_eval_runner *r, struct member *g, size_t n, struct batch *b,
                                    const float *P) {
    const struct ekv_eval_unit *u = &r->units[r->cur];
    const int32_t *ans = u->tokens + u->n_prompt;
    const int32_t a = u->n_tokens - u->n_prompt;
    const size_t V = (size_t)r->n_vocab;
    enum ekv_status s = EKV_OK;
    /* the reference (member 0) takes part when the cells' kl needs its logits */
    const size_t i0 = g[0].is_ref && !(r->cfg.metrics & EKV_METRIC_KL) ? 1 : 0;
    const size_t nb = n - i0;
    if (a >= 2 && u->score_from == 0)
        for (size_t i = i0; i < n && s == EKV_OK; i++)
            s = g[i].is_ref ? ekv_ev_ref_store(r, 0, P) : ekv_ev_score_cell(&g[i].cc, 0, P, ans[0]);
    for (int32_t k = 1; s == EKV_OK && k <= a - 2; k++) {
        for (size_t i = 0; i < nb; i++) b->seqs[i] = g[i0 + i].seq, b->toks[i] = ans[k - 1];
        if ((s = ekv_decode_batch(r->ctx, b->seqs, b->toks, (int32_t)nb, b->L)) != EKV_OK) break;
        for (size_t i = 0; k >= u->score_from && i < nb && s == EKV_OK; i++) {
            struct member *x = &g[i0 + i];
            s = x->is_ref ? ekv_ev_ref_store(r, k, b->L + i * V) : ekv_ev_score_cell(&x->cc, k, b->L + i * V, ans[k]);
        }
    }
    return s;
}

/* Every member's greedy answer from its glg, the members still generating
 * decoded as one batch per step (run_greedy's rule for each: stop before
 * an end-of-generation token or after max tokens, the last one not fed). */
static enum ekv_status group_greedy(struct ekv_eval_runner *r, struct member *g, size_t n, struct batch *b) {
    const struct ekv_eval_unit *u = &r->units[r->cur];
    const int32_t max = EV_MIN(r->cfg.n_predict, r->n_ctx - ekv_ev_unit_positions(u) + 1);
    const size_t V = (size_t)r->n_vocab;
    for (size_t i = 0; i < n; i++) g[i].n_gen = 0, g[i].active = max > 0;
    for (;;) {
        size_t nf = 0;
        for (size_t i = 0; i < n; i++) {
            if (!g[i].active) continue;
            size_t t;
            enum ekv_status s = ekv_argmax(g[i].glg, V, &t);
            if (s != EKV_OK) return s;
            if (ekv_token_is_eog(r->model, (int32_t)t)) {
                g[i].active = false;
                continue;
            }
            g[i].gen[g[i].n_gen++] = (int32_t)t;
            if (g[i].n_gen == max) {
                g[i].active = false;
                continue;
            }
            b->seqs[nf] = g[i].gseq, b->toks[nf] = (int32_t)t, b->who[nf] = i;
            nf++;
        }
        if (nf == 0) return EKV_OK;
        enum ekv_status s = ekv_decode_batch(r->ctx, b->seqs, b->toks, (int32_t)nf, b->L);
        if (s != EKV_OK) return s;
        for (size_t f = 0; f < nf; f++) memcpy(g[b->who[f]].glg, b->L + f * V, V * sizeof(float));
    }
}

/* The group's runs after its shared prompt (logits P), as ekv_ev_unit_run
 * does for each alone: hit rate and the greedy run's copy after the
 * prompt, the teacher-forced answer, the kept fraction, then the greedy
 * answers and their ROUGE (the reference's answer first, when it is member
 * 0: a cell's ROUGE needs it, as its greedy run needs a non-empty one). */
static enum ekv_status group_run(struct ekv_eval_runner *r, struct member *g, size_t n, struct ekv_eval_cell *cells,
                                 struct batch *b, const float *P) {
    const struct ekv_eval_unit *u = &r->units[r->cur];
    const unsigned m = r->cfg.metrics;
    const bool tf = m & EKV_EV_TF_METRICS, hit = m & EKV_METRIC_HITRATE;
    const bool rouge = (m & EKV_METRIC_ROUGE) && (r->ref_text || g[0].is_ref);
    const size_t V = (size_t)r->n_vocab;
    enum ekv_status s = EKV_OK;
    memcpy(r->logits, P, V * sizeof(float)); /* the prompt's logits, for the copies */
    for (size_t i = 0; i < n; i++)
        if (!g[i].is_ref)
            g[i].cc = (struct ekv_ev_cell){.r = r, .cell = &cells[g[i].idx], .u = u, .all_top1 = true, .fork = rouge};
    if (tf || hit) {
        for (size_t i = 0; i < n && s == EKV_OK; i++) {
            if (hit && !g[i].is_ref) s = ekv_ev_hitrate_cell(&g[i].cc, g[i].seq);
            if (s == EKV_OK && rouge && !(g[i].cc.fork_logits = malloc(V * sizeof(float))))
                s = ekv_error_set(EKV_ERR_NOMEM, "eval: no memory for the prompt's logits");
            if (s == EKV_OK && rouge) s = ekv_ev_fork_prompt(r, g[i].seq, &g[i].cc.forked, g[i].cc.fork_logits);
            if (s == EKV_OK && rouge && !g[i].cc.forked)
                s = ekv_error_set(EKV_ERR_INTERNAL, "eval: a sequence of a group could not be copied");
        }
        if (s == EKV_OK && tf) s = group_scored(r, g, n, b, P);
        for (size_t i = 0; i < n && s == EKV_OK; i++) {
            if (g[i].is_ref) continue;
            ekv_ev_add_kv_frac(g[i].cc.cell, g[i].seq);
            if ((m & EKV_METRIC_ACC) && g[i].cc.n_scored > 0)
                ekv_mean_add(&g[i].cc.cell->acc, g[i].cc.all_top1 ? 1.0 : 0.0);
        }
        for (size_t i = 0; i < n; i++) {
            ekv_seq_free(g[i].seq);
            g[i].seq = NULL;
            g[i].gseq = g[i].cc.forked, g[i].glg = g[i].cc.fork_logits;
            g[i].cc.forked = NULL, g[i].cc.fork_logits = NULL;
        }
    } else {
        for (size_t i = 0; i < n && s == EKV_OK; i++) { /* greedy only: it goes on from the shared prompt */
            g[i].gseq = g[i].seq, g[i].seq = NULL;
            if (!(g[i].glg = malloc(V * sizeof(float)))) s = ekv_error_set(EKV_ERR_NOMEM, "eval: out of memory");
            else memcpy(g[i].glg, P, V * sizeof(float));
        }
    }
    if (s != EKV_OK || !rouge) return s;
    for (size_t i = 0; i < n && s == EKV_OK; i++)
        if (!(g[i].gen = malloc((size_t)r->cfg.n_predict * sizeof(int32_t))))
            s = ekv_error_set(EKV_ERR_NOMEM, "eval: out of memory for %zu answers", n);
    if (s == EKV_OK) s = group_greedy(r, g, n, b);
    if (s == EKV_OK && g[0].is_ref) s = ekv_ev_ref_answer(r, g[0].gen, g[0].n_gen);
    for (size_t i = 0; i < n && s == EKV_OK && r->ref_text; i++) { /* an empty reference answer: no ROUGE */
        if (g[i].is_ref) continue;
        if (!tf && !hit) ekv_ev_add_kv_frac(g[i].cc.cell, g[i].gseq);
        s = ekv_ev_rouge_add(r, g[i].gen, g[i].n_gen, g[i].cc.cell);
    }
    return s;
}

/* Makes every cell's sequence; the cells that can join the first that can
 * lead go to g[1..], the others are flagged in alone; *ng counts the cells
 * that joined. The reference (when it waits for a group and can join)
 * becomes g[0]; *g0 is 0 then, else 1. */
static enum ekv_status group_make(struct ekv_eval_runner *r, const struct ekv_kv_params *kv, size_t n, struct member *g,
                                  size_t *ng, size_t *g0, bool *alone) {
    const struct ekv_seq *lead = NULL; /* the first cell that can share a prompt at all */
    *ng = 0;
    *g0 = 1;
    for (size_t i = 0; i < n; i++) {
        struct ekv_seq *seq = NULL;
        enum ekv_status s = ekv_seq_new(r->ctx, &kv[i], &seq);
        if (s != EKV_OK) return s;
        if (!lead && ekv_seq_can_share(seq, seq)) lead = seq;
        if (lead && ekv_seq_can_share(lead, seq)) {
            struct member *x = &g[1 + (*ng)++];
            x->idx = i, x->seq = seq;
        } else {
            ekv_seq_free(seq);
            alone[i] = true;
        }
    }
    if (!r->ref_pending || *ng < 2) return EKV_OK;
    struct ekv_seq *ref = NULL;
    enum ekv_status s = ekv_seq_new(r->ctx, NULL, &ref);
    if (s != EKV_OK) return s;
    if (ekv_seq_can_share(lead, ref)) {
        g[0].is_ref = true, g[0].seq = ref;
        *g0 = 0;
    } else {
        ekv_seq_free(ref);
    }
    return EKV_OK;
}

/* The group's prompt once for all (its last logits into P). */
static enum ekv_status group_prompt(struct ekv_eval_runner *r, struct member *g, size_t ng, struct batch *b, float *P) {
    struct ekv_segment sg;
    struct ekv_input in;
    enum ekv_status s = ekv_ev_unit_input(r, &r->units[r->cur], &sg, &in);
    for (size_t i = 0; i < ng; i++) b->seqs[i] = g[i].seq;
    return s == EKV_OK ? ekv_seq_eval_shared(b->seqs, (int32_t)ng, &in, P) : s;
}

static void group_free(struct member *g, size_t n, struct batch *b, float *P, bool *alone) {
    for (size_t i = 0; g && i < n; i++) {
        ekv_seq_free(g[i].seq);
        ekv_seq_free(g[i].gseq);
        ekv_seq_free(g[i].cc.forked);
        free(g[i].cc.fork_logits);
        free(g[i].glg);
        free(g[i].gen);
    }
    free(g);
    free(b->seqs), free(b->toks), free(b->who), free(b->L);
    free(P);
    free(alone);
}

enum ekv_status ekv_eval_unit_run_group(struct ekv_eval_runner *r, const struct ekv_kv_params *kv, size_t n,
                                        struct ekv_eval_cell *cells) {
    if (!r || (n && (!kv || !cells)) || r->cur >= r->n_units)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: no unit prepared (call ekv_eval_unit_prepare first)");
    const struct ekv_eval_unit *u = &r->units[r->cur];
    enum ekv_status s = EKV_OK;
    if (u->stream || n < 2 || r->cfg.no_fork || n >= INT32_MAX) { /* each cell alone */
        for (size_t i = 0; i < n && s == EKV_OK; i++) s = ekv_ev_unit_run(r, &kv[i], &cells[i]);
        return s;
    }
    const size_t V = (size_t)r->n_vocab, nm = n + 1; /* members: the reference's slot, then the cells */
    size_t lbytes;
    struct member *g = calloc(nm, sizeof *g);
    struct batch b = {calloc(nm, sizeof *b.seqs), calloc(nm, sizeof *b.toks), calloc(nm, sizeof *b.who), NULL};
    float *P = malloc(V * sizeof *P);
    bool *alone = calloc(n, sizeof *alone);
    if (ev_mul_ok(nm, V, &lbytes) && ev_mul_ok(lbytes, sizeof(float), &lbytes)) b.L = malloc(lbytes);
    if (!g || !b.seqs || !b.toks || !b.who || !b.L || !P || !alone)
        s = ekv_error_set(EKV_ERR_NOMEM, "eval: out of memory for a group of %zu cells", n);
    size_t ng = 0, g0 = 1;
    if (s == EKV_OK) s = group_make(r, kv, n, g, &ng, &g0, alone);
    if (s == EKV_OK && ng < 2) { /* nothing to share: all alone */
        for (size_t i = 1; i <= ng; i++) alone[g[i].idx] = true, ekv_seq_free(g[i].seq), g[i].seq = NULL;
        ng = 0;
    }
    const size_t nmem = ng + 1 - g0; /* the group's members from g[g0] */
    const bool ref_in = ng >= 2 && g0 == 0;
    if (ref_in) r->ref_pending = false;          /* it runs in this group */
    else if (s == EKV_OK) s = ekv_ev_ref_ready(r); /* before any cell, alone */
    if (s == EKV_OK && ng >= 2) s = group_prompt(r, g + g0, nmem, &b, P);
    if (s == EKV_OK && ng >= 2) s = group_run(r, g + g0, nmem, cells, &b, P);
    if (s == EKV_OK) r->n_grouped += ng;
    for (size_t i = 0; i < n && s == EKV_OK; i++)
        if (alone[i]) s = ekv_ev_unit_run(r, &kv[i], &cells[i]);
    group_free(g, nm, &b, P, alone);
    if (s != EKV_OK && ref_in) ekv_ev_ref_clear(r); /* the reference may be half made: no unit stays prepared */
    return s;
}
