/*
 * serve_native.c — llama-server's own /completion endpoint, for the clients
 * written against it (scripts and libraries that send "n_predict" and read
 * "content"): the request's native fields on top of what serve_request.c
 * parses for every endpoint (sampling, penalties, logit_bias, stop, kv),
 * and the answer and stream shapes (docs/server.md "/completion").
 *
 * Request: `prompt` as a string, as token ids, as token ids and strings
 * mixed (a string first gets the BOS the model wants, as llama-server does),
 * as an array of one prompt, or as {"prompt_string", "multimodal_data":
 * [base64 images]} with EKV_IMAGE_MARKER where each image goes (/props
 * names it media_marker); several prompts in one request are refused.
 * n_predict (-1: until the end; 0: the prompt is read, nothing generated),
 * n_probs, return_tokens, timings_per_token. llama-server's other samplers
 * (typical_p, mirostat, DRY, XTC, dynamic temperature, top-n-sigma,
 * grammars) are taken at the values that turn them off and refused
 * otherwise; `samplers` may list the chain in ekv's order (a sampler left
 * out is turned off); hints about llama-server's slots (id_slot, n_keep,
 * n_cache_reuse) are taken and change nothing: ekv reuses prefixes by
 * content and never shifts the context.
 *
 * Answer: content, tokens, stop, stop_type (eos, limit, word),
 * stopping_word, tokens_predicted, tokens_evaluated, tokens_cached,
 * truncated, has_new_line, generation_settings, model, timings,
 * completion_probabilities (with n_probs: id, token, logprob, bytes,
 * top_logprobs) and ekv's `kv` statistics. Streams: one event per token
 * ({"content", "tokens", "stop": false}), then one with the answer's
 * fields and "stop": true; no [DONE] (llama-server sends none).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define BAD(param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define UNSUPPORTED(param, ...) srv_fail(e, 400, "invalid_request_error", param, "unsupported_parameter", __VA_ARGS__)

/* ------------------------------------------------------------------ */
/* the request                                                          */
/* ------------------------------------------------------------------ */

/* llama-server's samplers that ekv does not have, and the value that turns each off. */
static const struct {
    const char *name;
    double off;
} k_off[] = {
    {"typical_p", 1}, {"mirostat", 0}, {"dry_multiplier", 0}, {"xtc_probability", 0}, {"dynatemp_range", 0},
    {"top_n_sigma", -1}, {"n_indent", 0}, {"t_max_predict_ms", 0}, {"n_cmpl", 1},
};

static bool samplers_off(const cJSON *root, struct srv_error *e) {
    for (size_t i = 0; i < sizeof k_off / sizeof k_off[0]; i++) {
        const cJSON *f = srv_field(root, k_off[i].name);
        if (!f) continue;
        if (!cJSON_IsNumber(f)) return BAD(k_off[i].name, "'%s' must be a number", k_off[i].name);
        if (f->valuedouble != k_off[i].off && !(k_off[i].off < 0 && f->valuedouble < 0))
            return UNSUPPORTED(k_off[i].name, "'%s' is not supported: ekv takes only %g (off)", k_off[i].name,
                               k_off[i].off);
    }
    long long mk = 0;
    if (!srv_get_int(e, root, "min_keep", 0, 1e9, &mk)) return false;
    if (mk > 1) return UNSUPPORTED("min_keep", "'min_keep' above 1 is not supported");
    const cJSON *f;
    if ((f = srv_field(root, "grammar")) && !(cJSON_IsString(f) && !f->valuestring[0]))
        return UNSUPPORTED("grammar", "grammars are not supported");
    if (srv_field(root, "json_schema")) return UNSUPPORTED("json_schema", "JSON schemas are not supported");
    if ((f = srv_field(root, "lora")) && !(cJSON_IsArray(f) && !f->child))
        return UNSUPPORTED("lora", "LoRA adapters are not supported");
    bool b = false;
    if (!srv_get_bool(e, root, "post_sampling_probs", &b)) return false;
    if (b) return UNSUPPORTED("post_sampling_probs", "'post_sampling_probs' is not supported (n_probs are the model's own)");
    if ((f = srv_field(root, "response_fields"))) return UNSUPPORTED("response_fields", "'response_fields' is not supported");
    long long x = 0; /* slot hints: typed, and no effect (prefixes are reused by content; no context shift) */
    return srv_get_int(e, root, "id_slot", -1, 1e9, &x) && srv_get_int(e, root, "n_keep", -1, 1 << 24, &x) &&
           srv_get_int(e, root, "n_cache_reuse", 0, 1 << 24, &x);
}

