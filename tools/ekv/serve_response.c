/*
 * serve_response.c — the bodies `ekv serve` sends, in OpenAI's shapes:
 * chat.completion / text_completion objects with `usage` (plus ekv's
 * `usage.kv`: the cache kept against the full one, and `timings`, as
 * llama.cpp's server reports them), streaming chunks, errors
 * ({"error": {"message", "type", "param", "code"}}), /v1/models, /health,
 * and /metrics in the Prometheus text format. Logprobs, when asked, in
 * the two shapes OpenAI uses: chat's logprobs.content entries (token,
 * logprob, bytes, top_logprobs) and the legacy completions' parallel arrays
 * (tokens, token_logprobs, top_logprobs, text_offset).
 *
 * Generated text may end inside a UTF-8 character or hold bytes that are
 * not UTF-8 (a model can emit any byte); JSON needs UTF-8, so such bytes
 * become U+FFFD here. Streaming only ever sends whole characters (the
 * engine holds back partial ones), so the chunks concatenate to the
 * non-streamed text.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

/* s[0..n) with every byte that is not part of valid UTF-8 replaced by U+FFFD; malloc'd. */
char *srv_text_clean(const char *s, size_t n) {
    char *out = malloc(3 * n + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        size_t k = srv_utf8_valid(s + i, 1) ? 1 : 0;
        if (!k) /* find the longest valid character here */
            for (size_t len = 2; len <= 4 && i + len <= n; len++)
                if (srv_utf8_valid(s + i, len)) {
                    k = len;
                    break;
                }
        if (k) {
            memcpy(o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *o = 0;
    return out;
}

char *srv_json_take(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *srv_error_json(const struct srv_error *e) {
    cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
    if (!er) return srv_json_take(o);
    char *msg = srv_text_clean(e->message, strlen(e->message));
    cJSON_AddStringToObject(er, "message", msg ? msg : "error");
    free(msg);
    cJSON_AddStringToObject(er, "type", e->type ? e->type : "invalid_request_error");
    if (e->param) cJSON_AddStringToObject(er, "param", e->param);
    else cJSON_AddNullToObject(er, "param");
    if (e->code) cJSON_AddStringToObject(er, "code", e->code);
    else cJSON_AddNullToObject(er, "code");
    return srv_json_take(o);
}

/* The served model's name, as OpenAI answers (never the request's own
 * "model" string: echoing it let one request make every streamed event as
 * large as it liked). */
static const char *model_id(const struct srv *srv, const struct srv_job *j) {
    (void)j;
    return srv->cfg.model_id;
}

/* id, object, created, model: the head of every completion object (the
 * id and time of the request's first choice, the same in all its choices). */
static cJSON *head(const struct srv *srv, const struct srv_job *j, bool chunk) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    const struct srv_job *l = j->lead ? j->lead : j;
    char id[48];
    snprintf(id, sizeof id, "%s-%llu", j->req.kind == SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)l->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            j->req.kind == SRV_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                    : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)(srv->t_epoch + (long long)(l->t_arrive - srv->t_start)));
    cJSON_AddStringToObject(o, "model", model_id(srv, j));
    char fp[32];
    snprintf(fp, sizeof fp, "ekv-%s", ekv_version());
    cJSON_AddStringToObject(o, "system_fingerprint", fp);
    return o;
}

size_t srv_lp_upto(const struct srv_job *j, size_t from, size_t upto) {
    size_t k = from;
    while (k < j->n_tok_end && j->tok_end[k] <= upto) k++;
    const size_t start = k ? j->tok_end[k - 1] : 0;
    if (k < j->n_tok_end && j->state == JOB_DONE && upto == j->text_len && start < upto) k++; /* cut by a stop string */
    return k;
}

/* A token's text: the string (invalid UTF-8 as U+FFFD) and, in *raw, its bytes. */
static char *lp_piece(const struct srv *srv, int32_t tok, char *raw, size_t cap, size_t *n) {
    if (ekv_token_to_piece(srv->model, tok, false, raw, cap, n) != EKV_OK) *n = 0;
    return srv_text_clean(raw, *n);
}

/* Chat's entry {token, logprob, bytes[, top_logprobs]} for a token (top: n of them, or NULL);
 * with_id: the native answers' {id, token, logprob, bytes[, top_logprobs]}. */
cJSON *srv_lp_entry(const struct srv *srv, const struct ekv_token_logprob *t, const struct ekv_token_logprob *top,
                    int n, bool with_id) {
    char raw[256];
    size_t len = 0;
    char *str = lp_piece(srv, t->token, raw, sizeof raw, &len);
    cJSON *o = cJSON_CreateObject(), *b = cJSON_CreateArray();
    if (!str || !o || !b) {
        free(str);
        cJSON_Delete(o);
        cJSON_Delete(b);
        return NULL;
    }
    if (with_id) cJSON_AddNumberToObject(o, "id", t->token);
    cJSON_AddStringToObject(o, "token", str);
    free(str);
    cJSON_AddNumberToObject(o, "logprob", t->logprob);
    for (size_t i = 0; i < len; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
    bool ok = (size_t)cJSON_GetArraySize(b) == len;
    if (!cJSON_AddItemToObject(o, "bytes", b)) cJSON_Delete(b), ok = false;
    if (top && ok) {
        cJSON *a = cJSON_AddArrayToObject(o, "top_logprobs");
        for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, srv_lp_entry(srv, &top[i], NULL, 0, with_id));
        ok = a && cJSON_GetArraySize(a) == n;
    }
    if (!ok) cJSON_Delete(o), o = NULL; /* out of memory: no entry rather than a short one */
    return o;
}

/* The logprobs of tokens [from, to): chat's {"content": [...]} or the
 * completions' arrays; null when not asked (or, streaming, none here). */
static cJSON *logprobs_json(const struct srv *srv, const struct srv_job *j, size_t from, size_t to, bool stream) {
    const int n = j->req.logprobs;
    if (n < 0 || (stream && from == to)) return cJSON_CreateNull();
    const size_t w = 1 + (size_t)n;
    cJSON *o = cJSON_CreateObject();
    if (j->req.kind == SRV_CHAT) {
        cJSON *c = cJSON_AddArrayToObject(o, "content");
        for (size_t k = from; c && k < to; k++)
            cJSON_AddItemToArray(c, srv_lp_entry(srv, &j->lp[k * w], &j->lp[k * w + 1], n, false));
        cJSON_AddNullToObject(o, "refusal");
        if (!c || (size_t)cJSON_GetArraySize(c) != to - from) cJSON_Delete(o), o = NULL; /* out of memory */
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (size_t k = from; toks && lps && tops && offs && k < to; k++) {
        char raw[256];
        size_t len;
        const struct ekv_token_logprob *t = &j->lp[k * w];
        char *str = lp_piece(srv, t->token, raw, sizeof raw, &len);
        cJSON_AddItemToArray(toks, str ? cJSON_CreateString(str) : NULL);
        free(str);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->logprob));
        cJSON *d = cJSON_CreateObject();
        for (int i = 0; d && i < n; i++) {
            char *ts = lp_piece(srv, t[1 + i].token, raw, sizeof raw, &len);
            if (ts && !cJSON_GetObjectItemCaseSensitive(d, ts)) cJSON_AddNumberToObject(d, ts, t[1 + i].logprob);
            free(ts); /* tokens of the same text: the most likely one's */
        }
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(k ? j->tok_end[k - 1] : 0)));
    }
    const cJSON *arrs[] = {toks, lps, tops, offs};
    for (int i = 0; i < 4 && o; i++)
        if (!arrs[i] || (size_t)cJSON_GetArraySize(arrs[i]) != to - from) cJSON_Delete(o), o = NULL; /* out of memory */
    return o;
}

