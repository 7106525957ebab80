/*
 * ekv_eval.h — the public API of libekv_eval, the evaluation library behind
 * `ekv eval` (a front end built on include/ekv.h only):
 * quality metrics (ROUGE-L, perplexity, KL, top-1 agreement, cache hit
 * rate, Jaccard), evaluation-set readers (JSONL and plain text with
 * --offset/--limit), result writers (CSV, JSON, Markdown, gnuplot PNGs),
 * and the runner (runner.c) that drives a model through include/ekv.h for
 * each item and policy. The CLI (tools/ekv/cmd_eval.c) parses options and
 * calls these functions; nothing here prints, every failure returns a
 * status and sets ekv_last_error().
 *
 * Protocols follow docs/policies.md "Evaluation protocols"; what each metric computes exactly is
 * written next to its function.
 */
#ifndef EKV_EVAL_PUBLIC_H
#define EKV_EVAL_PUBLIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ekv.h"

/*
 * The CLI (tools/ekv/cmd_eval.c; `ekv eval --help` is the reference):
 *
 *   ekv eval [-m MODEL] [-f DATA] [--metric ppl,rouge,kl,hitrate]
 *            [--kv-policy LIST] [--kv-budget LIST] [other --kv-* flags]
 *            [--format jsonl|text|auto] [--doc-sep S] [--rouge pltrdy|sentence]
 *            [--limit N] [--offset N] [-n N] [--stride N] [-c N]
 *            [-o DIR] [--no-plot] [--json] [-t N] [-s SEED]
 *            [--mmproj FILE] [--image-dir DIR] [--chat-template T]
 *
 *   Defaults: the bundled model and data/tinystories_eval.jsonl, metrics
 *   ppl,rouge,kl, policies full,local,h2o,elastic, budgets 0.2,0.5,1,
 *   -n 128, --stride 96, -c the model file's context, -o eval-out.
 *   Policies x budgets run as a grid ("full" once, at budget 1); the
 *   protocols are those of ekv_eval_unit_run below. DIR receives
 *   results.csv (deterministic: no timings), results.json (with timings in
 *   "meta"), results.md and one gnuplot PNG per metric; the Markdown table
 *   (or the JSON with --json) goes to stdout, progress with ETA to stderr.
 *   Exit status 0 on success, 1 on bad usage or failure, 2 when results
 *   were written but plotting failed. Items with an "image" need --mmproj
 *   (the vision tower); the image's embeddings are part of the prompt.
 */

/* ------------------------------------------------------------------------ */
/* ROUGE-L                                                                    */
/* ------------------------------------------------------------------------ */

enum ekv_rouge_kind {
    /* pltrdy `rouge` 1.0.1 "rouge-l" (the ElasticCache protocol, default):
     * both texts are cut into "sentences" at every '.', segments of length 0
     * are dropped, each kept segment is split on (Unicode) whitespace, and a
     * segment with no words counts as one empty word "" (as Python's
     * " ".join(s.split()).split(" ") gives). With set semantics:
     *   n = number of distinct hypothesis words, m = distinct reference words,
     *   U = union over reference sentences r and hypothesis sentences c of the
     *       set of words on the LCS(r, c) path that pltrdy's back-tracking
     *       picks (diagonal on match, else up if T[i-1][j] > T[i][j-1],
     *       else left; r indexes rows),
     *   P = |U|/n, R = |U|/m, F = 2PR/(P+R+1e-8).
     * Identical texts give F = 2/(2+1e-8) = 0.999999995. No lowercasing, no
     * stemming. */
    EKV_ROUGE_PLTRDY = 0,
    /* Plain sentence-level ROUGE-L (Lin 2004, beta = 1): the whole text is
     * one sequence of whitespace-separated words (no '.' splitting, counts
     * with multiplicity), L = LCS length, P = L/|hyp|, R = L/|ref|,
     * F = 2PR/(P+R) (0 when L = 0). Identical texts give exactly 1. */
    EKV_ROUGE_SENTENCE = 1,
};

struct ekv_rouge {
    double p, r, f;
    size_t hyp_len;  /* n: words (distinct words for PLTRDY)            */
    size_t ref_len;  /* m: words (distinct words for PLTRDY)            */
    size_t overlap;  /* LCS length, or |U| for PLTRDY                   */
};