/* `samplers`: llama-server's chain. Every name must be one llama-server
 * knows; ekv's own (penalties, top_k, top_p, min_p, temperature) must come
 * in ekv's fixed order, and temperature must be there; one left out is
 * turned off. */
static bool parse_samplers(const cJSON *root, struct srv_request *r, struct srv_error *e) {
    const cJSON *s = srv_field(root, "samplers");
    if (!s) return true;
    if (!cJSON_IsArray(s)) return UNSUPPORTED("samplers", "'samplers' must be an array of sampler names");
    static const char *const own[] = {"penalties", "top_k", "top_p", "min_p", "temperature"};
    static const char *const other[] = {"dry", "top_n_sigma", "typ_p", "xtc", "infill"};
    int pos[5] = {-1, -1, -1, -1, -1}, at = 0, last = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, s) {
        if (!cJSON_IsString(it)) return BAD("samplers", "'samplers' must be an array of sampler names");
        int k = -1;
        for (int i = 0; i < 5 && k < 0; i++)
            if (!strcmp(it->valuestring, own[i])) k = i;
        bool known = k >= 0;
        for (int i = 0; i < 5 && !known; i++) known = !strcmp(it->valuestring, other[i]);
        if (!known) return BAD("samplers", "unknown sampler '%.64s'", it->valuestring);
        if (k >= 0) {
            if (pos[k] >= 0) return UNSUPPORTED("samplers", "'%s' twice: ekv applies each sampler once", own[k]);
            if (k < last)
                return UNSUPPORTED("samplers", "ekv applies its samplers in one order: penalties, top_k, top_p, "
                                               "min_p, temperature");
            pos[k] = at;
            last = k;
        }
        at++;
    }
    if (pos[4] < 0) return UNSUPPORTED("samplers", "'samplers' without temperature is not supported");
    struct ekv_sampler_params *sp = &r->sampling;
    if (pos[0] < 0) sp->repeat_penalty = 1.0f, sp->frequency_penalty = sp->presence_penalty = 0.0f;
    if (pos[1] < 0) sp->top_k = 0;
    if (pos[2] < 0) sp->top_p = 1.0f;
    if (pos[3] < 0) sp->min_p = 0.0f;
    return true;
}

/* A prompt of token ids and strings mixed (at least one of each, or ids
 * only): strings tokenized with special tokens parsed, the first element,
 * when a string, with the BOS the model wants. */