/* llama.cpp-style timings: prompt and decode, ms and tokens/s. */
cJSON *srv_timings_json(const struct srv_job *j) {
    cJSON *t = cJSON_CreateObject();
    if (!t) return NULL;
    const double prompt_ms = j->t_prompt_done > 0 ? 1e3 * (j->t_prompt_done - j->t_admit) : 0;
    const double end = j->t_done > 0 ? j->t_done : cli_now();
    const double dec_ms = j->t_prompt_done > 0 ? 1e3 * (end - j->t_prompt_done) : 0;
    const long n_dec = j->n_gen > 1 ? j->n_gen - 1 : 0; /* the first token comes with the prompt */
    cJSON_AddNumberToObject(t, "queue_ms", j->t_admit > 0 ? 1e3 * (j->t_admit - j->t_arrive) : 0);
    cJSON_AddNumberToObject(t, "prompt_n", j->req.n_tokens);
    cJSON_AddNumberToObject(t, "prompt_ms", prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", j->req.n_tokens ? prompt_ms / j->req.n_tokens : 0);
    cJSON_AddNumberToObject(t, "prompt_per_second", prompt_ms > 0 ? 1e3 * j->req.n_tokens / prompt_ms : 0);
    cJSON_AddNumberToObject(t, "predicted_n", (double)j->n_gen);
    cJSON_AddNumberToObject(t, "predicted_ms", dec_ms);
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", n_dec ? dec_ms / n_dec : 0);
    cJSON_AddNumberToObject(t, "predicted_per_second", dec_ms > 0 ? 1e3 * n_dec / dec_ms : 0);
    return t;
}

/* usage with ekv's kv and timings, of all jobs of a request: each prompt counted once (its
 * choices read it into caches of their own), the answers' tokens and the caches' bytes summed. */
static cJSON *usage(struct srv_job *const *jobs, int n) {
    const struct srv_job *j = jobs[0];
    long gen = 0, prompt = 0, cached = 0;
    for (int i = 0; i < n; i++) {
        gen += jobs[i]->n_gen;
        if (jobs[i]->req.choice % jobs[i]->req.n_choices == 0) /* a prompt's first choice */
            prompt += jobs[i]->req.n_tokens, cached += jobs[i]->n_cached;
    }
    cJSON *u = cJSON_CreateObject();
    if (!u) return NULL;
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + gen));
    cJSON *det = cJSON_AddObjectToObject(u, "prompt_tokens_details"); /* OpenAI's: positions from a cached prefix */
    if (det) cJSON_AddNumberToObject(det, "cached_tokens", (double)cached);
    cJSON_AddItemToObject(u, "kv", srv_kv_json(jobs, n));
    cJSON_AddItemToObject(u, "timings", srv_timings_json(j));
    return u;
}

