/*
 * runner.c — the evaluation protocols of `ekv eval` on a real model
 * (docs/policies.md "Evaluation protocols", docs/architecture.md "Evaluation"): teacher-forced
 * perplexity and KL against the full cache, greedy ROUGE-L against the full
 * cache's greedy answer, cache hit rate against the full cache's attention,
 * and the policies x budgets grid. It lives beside the metrics so that tests
 * can run the same code as the CLI. Units are outer and grid cells inner, so
 * each full-cache reference is built once and only one unit's reference is
 * held in memory at a time. A unit's cells can also run together, with
 * the same results (group.c, ekv_eval_unit_run_group).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ekv.h"
#include "ekv_eval.h"
#include "eval_util.h"
#include "runner_int.h"


struct ekv_eval_cfg ekv_eval_default_cfg(void) {
    struct ekv_eval_cfg c = {
        .metrics = EKV_METRIC_PPL | EKV_METRIC_ROUGE | EKV_METRIC_KL,
        .rouge = EKV_ROUGE_PLTRDY,
        .n_predict = 128,
        .stride = 96,
        .share = 16,
    };
    return c;
}

void ekv_eval_cell_init(struct ekv_eval_cell *c) {
    memset(c, 0, sizeof *c);
    ekv_ppl_init(&c->ppl);
    ekv_kl_init(&c->kl);
}

static void mean_merge(struct ekv_mean_acc *d, const struct ekv_mean_acc *s) {
    d->sum += s->sum;
    d->n += s->n;
}

void ekv_eval_cell_merge(struct ekv_eval_cell *dst, const struct ekv_eval_cell *src) {
    ekv_ppl_merge(&dst->ppl, &src->ppl);
    ekv_kl_merge(&dst->kl, &src->kl);
    mean_merge(&dst->rouge_f, &src->rouge_f);
    mean_merge(&dst->rouge_p, &src->rouge_p);
    mean_merge(&dst->rouge_r, &src->rouge_r);
    mean_merge(&dst->hit_rate, &src->hit_rate);
    mean_merge(&dst->jaccard, &src->jaccard);
    mean_merge(&dst->acc, &src->acc);
    mean_merge(&dst->kv_frac, &src->kv_frac);
    mean_merge(&dst->kv_bytes, &src->kv_bytes);
    mean_merge(&dst->kv_bytes_frac, &src->kv_bytes_frac);
}

/* ---- set-up ---- */

/* Tokenises text into a malloc'd array (*toks, *n). */
static enum ekv_status tokenize_alloc(const struct ekv_model *m, const char *text, bool bos,
                                      int32_t **toks, size_t *n) {
    size_t len = strlen(text), cap;
    *toks = NULL;
    *n = 0;
    if (!ev_add_ok(len, 16, &cap)) return ekv_error_set(EKV_ERR_OVERFLOW, "text of %zu bytes is too long", len);
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t bytes;
        if (!ev_mul_ok(cap, sizeof(int32_t), &bytes))
            return ekv_error_set(EKV_ERR_OVERFLOW, "text of %zu bytes is too long", len);
        int32_t *t = malloc(bytes);
        if (!t) return ekv_error_set(EKV_ERR_NOMEM, "no memory for %zu tokens", cap);
        size_t got = 0;
        enum ekv_status s = ekv_tokenize(m, text, len, bos, false, t, cap, &got);
        if (s == EKV_OK) {
            *toks = t;
            *n = got;
            return EKV_OK;
        }
        free(t);
        if (s != EKV_ERR_INVALID_ARG || got <= cap) return s;
        cap = got;
    }
    return ekv_error_set(EKV_ERR_INTERNAL, "tokenizer asked for more room twice");
}

/* A templated prompt as text tokens (copied out of an ekv_prompt: BOS
 * first, special-token text parsed) and the positions its images take
 * together; the text holds one marker per image. */
static enum ekv_status templated_prompt_tokens(const struct ekv_eval_runner *r, const char *text, char *const *images,
                                               int32_t n_images, int32_t **toks, size_t *n, int32_t *n_image) {
    struct ekv_prompt *p = NULL;
    *toks = NULL;
    *n = 0;
    enum ekv_status s = ekv_prompt_new(r->model, text, strlen(text), true, &p);
    if (s != EKV_OK) return s;
    *n_image = 0;
    if (ekv_prompt_n_images(p) != n_images)
        s = ekv_error_set(EKV_ERR_INVALID_ARG, "the prompt has %d %s markers for %d image(s)", ekv_prompt_n_images(p),
                    EKV_IMAGE_MARKER, (int)n_images);
    for (int32_t i = 0; s == EKV_OK && i < n_images; i++) {
        struct ekv_image_input img = {.path = images[i]};
        int32_t k = 0;
        s = ekv_vision_image_tokens(r->cfg.vision, &img, &k);
        if (s == EKV_OK && k > INT32_MAX - *n_image)
            s = ekv_error_set(EKV_ERR_OVERFLOW, "the images take more than %d positions", INT32_MAX);
        if (s == EKV_OK) *n_image += k;
    }
    if (s == EKV_OK && !(*toks = malloc(((size_t)ekv_prompt_n_tokens(p) + 1) * sizeof **toks)))
        s = ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    if (s == EKV_OK) {
        ekv_prompt_tokens(p, *toks);
        *n = (size_t)ekv_prompt_n_tokens(p);
    }
    ekv_prompt_free(p);
    return s;
}