/* Scores hypothesis `hyp` against reference `ref` (NUL-terminated UTF-8).
 * An empty hypothesis or reference (PLTRDY: no non-empty '.'-segment;
 * SENTENCE: no word) is EKV_ERR_INVALID_ARG, as pltrdy raises ValueError.
 * A text longer than EKV_ROUGE_MAX_BYTES, or a sentence pair whose LCS
 * table would exceed EKV_ROUGE_MAX_CELLS cells, is EKV_ERR_INVALID_ARG
 * (pltrdy itself fails on long sentence pairs: its back-tracking recurses
 * once per path step, up to the two sentences' word counts summed, and hits
 * Python's default recursion limit of 1000). */
#define EKV_ROUGE_MAX_BYTES ((size_t)1 << 20)
#define EKV_ROUGE_MAX_CELLS ((size_t)1 << 26)
enum ekv_status ekv_rouge_l(enum ekv_rouge_kind kind, const char *hyp,
                            const char *ref, struct ekv_rouge *out);

/* Parses "pltrdy" or "sentence". */
enum ekv_status ekv_rouge_kind_parse(const char *s, enum ekv_rouge_kind *out);
const char *ekv_rouge_kind_name(enum ekv_rouge_kind kind);

/* ------------------------------------------------------------------------ */
/* Perplexity                                                                 */
/* ------------------------------------------------------------------------ */

/* Token-weighted negative log-likelihood accumulator. Pool items by adding
 * all their tokens to one accumulator (ElasticCache's eval_ppl.py pools all
 * scored tokens of all items) or merge per-item accumulators. */
struct ekv_ppl_acc {
    double nll_sum;   /* sum of -log p(target) in nats */
    size_t n_tokens;
};

void ekv_ppl_init(struct ekv_ppl_acc *acc);

/* -log softmax(logits)[target], computed in double with log-sum-exp:
 * lse = max + log(sum exp(x - max)), nll = lse - x[target].
 * logits: [n_vocab]. NaN or +inf logits are EKV_ERR_INVALID_ARG; -inf
 * logits are allowed (masked tokens) and give nll = +inf when targeted. */
enum ekv_status ekv_nll_from_logits(const float *logits, size_t n_vocab,
                                    int32_t target, double *nll);

/* Adds one scored token; *nll_out (may be NULL) receives its NLL. */
enum ekv_status ekv_ppl_add_logits(struct ekv_ppl_acc *acc, const float *logits,
                                   size_t n_vocab, int32_t target, double *nll_out);
/* Adds a precomputed NLL (must be >= 0 and not NaN). */
enum ekv_status ekv_ppl_add_nll(struct ekv_ppl_acc *acc, double nll);
void ekv_ppl_merge(struct ekv_ppl_acc *dst, const struct ekv_ppl_acc *src);
/* exp(nll_sum / n_tokens); EKV_ERR_INVALID_ARG when no token was added. */
enum ekv_status ekv_ppl_value(const struct ekv_ppl_acc *acc, double *ppl);
enum ekv_status ekv_ppl_mean_nll(const struct ekv_ppl_acc *acc, double *mean_nll);

/* ------------------------------------------------------------------------ */
/* Distribution agreement: KL and top-1                                       */
/* ------------------------------------------------------------------------ */

/* KL(P || Q) = sum_i p_i (log p_i - log q_i) with P = softmax(logits_p),
 * Q = softmax(logits_q), in double via log-softmax. Terms with p_i = 0 are
 * 0; p_i > 0 with q_i = 0 gives +inf. Rounding can make the sum a tiny
 * negative number; it is clamped at 0. For ekv's `kl` metric P is the
 * full-cache distribution and Q the policy's. Logits as for
 * ekv_nll_from_logits; both [n_vocab]. */
enum ekv_status ekv_kl_from_logits(const float *logits_p, const float *logits_q,
                                   size_t n_vocab, double *kl);

/* Index of the largest logit; the lowest index among equal maxima (as
 * torch.argmax). NaN logits are EKV_ERR_INVALID_ARG. */
enum ekv_status ekv_argmax(const float *logits, size_t n_vocab, size_t *idx);