static bool mixed_prompt(const struct srv *srv, const cJSON *arr, struct srv_request *r, struct srv_error *e) {
    size_t total = 0, cap = 0;
    const cJSON *it;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        size_t at = 0;
        bool first = true;
        cJSON_ArrayForEach(it, arr) {
            if (cJSON_IsNumber(it)) {
                if (!(it->valuedouble >= 0 && it->valuedouble < srv->mi.n_vocab) ||
                    it->valuedouble != floor(it->valuedouble))
                    return BAD("prompt", "token ids must be integers in [0, %d)", srv->mi.n_vocab);
                if (pass) r->tokens[at] = (int32_t)it->valuedouble;
                at++;
            } else {
                size_t n = 0;
                const size_t len = strlen(it->valuestring);
                enum ekv_status st = ekv_tokenize(srv->model, it->valuestring, len, first, true, pass ? r->tokens + at : NULL,
                                                  pass ? cap - at : 0, &n);
                if (st != EKV_OK && !(st == EKV_ERR_INVALID_ARG && !pass))
                    return BAD("prompt", "cannot tokenize the prompt: %s", ekv_last_error());
                at += n;
            }
            first = false;
            if (at > INT32_MAX) return BAD("prompt", "the prompt is too long");
        }
        if (!pass) {
            total = at;
            if (total == 0) return BAD("prompt", "the prompt is empty");
            if (!(r->tokens = malloc(total * sizeof *r->tokens)))
                return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            cap = total;
        } else if (at != total) {
            return srv_fail(e, 500, "server_error", "prompt", NULL, "the prompt's tokens changed between two counts");
        }
    }
    r->n_tokens = (int32_t)total;
    return true;
}

/* {"prompt_string": "... <image> ...", "multimodal_data": ["<base64>", ...]} */
static bool multimodal_prompt(const struct srv *srv, const cJSON *o, struct srv_request *r, struct srv_error *e) {
    const cJSON *ps = srv_field(o, "prompt_string"), *md = srv_field(o, "multimodal_data");
    if (!ps || !cJSON_IsString(ps)) return BAD("prompt", "a prompt object needs 'prompt_string' (a string)");
    if (md && !cJSON_IsArray(md)) return BAD("prompt", "'multimodal_data' must be an array of base64 strings");
    struct srv_images im = {0};
    bool ok = true;
    const cJSON *it;
    if (md) cJSON_ArrayForEach(it, md) {
        if (!ok) break;
        ok = cJSON_IsString(it) ? srv_images_add_b64(srv, it->valuestring, strlen(it->valuestring), &im, "prompt", e)
                                : BAD("prompt", "'multimodal_data' must be an array of base64 strings");
    }
    if (ok) ok = srv_prompt_from_text(srv, ps->valuestring, strlen(ps->valuestring), &im, r, "prompt", e);
    srv_images_free(&im);
    return ok;
}

static bool native_prompt(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e) {
    const cJSON *p = srv_field(root, "prompt");
    if (!p && srv_field(root, "messages"))
        return BAD("messages", "'messages' belongs to /v1/chat/completions; /completion takes 'prompt'");
    if (!p) return BAD("prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(p->child)) p = p->child; /* one prompt */
    struct srv_images none = {0};
    if (cJSON_IsString(p)) return srv_prompt_from_text(srv, p->valuestring, strlen(p->valuestring), &none, r, "prompt", e);
    if (cJSON_IsObject(p)) return multimodal_prompt(srv, p, r, e);
    if (!cJSON_IsArray(p)) return BAD("prompt", "'prompt' must be a string, an array of token ids and strings, or an object");
    bool num = false, str = false, other = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        num |= cJSON_IsNumber(it);
        str |= cJSON_IsString(it);
        other |= !cJSON_IsNumber(it) && !cJSON_IsString(it);
    }
    if (other || (str && !num)) /* llama-server's several prompts: strings only, or arrays and objects */
        return UNSUPPORTED("prompt", "one prompt per request (a string, token ids and strings, or an array of one)");
    if (!num) return BAD("prompt", "'prompt' is empty");
    return mixed_prompt(srv, p, r, e);
}

bool srv_native_parse(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e) {
    return samplers_off(root, e) && parse_samplers(root, r, e) &&
           srv_get_bool(e, root, "return_tokens", &r->return_tokens) &&
           srv_get_bool(e, root, "timings_per_token", &r->timings_per_token) && native_prompt(srv, root, r, e);
}

/* ------------------------------------------------------------------ */
/* the answer                                                           */
/* ------------------------------------------------------------------ */