static enum ekv_status add_skip(struct ekv_eval_runner *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static enum ekv_status add_skip(struct ekv_eval_runner *r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **ns = realloc(r->skipped, (r->n_skipped + 1) * sizeof *ns);
    if (!ns) return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    r->skipped = ns;
    if (!(ns[r->n_skipped] = strdup(buf))) return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    r->n_skipped++;
    return EKV_OK;
}

static enum ekv_status add_unit(struct ekv_eval_runner *r, size_t item, int32_t *tokens, int32_t n,
                                int32_t n_prompt, bool stream) {
    struct ekv_eval_unit *nu = realloc(r->units, (r->n_units + 1) * sizeof *nu);
    if (!nu) {
        free(tokens);
        return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    }
    r->units = nu;
    nu[r->n_units++] = (struct ekv_eval_unit){
        .item = item, .tokens = tokens, .n_tokens = n, .n_prompt = n_prompt, .stream = stream};
    return EKV_OK;
}

static const char *item_name(const struct ekv_eval_item *it, char *buf, size_t cap) {
    if (it->id) snprintf(buf, cap, "item '%s' (line %zu)", it->id, it->line);
    else snprintf(buf, cap, "item at line %zu", it->line);
    return buf;
}

static void free_paths(char **p, int32_t n) {
    for (int32_t i = 0; p && i < n; i++) free(p[i]);
    free(p);
}

/* The item's image paths resolved against --image-dir (relative ones). */
static enum ekv_status resolve_images(const struct ekv_eval_runner *r, const struct ekv_eval_item *it, char ***out) {
    *out = NULL;
    if (it->n_images == 0) return EKV_OK;
    char **p = calloc((size_t)it->n_images, sizeof *p);
    if (!p) return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    const char *dir = r->cfg.image_dir;
    for (int32_t k = 0; k < it->n_images; k++) {
        const char *im = it->images[k];
        size_t need = strlen(im) + (dir ? strlen(dir) : 0) + 2;
        if (!(p[k] = malloc(need))) {
            free_paths(p, it->n_images);
            return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
        }
        if (dir && im[0] != '/') snprintf(p[k], need, "%s/%s", dir, im);
        else snprintf(p[k], need, "%s", im);
    }
    *out = p;
    return EKV_OK;
}

/* The user text for an instruction without markers: one marker per image,
 * each on its own line, then the instruction (as `ekv run` does); NULL when
 * out of memory. */
static char *user_text(const struct ekv_eval_item *it) {
    const size_t ml = strlen(EKV_IMAGE_MARKER "\n"), il = strlen(it->instruction);
    char *u = malloc((size_t)it->n_images * ml + il + 1);
    if (!u) return NULL;
    for (int32_t k = 0; k < it->n_images; k++) memcpy(u + (size_t)k * ml, EKV_IMAGE_MARKER "\n", ml);
    memcpy(u + (size_t)it->n_images * ml, it->instruction, il + 1);
    return u;
}

static enum ekv_status init_jsonl_item(struct ekv_eval_runner *r, size_t i) {
    const struct ekv_eval_item *it = &r->ds->items[i];
    const unsigned m = r->cfg.metrics;
    const bool tf = m & EKV_EV_TF_METRICS;
    char name[160];
    item_name(it, name, sizeof name);
    if (it->image && !r->cfg.vision)
        return ekv_error_set(EKV_ERR_UNSUPPORTED, "%s has an image ('%s'): images need a vision tower (--mmproj)",
                       name, it->image);
    if ((m & (EKV_EV_TF_METRICS | EKV_METRIC_HITRATE)) && !it->answer)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "%s has no answer, which ppl, kl, acc and hitrate need", name);
    char *prompt = NULL, **image = NULL;
    int32_t n_image = 0;
    const int32_t n_img = it->n_images;
    const char *own = n_img && !r->cfg.chat_template ? ekv_model_chat_template(r->model) : NULL;
    const char *tmpl = r->cfg.chat_template ? r->cfg.chat_template : n_img ? (own ? own : "llava-1.5") : NULL;
    enum ekv_status rs = resolve_images(r, it, &image);
    if (rs != EKV_OK) return rs;
    if (tmpl) {
        size_t n = 0;
        char *user = NULL;
        enum ekv_status fs = EKV_OK;
        if (n_img && !strstr(it->instruction, EKV_IMAGE_MARKER) && !(user = user_text(it)))
            fs = ekv_error_set(EKV_ERR_NOMEM, "out of memory");
        const char *ut = user ? user : it->instruction;
        if (fs == EKV_OK) fs = ekv_chat_format(tmpl, it->system, ut, false, NULL, 0, &n);
        if (fs == EKV_OK && !(prompt = malloc(n + 1))) fs = ekv_error_set(EKV_ERR_NOMEM, "out of memory");
        if (fs == EKV_OK) fs = ekv_chat_format(tmpl, it->system, ut, false, prompt, n + 1, &n);
        free(user);
        if (fs != EKV_OK) {
            free(prompt);
            free_paths(image, n_img);
            return ekv_error_prefix(fs, "%s", name);
        }
    } else if (it->system) {
        size_t a = strlen(it->system), b = strlen(it->instruction);
        prompt = malloc(a + b + 2);
        if (!prompt) {
            free_paths(image, n_img);
            return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
        }
        memcpy(prompt, it->system, a);
        prompt[a] = '\n';
        memcpy(prompt + a + 1, it->instruction, b + 1);
    }
    int32_t *pt = NULL, *at = NULL;
    size_t np = 0, na = 0;
    enum ekv_status s = tmpl ? templated_prompt_tokens(r, prompt, image, n_img, &pt, &np, &n_image)
                              : tokenize_alloc(r->model, prompt ? prompt : it->instruction, true, &pt, &np);
    if (!image) {
        free(prompt);
        prompt = NULL;
    }
    if (s == EKV_OK && it->answer) s = tokenize_alloc(r->model, it->answer, false, &at, &na);
    if (s != EKV_OK) {
        free(pt);
        free(at);
        free_paths(image, n_img);
        free(prompt);
        return ekv_error_prefix(s, "%s", name);
    }
    const char *why = NULL;
    char wbuf[200];
    const size_t P = np + (size_t)n_image; /* prompt positions */
    if (np == 0) why = "the prompt has no tokens";
    else if (P >= (size_t)r->n_ctx) {
        snprintf(wbuf, sizeof wbuf, "prompt of %zu positions leaves no room in the context of %d", P, r->n_ctx);
        why = wbuf;
    } else if (tf && na < 2) {
        snprintf(wbuf, sizeof wbuf, "answer of %zu token(s) scores nothing (a-1 tokens are scored)", na);
        why = wbuf;
    } else if ((m & EKV_METRIC_HITRATE) && na < 1) {
        why = "empty answer (hitrate needs its first token)";
    } else if (tf && (size_t)it->score_from > na - 2) {
        snprintf(wbuf, sizeof wbuf, "score_from %d leaves no scored token in an answer of %zu tokens",
                 it->score_from, na);
        why = wbuf;
    } else if (tf && P + na - 2 > (size_t)r->n_ctx) {
        snprintf(wbuf, sizeof wbuf, "prompt %zu + answer %zu positions exceed the context of %d", P, na, r->n_ctx);
        why = wbuf;
    }
    if (why) {
        free(pt);
        free(at);
        free_paths(image, n_img);
        free(prompt);
        return add_skip(r, "%s: %s", name, why);
    }
    int32_t *all = realloc(pt, (np + na + 1) * sizeof *all);
    if (!all) {
        free(pt);
        free(at);
        free_paths(image, n_img);
        free(prompt);
        return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    }
    if (na) memcpy(all + np, at, na * sizeof *at);
    free(at);
    s = add_unit(r, i, all, (int32_t)(np + na), (int32_t)np, false);
    if (s != EKV_OK) {
        free_paths(image, n_img);
        free(prompt);
        return s;
    }
    struct ekv_eval_unit *u = &r->units[r->n_units - 1];
    u->images = image;
    u->n_images = n_img;
    u->prompt_text = prompt;
    u->n_image = n_image;
    u->score_from = it->score_from;
    return EKV_OK;
}