/* Mean KL and top-1 agreement over teacher-forced positions. */
struct ekv_kl_acc {
    double kl_sum;
    size_t n_positions;
    size_t top1_agree;  /* positions where argmax(full) == argmax(policy) */
};
/* ------------------------------------------------------------------------ */
/* Paired bootstrap: a perplexity ratio, a difference of means             */
/* ------------------------------------------------------------------------ */

/* The PPL of A over the PPL of B on the same n units (unit i: NLL sums
 * nll_a[i], nll_b[i] over tok[i] scored tokens, the same tokens for both),
 * pooled as the PPL is (exp(sum nll / sum tokens)): *ratio on all units,
 * and the 95 % percentile interval [*lo, *hi] of the ratio over `resamples`
 * resamplings of the units with replacement (the same units for A and B:
 * paired), drawn by a fixed generator from seed (the same interval on every
 * run). A resample without a scored token is drawn again. n >= 1,
 * resamples >= 1; every tok[i] counted, at least one > 0. */
enum ekv_status ekv_bootstrap_ppl_ratio(const double *nll_a, const double *nll_b, const size_t *tok, size_t n,
                                        size_t resamples, uint64_t seed, double *ratio, double *lo, double *hi);

/* The mean of a[i] - b[i] over n paired units (a per-unit score such as
 * accuracy or ROUGE-L F of two policies on the same units) in *diff, and
 * its 95 % percentile interval [*lo, *hi] over `resamples` resamplings of
 * the units with replacement, drawn by the same fixed generator as
 * ekv_bootstrap_ppl_ratio (the same seed draws the same units). n >= 1,
 * resamples >= 1, every value finite. */
enum ekv_status ekv_bootstrap_mean_diff(const double *a, const double *b, size_t n, size_t resamples, uint64_t seed,
                                        double *diff, double *lo, double *hi);

void ekv_kl_init(struct ekv_kl_acc *acc);
enum ekv_status ekv_kl_add(struct ekv_kl_acc *acc, const float *logits_full,
                           const float *logits_policy, size_t n_vocab);
void ekv_kl_merge(struct ekv_kl_acc *dst, const struct ekv_kl_acc *src);
/* Mean KL and top-1 fraction; EKV_ERR_INVALID_ARG when empty. */
enum ekv_status ekv_kl_result(const struct ekv_kl_acc *acc, double *mean_kl,
                              double *top1);

/* ------------------------------------------------------------------------ */
/* Kept-token agreement: top-k, Jaccard, cache hit rate                       */
/* ------------------------------------------------------------------------ */

/* The k largest scores, ranked by score descending then index ascending
 * (docs/policies.md "Ties"); out receives the k indices in ascending order.
 * scores: [n]; out: [k]; k <= n. NaN scores are EKV_ERR_INVALID_ARG. */
enum ekv_status ekv_topk_indices(const float *scores, size_t n, size_t k,
                                 uint32_t *out);

/* |A ∩ B| / |A ∪ B| with set semantics (duplicates are ignored; inputs need
 * not be sorted). Two empty sets give 1. */
enum ekv_status ekv_jaccard(const uint32_t *a, size_t na, const uint32_t *b,
                            size_t nb, double *out);

/*
 * Agreement of the tokens a policy kept with the next query's full
 * attention, for one (layer, head) at one step.
 *   attn_full: [n] post-softmax attention of the next query (the first
 *              decoding token in VL-Cache) over the n uncompressed cache
 *              positions, computed with the full cache;
 *   kept:      [n_kept] positions (0..n-1) the policy kept (distinct);
 *   k:         size of the "ideal" set S* = top-k of attn_full (ties: docs/policies.md "Ties");
 *              0 means k = n_kept, the comparison both papers make.
 * Outputs (any may be NULL):
 *   hit_rate:  VL-Cache Definition 3.1, |S ∩ S*| / |S*|  (S = kept);
 *   jaccard:   RoCo (the EasyKV paper's §4.3), |S ∩ S*| / |S ∪ S*|;
 *   mass:      sum of attn_full over S / sum of attn_full over all n (the
 *              attention mass the kept tokens would receive; not from either
 *              paper, reported as a diagnostic).
 * Positions >= n or duplicates in kept are EKV_ERR_INVALID_ARG.
 */
enum ekv_status ekv_kept_agreement(const float *attn_full, size_t n,
                                   const uint32_t *kept, size_t n_kept, size_t k,
                                   double *hit_rate, double *jaccard, double *mass);

