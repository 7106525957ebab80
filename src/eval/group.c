/*
 * group.c — a unit's cells run together (ekv_eval_unit_run_group): their
 * prompt read once (ekv_seq_eval_shared), the teacher-forced answer fed to
 * all of them one token at a time in one batch (ekv_decode_batch), the
 * greedy answers decoded in one batch per step, each cell scored by the
 * same code as a cell run alone (runner.c). A shared prompt and batched
 * decode give every sequence the bits it would have alone, so the results
 * are ekv_eval_unit_run's; the cost is one prompt forward for the group and
 * one read of the weights per step for all its sequences.
 */
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "ekv_eval.h"
#include "eval_util.h"
#include "runner_int.h"

/* One cell of the group. */
struct member {
    size_t idx;              /* its index in the caller's cells */
    struct ekv_ev_cell cc;   /* its scoring state */
    struct ekv_seq *seq;     /* after the shared prompt: the teacher-forced run */
    struct ekv_seq *gseq;    /* the greedy run (the copy taken after the prompt, or seq) */
    float *glg;              /* [n_vocab] the greedy run's latest logits */
    int32_t *gen;            /* [n_predict] its answer */
    int32_t n_gen;
    bool active;
};

/* Whether a cell under b can join a group led by a cell under a
 * (ekv_seq_eval_shared's conditions, from the parameters): on the CPU,
 * the whole prompt in one forward, the same storage. */