static enum ekv_status init_text_item(struct ekv_eval_runner *r, size_t i) {
    const struct ekv_eval_item *it = &r->ds->items[i];
    char name[160];
    item_name(it, name, sizeof name);
    int32_t *t = NULL;
    size_t n = 0;
    enum ekv_status s = tokenize_alloc(r->model, it->text, true, &t, &n);
    if (s != EKV_OK) return ekv_error_prefix(s, "document %s", name);
    size_t win = 0;
    for (size_t off = 0; off < n && s == EKV_OK; off += (size_t)r->n_ctx, win++) {
        size_t len = EV_MIN((size_t)r->n_ctx, n - off);
        if (len <= (size_t)r->cfg.stride) {
            s = add_skip(r, "document %s, window %zu: %zu tokens, not more than the stride %d, score nothing",
                         name, win, len, r->cfg.stride);
            continue;
        }
        int32_t *w = malloc(len * sizeof *w);
        if (!w) {
            s = ekv_error_set(EKV_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(w, t + off, len * sizeof *w);
        s = add_unit(r, i, w, (int32_t)len, r->cfg.stride, true);
    }
    free(t);
    return s;
}

static enum ekv_status runner_init(struct ekv_eval_runner *r, struct ekv_context *ctx, const struct ekv_dataset *ds,
                                   const struct ekv_eval_cfg *cfg);

/* On failure nothing is left allocated (r is as after ekv_eval_runner_free). */
enum ekv_status ekv_eval_runner_init(struct ekv_eval_runner *r, struct ekv_context *ctx,
                                     const struct ekv_dataset *ds, const struct ekv_eval_cfg *cfg) {
    memset(r, 0, sizeof *r);
    const enum ekv_status s = runner_init(r, ctx, ds, cfg);
    if (s != EKV_OK) ekv_eval_runner_free(r); /* units made before the failure (issue 23: alloc_fail) */
    return s;
}

static enum ekv_status runner_init(struct ekv_eval_runner *r, struct ekv_context *ctx, const struct ekv_dataset *ds,
                                   const struct ekv_eval_cfg *cfg) {
    r->cur = SIZE_MAX;
    if (!ctx || !ds || !cfg) return ekv_error_set(EKV_ERR_INVALID_ARG, "eval runner: NULL argument");
    r->ctx = ctx;
    r->model = ekv_context_model(ctx);
    r->ds = ds;
    r->cfg = *cfg;
    const unsigned all = EKV_EV_TF_METRICS | EKV_METRIC_ROUGE | EKV_METRIC_HITRATE;
    if (cfg->metrics == 0 || (cfg->metrics & ~all))
        return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: metric set 0x%x is empty or unknown", cfg->metrics);
    if (cfg->n_predict < 1) return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: n_predict %d < 1", cfg->n_predict);
    if (cfg->stride < 1) return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: stride %d < 1", cfg->stride);
    struct ekv_model_info mi;
    ekv_model_get_info(r->model, &mi);
    r->n_ctx = ekv_context_n_ctx(ctx);
    r->n_vocab = mi.n_vocab;
    r->n_layer = mi.n_layer;
    r->n_head_kv = mi.n_head_kv;
    if (ds->format == EKV_DATA_TEXT && (cfg->metrics & (EKV_METRIC_ROUGE | EKV_METRIC_HITRATE | EKV_METRIC_ACC)))
        return ekv_error_set(EKV_ERR_INVALID_ARG,
                       "eval: metrics rouge, hitrate and acc need a JSONL set with instructions (text supports ppl, kl)");
    if (ds->format == EKV_DATA_TEXT && cfg->stride >= r->n_ctx)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: stride %d must be below the context %d", cfg->stride, r->n_ctx);
    if (cfg->vision && ekv_vision_n_embd(cfg->vision) != mi.n_embd)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: the vision tower gives %d-wide embeddings, the model takes %d",
                       ekv_vision_n_embd(cfg->vision), mi.n_embd);
    enum ekv_status s = EKV_OK;
    for (size_t i = 0; i < ds->n_items && s == EKV_OK; i++)
        s = ds->format == EKV_DATA_TEXT ? init_text_item(r, i) : init_jsonl_item(r, i);
    if (s != EKV_OK) return s;
    /* scratch: stride rows of logits (text chunks) or one row, plus one */
    size_t rows = (size_t)(ds->format == EKV_DATA_TEXT ? cfg->stride : 1) + 1, cells;
    if (!ev_mul_ok(rows, (size_t)r->n_vocab, &cells)) return ekv_error_set(EKV_ERR_OVERFLOW, "eval: logits buffer");
    r->logits = malloc(cells * sizeof(float));
    r->gen = malloc((size_t)cfg->n_predict * sizeof *r->gen);
    if (!r->logits || !r->gen) return ekv_error_set(EKV_ERR_NOMEM, "eval: out of memory");
    return EKV_OK;
}

void ekv_ev_ref_clear(struct ekv_eval_runner *r) {
    r->ref_pending = false;
    free(r->ref_logits);
    free(r->ref_text);
    free(r->ref_attn);
    r->ref_logits = NULL;
    r->ref_text = NULL;
    r->ref_attn = NULL;
    r->n_scored = 0;
    r->cur = SIZE_MAX;
}

void ekv_eval_runner_free(struct ekv_eval_runner *r) {
    if (!r) return;
    ekv_ev_ref_clear(r);
    for (size_t i = 0; i < r->n_units; i++) {
        free(r->units[i].tokens);
        free_paths(r->units[i].images, r->units[i].n_images);
        free(r->units[i].prompt_text);
    }
    ekv_prompt_free(r->prompt);
    free(r->units);
    for (size_t i = 0; i < r->n_skipped; i++) free(r->skipped[i]);
    free(r->skipped);
    free(r->logits);
    free(r->gen);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* ---- the protocols on one sequence ---- */

/* Receives the logits that predict scored token `idx` (whose id is target). */
typedef enum ekv_status (*score_fn)(void *ud, int32_t idx, const float *logits, int32_t target);
/* Called once the prompt (JSONL) has been read and compressed. */
typedef enum ekv_status (*prompt_fn)(void *ud, struct ekv_seq *seq);

static int32_t unit_n_scored(const struct ekv_eval_unit *u) {
    return u->stream ? u->n_tokens - u->n_prompt : u->n_tokens - u->n_prompt - 1;
}


enum ekv_status ekv_ev_unit_input(const struct ekv_eval_runner *r, const struct ekv_eval_unit *u,
                                  struct ekv_segment *sg, struct ekv_input *in) {
    *sg = (struct ekv_segment){.tokens = u->tokens, .n = u->n_prompt, .tag = EKV_TAG_TEXT};
    *in = (struct ekv_input){.segs = sg, .n_segs = 1, .is_prompt = true};
    return u->n_image > 0 ? ekv_prompt_segments(r->prompt, &in->segs, &in->n_segs) : EKV_OK;
}

/* Reads a JSONL unit's prompt as one prompt the policy compresses; logits
 * of the last position. */
static enum ekv_status prefill_unit(struct ekv_eval_runner *r, struct ekv_seq *seq, const struct ekv_eval_unit *u,
                                    float *logits) {
    struct ekv_segment sg;
    struct ekv_input in;
    enum ekv_status s = ekv_ev_unit_input(r, u, &sg, &in);
    return s == EKV_OK ? ekv_seq_eval(seq, &in, logits) : s;
}

/* Teacher-forced scoring (JSONL) or chunked streaming (text); docs/policies.md "Evaluation protocols". */
static enum ekv_status run_scored(struct ekv_eval_runner *r, struct ekv_seq *seq, const struct ekv_eval_unit *u,
                                  score_fn fn, prompt_fn pfn, void *ud) {
    const size_t V = (size_t)r->n_vocab;
    float *lg = r->logits;
    enum ekv_status s;
    if (!u->stream) {
        const int32_t *ans = u->tokens + u->n_prompt;
        const int32_t a = u->n_tokens - u->n_prompt;
        if ((s = prefill_unit(r, seq, u, lg)) != EKV_OK) return s;
        if (pfn && (s = pfn(ud, seq)) != EKV_OK) return s;
        /* answer tokens before u->score_from are fed, not scored */
        if (fn && a >= 2 && u->score_from == 0 && (s = fn(ud, 0, lg, ans[0])) != EKV_OK) return s;
        for (int32_t k = 1; fn && k <= a - 2; k++) {
            if ((s = ekv_seq_decode(seq, ans[k - 1], lg)) != EKV_OK) return s;
            if (k >= u->score_from && (s = fn(ud, k, lg, ans[k])) != EKV_OK) return s;
        }
        return EKV_OK;
    }
    /* text window: first chunk, then stride chunks, each a prompt the policy compresses */
    float *prev = lg + (size_t)r->cfg.stride * V; /* [V] last row of the previous chunk */
    struct ekv_segment sg = {.tokens = u->tokens, .n = u->n_prompt, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &sg, .n_segs = 1, .is_prompt = true, .logits_all = false};
    if ((s = ekv_seq_eval(seq, &in, prev)) != EKV_OK) return s;
    int32_t idx = 0;
    for (int32_t off = u->n_prompt; off < u->n_tokens; off += r->cfg.stride) {
        int32_t len = EV_MIN(r->cfg.stride, u->n_tokens - off);
        sg.tokens = u->tokens + off;
        sg.n = len;
        in.logits_all = true;
        if ((s = ekv_seq_eval(seq, &in, lg)) != EKV_OK) return s;
        for (int32_t i = 0; i < len; i++) {
            const float *row = i == 0 ? prev : lg + (size_t)(i - 1) * V;
            if (fn && (s = fn(ud, idx++, row, u->tokens[off + i])) != EKV_OK) return s;
        }
        memcpy(prev, lg + (size_t)(len - 1) * V, V * sizeof(float));
    }
    return EKV_OK;
}

/* Greedy answer (docs/policies.md "Evaluation protocols") into r->gen; *n_gen tokens, EOG not included. */
/* lg: the logits of the prompt's last position when seq has read the
 * prompt already (a copy made after the teacher-forced run's prefill),
 * NULL to read it here into r->logits. */
static enum ekv_status run_greedy(struct ekv_eval_runner *r, struct ekv_seq *seq, const struct ekv_eval_unit *u,
                                  float *lg, int32_t *n_gen) {
    enum ekv_status s;
    *n_gen = 0;
    if (!lg) {
        lg = r->logits;
        if ((s = prefill_unit(r, seq, u, lg)) != EKV_OK) return s;
    }
    /* the last generated token is not fed, so prompt + max - 1 <= n_ctx */
    int32_t max = EV_MIN(r->cfg.n_predict, r->n_ctx - ekv_ev_unit_positions(u) + 1);
    int32_t n = 0;
    while (n < max) {
        size_t t;
        if ((s = ekv_argmax(lg, (size_t)r->n_vocab, &t)) != EKV_OK) return s;
        if (ekv_token_is_eog(r->model, (int32_t)t)) break;
        r->gen[n++] = (int32_t)t;
        if (n == max) break;
        if ((s = ekv_seq_decode(seq, (int32_t)t, lg)) != EKV_OK) return s;
    }
    *n_gen = n;
    return EKV_OK;
}

/* Detokenises r->gen[0..n) into r->text, surrounding whitespace stripped. */
static enum ekv_status gen_text(struct ekv_eval_runner *r, int32_t n) {
    for (int attempt = 0; attempt < 3; attempt++) {
        size_t need = 0;
        if (!r->text) {
            r->text_cap = (size_t)r->cfg.n_predict * 16 + 64;
            if (!(r->text = malloc(r->text_cap))) return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
        }
        enum ekv_status s = ekv_detokenize(r->model, r->gen, (size_t)n, false, true, r->text, r->text_cap, &need);
        if (s == EKV_OK && need < r->text_cap) {
            char *p = r->text, *e = r->text + need;
            while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v')) p++;
            while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r' || e[-1] == '\f' ||
                             e[-1] == '\v'))
                e--;
            memmove(r->text, p, (size_t)(e - p));
            r->text[e - p] = 0;
            return EKV_OK;
        }
        if (s != EKV_OK && s != EKV_ERR_INVALID_ARG) return s;
        if (need + 1 <= r->text_cap) return s;
        char *nt = realloc(r->text, need + 1);
        if (!nt) return ekv_error_set(EKV_ERR_NOMEM, "out of memory");
        r->text = nt;
        r->text_cap = need + 1;
    }
    return ekv_error_set(EKV_ERR_INTERNAL, "detokenize kept asking for more room");
}

