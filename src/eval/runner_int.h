/*
 * runner_int.h — the per-cell pieces of runner.c that group.c reuses to run
 * a unit's cells together (private to the evaluation library).
 */
#ifndef EKV_EVAL_RUNNER_INT_H
#define EKV_EVAL_RUNNER_INT_H

#include "ekv.h"
#include "ekv_eval.h"

/* Metrics that need the teacher-forced run. */
#define EKV_EV_TF_METRICS (EKV_METRIC_PPL | EKV_METRIC_KL | EKV_METRIC_ACC)

/* One cell's run on the prepared unit: what its scoring callbacks need. */
struct ekv_ev_cell {
    struct ekv_eval_runner *r;
    struct ekv_eval_cell *cell;
    const struct ekv_eval_unit *u;
    int32_t n_scored;       /* acc: tokens scored in this unit */
    bool all_top1;          /* acc: every one of them was the argmax */
    bool fork;              /* rouge too: copy the sequence after its prompt */
    struct ekv_seq *forked; /* that copy (NULL: the copy was not possible) */
    float *fork_logits;     /* [n_vocab] the prompt's last logits, for the copy */
};

/* Positions of a unit's prompt (tokens and image rows). */
static inline int32_t ekv_ev_unit_positions(const struct ekv_eval_unit *u) { return u->n_prompt + u->n_image; }

/* A JSONL unit's prompt as one input: its tokens, or the prepared
 * prompt's text and image segments (sg holds the text-only segment). */
enum ekv_status ekv_ev_unit_input(const struct ekv_eval_runner *r, const struct ekv_eval_unit *u,
                                  struct ekv_segment *sg, struct ekv_input *in);
/* Scores answer token `target` (index idx) from logits into the cell of
 * ud (a struct ekv_ev_cell): ppl, acc, kl against the reference. */
enum ekv_status ekv_ev_score_cell(void *ud, int32_t idx, const float *logits, int32_t target);
/* Hit rate of seq's kept prompt entries against the reference attention. */
enum ekv_status ekv_ev_hitrate_cell(void *ud, struct ekv_seq *seq);
/* A copy of seq (which has just read its prompt) into *out and r->logits
 * (the prompt's last logits) into logits; a sequence that cannot be copied
 * leaves *out NULL (not an error). */
enum ekv_status ekv_ev_fork_prompt(const struct ekv_eval_runner *r, struct ekv_seq *seq, struct ekv_seq **out,
                                   float *logits);
/* The cache's kept fraction and bytes at the end of a run into cell. */
void ekv_ev_add_kv_frac(struct ekv_eval_cell *cell, const struct ekv_seq *seq);
/* Detokenises gen[0..n) and adds its ROUGE-L against the reference answer. */
enum ekv_status ekv_ev_rouge_add(struct ekv_eval_runner *r, const int32_t *gen, int32_t n, struct ekv_eval_cell *cell);
/* The full-cache reference's logits of scored position idx (kl). */
enum ekv_status ekv_ev_ref_store(struct ekv_eval_runner *r, int32_t idx, const float *logits);
/* The full-cache reference's greedy answer gen[0..n) as r->ref_text (left
 * NULL when ROUGE cannot score it). */
enum ekv_status ekv_ev_ref_answer(struct ekv_eval_runner *r, const int32_t *gen, int32_t n);
/* Runs the reference's teacher-forced and greedy runs now when they wait
 * for a group (r->ref_pending); on failure no unit stays prepared. */
enum ekv_status ekv_ev_ref_ready(struct ekv_eval_runner *r);
/* Drops the prepared unit's reference (no unit is prepared afterwards). */
void ekv_ev_ref_clear(struct ekv_eval_runner *r);
/* ekv_eval_unit_run's work (arguments checked by the caller). */
enum ekv_status ekv_ev_unit_run(struct ekv_eval_runner *r, const struct ekv_kv_params *kv, struct ekv_eval_cell *cell);

#endif