/* completion_probabilities of tokens [from, to): each its own entry and its n most likely */
static cJSON *probs_json(const struct srv *srv, const struct srv_job *j, size_t from, size_t to) {
    const int n = j->req.logprobs;
    const size_t w = 1 + (size_t)n;
    cJSON *a = cJSON_CreateArray();
    for (size_t k = from; a && k < to; k++) cJSON_AddItemToArray(a, srv_lp_entry(srv, &j->lp[k * w], &j->lp[k * w + 1], n, true));
    if (a && (size_t)cJSON_GetArraySize(a) != to - from) cJSON_Delete(a), a = NULL; /* out of memory */
    return a;
}

/* The object of an event or answer: text[0..n), tokens [from, to) (ids only when `ids`), and with
 * final the answer's fields. NULL on out of memory. */
static cJSON *body(const struct srv *srv, const struct srv_job *j, const char *text, size_t n, bool final, size_t from,
                   size_t to, bool ids) {
    cJSON *o = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(o, "tokens");
    char *clean = srv_text_clean(text, n);
    if (!toks || !clean) {
        free(clean);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "index", 0);
    cJSON_AddStringToObject(o, "content", clean);
    free(clean);
    for (size_t k = from; ids && k < to; k++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(j->toks[k]));
    cJSON_AddBoolToObject(o, "stop", final);
    cJSON_AddNumberToObject(o, "id_slot", -1);
    cJSON_AddNumberToObject(o, "tokens_predicted", final ? (double)j->n_gen : (double)to);
    cJSON_AddNumberToObject(o, "tokens_evaluated", j->req.n_tokens);
    bool ok = !ids || (size_t)cJSON_GetArraySize(toks) == to - from;
    if (ok && j->req.logprobs >= 0 && (to > from || final)) {
        cJSON *p = probs_json(srv, j, from, to);
        ok = p && cJSON_AddItemToObject(o, "completion_probabilities", p);
        if (!ok) cJSON_Delete(p);
    }
    if (ok && (final || j->req.timings_per_token)) ok = cJSON_AddItemToObject(o, "timings", srv_timings_json(j));
    if (ok && final) {
        const char *type = !j->finish || !strcmp(j->finish, "length") ? "limit" : j->stop_hit >= 0 ? "word" : "eos";
        cJSON_AddStringToObject(o, "model", srv->cfg.model_id);
        cJSON_AddStringToObject(o, "stop_type", type);
        cJSON_AddStringToObject(o, "stopping_word", j->stop_hit >= 0 ? j->req.stop[j->stop_hit] : "");
        cJSON_AddNumberToObject(o, "tokens_cached", j->n_cached);
        /* truncated: the context's end stopped it (max_tokens was the room left, or it came first) */
        const bool length = j->finish && !strcmp(j->finish, "length");
        cJSON_AddBoolToObject(o, "truncated", length && (j->n_gen < j->req.max_tokens || j->req.to_ctx_end));
        cJSON_AddBoolToObject(o, "has_new_line", j->text && memchr(j->text, '\n', j->text_len) != NULL);
        ok = cJSON_AddItemToObject(o, "generation_settings", srv_job_settings_json(srv, j)) &&
             cJSON_AddItemToObject(o, "kv", srv_kv_json((struct srv_job *const *)&j, 1));
    }
    if (!ok) cJSON_Delete(o), o = NULL;
    return o;
}

char *srv_native_json(const struct srv *srv, const struct srv_job *j) {
    const size_t n = srv_lp_upto(j, 0, j->text_len); /* the tokens of the text (and the one a stop string cut) */
    return srv_json_take(body(srv, j, j->text ? j->text : "", j->text_len, true, 0, n, j->req.return_tokens));
}

char *srv_native_chunk_sse(const struct srv *srv, const struct srv_job *j, const char *delta, size_t n, bool final,
                           size_t tok_from, size_t tok_to) {
    return srv_sse_take(body(srv, j, delta, n, final, tok_from, tok_to, true));
}