/* A text ROUGE cannot score (pltrdy: nothing but '.'; sentence: no word). */
static bool rouge_empty(enum ekv_rouge_kind kind, const char *s) {
    if (kind == EKV_ROUGE_PLTRDY) return strspn(s, ".") == strlen(s);
    return strspn(s, " \t\n\r\f\v") == strlen(s);
}

/* ---- full-cache reference ---- */

enum ekv_status ekv_ev_ref_store(struct ekv_eval_runner *r, int32_t idx, const float *logits) {
    if (idx < 0 || idx >= r->n_scored) return ekv_error_set(EKV_ERR_INTERNAL, "eval: scored index %d of %d", idx, r->n_scored);
    memcpy(r->ref_logits + (size_t)idx * (size_t)r->n_vocab, logits, (size_t)r->n_vocab * sizeof(float));
    return EKV_OK;
}

/* The reference's teacher-forced run, with a copy of its sequence taken
 * after the prompt for the reference's greedy answer (as after_prompt). */
struct ref_ctx {
    struct ekv_eval_runner *r;
    struct ekv_seq *forked;
    float *fork_logits; /* [n_vocab], NULL: no copy wanted */
};

static enum ekv_status ref_store(void *ud, int32_t idx, const float *logits, int32_t target) {
    (void)target;
    return ekv_ev_ref_store(((struct ref_ctx *)ud)->r, idx, logits);
}