cJSON *srv_kv_json(struct srv_job *const *jobs, int n) {
    const struct srv_job *j = jobs[0];
    struct ekv_kv_stats st = {0};
    uint64_t proj = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        const struct ekv_kv_stats *s = &jobs[i]->kv_stats;
        st.bytes += s->bytes, st.bytes_full += s->bytes_full, st.entries += s->entries;
        st.entries_full += s->entries_full, st.evicted += s->evicted, st.merged += s->merged;
        proj += jobs[i]->proj.bytes_final, peak += jobs[i]->proj.bytes_peak;
    }
    cJSON *kv = cJSON_CreateObject();
    if (kv) {
        cJSON_AddStringToObject(kv, "policy", j->req.kv_policy);
        cJSON_AddNumberToObject(kv, "budget", j->req.kv.budget);
        if (j->req.kv.max_tokens > 0) cJSON_AddNumberToObject(kv, "tokens", j->req.kv.max_tokens);
        cJSON_AddNumberToObject(kv, "bytes", (double)st.bytes);
        cJSON_AddNumberToObject(kv, "bytes_full", (double)st.bytes_full);
        cJSON_AddNumberToObject(kv, "entries", (double)st.entries);
        cJSON_AddNumberToObject(kv, "entries_full", (double)st.entries_full);
        cJSON_AddNumberToObject(kv, "evicted", (double)st.evicted);
        cJSON_AddNumberToObject(kv, "merged", (double)st.merged);
        cJSON_AddNumberToObject(kv, "bytes_projected", (double)proj);
        cJSON_AddNumberToObject(kv, "bytes_peak_projected", (double)peak);
    }
    return kv;
}