/* Plain running mean, for averaging per-(layer, head, step) values. */
struct ekv_mean_acc {
    double sum;
    size_t n;
};
static inline void ekv_mean_add(struct ekv_mean_acc *a, double v) { a->sum += v; a->n++; }
static inline double ekv_mean_value(const struct ekv_mean_acc *a) {
    return a->n ? a->sum / (double)a->n : 0.0;
}

/* ------------------------------------------------------------------------ */
/* Evaluation sets                                                            */
/* ------------------------------------------------------------------------ */

enum ekv_data_format { EKV_DATA_AUTO = 0, EKV_DATA_JSONL, EKV_DATA_TEXT };

/* One evaluation item. JSONL fields (the first alias present wins):
 *   instruction | prompt | question | article | input   -> instruction (required)
 *   answer | reference | output | summary_gt | target   -> answer (optional)
 *   system, image                                        -> optional strings
 *   images: an array of 1-16 image paths (instead of image), one per
 *   <image> marker of the instruction (the first image alone goes before
 *   the instruction when it has no marker)
 *   id | question_id (string or number)                  -> id (optional)
 * A text item carries its document in `text` and nothing else. */
struct ekv_eval_item {
    char *id;           /* NULL if absent */
    char *system;       /* NULL if absent */
    char *instruction;  /* JSONL: never NULL; text: NULL */
    char *answer;       /* NULL if absent */
    char *image;        /* NULL if absent (path as written in the file); with "images", the first */
    char **images;      /* [n_images] every image path as written (image is images[0]); NULL if none */
    int32_t n_images;
    char *text;         /* text format: the document; JSONL: NULL */
    size_t line;        /* 1-based line of the item in the file */
    int32_t score_from; /* JSONL "score_from": answer tokens fed but not scored
                           (a cue inside the answer); 0 when absent */
    char *type;         /* JSONL "type" (or "category"): the item's kind, e.g. a question
                           type, for per-type results; NULL if absent */
};

struct ekv_dataset {
    struct ekv_eval_item *items;  /* [n_items] */
    size_t n_items;
    size_t n_total;               /* items in the file before offset/limit
                                     (counted up to the end of the selection) */
    enum ekv_data_format format;  /* resolved format */
};

struct ekv_data_opts {
    enum ekv_data_format format;  /* AUTO: ".jsonl"/".json" => JSONL, else TEXT */
    size_t offset;                /* items to skip */
    size_t limit;                 /* max items kept; 0 = all */
    size_t max_line_bytes;        /* JSONL: longer lines are an error */
    size_t max_file_bytes;        /* text: larger files are an error */
    size_t max_items;             /* more selected items are an error */
    bool require_answer;          /* JSONL: an item without answer is an error */
    const char *doc_sep;          /* text: document separator; NULL = whole file */
};
#define EKV_DATA_DEFAULT_MAX_LINE (16u << 20)   /* 16 MiB  */
#define EKV_DATA_DEFAULT_MAX_FILE (256u << 20)  /* 256 MiB */
#define EKV_DATA_DEFAULT_MAX_ITEMS 10000000u

struct ekv_data_opts ekv_data_default_opts(void);
enum ekv_status ekv_data_format_parse(const char *s, enum ekv_data_format *out);

/* Reads `path`. Items are the non-blank lines (JSONL) or the non-empty
 * documents (text); the first `offset` are skipped without being parsed and
 * reading stops after `limit`. Errors name the file and the 1-based line:
 * "data.jsonl:7: invalid JSON at column 12", "...:3: no instruction field
 * (instruction|prompt|question|article|input)", "...:9: line longer than
 * 16777216 bytes". Text documents are stripped of surrounding whitespace;
 * NUL bytes are EKV_ERR_FORMAT. An empty selection is not an error. */
enum ekv_status ekv_dataset_load(const char *path, const struct ekv_data_opts *opts,
                                 struct ekv_dataset *out);
void ekv_dataset_free(struct ekv_dataset *ds);

/* ------------------------------------------------------------------------ */
/* Grid specification helpers (comma-separated lists)                         */
/* ------------------------------------------------------------------------ */