/* A copy of seq, which has just read its prompt, and the prompt's last
 * logits (r->logits) into *logits; a sequence that cannot be copied
 * (EKV_ERR_UNSUPPORTED) leaves *out NULL and is not an error. */
enum ekv_status ekv_ev_fork_prompt(const struct ekv_eval_runner *r, struct ekv_seq *seq, struct ekv_seq **out,
                                   float *logits) {
    enum ekv_status s = ekv_seq_copy(seq, out);
    if (s == EKV_ERR_UNSUPPORTED) return EKV_OK;
    if (s == EKV_OK) memcpy(logits, r->logits, (size_t)r->n_vocab * sizeof(float));
    return s;
}

static enum ekv_status ref_fork(void *ud, struct ekv_seq *seq) {
    struct ref_ctx *c = ud;
    return ekv_ev_fork_prompt(c->r, seq, &c->forked, c->fork_logits);
}

/* The full-cache reference's teacher-forced run (kl: its logits into
 * r->ref_logits, allocated) and greedy answer (rouge: r->ref_text) of unit u. */
static enum ekv_status ref_runs(struct ekv_eval_runner *r, const struct ekv_eval_unit *u) {
    const unsigned m = r->cfg.metrics;
    struct ekv_seq *seq = NULL;
    struct ref_ctx rc = {.r = r};
    enum ekv_status s = EKV_OK;
    if (m & EKV_METRIC_KL) {
        if ((m & EKV_METRIC_ROUGE) && !u->stream && !r->cfg.no_fork &&
            !(rc.fork_logits = malloc((size_t)r->n_vocab * sizeof(float))))
            return ekv_error_set(EKV_ERR_NOMEM, "eval: no memory for the prompt's logits");
        if ((s = ekv_seq_new(r->ctx, NULL, &seq)) == EKV_OK)
            s = run_scored(r, seq, u, ref_store, rc.fork_logits ? ref_fork : NULL, &rc);
        ekv_seq_free(seq);
        seq = NULL;
    }
    if (s == EKV_OK && (m & EKV_METRIC_ROUGE)) {
        int32_t n = 0;
        const bool from_fork = rc.forked != NULL;
        if (from_fork) seq = rc.forked, rc.forked = NULL;
        else s = ekv_seq_new(r->ctx, NULL, &seq);
        if (s == EKV_OK) s = run_greedy(r, seq, u, from_fork ? rc.fork_logits : NULL, &n);
        ekv_seq_free(seq);
        if (s == EKV_OK) s = ekv_ev_ref_answer(r, r->gen, n);
    }
    ekv_seq_free(rc.forked);
    free(rc.fork_logits);
    return s;
}