/* One choice of a non-streamed answer; NULL on out of memory. */
static cJSON *choice_json(const struct srv *srv, const struct srv_job *j) {
    char *text = srv_text_clean(j->text ? j->text : "", j->text_len);
    cJSON *c = cJSON_CreateObject();
    if (!text || !c) {
        free(text);
        cJSON_Delete(c);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", j->req.choice);
    if (j->req.kind == SRV_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    free(text);
    cJSON *lp = logprobs_json(srv, j, 0, srv_lp_upto(j, 0, j->text_len), false);
    if (!lp) {
        cJSON_Delete(c);
        return NULL;
    }
    cJSON_AddItemToObject(c, "logprobs", lp);
    cJSON_AddStringToObject(c, "finish_reason", j->finish ? j->finish : "length");
    return c;
}

char *srv_response_json(const struct srv *srv, struct srv_job *const *jobs, int n) {
    cJSON *o = head(srv, jobs[0], false), *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; choices && i < n; i++) cJSON_AddItemToArray(choices, choice_json(srv, jobs[i]));
    if (!choices || cJSON_GetArraySize(choices) != n) { /* out of memory */
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToObject(o, "usage", usage(jobs, n));
    cJSON_AddItemToObject(o, "timings", srv_timings_json(jobs[0]));
    return srv_json_take(o);
}

char *srv_sse_take(cJSON *o) {
    char *js = srv_json_take(o);
    if (!js) return NULL;
    size_t n = strlen(js);
    char *ev = malloc(n + 9);
    if (ev) snprintf(ev, n + 9, "data: %s\n\n", js);
    free(js);
    return ev;
}

char *srv_chunk_sse(const struct srv *srv, const struct srv_job *j, const char *delta, size_t n, bool first,
                    bool final, size_t lp_from, size_t lp_to) {
    cJSON *o = head(srv, j, true);
    if (!o) return NULL;
    char *text = srv_text_clean(delta, n);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    if (!text || !choices || !c) {
        free(text);
        cJSON_Delete(c);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", j->req.choice);
    if (j->req.kind == SRV_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        if (!final) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    free(text);
    cJSON *lp = logprobs_json(srv, j, lp_from, lp_to, true);
    if (!lp) {
        cJSON_Delete(c);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToObject(c, "logprobs", lp);
    if (final) cJSON_AddStringToObject(c, "finish_reason", j->finish ? j->finish : "length");
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (final) cJSON_AddItemToObject(o, "timings", srv_timings_json(j));
    return srv_sse_take(o);
}

char *srv_usage_chunk_sse(const struct srv *srv, struct srv_job *const *jobs, int n) {
    cJSON *o = head(srv, jobs[0], true);
    if (!o) return NULL;
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage(jobs, n));
    return srv_sse_take(o);
}

/* The served model as /v1/models lists it (cJSON object, caller-owned). */
static cJSON *model_object(const struct srv *srv) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "id", srv->cfg.model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->t_epoch);
    cJSON_AddStringToObject(m, "owned_by", "ekv");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    if (meta) {
        cJSON_AddStringToObject(meta, "arch", srv->mi.arch);
        cJSON_AddNumberToObject(meta, "n_params", (double)srv->mi.n_params);
        cJSON_AddNumberToObject(meta, "n_ctx", srv->cfg.n_ctx);
        cJSON_AddNumberToObject(meta, "n_ctx_train", srv->mi.n_ctx_train);
        cJSON_AddNumberToObject(meta, "n_vocab", srv->mi.n_vocab);
        cJSON_AddStringToObject(meta, "chat_template", srv->cfg.chat_template);
        cJSON_AddStringToObject(meta, "kv_policy", srv->cfg.kv_policy);
        cJSON_AddNumberToObject(meta, "kv_budget", srv->cfg.kv.budget);
        cJSON_AddNumberToObject(meta, "kv_bytes_per_token", (double)srv->mi.kv_bytes_per_token);
    }
    return m;
}

char *srv_models_json(const struct srv *srv) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data"), *m = model_object(srv);
    if (!data || !m) {
        cJSON_Delete(m);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToArray(data, m);
    return srv_json_take(o);
}

char *srv_model_json(const struct srv *srv) {
    cJSON *m = model_object(srv);
    return m ? srv_json_take(m) : NULL;
}

/* A float setting as the user wrote it (6 digits), not as its double prints. */
static double num6(float f) {
    char b[32];
    snprintf(b, sizeof b, "%.6g", (double)f);
    return strtod(b, NULL);
}

/* llama-server's sampling params: sp, n_predict, seed (-1 when each request gets a new one),
 * ignore_eos, the logit biases as [token, bias] pairs (false: banned). */
static void add_params(cJSON *p, const struct ekv_sampler_params *sp, long n_predict, int32_t n_ctx, bool seed_known,
                       bool ignore_eos, const int32_t *lb_tok, const float *lb_val, int32_t n_lb) {
    cJSON_AddNumberToObject(p, "n_predict", (double)n_predict);
    cJSON_AddNumberToObject(p, "temperature", num6(sp->temp));
    cJSON_AddNumberToObject(p, "top_k", sp->top_k);
    cJSON_AddNumberToObject(p, "top_p", num6(sp->top_p));
    cJSON_AddNumberToObject(p, "min_p", num6(sp->min_p));
    cJSON_AddNumberToObject(p, "repeat_penalty", num6(sp->repeat_penalty));
    cJSON_AddNumberToObject(p, "repeat_last_n", sp->repeat_last_n < 0 ? n_ctx : sp->repeat_last_n);
    cJSON_AddNumberToObject(p, "frequency_penalty", num6(sp->frequency_penalty));
    cJSON_AddNumberToObject(p, "presence_penalty", num6(sp->presence_penalty));
    char seed[24] = "-1"; /* -1: a new one per request */
    if (seed_known) snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed);
    cJSON_AddRawToObject(p, "seed", seed); /* every digit (cJSON rounds numbers past 15 digits) */
    cJSON_AddBoolToObject(p, "ignore_eos", ignore_eos);
    cJSON *lb = cJSON_AddArrayToObject(p, "logit_bias");
    for (int i = 0; lb && i < n_lb; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(lb_tok[i]));
        cJSON_AddItemToArray(pair, isinf(lb_val[i]) ? cJSON_CreateFalse() : cJSON_CreateNumber(num6(lb_val[i])));
        cJSON_AddItemToArray(lb, pair);
    }
}