enum ekv_metric_bits {
    EKV_METRIC_PPL = 1u << 0,
    EKV_METRIC_ROUGE = 1u << 1,
    EKV_METRIC_KL = 1u << 2,
    EKV_METRIC_HITRATE = 1u << 3,
    EKV_METRIC_ACC = 1u << 4, /* exact match of the teacher-forced answer (every scored token top-1) */
};
/* "ppl,rouge" -> bits. Unknown names, empty elements are EKV_ERR_INVALID_ARG. */
enum ekv_status ekv_metrics_parse(const char *list, unsigned *bits);

/* Splits "a,b,c" into *n strings (one allocation; free with free(*items)).
 * Empty elements and duplicate names are EKV_ERR_INVALID_ARG. */
enum ekv_status ekv_split_list(const char *list, char ***items, size_t *n);

/* "1,0.5,0.2" -> budgets (malloc'd). Each must be a finite number in (0,1];
 * duplicates are rejected. */
enum ekv_status ekv_budgets_parse(const char *list, double **budgets, size_t *n);

/* "[ 12/100  12.0%] 0:00:31 elapsed, ETA 0:03:47" into buf (always
 * NUL-terminated); ETA is "--:--:--" before the first item is done. */
void ekv_eval_format_progress(char *buf, size_t cap, size_t done, size_t total,
                              double elapsed_s);

/* ------------------------------------------------------------------------ */
/* Results                                                                    */
/* ------------------------------------------------------------------------ */

/* One measured value: metric `metric` for policy at budget. Long format, so
 * that a grid with several metrics per cell is several rows. */
struct ekv_result_row {
    char *policy;
    char *kv_type;      /* KV storage type label ("f16", "q8_0/kivi4"), NULL when the grid has none */
    double budget;      /* kept fraction, 1 = full cache */
    char *metric;       /* e.g. "ppl", "rouge_l_f", "kl", "top1", "hit_rate" */
    double value;
    size_t n;           /* items (rouge) or tokens/positions (ppl, kl) */
};

struct ekv_report {
    struct ekv_result_row *rows;  /* [n_rows], insertion order */
    size_t n_rows, cap;
    char *title;                  /* e.g. "stories260K on tinystories_eval" */
    char *meta_json;              /* optional JSON object text copied into "meta" */
};

void ekv_report_init(struct ekv_report *rep);
void ekv_report_free(struct ekv_report *rep);
/* Copies the strings. A second value for the same (policy, budget, metric)
 * is EKV_ERR_INVALID_ARG. policy and metric must be non-empty and made of
 * printable ASCII without ',' or '|' or '"'. */
enum ekv_status ekv_report_add(struct ekv_report *rep, const char *policy,
                               double budget, const char *metric, double value,
                               size_t n);
/* ekv_report_add for a grid with a storage-type axis: kv_type (NULL = none)
 * is part of the cell's key and a column of every output. */
enum ekv_status ekv_report_add_kv(struct ekv_report *rep, const char *policy, const char *kv_type, double budget,
                                  const char *metric, double value, size_t n);
enum ekv_status ekv_report_set_title(struct ekv_report *rep, const char *title);
/* meta must parse as a JSON object. */
enum ekv_status ekv_report_set_meta(struct ekv_report *rep, const char *meta_json);

/* CSV, header "policy,kv_type,budget,metric,value,n", one row per result
 * (kv_type empty when the row has none). */
enum ekv_status ekv_report_write_csv(const struct ekv_report *rep, const char *path);
/* {"title":..., "meta":{...}, "results":[{"policy":..,"budget":..,"metric":..,
 *  "value":..,"n":..}, ...]}; non-finite values are written as null. */
enum ekv_status ekv_report_write_json(const struct ekv_report *rep, const char *path);
/* Pivot table: one row per (policy, budget) in first-seen order, one column
 * per metric in first-seen order; missing cells are "-". Returns a malloc'd
 * string in *out. */
enum ekv_status ekv_report_markdown(const struct ekv_report *rep, char **out);
enum ekv_status ekv_report_write_markdown(const struct ekv_report *rep, const char *path);