enum ekv_status ekv_ev_ref_answer(struct ekv_eval_runner *r, const int32_t *gen, int32_t n) {
    if (gen != r->gen) memcpy(r->gen, gen, (size_t)n * sizeof *gen);
    enum ekv_status s = gen_text(r, n);
    if (s == EKV_OK && !rouge_empty(r->cfg.rouge, r->text) && !(r->ref_text = strdup(r->text)))
        s = ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    return s;
}

enum ekv_status ekv_ev_ref_ready(struct ekv_eval_runner *r) {
    if (!r->ref_pending) return EKV_OK;
    r->ref_pending = false;
    enum ekv_status s = ref_runs(r, &r->units[r->cur]);
    if (s != EKV_OK) ekv_ev_ref_clear(r); /* no unit is prepared now */
    return s;
}

enum ekv_status ekv_eval_unit_prepare(struct ekv_eval_runner *r, size_t ui) {
    if (!r || ui >= r->n_units) return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: unit %zu out of range", ui);
    ekv_ev_ref_clear(r);
    const struct ekv_eval_unit *u = &r->units[ui];
    const unsigned m = r->cfg.metrics;
    struct ekv_seq *seq = NULL;
    enum ekv_status s = EKV_OK;
    ekv_prompt_free(r->prompt);
    r->prompt = NULL;
    if (u->n_image > 0) {
        struct ekv_image_input img[16];
        if (u->n_images > 16) return ekv_error_set(EKV_ERR_INTERNAL, "eval: unit %zu has %d images", ui, (int)u->n_images);
        for (int32_t k = 0; k < u->n_images; k++) img[k] = (struct ekv_image_input){.path = u->images[k]};
        s = ekv_prompt_new(r->model, u->prompt_text, strlen(u->prompt_text), true, &r->prompt);
        if (s == EKV_OK) s = ekv_prompt_set_images(r->prompt, r->cfg.vision, r->ctx, img, u->n_images);
        if (s == EKV_OK && (ekv_prompt_n_tokens(r->prompt) != u->n_prompt ||
                            ekv_prompt_n_positions(r->prompt) != ekv_ev_unit_positions(u)))
            s = ekv_error_set(EKV_ERR_INTERNAL, "eval: unit %zu: the prompt changed between tokenization and encoding", ui);
        if (s != EKV_OK) return ekv_error_prefix(s, "image '%s'%s", u->images[0], u->n_images > 1 ? " (and others)" : "");
    }
    if (m & EKV_METRIC_KL) {
        r->n_scored = unit_n_scored(u);
        size_t cells;
        if (r->n_scored < 1 || !ev_mul_ok((size_t)r->n_scored, (size_t)r->n_vocab, &cells) ||
            !ev_mul_ok(cells, sizeof(float), &cells))
            return ekv_error_set(EKV_ERR_INTERNAL, "eval: unit %zu scores %d tokens", ui, r->n_scored);
        if (!(r->ref_logits = malloc(cells))) return ekv_error_set(EKV_ERR_NOMEM, "eval: no memory for reference logits");
    }
    /* the teacher-forced and greedy references now, or (grouped cells) in the first group */
    r->ref_pending = (m & (EKV_METRIC_KL | EKV_METRIC_ROUGE)) && !u->stream && !r->cfg.no_fork && r->cfg.share > 1;
    if (!r->ref_pending && (s = ref_runs(r, u)) != EKV_OK) goto fail;
    if (m & EKV_METRIC_HITRATE) {
        const size_t P = (size_t)ekv_ev_unit_positions(u);
        size_t cells = (size_t)r->n_layer * (size_t)r->n_head_kv;
        if (!ev_mul_ok(cells, P, &cells) || !(r->ref_attn = malloc(cells * sizeof(float)))) {
            s = ekv_error_set(EKV_ERR_NOMEM, "eval: no memory for the reference attention");
            goto fail;
        }
        if ((s = ekv_seq_new(r->ctx, NULL, &seq)) != EKV_OK) goto fail;
        s = ekv_seq_kv_record_attention(seq, true);
        if (s == EKV_OK) s = prefill_unit(r, seq, u, NULL);
        if (s == EKV_OK) s = ekv_seq_decode(seq, u->tokens[u->n_prompt], NULL);
        float *row = s == EKV_OK ? malloc((P + 1) * sizeof *row) : NULL;
        if (s == EKV_OK && !row) s = ekv_error_set(EKV_ERR_NOMEM, "eval: no memory for an attention row");
        for (int32_t l = 0; s == EKV_OK && l < r->n_layer; l++)
            for (int32_t h = 0; s == EKV_OK && h < r->n_head_kv; h++) {
                size_t len = 0;
                s = ekv_seq_kv_last_attention(seq, l, h, row, P + 1, &len);
                if (s == EKV_OK && len != P + 1)
                    s = ekv_error_set(EKV_ERR_INTERNAL, "eval: full cache holds %zu entries, expected %zu", len, P + 1);
                if (s == EKV_OK)
                    memcpy(r->ref_attn + ((size_t)l * (size_t)r->n_head_kv + (size_t)h) * P, row, P * sizeof(float));
            }
        free(row);
        ekv_seq_free(seq);
        if (s != EKV_OK) goto fail;
    }
    r->cur = ui;
    return EKV_OK;
fail:
    ekv_ev_ref_clear(r);
    return s;
}

