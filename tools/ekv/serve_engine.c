/*
 * serve_engine.c — the engine thread of `ekv serve`: the one owner of the
 * context and every sequence (a context is used from one thread at a time).
 *
 * Each iteration, under srv->mu: cancelled jobs are reaped (their caches
 * freed at once), then the head of the FIFO is admitted when its projected
 * cache fits --kv-mem next to what is reserved and fewer than --parallel
 * jobs are active. Then, without the lock: the one job reading its prompt
 * advances by --prefill-chunk tokens' worth (one layer of a piece of rows at
 * a time, ekv_prompt_step), and every running job decodes one token in one
 * ekv_decode_batch call, each with its own policy. Then, under the lock
 * again, the new text is published and the waiting HTTP threads woken.
 *
 * Admission by memory: a job in prefill reserves the most its cache holds
 * while the prompt is read (ekv_kv_project's bytes_peak: the layers already
 * compressed plus one whole layer); a running job reserves the larger of
 * its projected final cache (prompt + max_tokens under its policy) and what
 * it holds now. Only one job reads its prompt at a time, so the transient
 * peak is paid once, and the running jobs hold their compressed caches:
 * that is how a budget of 0.2 admits about five times the sessions.
 *
 * A request's numerics do not depend on the load: its prompt is always read
 * in pieces of the same size, and batched decoding gives each row the
 * result it has alone (the kernels' batch invariance).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

/* ------------------------------------------------------------------ */
/* jobs                                                                 */
/* ------------------------------------------------------------------ */