cJSON *srv_job_settings_json(const struct srv *srv, const struct srv_job *j) {
    const struct srv_request *r = &j->req;
    cJSON *g = cJSON_CreateObject();
    if (!g) return NULL;
    add_params(g, &r->sampling, r->max_tokens, srv->cfg.n_ctx, true, r->ignore_eos, r->lb_given ? r->lb_tok : srv->cfg.lb_tok,
               r->lb_given ? r->lb_val : srv->cfg.lb_val, r->lb_given ? r->n_lb : srv->cfg.n_lb);
    cJSON_AddNumberToObject(g, "n_probs", r->logprobs > 0 ? r->logprobs : 0);
    cJSON_AddBoolToObject(g, "stream", r->stream);
    cJSON *st = cJSON_AddArrayToObject(g, "stop");
    for (int i = 0; st && i < r->n_stop; i++) cJSON_AddItemToArray(st, cJSON_CreateString(r->stop[i]));
    cJSON_AddNumberToObject(g, "n_ctx", srv->cfg.n_ctx);
    cJSON_AddStringToObject(g, "model", srv->cfg.model_id);
    cJSON *kv = cJSON_AddObjectToObject(g, "kv");
    if (kv) {
        cJSON_AddStringToObject(kv, "policy", r->kv_policy);
        cJSON_AddNumberToObject(kv, "budget", r->kv.budget);
    }
    return g;
}