/* ---- one policy on the prepared unit ---- */

enum ekv_status ekv_ev_score_cell(void *ud, int32_t idx, const float *logits, int32_t target) {
    struct ekv_ev_cell *c = ud;
    struct ekv_eval_runner *r = c->r;
    enum ekv_status s = EKV_OK;
    if (r->cfg.metrics & EKV_METRIC_PPL) s = ekv_ppl_add_logits(&c->cell->ppl, logits, (size_t)r->n_vocab, target, NULL);
    if (s == EKV_OK && (r->cfg.metrics & EKV_METRIC_ACC)) {
        size_t t;
        if ((s = ekv_argmax(logits, (size_t)r->n_vocab, &t)) != EKV_OK) return s;
        c->n_scored++;
        c->all_top1 = c->all_top1 && (int32_t)t == target;
    }
    if (s == EKV_OK && (r->cfg.metrics & EKV_METRIC_KL)) {
        if (idx < 0 || idx >= r->n_scored)
            return ekv_error_set(EKV_ERR_INTERNAL, "eval: scored index %d of %d", idx, r->n_scored);
        s = ekv_kl_add(&c->cell->kl, r->ref_logits + (size_t)idx * (size_t)r->n_vocab, logits, (size_t)r->n_vocab);
    }
    return s;
}

enum ekv_status ekv_ev_hitrate_cell(void *ud, struct ekv_seq *seq) {
    struct ekv_ev_cell *c = ud;
    struct ekv_eval_runner *r = c->r;
    const size_t P = (size_t)ekv_ev_unit_positions(c->u);
    int32_t *pos = malloc(P * sizeof *pos);
    uint32_t *kept = malloc(P * sizeof *kept);
    enum ekv_status s = (pos && kept) ? EKV_OK : ekv_error_set(EKV_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; s == EKV_OK && l < r->n_layer; l++)
        for (int32_t h = 0; s == EKV_OK && h < r->n_head_kv; h++) {
            int32_t n = ekv_seq_kv_layer_len(seq, l, h);
            if (n < 0 || (size_t)n > P) {
                s = ekv_error_set(EKV_ERR_INTERNAL, "eval: layer %d head %d keeps %d of %zu prompt tokens", l, h, n, P);
                break;
            }
            if ((s = ekv_seq_kv_entries(seq, l, h, pos, NULL, NULL)) != EKV_OK) break;
            for (int32_t j = 0; j < n; j++) kept[j] = (uint32_t)pos[j];
            double hit, jac;
            const float *row = r->ref_attn + ((size_t)l * (size_t)r->n_head_kv + (size_t)h) * P;
            if ((s = ekv_kept_agreement(row, P, kept, (size_t)n, 0, &hit, &jac, NULL)) != EKV_OK) break;
            ekv_mean_add(&c->cell->hit_rate, hit);
            ekv_mean_add(&c->cell->jaccard, jac);
        }
    free(pos);
    free(kept);
    return s;
}

