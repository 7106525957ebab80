/*
 * context.c — contexts and sequences: owning the worker pool and scratch,
 * turning tokens or embeddings into the rows of a forward, splitting prompts
 * into chunks for block-wise compression, batching decode steps of several
 * sequences, and reporting cache statistics.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "engine/engine.h"
#include "model/vocab.h"

struct ekv_context_params ekv_context_default_params(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    struct ekv_context_params p = {.n_threads = (int32_t)(n < 1 ? 1 : n > 8 ? 8 : n), .n_ctx = 0};
    return p;
}

static void free_scratch(struct ekv_context *c) {
    free(c->x); free(c->xb); free(c->q); free(c->k); free(c->v);
    free(c->att); free(c->proj); free(c->gate); free(c->up); free(c->rope_cs); free(c->rope_key);
    c->x = c->xb = c->q = c->k = c->v = c->att = c->proj = c->gate = c->up = c->rope_cs = NULL;
    c->rope_key = NULL;
    c->scratch_rows = 0;
}

static float *alloc_rows(size_t rows, int64_t width, bool *ok) {
    size_t n;
    if (!ekv_mul_ok(rows, (size_t)width, &n) || !ekv_mul_ok(n, sizeof(float), &n)) {
        *ok = false;
        return NULL;
    }
    float *p = malloc(n ? n : 1);
    if (!p) *ok = false;
    return p;
}

enum ekv_status ekv_context_reserve(struct ekv_context *c, int32_t rows) {
    if (rows <= 0) rows = 1;
    if ((size_t)rows <= c->scratch_rows) return EKV_OK;
    const struct ekv_model_info *in = &c->model->info;
    size_t want = EKV_MAX((size_t)rows, c->scratch_rows * 3 / 2);
    size_t ffn_rows = EKV_MIN(want, (size_t)256);
    int64_t qd = (int64_t)in->n_head * in->head_dim, kvd = (int64_t)in->n_head_kv * in->head_dim;
    free_scratch(c);
    bool ok = true;
    c->x = alloc_rows(want, in->n_embd, &ok);
    c->xb = alloc_rows(want, in->n_embd, &ok);
    c->q = alloc_rows(want, qd, &ok);
    c->k = alloc_rows(want, kvd, &ok);
    c->v = alloc_rows(want, kvd, &ok);
    c->att = alloc_rows(want, qd, &ok);
    c->proj = alloc_rows(want, in->n_embd, &ok);
    c->gate = alloc_rows(ffn_rows, in->n_ff, &ok);
    c->up = alloc_rows(ffn_rows, in->n_ff, &ok);
    c->rope_cs = alloc_rows(want, in->rope_dim, &ok);
    if (ok && !(c->rope_key = calloc(want, sizeof *c->rope_key))) ok = false; /* kind 0: nothing yet */
    if (!ok) {
        free_scratch(c);
        return ekv_err(EKV_ERR_NOMEM, "out of memory for activations of %d positions", rows);
    }
    c->scratch_rows = want;
    return EKV_OK;
}

/* The device a context runs on: params, else $EKV_DEVICE, else auto. */
static enum ekv_status open_device(struct ekv_context *c, const char *spec) {
    if (!spec || !*spec) spec = getenv("EKV_DEVICE");
    if (!spec || !*spec) spec = "auto";
    snprintf(c->device_name, sizeof c->device_name, "cpu");
    if (!strcmp(spec, "cpu")) return EKV_OK;
    c->gpu_required = strcmp(spec, "auto") != 0;
    enum ekv_status s = ekv_vk_ctx_new(c, spec, &c->gpu);
    if (s != EKV_OK) return s;
    if (c->gpu) snprintf(c->device_name, sizeof c->device_name, "%s", ekv_vk_ctx_name(c->gpu));
    return EKV_OK;
}