char *srv_props_json(const struct srv *srv) {
    const struct srv_config *c = &srv->cfg;
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON *p = cJSON_AddObjectToObject(d, "params"), *kv = cJSON_AddObjectToObject(d, "kv");
    if (!p || !kv) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddNumberToObject(d, "n_ctx", c->n_ctx);
    add_params(p, &c->sampling, c->n_predict, c->n_ctx, c->seed_fixed, c->ignore_eos, c->lb_tok, c->lb_val, c->n_lb);
    cJSON_AddStringToObject(kv, "policy", c->kv_policy);
    cJSON_AddNumberToObject(kv, "budget", c->kv.budget);
    cJSON_AddNumberToObject(o, "total_slots", c->parallel);
    cJSON_AddStringToObject(o, "model_alias", c->model_id);
    cJSON_AddStringToObject(o, "model_path", c->model_path);
    cJSON_AddStringToObject(o, "chat_template", c->chat_template);
    cJSON *m = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddBoolToObject(m, "vision", srv->vision != NULL);
    cJSON_AddStringToObject(o, "media_marker", EKV_IMAGE_MARKER); /* where /completion's multimodal_data go */
    char b[32];
    snprintf(b, sizeof b, "ekv-%s", ekv_version());
    cJSON_AddStringToObject(o, "build_info", b);
    return srv_json_take(o);
}

char *srv_health_json(struct srv *srv) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    pthread_mutex_lock(&srv->mu);
    cJSON_AddStringToObject(o, "status", srv->stop || srv->draining ? "shutting down" : "ok");
    cJSON_AddNumberToObject(o, "slots_processing", srv->n_active);
    cJSON_AddNumberToObject(o, "requests_queued", (double)srv->n_queued);
    pthread_mutex_unlock(&srv->mu);
    return srv_json_take(o);
}

/* ---- /metrics ---- */

struct text {
    char *s;
    size_t len, cap;
    bool oom;
};