static bool can_join(const struct ekv_kv_params *a, const struct ekv_kv_params *b, const struct ekv_seq *seq) {
    return !ekv_seq_on_device(seq) && b->chunk <= 0 && a->type_k == b->type_k && a->type_v == b->type_v &&
           a->kv_group == b->kv_group && a->kv_residual == b->kv_residual;
}

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
    if (a >= 2 && u->score_from == 0)
        for (size_t i = 0; i < n && s == EKV_OK; i++) s = ekv_ev_score_cell(&g[i].cc, 0, P, ans[0]);
    for (int32_t k = 1; s == EKV_OK && k <= a - 2; k++) {
        for (size_t i = 0; i < n; i++) b->seqs[i] = g[i].seq, b->toks[i] = ans[k - 1];
        if ((s = ekv_decode_batch(r->ctx, b->seqs, b->toks, (int32_t)n, b->L)) != EKV_OK) break;
        for (size_t i = 0; k >= u->score_from && i < n && s == EKV_OK; i++)
            s = ekv_ev_score_cell(&g[i].cc, k, b->L + i * V, ans[k]);
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
 * answers and their ROUGE. */
static enum ekv_status group_run(struct ekv_eval_runner *r, struct member *g, size_t n, struct ekv_eval_cell *cells,
                                 struct batch *b, const float *P) {
    const struct ekv_eval_unit *u = &r->units[r->cur];
    const unsigned m = r->cfg.metrics;
    const bool tf = m & EKV_EV_TF_METRICS, hit = m & EKV_METRIC_HITRATE, rouge = (m & EKV_METRIC_ROUGE) && r->ref_text;
    const size_t V = (size_t)r->n_vocab;
    enum ekv_status s = EKV_OK;
    memcpy(r->logits, P, V * sizeof(float)); /* the prompt's logits, for the copies */
    for (size_t i = 0; i < n; i++)
        g[i].cc = (struct ekv_ev_cell){.r = r, .cell = &cells[g[i].idx], .u = u, .all_top1 = true, .fork = rouge};
    if (tf || hit) {
        for (size_t i = 0; i < n && s == EKV_OK; i++) {
            if (hit) s = ekv_ev_hitrate_cell(&g[i].cc, g[i].seq);
            if (s == EKV_OK && rouge && !(g[i].cc.fork_logits = malloc(V * sizeof(float))))
                s = ekv_error_set(EKV_ERR_NOMEM, "eval: no memory for the prompt's logits");
            if (s == EKV_OK && rouge) s = ekv_ev_fork_prompt(r, g[i].seq, &g[i].cc.forked, g[i].cc.fork_logits);
            if (s == EKV_OK && rouge && !g[i].cc.forked)
                s = ekv_error_set(EKV_ERR_INTERNAL, "eval: a sequence of a group could not be copied");
        }
        if (s == EKV_OK && tf) s = group_scored(r, g, n, b, P);
        for (size_t i = 0; i < n && s == EKV_OK; i++) {
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
    for (size_t i = 0; i < n && s == EKV_OK; i++) {
        if (!tf && !hit) ekv_ev_add_kv_frac(g[i].cc.cell, g[i].gseq);
        s = ekv_ev_rouge_add(r, g[i].gen, g[i].n_gen, g[i].cc.cell);
    }
    return s;
}

/* Makes every cell's sequence; those that can join the first eligible
 * one go to g (*ng of them), the others' indices are flagged in alone. */
static enum ekv_status group_make(struct ekv_eval_runner *r, const struct ekv_kv_params *kv, size_t n, struct member *g,
                                  size_t *ng, bool *alone) {
    size_t lead = n;
    *ng = 0;
    for (size_t i = 0; i < n; i++) {
        struct ekv_seq *seq = NULL;
        enum ekv_status s = ekv_seq_new(r->ctx, &kv[i], &seq);
        if (s != EKV_OK) return s;
        if (lead == n && !ekv_seq_on_device(seq) && kv[i].chunk <= 0) lead = i;
        if (lead < n && can_join(&kv[lead], &kv[i], seq)) {
            g[*ng].idx = i, g[*ng].seq = seq;
            (*ng)++;
        } else {
            ekv_seq_free(seq);
            alone[i] = true;
        }
    }
    return EKV_OK;
}

/* The group's prompt once for all (its last logits into P). */
static enum ekv_status group_prompt(struct ekv_eval_runner *r, struct member *g, size_t ng, struct batch *b, float *P) {
    const struct ekv_eval_unit *u = &r->units[r->cur];
    struct ekv_segment sg = {.tokens = u->tokens, .n = u->n_prompt, .tag = EKV_TAG_TEXT};
    const struct ekv_segment *segs = &sg;
    int32_t ns = 1;
    enum ekv_status s = u->n_image > 0 ? ekv_prompt_segments(r->prompt, &segs, &ns) : EKV_OK;
    struct ekv_input in = {.segs = segs, .n_segs = ns, .is_prompt = true};
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
    if (u->stream || n < 2 || r->cfg.no_fork || n > INT32_MAX) { /* each cell alone */
        for (size_t i = 0; i < n && s == EKV_OK; i++) s = ekv_ev_unit_run(r, &kv[i], &cells[i]);
        return s;
    }
    const size_t V = (size_t)r->n_vocab;
    size_t lbytes;
    struct member *g = calloc(n, sizeof *g);
    struct batch b = {calloc(n, sizeof *b.seqs), calloc(n, sizeof *b.toks), calloc(n, sizeof *b.who), NULL};
    float *P = malloc(V * sizeof *P);
    bool *alone = calloc(n, sizeof *alone);
    if (ev_mul_ok(n, V, &lbytes) && ev_mul_ok(lbytes, sizeof(float), &lbytes)) b.L = malloc(lbytes);
    if (!g || !b.seqs || !b.toks || !b.who || !b.L || !P || !alone)
        s = ekv_error_set(EKV_ERR_NOMEM, "eval: out of memory for a group of %zu cells", n);
    size_t ng = 0;
    if (s == EKV_OK) s = group_make(r, kv, n, g, &ng, alone);
    if (s == EKV_OK && ng < 2) { /* nothing to share: all alone */
        for (size_t i = 0; i < ng; i++) alone[g[i].idx] = true;
        for (size_t i = 0; i < ng; i++) ekv_seq_free(g[i].seq), g[i].seq = NULL;
        ng = 0;
    }
    if (s == EKV_OK && ng >= 2) s = group_prompt(r, g, ng, &b, P);
    if (s == EKV_OK && ng >= 2) s = group_run(r, g, ng, cells, &b, P);
    if (s == EKV_OK) r->n_grouped += ng;
    for (size_t i = 0; i < n && s == EKV_OK; i++)
        if (alone[i]) s = ekv_ev_unit_run(r, &kv[i], &cells[i]);
    group_free(g, n, &b, P, alone);
    return s;
}