/* After the prompt of the teacher-forced run: the cache hit rate, and with
 * ROUGE a copy of the sequence, so that the greedy answer starts from the
 * same prompt without reading it again (a copy equals its source bit for
 * bit: ekv_seq_copy). A sequence that cannot be copied (EKV_ERR_UNSUPPORTED)
 * makes the greedy run read the prompt itself. */
static enum ekv_status after_prompt(void *ud, struct ekv_seq *seq) {
    struct ekv_ev_cell *c = ud;
    enum ekv_status s = EKV_OK;
    if (c->r->cfg.metrics & EKV_METRIC_HITRATE) s = ekv_ev_hitrate_cell(ud, seq);
    if (s != EKV_OK || !c->fork) return s;
    return ekv_ev_fork_prompt(c->r, seq, &c->forked, c->fork_logits);
}

void ekv_ev_add_kv_frac(struct ekv_eval_cell *cell, const struct ekv_seq *seq) {
    struct ekv_kv_stats st;
    ekv_seq_kv_stats(seq, &st);
    if (st.entries_full > 0) ekv_mean_add(&cell->kv_frac, (double)st.entries / (double)st.entries_full);
    ekv_mean_add(&cell->kv_bytes, (double)st.bytes);
    if (st.bytes_full_f32 > 0) ekv_mean_add(&cell->kv_bytes_frac, (double)st.bytes / (double)st.bytes_full_f32);
}

enum ekv_status ekv_ev_unit_run(struct ekv_eval_runner *r, const struct ekv_kv_params *kv, struct ekv_eval_cell *cell) {
    enum ekv_status s = ekv_ev_ref_ready(r);
    if (s != EKV_OK) return s;
    const struct ekv_eval_unit *u = &r->units[r->cur];
    const unsigned m = r->cfg.metrics;
    const bool rouge = (m & EKV_METRIC_ROUGE) && r->ref_text;
    struct ekv_ev_cell cc = {.r = r, .cell = cell, .u = u, .all_top1 = true};
    struct ekv_seq *seq = NULL;
    bool frac_done = false;
    if (m & (EKV_EV_TF_METRICS | EKV_METRIC_HITRATE)) {
        const bool tf = m & EKV_EV_TF_METRICS;
        /* one prompt for both runs: the greedy one continues a copy (JSONL units) */
        cc.fork = rouge && !u->stream && !r->cfg.no_fork;
        if (cc.fork && !(cc.fork_logits = malloc((size_t)r->n_vocab * sizeof(float))))
            s = ekv_error_set(EKV_ERR_NOMEM, "eval: no memory for the prompt's logits");
        if (s == EKV_OK) s = ekv_seq_new(r->ctx, kv, &seq);
        if (s == EKV_OK) {
            s = run_scored(r, seq, u, tf ? ekv_ev_score_cell : NULL,
                           (m & EKV_METRIC_HITRATE) || cc.fork ? after_prompt : NULL, &cc);
            if (s == EKV_OK) ekv_ev_add_kv_frac(cell, seq);
            if (s == EKV_OK && (m & EKV_METRIC_ACC) && cc.n_scored > 0)
                ekv_mean_add(&cell->acc, cc.all_top1 ? 1.0 : 0.0);
        }
        frac_done = true;
        ekv_seq_free(seq);
        seq = NULL;
        if (s != EKV_OK) {
            ekv_seq_free(cc.forked);
            free(cc.fork_logits);
            return s;
        }
    }
    if (!rouge) return EKV_OK;
    int32_t n = 0;
    float *lg = NULL;
    if (cc.forked) {
        seq = cc.forked, lg = cc.fork_logits;
    } else if ((s = ekv_seq_new(r->ctx, kv, &seq)) != EKV_OK) {
        free(cc.fork_logits);
        return s;
    }
    s = run_greedy(r, seq, u, lg, &n);
    if (s == EKV_OK && !frac_done) ekv_ev_add_kv_frac(cell, seq);
    ekv_seq_free(seq);
    free(cc.fork_logits);
    return s == EKV_OK ? ekv_ev_rouge_add(r, r->gen, n, cell) : s;
}

/* Detokenises gen[0..n) and adds its ROUGE-L against the reference answer
 * to cell (an empty answer scores 0). */
enum ekv_status ekv_ev_rouge_add(struct ekv_eval_runner *r, const int32_t *gen, int32_t n, struct ekv_eval_cell *cell) {
    if (gen != r->gen) memcpy(r->gen, gen, (size_t)n * sizeof *gen);
    enum ekv_status s = gen_text(r, n);
    if (s != EKV_OK) return s;
    struct ekv_rouge rg = {0};
    if (!rouge_empty(r->cfg.rouge, r->text) && (s = ekv_rouge_l(r->cfg.rouge, r->text, r->ref_text, &rg)) != EKV_OK)
        return s;
    ekv_mean_add(&cell->rouge_f, rg.f);
    ekv_mean_add(&cell->rouge_p, rg.p);
    ekv_mean_add(&cell->rouge_r, rg.r);
    return EKV_OK;
}

enum ekv_status ekv_eval_unit_run(struct ekv_eval_runner *r, const struct ekv_kv_params *kv,
                                  struct ekv_eval_cell *cell) {
    if (!r || !cell || r->cur >= r->n_units)
        return ekv_error_set(EKV_ERR_INVALID_ARG, "eval: no unit prepared (call ekv_eval_unit_prepare first)");
    return ekv_ev_unit_run(r, kv, cell);
}