enum ekv_status ekv_context_new(const struct ekv_model *model, const struct ekv_context_params *params,
                                struct ekv_context **out) {
    ekv_err_clear();
    if (!model || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_context_new: model and out are required");
    *out = NULL;
    struct ekv_context_params p = params ? *params : ekv_context_default_params();
    if (p.n_threads < 1 || p.n_threads > 256)
        return ekv_err(EKV_ERR_INVALID_ARG, "thread count %d out of range [1, 256]", p.n_threads);
    if (p.n_ctx < 0) return ekv_err(EKV_ERR_INVALID_ARG, "context size %d is negative", p.n_ctx);
    if (p.n_ctx == 0) p.n_ctx = model->info.n_ctx_train;
    struct ekv_context *c = calloc(1, sizeof *c);
    if (!c) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    c->model = model;
    c->params = p;
    c->params.device = NULL; /* borrowed for this call only */
    ekv_model_rope_params(model, p.n_ctx, &c->rope);
    enum ekv_status s = ekv_pool_new(p.n_threads, &c->pool);
    if (s == EKV_OK) s = ekv_context_reserve(c, 1);
    if (s == EKV_OK) s = open_device(c, p.device);
    if (s != EKV_OK) {
        ekv_context_free(c);
        return s;
    }
    *out = c;
    return EKV_OK;
}

void ekv_context_free(struct ekv_context *c) {
    if (!c) return;
    ekv_vk_ctx_free(c->gpu);
    ekv_pool_free(c->pool);
    free_scratch(c);
    free(c);
}

enum ekv_status ekv_seq_new(struct ekv_context *ctx, const struct ekv_kv_params *kvp, struct ekv_seq **out) {
    ekv_err_clear();
    if (!ctx || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_new: context and out are required");
    *out = NULL;
    struct ekv_kv_params p = kvp ? *kvp : ekv_kv_default_params();
    struct ekv_seq *s = calloc(1, sizeof *s);
    if (!s) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    s->ctx = ctx;
    const struct ekv_model_info *in = &ctx->model->info;
    enum ekv_status st = ekv_kv_new(in->n_layer, in->n_head, in->n_head_kv, in->head_dim, &p, &s->kv);
    if (st != EKV_OK) {
        free(s);
        return st;
    }
    s->kv->swa_window = in->sliding_window;
    s->kv->rope = ctx->rope; /* the keys' RoPE, for policies that move keys between positions */
    if (ekv_kv_mrope(s->kv) && s->kv->params.compat_ref) {
        ekv_seq_free(s);
        return ekv_err(EKV_ERR_UNSUPPORTED, "ekv_seq_new: --kv-compat ref renumbers positions one by one, which an "
                                            "M-RoPE model (%s: three position components per token) cannot take",
                       in->arch);
    }
    if (ctx->gpu) {
        const char *why = NULL;
        if (ekv_vk_seq_supported(s, &why)) {
            st = ekv_vk_seq_new(ctx->gpu, s, &s->gpu);
        } else if (ctx->gpu_required) {
            st = ekv_err(EKV_ERR_UNSUPPORTED, "ekv_seq_new: %s cannot run this cache on the GPU yet: %s "
                                              "(use device cpu or auto)", ctx->device_name, why);
        }
        if (st != EKV_OK) {
            ekv_seq_free(s);
            return st;
        }
    }
    *out = s;
    return EKV_OK;
}

void ekv_seq_free(struct ekv_seq *s) {
    if (!s) return;
    if (s->prefill) ekv_prefill_detach(s->prefill);
    if (s->gpu) ekv_vk_seq_free(s->ctx->gpu, s->gpu);
    ekv_kv_free(s->kv);
    free(s);
}

enum ekv_status ekv_seq_copy(const struct ekv_seq *src, struct ekv_seq **out) {
    ekv_err_clear();
    if (!src || !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_copy: src and out are required");
    *out = NULL;
    enum ekv_status st = ekv_seq_ready(src, "ekv_seq_copy");
    if (st != EKV_OK) return st;
    struct ekv_seq *s = calloc(1, sizeof *s);
    if (!s) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    s->ctx = src->ctx;
    s->n_seen = src->n_seen;
    s->rope_delta = src->rope_delta;
    st = ekv_kv_clone(src->kv, &s->kv);
    if (st == EKV_OK && src->gpu) st = ekv_vk_seq_copy(src->ctx->gpu, src->gpu, s, &s->gpu);
    if (st != EKV_OK) {
        ekv_seq_free(s);
        return ekv_err_prefix(st, "ekv_seq_copy");
    }
    *out = s;
    return EKV_OK;
}

int64_t ekv_seq_n_seen(const struct ekv_seq *s) { return s->n_seen; }

enum ekv_status ekv_seq_ready(const struct ekv_seq *seq, const char *fn) {
    if (seq->prefill)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: the sequence is reading a prompt in pieces (ekv_prefill_step)", fn);
    if (seq->broken)
        return ekv_err(EKV_ERR_INVALID_ARG, "%s: the sequence was left with a half-read prompt; free it", fn);
    return EKV_OK;
}

enum ekv_status ekv_input_rows(const struct ekv_context *ctx, const struct ekv_input *in, int32_t skip, int32_t n,
                               float *x, uint8_t *tags) {
    const struct ekv_model *m = ctx->model;
    const int64_t D = m->info.n_embd;
    int32_t row = 0, at = 0;
    for (int32_t si = 0; si < in->n_segs && row < n; si++) {
        const struct ekv_segment *sg = &in->segs[si];
        for (int32_t j = 0; j < sg->n && row < n; j++, at++) {
            if (at < skip) continue;
            float *dst = x + (size_t)row * D;
            if (sg->tokens) {
                int32_t t = sg->tokens[j];
                if (t < 0 || t >= m->info.n_vocab)
                    return ekv_err(EKV_ERR_INVALID_ARG, "token id %d out of range [0, %d)", t, m->info.n_vocab);
                enum ekv_status s = ekv_forward_embed(m, t, dst);
                if (s != EKV_OK) return s;
            } else {
                memcpy(dst, sg->embd + (size_t)j * D, (size_t)D * sizeof(float));
            }
            if (tags) tags[row] = (uint8_t)sg->tag;
            row++;
        }
    }
    return EKV_OK;
}

enum ekv_status ekv_input_check(const struct ekv_seq *seq, const struct ekv_input *in, int64_t *total_out) {
    if (!seq || !in || (in->n_segs > 0 && !in->segs) || in->n_segs < 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "sequence and input are required");
    const struct ekv_context *ctx = seq->ctx;
    int64_t total = 0;
    for (int32_t i = 0; i < in->n_segs; i++) {
        const struct ekv_segment *sg = &in->segs[i];
        if (sg->n < 0 || (sg->n > 0 && !sg->tokens && !sg->embd))
            return ekv_err(EKV_ERR_INVALID_ARG, "input segment %d has no tokens or embeddings", i);
        if (sg->tag > EKV_TAG_GENERATED) return ekv_err(EKV_ERR_INVALID_ARG, "input segment %d: bad tag", i);
        total += sg->n;
    }
    if (total == 0) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_eval: empty input");
    if (seq->n_seen + total > ctx->params.n_ctx)
        return ekv_err(EKV_ERR_CONTEXT_FULL, "context full: %lld positions seen + %lld new > context size %d",
                       (long long)seq->n_seen, (long long)total, ctx->params.n_ctx);
    *total_out = total;
    return EKV_OK;
}

enum ekv_status ekv_input_mpos(const struct ekv_seq *seq, const struct ekv_input *in, int32_t n, int32_t **mpos,
                               int64_t *delta_end) {
    *mpos = NULL;
    *delta_end = seq->rope_delta;
    if (!ekv_kv_mrope(seq->kv)) return EKV_OK;
    bool grid = false;
    for (int32_t i = 0; i < in->n_segs; i++) {
        const struct ekv_segment *sg = &in->segs[i];
        if (!sg->grid_w && !sg->grid_h) continue;
        if (sg->grid_w < 1 || sg->grid_h < 1 || (int64_t)sg->grid_w * sg->grid_h != sg->n)
            return ekv_err(EKV_ERR_INVALID_ARG, "input segment %d: an image grid of %d x %d for %d rows", (int)i,
                           (int)sg->grid_w, (int)sg->grid_h, (int)sg->n);
        grid = true;
    }
    if (!grid) return EKV_OK;
    int32_t *m = malloc((size_t)n * 3 * sizeof *m);
    if (!m) return ekv_err(EKV_ERR_NOMEM, "out of memory for the positions of %d rows", (int)n);
    int64_t pos = seq->n_seen, delta = seq->rope_delta;
    int32_t row = 0;
    for (int32_t i = 0; i < in->n_segs; i++) {
        const struct ekv_segment *sg = &in->segs[i];
        const int64_t t = pos + delta;
        for (int32_t j = 0; j < sg->n; j++, row++) {
            if (sg->grid_w > 0) { /* llama.cpp mtmd: (t, t + row, t + col) */
                m[3 * row] = (int32_t)t;
                m[3 * row + 1] = (int32_t)(t + j / sg->grid_w);
                m[3 * row + 2] = (int32_t)(t + j % sg->grid_w);
            } else {
                m[3 * row] = m[3 * row + 1] = m[3 * row + 2] = (int32_t)(t + j);
            }
        }
        pos += sg->n;
        if (sg->grid_w > 0) delta += (int64_t)EKV_MAX(sg->grid_w, sg->grid_h) - sg->n;
    }
    *mpos = m;
    *delta_end = delta;
    return EKV_OK;
}

enum ekv_status ekv_seq_eval(struct ekv_seq *seq, const struct ekv_input *in, float *logits) {
    ekv_err_clear();
    int64_t total = 0;
    enum ekv_status s = ekv_input_check(seq, in, &total);
    if (s == EKV_OK) s = ekv_seq_ready(seq, "ekv_seq_eval");
    if (s != EKV_OK) return ekv_err_prefix(s, "ekv_seq_eval");
    struct ekv_context *ctx = seq->ctx;
    const int32_t n = (int32_t)total;
    uint8_t *tags = malloc((size_t)n);
    if (!tags) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    int32_t *mpos = NULL;
    int64_t delta_end = 0;
    if ((s = ekv_input_mpos(seq, in, n, &mpos, &delta_end)) != EKV_OK) {
        free(tags);
        return ekv_err_prefix(s, "ekv_seq_eval");
    }
    /* all tags first (policies see the whole prompt's modality layout) */
    int32_t at = 0;
    for (int32_t i = 0; i < in->n_segs; i++)
        for (int32_t j = 0; j < in->segs[i].n; j++) tags[at++] = (uint8_t)in->segs[i].tag;

    int32_t chunk = n;
    if (in->is_prompt && ekv_kv_prompt_chunk(seq->kv) > 0) chunk = ekv_kv_prompt_chunk(seq->kv);
    if (!in->is_prompt) chunk = 1; /* decode steps: the policy acts after each one */
    const int32_t V = ctx->model->info.n_vocab;
    int64_t prompt_pos0 = seq->n_seen;
    for (int32_t off = 0; off < n && s == EKV_OK; off += chunk) {
        int32_t len = EKV_MIN(chunk, n - off);
        if ((s = ekv_context_reserve(ctx, len)) != EKV_OK) break;
        if ((s = ekv_input_rows(ctx, in, off, len, ctx->x, NULL)) != EKV_OK) break;
        struct ekv_fwd_part part = {.seq = seq, .row0 = 0, .n = len};
        part.step.is_prompt = in->is_prompt;
        part.step.last_chunk = off + len == n;
        part.step.pos0 = seq->n_seen;
        part.step.n_new = len;
        part.step.prompt_pos0 = in->is_prompt ? prompt_pos0 : seq->n_seen;
        part.step.prompt_len = in->is_prompt ? n : 0;
        part.step.prompt_tags = in->is_prompt ? tags : NULL;
        part.step.tags = tags + off;
        part.step.mpos = mpos ? mpos + 3 * (size_t)off : NULL;
        part.step.rope_delta = seq->rope_delta;
        float *out = NULL;
        if (logits) out = in->logits_all ? logits + (size_t)off * V : (off + len == n ? logits : NULL);
        /* logits of every row, or of the last one */
        s = ekv_forward(ctx, &part, 1, len, in->logits_all ? 0 : len - 1, out);
        if (s == EKV_OK) seq->n_seen += len;
    }
    if (s == EKV_OK) seq->rope_delta = delta_end;
    else if (mpos && seq->n_seen > prompt_pos0)
        seq->broken = true; /* part of an input with an image read: where the next row's positions start is undefined */
    free(mpos);
    free(tags);
    return s;
}

/* Why b cannot read a prompt together with a (ekv_seq_eval_shared), with
 * the status for it in *st; NULL when it can. */
static const char *share_refusal(const struct ekv_seq *a, const struct ekv_seq *b, enum ekv_status *st) {
    *st = EKV_ERR_INVALID_ARG;
    if (b->prefill) return "is reading a prompt in pieces (ekv_prefill_step)";
    if (b->broken) return "was left with a half-read prompt; free it";
    if (b->ctx != a->ctx) return "belongs to another context";
    *st = EKV_ERR_UNSUPPORTED;
    if (b->gpu) return "runs on the GPU (shared prompts are read on the CPU)";
    *st = EKV_ERR_INVALID_ARG;
    if (b->n_seen != 0) return "has read positions already (only new sequences share a prompt)";
    *st = EKV_ERR_UNSUPPORTED;
    if (ekv_kv_prompt_chunk(b->kv) > 0) return "reads prompts in blocks (--kv-chunk): its policy compresses inside the prompt";
    *st = EKV_ERR_INVALID_ARG;
    const struct ekv_kv *ka = a->kv, *kb = b->kv;
    if (kb->fk.type != ka->fk.type || kb->fv.type != ka->fv.type || kb->fk.g != ka->fk.g || kb->fv.g != ka->fv.g ||
        kb->fk.r != ka->fk.r || kb->fv.r != ka->fv.r)
        return "stores keys and values in other types than sequence 0 (the prompt's attention reads the stored rows)";
    return NULL;
}

bool ekv_seq_can_share(const struct ekv_seq *a, const struct ekv_seq *b) {
    enum ekv_status st;
    return a && b && !share_refusal(a, a, &st) && !share_refusal(a, b, &st);
}

/* Why seqs[i] cannot follow seqs[0] through one shared prompt forward
 * (EKV_OK when it can). */
static enum ekv_status shared_check(struct ekv_seq *const *seqs, int32_t i) {
    if (!seqs[i]) return ekv_err(EKV_ERR_INVALID_ARG, "sequence %d is NULL", (int)i);
    for (int32_t j = 0; j < i; j++)
        if (seqs[j] == seqs[i]) return ekv_err(EKV_ERR_INVALID_ARG, "sequence %d appears twice", (int)i);
    enum ekv_status st;
    const char *why = share_refusal(seqs[0], seqs[i], &st);
    return why ? ekv_err(st, "sequence %d %s", (int)i, why) : EKV_OK;
}

enum ekv_status ekv_seq_eval_shared(struct ekv_seq *const *seqs, int32_t n, const struct ekv_input *in, float *logits) {
    ekv_err_clear();
    if (!seqs || n < 1 || !in) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_eval_shared: sequences and input are required");
    if (!in->is_prompt || in->logits_all)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_eval_shared: the input must be a prompt with the last position's logits");
    enum ekv_status s = EKV_OK;
    for (int32_t i = 0; i < n && s == EKV_OK; i++) s = shared_check(seqs, i);
    if (s != EKV_OK) return ekv_err_prefix(s, "ekv_seq_eval_shared");
    struct ekv_seq *lead = seqs[0];
    int64_t total = 0;
    if ((s = ekv_input_check(lead, in, &total)) != EKV_OK) return ekv_err_prefix(s, "ekv_seq_eval_shared");
    if (n == 1) return ekv_seq_eval(lead, in, logits);
    struct ekv_kv **kvs = malloc((size_t)(n - 1) * sizeof *kvs);
    if (!kvs) return ekv_err(EKV_ERR_NOMEM, "out of memory for %d sequences", (int)n);
    for (int32_t i = 1; i < n; i++) kvs[i - 1] = seqs[i]->kv;
    lead->kv->shadows = kvs;
    lead->kv->n_shadows = n - 1;
    s = ekv_seq_eval(lead, in, logits); /* one forward: the lead's chunking is 0 (checked) */
    lead->kv->shadows = NULL;
    lead->kv->n_shadows = 0;
    free(kvs);
    for (int32_t i = 1; i < n; i++) {
        if (s == EKV_OK) seqs[i]->n_seen = lead->n_seen, seqs[i]->rope_delta = lead->rope_delta;
        else seqs[i]->broken = true; /* its cache may hold part of the prompt */
    }
    if (s != EKV_OK) lead->broken = true;
    return s;
}

enum ekv_status ekv_seq_prefill(struct ekv_seq *seq, const int32_t *tokens, int32_t n, float *logits) {
    struct ekv_segment sg = {.tokens = tokens, .n = n, .tag = EKV_TAG_TEXT};
    struct ekv_input in = {.segs = &sg, .n_segs = 1, .is_prompt = true};
    return ekv_seq_eval(seq, &in, logits);
}

enum ekv_status ekv_seq_decode(struct ekv_seq *seq, int32_t token, float *logits) {
    struct ekv_segment sg = {.tokens = &token, .n = 1, .tag = EKV_TAG_GENERATED};
    struct ekv_input in = {.segs = &sg, .n_segs = 1, .is_prompt = false};
    return ekv_seq_eval(seq, &in, logits);
}

enum ekv_status ekv_decode_batch(struct ekv_context *ctx, struct ekv_seq *const *seqs, const int32_t *tokens,
                                 int32_t n, float *logits) {
    ekv_err_clear();
    if (!ctx || !seqs || !tokens || n <= 0)
        return ekv_err(EKV_ERR_INVALID_ARG, "ekv_decode_batch: context, sequences and tokens are required");
    const struct ekv_model *m = ctx->model;
    for (int32_t i = 0; i < n; i++) {
        if (!seqs[i] || seqs[i]->ctx != ctx)
            return ekv_err(EKV_ERR_INVALID_ARG, "ekv_decode_batch: sequence %d does not belong to this context", i);
        enum ekv_status r = ekv_seq_ready(seqs[i], "ekv_decode_batch");
        if (r != EKV_OK) return r;
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return ekv_err(EKV_ERR_INVALID_ARG, "ekv_decode_batch: sequence %d appears twice", i);
        if (seqs[i]->n_seen + 1 > ctx->params.n_ctx)
            return ekv_err(EKV_ERR_CONTEXT_FULL, "context full for sequence %d", i);
        if (tokens[i] < 0 || tokens[i] >= m->info.n_vocab)
            return ekv_err(EKV_ERR_INVALID_ARG, "token id %d out of range", tokens[i]);
    }
    for (int32_t i = 1; i < n; i++)
        if (ekv_seq_backend(seqs[i]) != ekv_seq_backend(seqs[0])) { /* some on the GPU, some not */
            const int32_t V = m->info.n_vocab;
            for (int32_t j = 0; j < n; j++) {
                enum ekv_status r = ekv_seq_decode(seqs[j], tokens[j], logits ? logits + (size_t)j * V : NULL);
                if (r != EKV_OK) return r;
            }
            return EKV_OK;
        }
    enum ekv_status s = ekv_context_reserve(ctx, n);
    if (s != EKV_OK) return s;
    struct ekv_fwd_part *parts = calloc((size_t)n, sizeof *parts);
    if (!parts) return ekv_err(EKV_ERR_NOMEM, "out of memory");
    static const uint8_t gen_tag = EKV_TAG_GENERATED;
    for (int32_t i = 0; i < n && s == EKV_OK; i++) {
        s = ekv_forward_embed(m, tokens[i], ctx->x + (size_t)i * m->info.n_embd);
        parts[i].seq = seqs[i];
        parts[i].row0 = i;
        parts[i].n = 1;
        parts[i].step.pos0 = seqs[i]->n_seen;
        parts[i].step.n_new = 1;
        parts[i].step.prompt_pos0 = seqs[i]->n_seen;
        parts[i].step.tags = &gen_tag;
        parts[i].step.rope_delta = seqs[i]->rope_delta;
    }
    if (s == EKV_OK) s = ekv_forward(ctx, parts, n, n, 0, logits);
    if (s == EKV_OK)
        for (int32_t i = 0; i < n; i++) seqs[i]->n_seen++;
    free(parts);
    return s;
}

void ekv_seq_kv_params(const struct ekv_seq *seq, struct ekv_kv_params *out) {
    *out = seq->kv->params;
    out->policy = seq->kv->spec;
}

void ekv_seq_kv_stats(const struct ekv_seq *seq, struct ekv_kv_stats *st) {
    memset(st, 0, sizeof *st);
    const struct ekv_kv *kv = seq->kv;
    st->n_seen = seq->n_seen;
    st->policy = kv->spec;
    st->budget = kv->params.budget;
    if (seq->gpu && !ekv_vk_seq_compressed(seq->gpu)) { /* a full cache on the device: every position of every (layer, KV head) */
        st->entries = st->entries_full = seq->n_seen * kv->n_layer * kv->n_head_kv;
        st->bytes = st->bytes_full = ekv_vk_seq_bytes(seq->gpu, seq->n_seen, &st->bytes_alloc);
        st->peak_bytes_alloc = st->bytes_alloc;
        st->bytes_full_f32 = (uint64_t)st->entries_full * 2u * (uint64_t)kv->head_dim * sizeof(float);
        st->type_k = kv->params.type_k;
        st->type_v = kv->params.type_v;
        return;
    }
    for (int32_t l = 0; l < kv->n_layer; l++)
        for (int32_t h = 0; h < kv->n_head_kv; h++) {
            const struct ekv_kv_head *hd = &kv->layers[l].heads[h];
            st->entries += hd->len;
            st->evicted += hd->n_evicted;
            st->merged += hd->n_merged;
        }
    st->entries_full = seq->n_seen * kv->n_layer * kv->n_head_kv;
    st->bytes = ekv_kv_bytes(kv);
    st->bytes_full = ekv_kv_bytes_full(kv, seq->n_seen);
    st->bytes_full_f32 = (uint64_t)st->entries_full * 2u * (uint64_t)kv->head_dim * sizeof(float);
    st->bytes_alloc = kv->bytes_alloc;
    st->peak_bytes_alloc = kv->peak_bytes_alloc;
    if (seq->gpu) { /* a compressed cache on the device: the rows are there, the host keeps their metadata */
        uint64_t dev = 0;
        (void)ekv_vk_seq_bytes(seq->gpu, seq->n_seen, &dev);
        st->bytes_alloc += dev;
        st->peak_bytes_alloc += dev;
    }
    st->type_k = kv->params.type_k;
    st->type_v = kv->params.type_v;
}

int32_t ekv_seq_kv_layer_len(const struct ekv_seq *seq, int32_t layer, int32_t kv_head) {
    const struct ekv_kv *kv = seq->kv;
    if (layer < 0 || layer >= kv->n_layer || kv_head < 0 || kv_head >= kv->n_head_kv) return 0;
    if (seq->gpu && !ekv_vk_seq_compressed(seq->gpu)) return (int32_t)seq->n_seen; /* a full cache on the device */
    return kv->layers[layer].heads[kv_head].len;
}

enum ekv_status ekv_seq_kv_entries(const struct ekv_seq *seq, int32_t layer, int32_t kv_head, int32_t *positions,
                                   float *weights, uint8_t *tags) {
    const struct ekv_kv *kv = seq->kv;
    if (layer < 0 || layer >= kv->n_layer || kv_head < 0 || kv_head >= kv->n_head_kv)
        return ekv_err(EKV_ERR_INVALID_ARG, "layer %d / KV head %d out of range", layer, kv_head);
    if (seq->gpu && !ekv_vk_seq_compressed(seq->gpu)) { /* a full cache on the device: every position, weight 1 (tags are not kept there) */
        for (int64_t i = 0; i < seq->n_seen; i++) {
            if (positions) positions[i] = (int32_t)i;
            if (weights) weights[i] = 1.0f;
            if (tags) tags[i] = EKV_TAG_TEXT;
        }
        return EKV_OK;
    }
    const struct ekv_kv_head *h = &kv->layers[layer].heads[kv_head];
    if (positions) memcpy(positions, h->pos, (size_t)h->len * sizeof *positions);
    if (weights) memcpy(weights, h->weight, (size_t)h->len * sizeof *weights);
    if (tags) memcpy(tags, h->tag, (size_t)h->len);
    return EKV_OK;
}

int64_t ekv_seq_kv_window_start(const struct ekv_seq *seq) {
    if (!seq || !(seq->kv->stats & (EKV_STAT_WINSUM | EKV_STAT_SPARSITY))) return -1;
    return seq->kv->win_start;
}

const struct ekv_model *ekv_context_model(const struct ekv_context *ctx) { return ctx ? ctx->model : NULL; }

int32_t ekv_context_n_ctx(const struct ekv_context *ctx) { return ctx ? ctx->params.n_ctx : 0; }

const char *ekv_context_device(const struct ekv_context *ctx) { return ctx ? ctx->device_name : "cpu"; }
uint64_t ekv_context_device_bytes(const struct ekv_context *ctx) { return ctx ? ekv_vk_ctx_bytes(ctx->gpu, false) : 0; }
uint64_t ekv_context_device_peak_bytes(const struct ekv_context *ctx) {
    return ctx ? ekv_vk_ctx_bytes(ctx->gpu, true) : 0;
}
bool ekv_seq_on_device(const struct ekv_seq *seq) { return seq && seq->gpu; }
enum ekv_status ekv_context_device_profile(const struct ekv_context *ctx, char *buf, size_t cap) {
    ekv_err_clear();
    return ekv_vk_ctx_profile(ctx ? ctx->gpu : NULL, buf, cap);
}

void ekv_context_device_profile_reset(struct ekv_context *ctx) {
    if (ctx) ekv_vk_ctx_profile_reset(ctx->gpu);
}

uint64_t ekv_context_device_last_ns(const struct ekv_context *ctx) {
    return ctx ? ekv_vk_ctx_last_ns(ctx->gpu) : 0;
}
const struct ekv_backend_ops *ekv_seq_backend(const struct ekv_seq *seq) {
    return seq->gpu ? &ekv_backend_vk : &ekv_backend_cpu;
}

enum ekv_status ekv_seq_kv_record_attention(struct ekv_seq *seq, bool on) {
    if (!seq) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_kv_record_attention: NULL sequence");
    const unsigned before = seq->kv->extra_stats;
    if (on) seq->kv->extra_stats |= EKV_STAT_LASTROW;
    else seq->kv->extra_stats &= ~(unsigned)EKV_STAT_LASTROW;
    if (seq->gpu && on && !ekv_vk_seq_compressed(seq->gpu)) {
        /* a full cache on the GPU keeps no entries on the host: remade as a
         * cache whose host side tracks entries and statistics (the GPU's
         * statistics pass records the attention), before its first forward */
        const char *why = NULL;
        enum ekv_status s = EKV_OK;
        if (seq->n_seen > 0)
            s = ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_kv_record_attention: a full cache on the GPU records attention "
                                             "only from its first forward");
        else if (!ekv_vk_seq_supported(seq, &why))
            s = ekv_err(EKV_ERR_UNSUPPORTED, "ekv_seq_kv_record_attention on %s: %s", seq->ctx->device_name, why);
        struct ekv_vk_seq *ns = NULL;
        if (s == EKV_OK) s = ekv_vk_seq_new(seq->ctx->gpu, seq, &ns);
        if (s != EKV_OK) {
            seq->kv->extra_stats = before;
            return s;
        }
        ekv_vk_seq_free(seq->ctx->gpu, seq->gpu);
        seq->gpu = ns;
    }
    return EKV_OK;
}

enum ekv_status ekv_seq_kv_last_attention(const struct ekv_seq *seq, int32_t layer, int32_t kv_head, float *out,
                                          size_t n, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!seq || !n_out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_kv_last_attention: NULL argument");
    const struct ekv_kv *kv = seq->kv;
    if (layer < 0 || layer >= kv->n_layer || kv_head < 0 || kv_head >= kv->n_head_kv)
        return ekv_err(EKV_ERR_INVALID_ARG, "layer %d / KV head %d out of range", layer, kv_head);
    const struct ekv_kv_head *h = &kv->layers[layer].heads[kv_head];
    if (!(kv->extra_stats & EKV_STAT_LASTROW) || !h->lastrow)
        return ekv_err(EKV_ERR_INVALID_ARG, "attention is not recorded (ekv_seq_kv_record_attention before the forward)");
    *n_out = (size_t)h->len;
    if (n < (size_t)h->len)
        return ekv_err(EKV_ERR_INVALID_ARG, "buffer of %zu floats for %d entries", n, (int)h->len);
    if (h->len > 0 && !out) return ekv_err(EKV_ERR_INVALID_ARG, "ekv_seq_kv_last_attention: NULL out");
    if (h->len > 0) memcpy(out, h->lastrow, (size_t)h->len * sizeof *out);
    return EKV_OK;
}