static void job_free(struct srv_job *j) {
    srv_request_free(&j->req);
    free(j->text);
    free(j->tok_end);
    free(j->toks);
    free(j->lp);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Drops one side's hold on a job (locked); the last one frees it. */
static void job_unref_locked(struct srv *srv, struct srv_job *j) {
    if (--j->refs > 0) return;
    job_free(j);
    srv->n_live--;
}

/* The engine's resources of a job (engine thread only). */
static void job_drop_engine(struct srv_job *j) {
    ekv_prefill_free(j->prefill);
    ekv_seq_free(j->seq);
    ekv_sampler_free(j->smp);
    srv_pkey_free(&j->pkey);
    j->prefill = NULL;
    j->seq = NULL;
    j->smp = NULL;
}

static void list_remove(struct srv_job **head, struct srv_job *j) {
    for (struct srv_job **p = head; *p; p = &(*p)->next_in_list)
        if (*p == j) {
            *p = j->next_in_list;
            j->next_in_list = NULL;
            return;
        }
}

/* Marks a job done (locked): statistics, counters, wakes its HTTP thread,
 * drops the engine's reference. The job must already be off the lists. */
static void job_finish_locked(struct srv *srv, struct srv_job *j) {
    if (j->seq) ekv_seq_kv_stats(j->seq, &j->kv_stats);
    job_drop_engine(j);
    j->state = JOB_DONE;
    j->ready = j->text_len;
    j->t_done = cli_now();
    srv->st.completion_tokens += (uint64_t)j->n_gen;
    srv->st.evicted += (uint64_t)(j->kv_stats.evicted > 0 ? j->kv_stats.evicted : 0);
    srv->st.merged += (uint64_t)(j->kv_stats.merged > 0 ? j->kv_stats.merged : 0);
    if (j->t_prompt_done > 0) {
        srv->st.prompt_seconds += j->t_prompt_done - j->t_admit;
        srv->st.decode_seconds += j->t_done - j->t_prompt_done;
    }
    pthread_cond_broadcast(&j->cv);
    job_unref_locked(srv, j);
}

/* Ends an active job (locked). */
static void active_finish_locked(struct srv *srv, struct srv_job *j) {
    list_remove(&srv->active, j);
    srv->n_active--;
    job_finish_locked(srv, j);
}

/* Sets j's error from the engine thread, which holds no lock while it
 * computes: under the lock, because a stream's thread may be reading
 * j->err (an error event made between the status and the message being
 * written went out with an empty message). */
static void job_error(struct srv *srv, struct srv_job *j, int status, const char *what, enum ekv_status s) {
    pthread_mutex_lock(&srv->mu);
    srv_fail(&j->err, status, status >= 500 ? "server_error" : "invalid_request_error", NULL, NULL, "%s: %s: %s",
             what, ekv_status_str(s), ekv_last_error());
    pthread_mutex_unlock(&srv->mu);
}

/* ------------------------------------------------------------------ */
/* submission and release (HTTP threads)                                */
/* ------------------------------------------------------------------ */

/* On a GPU, --kv-mem holds what the device allocates: a full cache takes
 * the whole context at its start; a compressed one grows to at most 1.5 x
 * what it needs, plus 64 entries per head (engine/backend_vk_policy.c). */
static void device_projection(const struct srv *srv, const struct ekv_kv_params *kv, struct ekv_kv_projection *p) {
    struct ekv_kv_projection c;
    struct ekv_kv_params full = *kv;
    full.policy = "full";
    full.budget = 1.0;
    full.max_tokens = 0;
    if (!kv->policy || !strcmp(kv->policy, "full")) {
        if (ekv_kv_project(srv->model, &full, srv->cfg.n_ctx, 0, &c) == EKV_OK) p->bytes_peak = p->bytes_final = c.bytes_final;
        return;
    }
    const uint64_t slack = ekv_kv_project(srv->model, &full, 64, 0, &c) == EKV_OK ? c.bytes_final : 0;
    p->bytes_peak += p->bytes_peak / 2 + slack;
    p->bytes_final += p->bytes_final / 2 + slack;
}

struct srv_job *srv_submit(struct srv *srv, struct srv_request *req, struct srv_error *e) {
    const struct srv_config *cfg = &srv->cfg;
    const int64_t n_prompt = req->n_tokens;
    if (n_prompt >= cfg->n_ctx) {
        srv_fail(e, 400, "invalid_request_error", req->kind == SRV_CHAT ? "messages" : "prompt", "context_length_exceeded",
                 "the prompt has %lld tokens; the context holds %d (at least one must be left to generate)",
                 (long long)n_prompt, cfg->n_ctx);
        return NULL;
    }
    long room = cfg->n_ctx - (long)n_prompt;
    if (req->max_tokens < 0 || req->max_tokens > room) { /* the context's end is the limit */
        req->max_tokens = room;
        req->to_ctx_end = true;
    }
    struct ekv_kv_projection proj;
    enum ekv_status s = ekv_kv_project(srv->model, &req->kv, n_prompt, req->max_tokens, &proj);
    if (s != EKV_OK) {
        srv_fail(e, 400, "invalid_request_error", "kv", "invalid_kv", "kv: %s", ekv_last_error());
        return NULL;
    }
    if (srv->on_gpu) device_projection(srv, &req->kv, &proj);
    const uint64_t need = proj.bytes_peak > proj.bytes_final ? proj.bytes_peak : proj.bytes_final;
    if (cfg->kv_mem && need > cfg->kv_mem) {
        srv_fail(e, 400, "invalid_request_error", "max_tokens", "kv_mem_exceeded",
                 "this request needs %.2f MiB of KV cache under policy %s at budget %g (%lld prompt + %ld new "
                 "tokens), more than the server's --kv-mem of %.2f MiB",
                 need / 1048576.0, req->kv.policy, req->kv.budget, (long long)n_prompt, req->max_tokens,
                 cfg->kv_mem / 1048576.0);
        return NULL;
    }
    struct srv_job *j = calloc(1, sizeof *j);
    if (!j || pthread_cond_init(&j->cv, NULL) != 0) {
        free(j);
        srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    j->req = *req;
    memset(req, 0, sizeof *req);
    if (j->req.kv.policy) j->req.kv.policy = j->req.kv_policy; /* the copy's own string */
    j->proj = proj;
    j->t_arrive = cli_now();
    j->refs = 2;
    j->stop_hit = -1;
    pthread_mutex_lock(&srv->mu);
    /* --queue 0: nothing waits; a request runs if a slot (and, with
     * --kv-mem, the memory it projects, by the engine's last count) is free
     * now, else 503 */
    const bool full = cfg->queue > 0 ? srv->n_queued >= cfg->queue
                                     : srv->n_queued + srv->n_active >= cfg->parallel ||
                                           (cfg->kv_mem && srv->kv_reserved + need > cfg->kv_mem);
    if (srv->stop || srv->draining || full) {
        bool stopping = srv->stop || srv->draining;
        if (!stopping) srv->st.rejected_busy++;
        pthread_mutex_unlock(&srv->mu);
        srv_fail(e, 503, "server_error", NULL, stopping ? "shutting_down" : "server_busy",
                 stopping          ? "the server is shutting down"
                 : cfg->queue > 0 ? "the server is busy: %ld requests are waiting already; retry later"
                                  : "the server is busy: no free slot now and --queue %ld; retry later",
                 cfg->queue);
        *req = j->req; /* back to the caller, who frees it */
        if (req->kv.policy) req->kv.policy = req->kv_policy;
        pthread_cond_destroy(&j->cv);
        free(j);
        return NULL;
    }
    j->id = ++srv->next_id;
    srv->n_live++;
    if (srv->queue_tail) srv->queue_tail->next_in_list = j;
    else srv->queue_head = j;
    srv->queue_tail = j;
    srv->n_queued++;
    pthread_cond_signal(&srv->engine_cv);
    pthread_mutex_unlock(&srv->mu);
    return j;
}

void srv_release(struct srv *srv, struct srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&srv->mu);
    if (j->state == JOB_QUEUED) { /* never admitted: no engine resources */
        struct srv_job *prev = NULL;
        for (struct srv_job *q = srv->queue_head; q; prev = q, q = q->next_in_list)
            if (q == j) {
                if (prev) prev->next_in_list = j->next_in_list;
                else srv->queue_head = j->next_in_list;
                if (srv->queue_tail == j) srv->queue_tail = prev;
                srv->n_queued--;
                break;
            }
        j->state = JOB_DONE;
        j->refs--; /* the engine's */
        srv->st.cancelled++;
    } else if (j->state != JOB_DONE) {
        j->cancel = true; /* the engine frees the cache at its next iteration */
        pthread_cond_signal(&srv->engine_cv);
    }
    job_unref_locked(srv, j);
    pthread_mutex_unlock(&srv->mu);
}

/* ------------------------------------------------------------------ */
/* admission (locked)                                                   */
/* ------------------------------------------------------------------ */

static uint64_t job_reserve(const struct srv_job *j, uint64_t bytes_now) {
    if (j->state == JOB_PREFILL) return j->proj.bytes_peak > j->proj.bytes_final ? j->proj.bytes_peak : j->proj.bytes_final;
    return j->proj.bytes_final > bytes_now ? j->proj.bytes_final : bytes_now;
}

/* Bytes in use and reserved over the active jobs. */
static void account_locked(struct srv *srv) {
    uint64_t used = 0, reserved = 0, alloc = 0;
    for (struct srv_job *j = srv->active; j; j = j->next_in_list) {
        struct ekv_kv_stats st = {0};
        if (j->seq) ekv_seq_kv_stats(j->seq, &st);
        used += st.bytes;
        alloc += st.bytes_alloc;
        j->reserve = job_reserve(j, srv->on_gpu ? st.bytes_alloc : st.bytes); /* a GPU: its buffers */
        reserved += j->reserve;
    }
    srv->kv_used = used;
    srv->kv_reserved = reserved;
    srv->kv_alloc = alloc;
}

static void reap_cancelled_locked(struct srv *srv) {
    for (struct srv_job *j = srv->active, *next; j; j = next) {
        next = j->next_in_list;
        if (!j->cancel) continue;
        srv->st.cancelled++;
        active_finish_locked(srv, j);
    }
}

static bool in_prefill_locked(const struct srv *srv) {
    for (const struct srv_job *j = srv->active; j; j = j->next_in_list)
        if (j->state == JOB_PREFILL) return true;
    return false;
}

/* Admits the FIFO head when no prompt is being read, fewer than --parallel
 * jobs are active and its peak fits next to what is reserved. */
static void admit_locked(struct srv *srv) {
    struct srv_job *j = srv->queue_head;
    if (!j || in_prefill_locked(srv) || srv->n_active >= srv->cfg.parallel) return;
    account_locked(srv);
    const uint64_t need = job_reserve(j, 0);
    /* cached prefixes count against --kv-mem: they go before a request waits */
    while (srv->cfg.kv_mem && srv->kv_reserved + srv->pc_bytes + need > srv->cfg.kv_mem && srv_prefix_evict_locked(srv)) {
    }
    if (srv->cfg.kv_mem && srv->kv_reserved + srv->pc_bytes + need > srv->cfg.kv_mem) return;
    srv->queue_head = j->next_in_list;
    if (!srv->queue_head) srv->queue_tail = NULL;
    srv->n_queued--;
    j->next_in_list = NULL;
    /* active list in admission order (decode batch order follows it) */
    struct srv_job **p = &srv->active;
    while (*p) p = &(*p)->next_in_list;
    *p = j;
    srv->n_active++;
    if (srv->n_active > srv->st.running_max) srv->st.running_max = srv->n_active;
    j->state = JOB_PREFILL;
    j->t_admit = cli_now();
    j->reserve = need;
    srv->kv_reserved += need;
    srv->st.prompt_tokens += (uint64_t)j->req.n_tokens;
}

/* ------------------------------------------------------------------ */
/* generation (engine thread, unlocked unless said)                     */
/* ------------------------------------------------------------------ */

/* The prompt reader of positions [from, to) of j->req.prompt (or its
 * tokens) on j->seq, as one prompt. The reader copies what it needs: once
 * the last part is started, the prompt's memory goes. */
static enum ekv_status prompt_start(struct srv *srv, struct srv_job *j, int32_t from, int32_t to) {
    struct ekv_segment tok = {.tokens = j->req.tokens, .n = j->req.n_tokens, .tag = EKV_TAG_TEXT};
    const struct ekv_segment *sg = &tok;
    int32_t ns = 1;
    enum ekv_status s;
    if (j->req.prompt && (s = ekv_prompt_segments(j->req.prompt, &sg, &ns)) != EKV_OK) return s;
    struct ekv_segment *part = malloc((size_t)ns * sizeof *part);
    if (!part) return EKV_ERR_NOMEM;
    int32_t np = 0, pos = 0;
    for (int32_t i = 0; i < ns; pos += sg[i].n, i++) { /* the pieces of [from, to) */
        const int32_t a = from > pos ? from - pos : 0, b = to < pos + sg[i].n ? to - pos : sg[i].n;
        if (a >= b) continue;
        part[np] = sg[i];
        if (part[np].tokens) part[np].tokens += a;
        else part[np].embd += (size_t)a * (size_t)srv->mi.n_embd;
        part[np++].n = b - a;
    }
    const struct ekv_input in = {.segs = part, .n_segs = np, .is_prompt = true};
    s = ekv_prefill_new(j->seq, &in, srv->cfg.prefill_chunk, &j->prefill);
    free(part);
    if (s == EKV_OK && to == j->req.n_tokens) {
        ekv_prompt_free(j->req.prompt);
        j->req.prompt = NULL;
    }
    return s;
}

/* The end of the part that starts at bound `part` - 1 (or 0). */
static int32_t part_end(const struct srv_job *j) {
    return j->part < j->req.n_bounds ? j->req.bounds[j->part] : j->req.n_tokens;
}

/* Sequence, sampler and the prompt reader of a newly admitted job. A
 * prompt in parts (message by message) starts from the longest cached
 * prefix that ends at one of its bounds, and caches the one that ends at
 * its last bound once read. */
static enum ekv_status job_start(struct srv *srv, struct srv_job *j) {
    enum ekv_status s = ekv_seq_new(srv->ctx, &j->req.kv, &j->seq);
    if (s != EKV_OK) return s;
    struct ekv_sampler_params sp = j->req.sampling;
    if ((s = ekv_sampler_new(&sp, &j->smp)) != EKV_OK) return s;
    const bool own = j->req.lb_given; /* the request's logit_bias, else the server's -l */
    s = ekv_sampler_set_logit_bias(j->smp, own ? j->req.lb_tok : srv->cfg.lb_tok, own ? j->req.lb_val : srv->cfg.lb_val,
                                   own ? j->req.n_lb : srv->cfg.n_lb);
    if (s != EKV_OK) return s;
    if (j->req.prompt) ekv_sampler_accept_prompt(j->smp, j->req.prompt); /* the penalties' window */
    for (int32_t i = 0; !j->req.prompt && j->req.tokens && i < j->req.n_tokens; i++)
        ekv_sampler_accept(j->smp, j->req.tokens[i]);
    j->part = 0;
    int32_t from = 0;
    const int32_t nb = j->req.n_bounds;
    for (int32_t b = nb - 1; b >= 0 && j->req.prompt; b--) {
        struct srv_pkey k;
        if (!srv_pkey_make(srv, j->req.prompt, j->req.bounds[b], &k)) return EKV_ERR_NOMEM;
        struct ekv_seq *hit = NULL;
        s = srv_prefix_take(srv, &k, j->seq, &hit);
        if (b == nb - 1 && !hit) j->pkey = k; /* to cache once read */
        else srv_pkey_free(&k);
        if (s != EKV_OK) return s;
        if (hit) { /* that prefix's cache as it was read: the parts after it are left */
            ekv_seq_free(j->seq);
            j->seq = hit;
            j->n_cached = from = j->req.bounds[b];
            j->part = b + 1;
            break;
        }
    }
    if (nb > 0) srv_prefix_count(srv, j->n_cached);
    return prompt_start(srv, j, from, part_end(j));
}

/* What one token did to a job, decided outside the lock. */
struct token_out {
    struct srv_job *job;
    char piece[256];
    size_t n;
    const char *finish; /* NULL: goes on */
    bool gen;           /* a token was generated (not: the end of text, an error, n_predict 0) */
    double t_prompt;    /* > 0: the prompt was read then (the job's t_prompt_done and t_first) */
    int32_t tok;        /* which, when gen */
    struct ekv_token_logprob lp[1 + SRV_MAX_TOP_LOGPROBS]; /* with req.logprobs >= 0: the token's, then its top */
};

/* Samples the next token from logits and decides whether the job ends. */
static void take_token(struct srv *srv, struct srv_job *j, const float *logits, struct token_out *o) {
    o->job = j;
    o->n = 0;
    o->finish = NULL;
    o->gen = false;
    o->t_prompt = 0;
    int32_t t = ekv_sampler_sample(j->smp, logits, srv->mi.n_vocab);
    if (!j->req.ignore_eos && ekv_token_is_eog(srv->model, t)) {
        o->finish = "stop";
        return;
    }
    if (ekv_token_to_piece(srv->model, t, false, o->piece, sizeof o->piece, &o->n) != EKV_OK) o->n = 0;
    if (j->req.logprobs >= 0) { /* the model's own distribution (arguments valid: cannot fail) */
        o->lp[0].token = t;
        ekv_logprobs(logits, srv->mi.n_vocab, t, j->req.logprobs, o->lp + 1, &o->lp[0].logprob);
    }
    j->next = t;
    o->gen = true;
    o->tok = t;
    ekv_sampler_accept(j->smp, t);
    /* j->n_gen counts it under the lock (engine_main): HTTP threads read it for timings */
    if (j->n_gen + 1 >= j->req.max_tokens || ekv_seq_n_seen(j->seq) + 1 > srv->cfg.n_ctx) o->finish = "length";
}

/* The longest suffix of text that is a proper prefix of a stop string. */
static size_t stop_hold(const struct srv_request *r, const char *text, size_t len) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t m = strlen(r->stop[i]);
        for (size_t k = m - 1 < len ? m - 1 : len; k > hold; k--)
            if (!memcmp(text + len - k, r->stop[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Appends a token's text to its job (locked): stop strings, what is safe to
 * send, the end. Returns true when the job ended. */
static bool publish_locked(struct srv *srv, struct token_out *o) {
    struct srv_job *j = o->job;
    if (j->text_len + o->n + 1 > j->text_cap) {
        size_t cap = (j->text_len + o->n + 1) * 2;
        char *t = realloc(j->text, cap);
        if (!t) {
            srv_fail(&j->err, 500, "server_error", NULL, NULL, "out of memory for the generated text");
            return true;
        }
        j->text = t;
        j->text_cap = cap;
    }
    const size_t old = j->text_len;
    memcpy(j->text + old, o->piece, o->n);
    j->text_len += o->n;
    j->text[j->text_len] = 0;
    const size_t w = j->req.logprobs >= 0 ? 1 + (size_t)j->req.logprobs : 0; /* logprobs per token */
    if (o->gen && j->n_tok_end == j->cap_tok_end) {
        size_t cap = j->cap_tok_end ? 2 * j->cap_tok_end : 64;
        size_t *te = realloc(j->tok_end, cap * sizeof *te);
        if (te) j->tok_end = te;
        int32_t *tk = te ? realloc(j->toks, cap * sizeof *tk) : NULL;
        if (tk) j->toks = tk;
        struct ekv_token_logprob *lp = tk && w ? realloc(j->lp, cap * w * sizeof *lp) : NULL;
        if (lp) j->lp = lp;
        if (tk && (lp || !w)) j->cap_tok_end = cap;
        else if (w || j->req.kind == SRV_NATIVE) { /* logprobs and native answers' token ids need one entry per token */
            srv_fail(&j->err, 500, "server_error", NULL, NULL, "out of memory for the tokens' entries");
            return true;
        }
    }
    if (o->gen && j->n_tok_end < j->cap_tok_end) { /* else: events merge */
        if (w) memcpy(j->lp + j->n_tok_end * w, o->lp, w * sizeof *o->lp);
        j->toks[j->n_tok_end] = o->tok;
        j->tok_end[j->n_tok_end++] = j->text_len;
    }
    /* a stop string ends the text where it starts (searched where it can be new) */
    for (int i = 0; i < j->req.n_stop; i++) {
        size_t m = strlen(j->req.stop[i]);
        size_t from = old >= m ? old - m + 1 : 0;
        char *hit = memmem(j->text + from, j->text_len - from, j->req.stop[i], m);
        if (hit) { /* a later stop string only looks at the text before this one */
            j->text_len = (size_t)(hit - j->text);
            j->text[j->text_len] = 0;
            o->finish = "stop";
            j->stop_hit = i;
        }
    }
    if (o->finish) {
        j->finish = o->finish;
        return true;
    }
    size_t ready = srv_utf8_whole(j->text, j->text_len - stop_hold(&j->req, j->text, j->text_len));
    if (ready > j->ready) {
        j->ready = ready;
        pthread_cond_broadcast(&j->cv);
    }
    return false;
}

/* Advances the job reading its prompt; true when its first token came. */
static bool step_prefill(struct srv *srv, struct srv_job *j, float *logits, struct token_out *o) {
    enum ekv_status s = EKV_OK;
    if (!j->seq && (s = job_start(srv, j)) != EKV_OK) {
        job_error(srv, j, s == EKV_ERR_NOMEM ? 503 : 400, "cannot start the sequence", s);
        *o = (struct token_out){.job = j, .finish = "error"};
        return true;
    }
    bool done = false;
    s = ekv_prefill_step(j->prefill, srv->mi.n_layer, logits, &done);
    if (s != EKV_OK) {
        job_error(srv, j, 500, "prompt", s);
        *o = (struct token_out){.job = j, .finish = "error"};
        return true;
    }
    if (!done) return false;
    ekv_prefill_free(j->prefill);
    j->prefill = NULL;
    if (j->part < j->req.n_bounds) { /* a part is read: the next; the shared prefix is cached */
        const int32_t from = j->req.bounds[j->part++];
        if (j->part == j->req.n_bounds && j->pkey.ids) srv_prefix_put(srv, &j->pkey, j->seq);
        if ((s = prompt_start(srv, j, from, part_end(j))) != EKV_OK) {
            job_error(srv, j, 500, "prompt", s);
            *o = (struct token_out){.job = j, .finish = "error"};
            return true;
        }
        return false;
    }
    const double now = cli_now(); /* the job's times are set under the lock (engine_main) */
    if (j->req.max_tokens == 0) { /* native n_predict 0: the prompt read, nothing generated */
        *o = (struct token_out){.job = j, .finish = "length", .t_prompt = now};
        return true;
    }
    take_token(srv, j, logits, o);
    o->t_prompt = now;
    return true;
}

struct engine_buf {
    struct srv_job **jobs;
    struct ekv_seq **seqs;
    int32_t *toks;
    struct token_out *outs;
    float *logits;
    int cap;
};

static bool buf_reserve(struct engine_buf *b, int n, int32_t n_vocab) {
    if (n <= b->cap) return true;
    int cap = n < 8 ? 8 : n;
    struct srv_job **jobs = realloc(b->jobs, (size_t)cap * sizeof *jobs);
    if (jobs) b->jobs = jobs;
    struct ekv_seq **seqs = realloc(b->seqs, (size_t)cap * sizeof *seqs);
    if (seqs) b->seqs = seqs;
    int32_t *toks = realloc(b->toks, (size_t)cap * sizeof *toks);
    if (toks) b->toks = toks;
    struct token_out *outs = realloc(b->outs, (size_t)(cap + 1) * sizeof *outs);
    if (outs) b->outs = outs;
    float *lg = realloc(b->logits, (size_t)(cap + 1) * (size_t)n_vocab * sizeof *lg);
    if (lg) b->logits = lg;
    if (!jobs || !seqs || !toks || !outs || !lg) return false;
    b->cap = cap;
    return true;
}

/* One decode step of every running job; fills outs[0..n). */
static void step_decode(struct srv *srv, struct engine_buf *b, int n) {
    for (int i = 0; i < n; i++) {
        b->seqs[i] = b->jobs[i]->seq;
        b->toks[i] = b->jobs[i]->next;
    }
    enum ekv_status s = ekv_decode_batch(srv->ctx, b->seqs, b->toks, n, b->logits);
    for (int i = 0; i < n; i++) {
        if (s != EKV_OK) {
            job_error(srv, b->jobs[i], 500, "decode", s);
            b->outs[i] = (struct token_out){.job = b->jobs[i], .finish = "error"};
        } else {
            take_token(srv, b->jobs[i], b->logits + (size_t)i * srv->mi.n_vocab, &b->outs[i]);
        }
    }
}

/* Fails every queued job (locked), at shut-down. */
static void fail_queued_locked(struct srv *srv) {
    while (srv->queue_head) {
        struct srv_job *j = srv->queue_head;
        srv->queue_head = j->next_in_list;
        srv->n_queued--;
        srv_fail(&j->err, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        job_finish_locked(srv, j);
    }
    srv->queue_tail = NULL;
}

/* Fails every queued and active job (locked), at shut-down. */
static void fail_all_locked(struct srv *srv) {
    fail_queued_locked(srv);
    while (srv->active) {
        struct srv_job *j = srv->active;
        srv_fail(&j->err, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        active_finish_locked(srv, j);
    }
}

/* Collects this iteration's work (locked): the job reading its prompt and
 * the running ones. Returns false when there is none. */
static bool collect_locked(struct srv *srv, struct engine_buf *b, struct srv_job **pre, int *n_run) {
    *pre = NULL;
    *n_run = 0;
    if (!buf_reserve(b, srv->n_active, srv->mi.n_vocab)) { /* no memory for this many: they cannot go on */
        while (srv->active) {
            struct srv_job *j = srv->active;
            srv_fail(&j->err, 503, "server_error", NULL, "out_of_memory", "out of memory for %d sequences",
                     srv->n_active);
            active_finish_locked(srv, j);
        }
        return false;
    }
    for (struct srv_job *j = srv->active; j; j = j->next_in_list) {
        if (j->state == JOB_PREFILL && !*pre) *pre = j;
        else if (j->state == JOB_RUNNING) b->jobs[(*n_run)++] = j;
    }
    return *pre || *n_run;
}

static void *engine_main(void *arg) {
    struct srv *srv = arg;
    struct engine_buf b = {0};
    pthread_mutex_lock(&srv->mu);
    while (!srv->stop) {
        srv_ctl_run_locked(srv); /* /slots actions */
        reap_cancelled_locked(srv);
        admit_locked(srv);
        struct srv_job *pre;
        int n_run;
        if (!collect_locked(srv, &b, &pre, &n_run)) {
            account_locked(srv);
            pthread_cond_wait(&srv->engine_cv, &srv->mu);
            continue;
        }
        pthread_mutex_unlock(&srv->mu);

        int n_out = 0;
        double t0 = cli_now(), t1 = t0, t2;
        if (n_run > 0) {
            step_decode(srv, &b, n_run);
            n_out = n_run;
            t1 = cli_now();
        }
        /* the prompt's logits go after the decode rows' */
        if (pre && step_prefill(srv, pre, b.logits + (size_t)b.cap * srv->mi.n_vocab, &b.outs[n_out])) n_out++;
        t2 = cli_now();

        pthread_mutex_lock(&srv->mu);
        if (n_run > 0) {
            srv->st.decode_steps++;
            srv->st.decode_rows += (uint64_t)n_run;
            srv->st.engine_decode_seconds += t1 - t0;
        }
        if (pre) srv->st.engine_prefill_seconds += t2 - t1;
        srv->st.device_bytes = ekv_context_device_bytes(srv->ctx); /* ctx is the engine thread's */
        srv->st.device_peak_bytes = ekv_context_device_peak_bytes(srv->ctx);
        for (int i = 0; i < n_out; i++) {
            struct token_out *o = &b.outs[i];
            struct srv_job *j = o->job;
            if (o->gen) j->n_gen++;
            if (o->t_prompt > 0) j->t_prompt_done = j->t_first = o->t_prompt;
            bool end = o->finish && !strcmp(o->finish, "error");
            if (!end) end = publish_locked(srv, o);
            if (j->state == JOB_PREFILL) j->state = JOB_RUNNING;
            if (end) active_finish_locked(srv, j);
        }
        account_locked(srv);
    }
    fail_all_locked(srv);
    srv_ctl_fail_locked(srv);
    pthread_mutex_unlock(&srv->mu);
    srv_prefix_free_all(srv);
    free(b.jobs);
    free(b.seqs);
    free(b.toks);
    free(b.outs);
    free(b.logits);
    return NULL;
}

enum ekv_status srv_engine_start(struct srv *srv) {
    srv->on_gpu = strcmp(ekv_context_device(srv->ctx), "cpu") != 0;
    srv->st.device_bytes = ekv_context_device_bytes(srv->ctx); /* before the engine owns ctx */
    srv->st.device_peak_bytes = ekv_context_device_peak_bytes(srv->ctx);
    if (pthread_create(&srv->engine, NULL, engine_main, srv) != 0)
        return EKV_ERR_NOMEM;
    srv->engine_started = true;
    return EKV_OK;
}

/* Lets go of the lock for 10 ms (the engine and the connection threads
 * finish jobs on their own; shut-down looks at them this often). */
static void nap_locked(struct srv *srv) {
    pthread_mutex_unlock(&srv->mu);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&srv->mu);
}

void srv_engine_drain(struct srv *srv, double seconds, volatile sig_atomic_t *interrupt) {
    if (!srv->engine_started) return;
    const double until = cli_now() + seconds;
    pthread_mutex_lock(&srv->mu);
    srv->draining = true;
    fail_queued_locked(srv);
    pthread_cond_signal(&srv->engine_cv);
    while (srv->active && cli_now() < until && !*interrupt) nap_locked(srv);
    pthread_mutex_unlock(&srv->mu);
}

void srv_engine_wait_released(struct srv *srv, double seconds) {
    const double until = cli_now() + seconds;
    pthread_mutex_lock(&srv->mu);
    while (srv->n_live > 0 && cli_now() < until) nap_locked(srv);
    pthread_mutex_unlock(&srv->mu);
}

void srv_engine_stop(struct srv *srv) {
    if (!srv->engine_started) return;
    pthread_mutex_lock(&srv->mu);
    srv->stop = true;
    pthread_cond_signal(&srv->engine_cv);
    pthread_mutex_unlock(&srv->mu);
    pthread_join(srv->engine, NULL);
    srv->engine_started = false;
}