static void tprintf(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tprintf(struct text *t, const char *fmt, ...) {
    if (t->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = true;
            return;
        }
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->len + (size_t)n + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->oom = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

static void metric(struct text *t, const char *name, const char *type, const char *help, double v) {
    tprintf(t, "# HELP ekv_%s %s\n# TYPE ekv_%s %s\nekv_%s %.17g\n", name, help, name, type, name, v);
}

char *srv_metrics_text(struct srv *srv) {
    struct text t = {0};
    pthread_mutex_lock(&srv->mu);
    const struct srv_stats st = srv->st;
    const double queued = (double)srv->n_queued, active = srv->n_active;
    const double used = (double)srv->kv_used, reserved = (double)srv->kv_reserved, alloc = (double)srv->kv_alloc;
    const double pc_bytes = (double)srv->pc_bytes, pc_n = srv->pc_n;
    int prefill = 0;
    for (const struct srv_job *j = srv->active; j; j = j->next_in_list) prefill += j->state == JOB_PREFILL;
    pthread_mutex_unlock(&srv->mu);
    tprintf(&t, "# HELP ekv_requests_total HTTP requests answered, by status class\n# TYPE ekv_requests_total counter\n");
    static const char *const k_class[] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
    for (int c = 0; c < 6; c++) tprintf(&t, "ekv_requests_total{code=\"%s\"} %llu\n", k_class[c], (unsigned long long)st.requests[c]);
    metric(&t, "requests_rejected_busy_total", "counter", "requests refused with 503 because the queue was full",
           (double)st.rejected_busy);
    metric(&t, "requests_cancelled_total", "counter", "requests whose client went away before the end",
           (double)st.cancelled);
    metric(&t, "streams_stalled_total", "counter",
           "streams closed because their client took no bytes for --timeout seconds", (double)st.streams_stalled);
    metric(&t, "prompt_tokens_total", "counter", "prompt tokens (positions) admitted", (double)st.prompt_tokens);
    metric(&t, "completion_tokens_total", "counter", "tokens generated", (double)st.completion_tokens);
    metric(&t, "prompt_seconds_total", "counter", "seconds from admission to the first token, summed over requests",
           st.prompt_seconds);
    metric(&t, "decode_seconds_total", "counter", "seconds from the first token to the end, summed over requests",
           st.decode_seconds);
    metric(&t, "decode_steps_total", "counter", "batched decode steps", (double)st.decode_steps);
    metric(&t, "decode_rows_total", "counter", "sequences decoded, summed over steps", (double)st.decode_rows);
    metric(&t, "engine_decode_seconds_total", "counter", "engine time in batched decode steps", st.engine_decode_seconds);
    metric(&t, "engine_prefill_seconds_total", "counter", "engine time reading prompts", st.engine_prefill_seconds);
    metric(&t, "requests_running", "gauge", "sequences admitted (reading their prompt or generating)", active);
    metric(&t, "requests_prefilling", "gauge", "sequences reading their prompt", prefill);
    metric(&t, "requests_queued", "gauge", "requests waiting for admission", queued);
    metric(&t, "requests_running_max", "gauge", "most sequences admitted at once since start", st.running_max);
    metric(&t, "kv_bytes_used", "gauge", "K/V bytes kept by all sequences now", used);
    metric(&t, "kv_bytes_reserved", "gauge", "K/V bytes reserved by admission (projected peaks)", reserved);
    metric(&t, "kv_bytes_allowed", "gauge", "--kv-mem in bytes (0 = no cap)", (double)srv->cfg.kv_mem);
    metric(&t, "kv_bytes_allocated", "gauge", "bytes the caches allocated (entries, statistics, headroom)", alloc);
    metric(&t, "kv_tokens_evicted_total", "counter", "cache entries evicted, summed over layers and heads of finished requests",
           (double)st.evicted);
    metric(&t, "kv_tokens_merged_total", "counter", "cache entries merged, summed over layers and heads of finished requests",
           (double)st.merged);
    metric(&t, "prefix_cache_hits_total", "counter", "requests that started from a cached prefix", (double)st.prefix_hits);
    metric(&t, "prefix_cache_misses_total", "counter", "requests with a prefix that was not cached (read, then cached)",
           (double)st.prefix_misses);
    metric(&t, "prefix_cache_hit_tokens_total", "counter", "prompt positions not read again thanks to cached prefixes",
           (double)st.prefix_hit_tokens);
    metric(&t, "prefix_cache_evicted_total", "counter", "cached prefixes dropped (least recently used)",
           (double)st.prefix_evicted);
    metric(&t, "prefix_cache_entries", "gauge", "cached prefixes now", pc_n);
    metric(&t, "prefix_cache_bytes", "gauge", "bytes the cached prefixes' caches allocated", pc_bytes);
    metric(&t, "prefix_cache_bytes_allowed", "gauge", "--prefix-cache in bytes (0 = off)", (double)srv->cfg.prefix_cache);
    metric(&t, "rss_bytes", "gauge", "resident set size of the server", (double)cli_rss());
    metric(&t, "device_bytes", "gauge", "GPU memory the context holds (weights, activations, caches; 0 on the CPU)",
           (double)st.device_bytes);
    metric(&t, "device_peak_bytes", "gauge", "most GPU memory the context held since start", (double)st.device_peak_bytes);
    if (t.oom) {
        free(t.s);
        return NULL;
    }
    return t.s;
}