struct ekv_plot_opts {
    const char *gnuplot;   /* program to run; NULL = "gnuplot" from PATH */
    int width, height;     /* PNG size in pixels; 0 = 800 x 500 */
};
/* For each metric: writes DIR/<metric>.gp (a self-contained gnuplot script
 * with inline data, x = budget, one line per policy) and runs gnuplot on it
 * to make DIR/<metric>.png. gnuplot's own output goes to DIR/gnuplot.log.
 * gnuplot missing from PATH: EKV_ERR_NOT_FOUND; gnuplot failing:
 * EKV_ERR_IO naming the log. The .gp scripts are written either way, so a
 * user can run them later. */
enum ekv_status ekv_report_plot(const struct ekv_report *rep, const char *dir,
                                const struct ekv_plot_opts *opts);

/* ------------------------------------------------------------------------ */
/* Runner: the per-item protocols on a model (src/eval/runner.c)              */
/* ------------------------------------------------------------------------ */

struct ekv_context;

/* What to measure and how. */
struct ekv_eval_cfg {
    unsigned metrics;            /* EKV_METRIC_* bits */
    enum ekv_rouge_kind rouge;
    int32_t n_predict;           /* rouge: max new tokens per greedy answer (default 128) */
    int32_t stride;              /* text ppl: tokens per streamed chunk (default 96) */
    struct ekv_vision *vision;   /* borrowed; NULL: items with an image are refused */
    const char *image_dir;       /* relative "image" paths resolve against it (NULL: as written) */
    const char *chat_template;   /* NULL: plain prompts (system + "\n" + instruction), and
                                    "llava-1.5" for items with an image; else ekv_chat_format's name */
    bool no_fork;                /* read each JSONL prompt twice when both teacher-forced metrics and
                                    rouge are asked, in a cell and in the full-cache reference (default
                                    false: the greedy answer continues a copy of the teacher-forced
                                    run's sequence, ekv_seq_copy; the same results bit for bit) */
    int32_t share;               /* cells run together (ekv_eval_unit_run_group; ekv eval --share): the
                                    grid's cells go through a unit in groups of at most this many,
                                    one shared prompt and batched decode steps (memory: a group's
                                    caches live together); <= 1 = every cell alone. The same
                                    results bit for bit either way (default 16) */
};
struct ekv_eval_cfg ekv_eval_default_cfg(void);

/* Accumulators of one grid cell (policy, budget), summed over units. */
struct ekv_eval_cell {
    struct ekv_ppl_acc ppl;       /* pooled over every scored token */
    struct ekv_kl_acc kl;         /* KL(full || policy) and top-1 agreement */
    struct ekv_mean_acc rouge_f;  /* macro means over items */
    struct ekv_mean_acc rouge_p;
    struct ekv_mean_acc rouge_r;
    struct ekv_mean_acc hit_rate; /* mean over items x layers x KV heads */
    struct ekv_mean_acc jaccard;
    struct ekv_mean_acc acc;      /* items whose scored answer tokens are all the argmax, mean */
    struct ekv_mean_acc kv_frac;  /* cache entries / full-cache entries at the
                                     end of each teacher-forced (or greedy,
                                     or prompt-only) run, mean over units */
    struct ekv_mean_acc kv_bytes; /* K/V bytes of the cache in its storage types
                                     at the same moment (ekv_kv_stats.bytes), mean */
    struct ekv_mean_acc kv_bytes_frac; /* those bytes / a full f32 cache's bytes, mean */
};
void ekv_eval_cell_init(struct ekv_eval_cell *c);
/* Adds src's measurements to dst (every accumulator). */
void ekv_eval_cell_merge(struct ekv_eval_cell *dst, const struct ekv_eval_cell *src);

/* An evaluation unit is what one fresh sequence processes: a JSONL item
 * (prompt + answer) or one window of at most n_ctx tokens of a text
 * document. */
struct ekv_eval_unit {
    size_t item;         /* index into the dataset */
    int32_t *tokens;     /* [n_tokens] JSONL: prompt (with BOS) then answer
                            (no BOS, no EOS); text: the window */
    int32_t n_tokens;
    int32_t n_prompt;    /* JSONL: prompt tokens; text: the first chunk (stride) */
    bool stream;         /* text window: streamed in stride chunks */
    char **images;       /* JSONL: [n_images] resolved image paths, or NULL */
    int32_t n_images;
    char *prompt_text;   /* JSONL with images: the templated prompt holding their <image> markers */
    int32_t n_image;     /* image positions, all images; the prompt spans n_prompt + n_image positions */
    int32_t score_from;  /* JSONL: the first answer token scored (the item's "score_from") */
};

struct ekv_eval_runner {
    struct ekv_context *ctx;       /* borrowed */
    const struct ekv_model *model; /* borrowed */
    const struct ekv_dataset *ds;  /* borrowed */
    struct ekv_eval_cfg cfg;
    int32_t n_ctx, n_vocab, n_layer, n_head_kv;
    struct ekv_eval_unit *units;   /* [n_units] */
    size_t n_units;
    char **skipped;                /* [n_skipped] one message per item left out */
    size_t n_skipped;
    /* full-cache reference of the prepared unit */
    size_t cur;                    /* prepared unit, or SIZE_MAX */
    float *ref_logits;             /* [n_scored][n_vocab] (kl only) */
    int32_t n_scored;
    char *ref_text;                /* rouge: the full cache's greedy answer, or NULL
                                      when it is empty (item then has no ROUGE) */
    struct ekv_prompt *prompt;     /* the prepared unit's prompt with its image encoded once, or NULL */
    float *ref_attn;               /* hitrate: [n_layer][n_head_kv][n_prompt + n_image] attention of the
                                      first answer token's query over the prompt, full cache */
    bool ref_pending;              /* the reference's teacher-forced and greedy runs wait for the unit's
                                      first group (cfg.share > 1, JSONL unit): they run in it (its
                                      prompt and batched steps), or before the first cell run alone */
    size_t n_grouped;              /* cells run in groups so far (ekv_eval_unit_run_group), the rest alone */
    /* scratch */
    float *logits;                 /* [n_ctx + 1][n_vocab] */
    int32_t *gen;                  /* [n_predict] */
    char *text;                    /* detokenised answer */
    size_t text_cap;
};

/* Tokenises every selected item into units. JSONL: prompt = system + "\n" +
 * instruction when a system prompt is present (plain concatenation, no chat
 * template) tokenised with BOS, or the cfg's chat template (llava-1.5 for
 * items with an image, whose embeddings go where the template's <image>
 * marker is); answer tokenised without BOS as a continuation, no EOS. An item whose prompt does not leave room in n_ctx
 * for its teacher-forced answer (n_prompt + n_answer - 2 > n_ctx), or with
 * an empty prompt, is skipped with a message (runner->skipped). Text:
 * the document tokenised with BOS and cut into windows of n_ctx tokens,
 * each a fresh sequence; windows of at most `stride` tokens score nothing
 * and are skipped. rouge and hitrate need JSONL; ppl, kl and hitrate need
 * answers; images without cfg->vision are EKV_ERR_UNSUPPORTED. On failure
 * nothing stays allocated (no ekv_eval_runner_free needed, though harmless). */
enum ekv_status ekv_eval_runner_init(struct ekv_eval_runner *r, struct ekv_context *ctx,
                                     const struct ekv_dataset *ds, const struct ekv_eval_cfg *cfg);
void ekv_eval_runner_free(struct ekv_eval_runner *r);

/* Builds the full-cache reference of unit u (what the policies are compared
 * with): teacher-forced logits (kl), the greedy answer (rouge), the next
 * query's attention (hitrate). With cfg.share > 1 a JSONL unit's
 * teacher-forced and greedy references wait (ref_pending) and run in the
 * unit's first ekv_eval_unit_run_group, or before the first cell run alone:
 * the same values either way. */
enum ekv_status ekv_eval_unit_prepare(struct ekv_eval_runner *r, size_t u);

/* Runs the prepared unit with a fresh sequence under `kv` (NULL = full
 * cache) and adds its measurements to `cell`:
 *   ppl/kl, JSONL (docs/policies.md "Evaluation protocols"): prefill the prompt (compressed by the
 *     policy; its last logits come before compression), score answer token 0
 *     from them, then for k = 1 .. a-2 feed answer token k-1 with
 *     ekv_seq_decode (decode-time policy) and score token k; a-1 tokens per
 *     item, the last one is never fed.
 *   ppl/kl, text: the window streamed in prompt chunks of `stride` tokens
 *     (the policy compresses after each), every token after the first
 *     chunk scored from the logits of the position before it.
 *   rouge: greedy answer (argmax, lowest index on ties) of at most
 *     n_predict tokens (fewer when the context is full), stopping before an
 *     end-of-generation token; the policy acts after every forward, so the
 *     first token comes from the prefill logits. Detokenised, stripped, and
 *     scored against the full-cache answer; an empty answer scores 0.
 *   acc: on the teacher-forced run of ppl/kl, an item counts 1 when every
 *     scored answer token (all but the last) is the argmax of its logits
 *     (lowest index on ties), else 0 -- the greedy answer equals the
 *     reference answer exactly; mean over items.
 *   hitrate: after the prompt, per (layer, KV head): the kept positions
 *     against the top-k (k = kept count) of the full cache's attention of the
 *     first answer token's query over the prompt (ekv_kept_agreement). */
enum ekv_status ekv_eval_unit_run(struct ekv_eval_runner *r, const struct ekv_kv_params *kv,
                                  struct ekv_eval_cell *cell);

/* ekv_eval_unit_run for the n cells kv[0..n) of the prepared unit, into
 * cells[0..n), run together: their prompt read once (ekv_seq_eval_shared:
 * one forward, every cache with its own policy's statistics and
 * compression), each teacher-forced answer token fed to all of them in one
 * batch (ekv_decode_batch: the weights read once per token for the group),
 * the greedy answers decoded one batch per step; the unit's full-cache
 * reference runs in the group as its first member when it waits for one
 * (ref_pending). The results equal n ekv_eval_unit_run calls bit for bit (a shared prompt leaves each cache as
 * reading it alone; batched decode equals decoding alone). Cells that
 * cannot join (on a GPU, --kv-chunk, storage types other than the first
 * joining cell's) run alone afterwards, as do all cells of a text window,
 * with cfg.no_fork, or when fewer than two can join. Memory: the n caches
 * (and their greedy copies) live together. */
enum ekv_status ekv_eval_unit_run_group(struct ekv_eval_runner *r, const struct ekv_kv_params *kv, size_t n,
                                        struct ekv_eval_cell *cells);

/* Rows of one cell into a report: ppl (n = tokens), rouge_l_f, rouge_l_p,
 * rouge_l_r (n = items), kl, top1 (n = positions), acc (n = items), hit_rate, jaccard
 * (n = layer-head pairs), kv_frac, kv_bytes and kv_bytes_frac (n = units);
 * only requested metrics with at least one measurement. */
enum ekv_status ekv_eval_cell_report(const struct ekv_eval_cell *c, unsigned metrics,
                                     const char *policy, double budget, struct ekv_report *rep);
/* ekv_eval_cell_report with a storage-type label on every row (NULL = none). */
enum ekv_status ekv_eval_cell_report_kv(const struct ekv_eval_cell *c, unsigned metrics, const char *policy,
                                        const char *kv_type, double budget, struct ekv_report *rep);

/* One grid cell: a policy at a budget with the shared KV parameters. */
struct ekv_eval_grid_cell {
    char policy[96];    /* a name or a spec "name:opt=val:..." */
    double budget;
};
/* Policies x budgets in the order given; "full" appears once, at budget 1.
 * *cells is malloc'd. Unknown policy names are EKV_ERR_INVALID_ARG. */
enum ekv_status ekv_eval_grid(char *const *policies, size_t n_policies, const double *budgets,
                              size_t n_budgets, struct ekv_eval_grid_cell **cells, size_t *n_cells);

/* Checks that every cell's parameters (base with the cell's policy and
 * budget) make a sequence, before any work; the error names the cell. */
enum ekv_status ekv_eval_grid_check(struct ekv_eval_runner *r, const struct ekv_kv_params *base,
                                    const struct ekv_eval_grid_cell *cells, size_t n_cells);

/* Progress callback: units done (of total) after each (unit, all cells). */
typedef void (*ekv_eval_progress_fn)(void *user, size_t done, size_t total, size_t unit);

/* Runs the whole grid, units outer (each reference is built once), cells
 * inner; out: [n_cells] accumulators (initialised here). base supplies the
 * shared KV parameters; policy and budget come from each cell. */
enum ekv_status ekv_eval_run_grid(struct ekv_eval_runner *r, const struct ekv_kv_params *base,
                                  const struct ekv_eval_grid_cell *cells, size_t n_cells,
                                  struct ekv_eval_cell *out, ekv_eval_progress_fn progress,
                                  void *user);

#endif
