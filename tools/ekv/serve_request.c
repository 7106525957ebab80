/*
 * serve_request.c — an OpenAI request body becomes a validated srv_request,
 * or a 4xx error naming the field and the reason. Runs on the HTTP thread
 * of the request, so that the engine thread only ever sees requests that
 * can run.
 *
 * Every field is type- and range-checked: the body must be valid UTF-8 and
 * one JSON object; numbers must be finite and, where counts are meant,
 * integers in range; fields ekv does not implement (n > 1, tools, echo,
 * response_format json, ...) are refused rather than silently ignored. Chat messages go
 * through the chat template (--chat-template, else the one the GGUF
 * declares, else "none"); image_url parts with base64 data: URIs are decoded
 * here and encoded by the vision tower (--mmproj) into the prompt's image
 * slots. The per-request KV policy ("kv": {...} or "kv_*" fields) is parsed
 * by the command line's own option rows (cli_set_option), so a request is
 * validated exactly like `ekv run`.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "serve.h"

#define SRV_MAX_MESSAGES 4096
#define SRV_MAX_STOP_LEN 1024

bool srv_fail(struct srv_error *e, int status, const char *type, const char *param, const char *code,
              const char *fmt, ...) {
    if (e->status) return false; /* the first error wins */
    e->status = status;
    e->type = type;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(param, ...) srv_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define UNSUPPORTED(param, ...) srv_fail(e, 400, "invalid_request_error", param, "unsupported_parameter", __VA_ARGS__)

void srv_request_free(struct srv_request *r) {
    if (!r) return;
    free(r->tokens);
    ekv_prompt_free(r->prompt);
    free(r->bounds);
    free(r->lb_tok);
    free(r->lb_val);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------ */
/* UTF-8                                                                */
/* ------------------------------------------------------------------ */

/* Length of the valid UTF-8 character at s (n bytes left), 0 if invalid or cut short. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

bool srv_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char(u + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

size_t srv_utf8_whole(const char *s, size_t n) {
    /* back over at most 3 continuation bytes to the last lead byte */
    size_t i = n;
    for (int k = 0; k < 4 && i > 0; k++) {
        unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xC0) != 0x80) { /* a lead or ASCII byte at i - 1 */
            size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            return n - (i - 1) >= need ? n : i - 1;
        }
        i--;
    }
    return n; /* not UTF-8 anyway: let the final sanitising deal with it */
}

/* ------------------------------------------------------------------ */
/* typed fields                                                         */
/* ------------------------------------------------------------------ */

/* The field, or NULL when absent or JSON null. */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static bool get_number(struct srv_error *e, const cJSON *o, const char *name, double lo, double hi, double *out) {
    const cJSON *f = field(o, name);
    if (!f) return true;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble))
        return BAD(name, "'%s' must be a number", name);
    if (f->valuedouble < lo || f->valuedouble > hi)
        return BAD(name, "'%s' must be in [%g, %g], got %g", name, lo, hi, f->valuedouble);
    *out = f->valuedouble;
    return true;
}

static bool get_int(struct srv_error *e, const cJSON *o, const char *name, double lo, double hi, long long *out) {
    const cJSON *f = field(o, name);
    if (!f) return true;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble != floor(f->valuedouble))
        return BAD(name, "'%s' must be an integer", name);
    if (f->valuedouble < lo || f->valuedouble > hi)
        return BAD(name, "'%s' must be in [%.0f, %.0f], got %.17g", name, lo, hi, f->valuedouble);
    *out = (long long)f->valuedouble;
    return true;
}

static bool get_bool(struct srv_error *e, const cJSON *o, const char *name, bool *out) {
    const cJSON *f = field(o, name);
    if (!f) return true;
    if (!cJSON_IsBool(f)) return BAD(name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(f);
    return true;
}

const cJSON *srv_field(const cJSON *o, const char *name) { return field(o, name); }
bool srv_get_number(struct srv_error *e, const cJSON *o, const char *name, double lo, double hi, double *out) {
    return get_number(e, o, name, lo, hi, out);
}
bool srv_get_int(struct srv_error *e, const cJSON *o, const char *name, double lo, double hi, long long *out) {
    return get_int(e, o, name, lo, hi, out);
}
bool srv_get_bool(struct srv_error *e, const cJSON *o, const char *name, bool *out) { return get_bool(e, o, name, out); }

/* Sampling, length, stop strings, streaming. */
static bool parse_sampling(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e) {
    double d;
    long long x;
    d = r->sampling.temp;
    if (!get_number(e, root, "temperature", 0, 2, &d)) return false;
    r->sampling.temp = (float)d;
    d = r->sampling.top_p;
    if (!get_number(e, root, "top_p", 0, 1, &d)) return false;
    r->sampling.top_p = d > 1e-6 ? (float)d : 1e-6f; /* 0 keeps the most likely token only */
    x = r->sampling.top_k;
    if (!get_int(e, root, "top_k", 0, 1 << 24, &x)) return false;
    r->sampling.top_k = (int32_t)x;
    d = r->sampling.min_p;
    if (!get_number(e, root, "min_p", 0, 1, &d)) return false;
    r->sampling.min_p = (float)d;
    /* penalties: OpenAI's two (-2 .. 2) and llama-server's repeat_penalty and
     * repeat_last_n, over the last repeat_last_n tokens of prompt and answer */
    d = r->sampling.presence_penalty;
    if (!get_number(e, root, "presence_penalty", -2, 2, &d)) return false;
    r->sampling.presence_penalty = (float)d;
    d = r->sampling.frequency_penalty;
    if (!get_number(e, root, "frequency_penalty", -2, 2, &d)) return false;
    r->sampling.frequency_penalty = (float)d;
    d = r->sampling.repeat_penalty;
    if (!get_number(e, root, "repeat_penalty", 1e-6, 1e6, &d)) return false;
    r->sampling.repeat_penalty = (float)d;
    x = r->sampling.repeat_last_n;
    if (!get_int(e, root, "repeat_last_n", -1, 1 << 24, &x)) return false;
    r->sampling.repeat_last_n = (int32_t)(x < 0 ? srv->cfg.n_ctx : x); /* -1: the context */
    if (field(root, "seed")) {
        if (!get_int(e, root, "seed", -9.2e18, 9.2e18, &x)) return false;
        r->sampling.seed = (uint64_t)x;
    } else if (!srv->cfg.seed_fixed) { /* a new seed per request, like llama-server's default */
        static uint64_t counter;
        r->sampling.seed = ((uint64_t)(cli_now() * 1e9) ^ (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull)) &
                           ((1ull << 53) - 1); /* exact as a JSON number: the seed an answer reports can be sent back */
    }
    x = r->max_tokens;
    if (r->kind == SRV_NATIVE && field(root, "n_predict")) { /* llama-server's: -1 (and -2) until the end, 0 none */
        if (!get_int(e, root, "n_predict", -2, 1 << 24, &x)) return false;
        if (x < 0) x = -1;
    } else {
        const char *mt = field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
        if (!get_int(e, root, mt, 1, 1 << 24, &x)) return false;
    }
    r->max_tokens = (long)x;
    if (!get_bool(e, root, "stream", &r->stream)) return false;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (!get_bool(e, so, "include_usage", &r->include_usage)) return false;
    }
    if (!get_bool(e, root, "ignore_eos", &r->ignore_eos)) return false;
    const cJSON *st = field(root, "stop");
    if (st) {
        if (cJSON_IsString(st)) {
            r->stop[r->n_stop++] = strdup(st->valuestring);
        } else if (cJSON_IsArray(st)) {
            if (cJSON_GetArraySize(st) > SRV_MAX_STOP) return BAD("stop", "'stop' takes at most %d strings", SRV_MAX_STOP);
            const cJSON *it;
            cJSON_ArrayForEach(it, st) {
                if (!cJSON_IsString(it)) return BAD("stop", "'stop' must be a string or an array of strings");
                r->stop[r->n_stop++] = strdup(it->valuestring);
            }
        } else {
            return BAD("stop", "'stop' must be a string or an array of strings");
        }
        for (int i = 0; i < r->n_stop; i++) {
            if (!r->stop[i]) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            size_t n = strlen(r->stop[i]);
            if (n == 0 || n > SRV_MAX_STOP_LEN)
                return BAD("stop", "stop strings must have 1 to %d bytes", SRV_MAX_STOP_LEN);
        }
    }
    return true;
}

/* One more logit bias; false on no memory (e set). The list grows by
 * doubling; its length is bounded by the body (a pair or key per entry, at
 * most a token per byte of a text). */
static bool lb_push(struct srv_request *r, int32_t tok, float val, int32_t *cap, struct srv_error *e) {
    if (r->n_lb == *cap) {
        if (*cap > (1 << 26)) return BAD("logit_bias", "'logit_bias' has too many entries");
        const int32_t nc = *cap ? 2 * *cap : 16;
        int32_t *t = realloc(r->lb_tok, (size_t)nc * sizeof *t);
        if (t) r->lb_tok = t;
        float *v = t ? realloc(r->lb_val, (size_t)nc * sizeof *v) : NULL;
        if (v) r->lb_val = v;
        if (!t || !v) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        *cap = nc;
    }
    r->lb_tok[r->n_lb] = tok;
    r->lb_val[r->n_lb++] = val;
    return true;
}

/* A bias: a number in [-100, 100] (OpenAI's range) or false (banned, llama-server's). */
static bool lb_value(const cJSON *v, float *out, struct srv_error *e) {
    if (cJSON_IsFalse(v)) {
        *out = -INFINITY;
        return true;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -100 && v->valuedouble <= 100))
        return BAD("logit_bias", "a logit bias must be a number in [-100, 100] or false (never the token)");
    *out = (float)v->valuedouble;
    return true;
}

/* A token id of the vocabulary: an integer (array form) or its decimal
 * digits (an object's key, OpenAI's form). */
static bool lb_token(const struct srv *srv, const cJSON *v, const char *key, int32_t *out, struct srv_error *e) {
    double t = -1;
    if (key) {
        size_t n = strlen(key);
        bool digits = n > 0 && n <= 10 && (key[0] != '0' || n == 1);
        for (size_t i = 0; digits && i < n; i++) digits = isdigit((unsigned char)key[i]);
        if (!digits) return BAD("logit_bias", "logit_bias keys must be token ids (decimal), got '%.40s'", key);
        t = strtod(key, NULL);
    } else if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble)) {
        t = v->valuedouble;
    } else {
        return BAD("logit_bias", "a logit_bias pair must start with a token id or a text");
    }
    if (!(t >= 0 && t < srv->mi.n_vocab))
        return BAD("logit_bias", "logit_bias: token %.0f is not in the vocabulary [0, %d)", t, srv->mi.n_vocab);
    *out = (int32_t)t;
    return true;
}

/* logit_bias: OpenAI's object of token ids to biases, or llama-server's
 * array of [token id or text, bias] pairs (every token of the text, without
 * BOS, gets the bias). Given, even empty, it replaces the server's -l list. */
static bool parse_logit_bias(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e) {
    const cJSON *f = field(root, "logit_bias"), *it;
    if (!f || cJSON_IsNull(f)) return true;
    if (!cJSON_IsObject(f) && !cJSON_IsArray(f))
        return BAD("logit_bias", "'logit_bias' must be an object of token ids to biases or an array of "
                   "[token id or text, bias] pairs");
    r->lb_given = true;
    int32_t cap = 0, tok;
    float val;
    cJSON_ArrayForEach(it, f) {
        if (cJSON_IsObject(f)) {
            if (!lb_token(srv, NULL, it->string, &tok, e) || !lb_value(it, &val, e) || !lb_push(r, tok, val, &cap, e))
                return false;
            continue;
        }
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
            return BAD("logit_bias", "'logit_bias' as an array holds [token id or text, bias] pairs");
        const cJSON *k = it->child, *v = k->next;
        if (!lb_value(v, &val, e)) return false;
        if (!cJSON_IsString(k)) {
            if (!lb_token(srv, k, NULL, &tok, e) || !lb_push(r, tok, val, &cap, e)) return false;
            continue;
        }
        const size_t n = strlen(k->valuestring), tcap = 3 * n + 16; /* as /tokenize: room for any tokenizer */
        size_t got = 0;
        int32_t *tk = malloc(tcap * sizeof *tk);
        if (!tk) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        enum ekv_status s = ekv_tokenize(srv->model, k->valuestring, n, false, false, tk, tcap, &got);
        bool ok = s == EKV_OK || BAD("logit_bias", "logit_bias: cannot tokenize '%.40s': %s", k->valuestring,
                                     ekv_last_error());
        for (size_t i = 0; ok && i < got; i++) ok = lb_push(r, tk[i], val, &cap, e);
        free(tk);
        if (!ok) return false;
    }
    return true;
}

/* logprobs: chat's `logprobs` (true/false) and `top_logprobs` (0..20, with
 * logprobs true); completions' `logprobs` N (0..20 most likely tokens
 * beside each chosen one; OpenAI allows 5; true = 0). */
static bool parse_logprobs(const cJSON *root, struct srv_request *r, struct srv_error *e) {
    r->logprobs = -1;
    const cJSON *f = field(root, "logprobs"), *t = field(root, "top_logprobs");
    if (f && cJSON_IsNull(f)) f = NULL;
    if (t && cJSON_IsNull(t)) t = NULL;
    long long n = 0;
    if (r->kind == SRV_NATIVE) { /* llama-server's n_probs: > 0 gives each token's logprob and its n most likely */
        if (!get_int(e, root, "n_probs", 0, SRV_MAX_TOP_LOGPROBS, &n)) return false;
        if (n > 0) r->logprobs = (int32_t)n;
        return true;
    }
    if (r->kind == SRV_CHAT) {
        bool on = false;
        if (!get_bool(e, root, "logprobs", &on)) return false;
        if (t && !get_int(e, root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &n)) return false;
        if (t && !on) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (on) r->logprobs = (int32_t)n;
        return true;
    }
    if (t) return BAD("top_logprobs", "'top_logprobs' belongs to /v1/chat/completions; /v1/completions takes 'logprobs': N");
    if (!f || cJSON_IsFalse(f)) return true;
    if (!cJSON_IsTrue(f) && !get_int(e, root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &n)) return false;
    r->logprobs = (int32_t)n;
    return true;
}

/* Fields of the OpenAI API that ekv does not implement: refused unless they
 * ask for the default. */
static bool refuse_unsupported(const cJSON *root, struct srv_request *r, struct srv_error *e) {
    long long n = 1;
    if (!get_int(e, root, "n", 1, 1e9, &n)) return false;
    if (n > SRV_MAX_CHOICES) return UNSUPPORTED("n", "at most n = %d choices per request", SRV_MAX_CHOICES);
    if (n > 1 && r->kind == SRV_NATIVE) return UNSUPPORTED("n", "/completion takes one choice ('n_cmpl' 1)");
    r->n_choices = (int32_t)n;
    const cJSON *f;
    if (field(root, "tools") || field(root, "functions")) return UNSUPPORTED("tools", "tools are not supported");
    if ((f = field(root, "tool_choice")) && !(cJSON_IsString(f) && !strcmp(f->valuestring, "none")))
        return UNSUPPORTED("tool_choice", "tools are not supported");
    if ((f = field(root, "response_format"))) {
        const cJSON *t = cJSON_IsObject(f) ? field(f, "type") : NULL;
        if (!t || !cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            return UNSUPPORTED("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
    if ((f = field(root, "echo")) && !cJSON_IsFalse(f)) return UNSUPPORTED("echo", "echo is not supported");
    if ((f = field(root, "suffix"))) return UNSUPPORTED("suffix", "suffix is not supported");
    long long best = 1;
    if (!get_int(e, root, "best_of", 1, 1e9, &best)) return false;
    if (best != 1) return UNSUPPORTED("best_of", "only best_of = 1 is supported");
    if ((f = field(root, "model")) && !cJSON_IsString(f)) return BAD("model", "'model' must be a string");
    if ((f = field(root, "user")) && !cJSON_IsString(f)) return BAD("user", "'user' must be a string");
    return true;
}

/* ------------------------------------------------------------------ */
/* the KV extension                                                     */
/* ------------------------------------------------------------------ */

/* One KV parameter: name as in the API ("budget", "obs_window") -> the
 * command line's row (--kv-budget, --kv-obs-window). */
static bool kv_param(struct cli_params *p, const char *where, const char *name, const cJSON *v, struct srv_error *e) {
    char opt[48], num[64], err[640];
    const char *val = num; /* strings are passed as they are: a string option keeps the pointer (valid until the
                              JSON is freed; parse_kv copies the policy name before that) */
    size_t n = strlen(name);
    if (n == 0 || n > 32) return BAD("kv", "%s: unknown KV parameter '%.40s'", where, name);
    for (size_t i = 0; i < n; i++)
        if (!(islower((unsigned char)name[i]) || name[i] == '_')) return BAD("kv", "%s: unknown KV parameter '%.40s'", where, name);
    snprintf(opt, sizeof opt, "--kv-%s", name);
    for (char *c = opt + 5; *c; c++)
        if (*c == '_') *c = '-';
    if (!strcmp(opt, "--kv-mem")) return BAD("kv", "%s: 'mem' is the server's --kv-mem, not a request parameter", where);
    if (cJSON_IsString(v)) {
        if (strlen(v->valuestring) >= sizeof num) return BAD("kv", "%s: the value of '%s' is too long", where, name);
        val = v->valuestring;
    } else if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
        if (v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9e15)
            snprintf(num, sizeof num, "%.0f", v->valuedouble);
        else
            snprintf(num, sizeof num, "%.17g", v->valuedouble);
    } else {
        return BAD("kv", "%s: '%s' must be a number or a string", where, name);
    }
    if (!cli_set_option(p, opt, val, err, sizeof err)) {
        if (!strncmp(err, "unknown option", 14)) return BAD("kv", "%s: unknown KV parameter '%s'", where, name);
        return BAD("kv", "%s: %s", where, err);
    }
    return true;
}

/* "kv": {"policy": "h2o", "budget": 0.2, ...} and top-level "kv_policy", "kv_budget", ... */
static bool parse_kv(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e) {
    struct cli_params p = *srv->cfg.cli; /* copied: only its kv fields change */
    p.kv = r->kv;
    const cJSON *kv = field(root, "kv"), *it;
    if (kv) {
        if (!cJSON_IsObject(kv)) return BAD("kv", "'kv' must be an object");
        cJSON_ArrayForEach(it, kv) {
            if (!kv_param(&p, "kv", it->string, it, e)) return false;
        }
    }
    cJSON_ArrayForEach(it, root) {
        if (strncmp(it->string, "kv_", 3) || cJSON_IsNull(it)) continue;
        if (!kv_param(&p, it->string, it->string + 3, it, e)) return false;
    }
    r->kv = p.kv;
    snprintf(r->kv_policy, sizeof r->kv_policy, "%s", p.kv.policy ? p.kv.policy : "full");
    r->kv.policy = r->kv_policy;
    return true;
}

/* ------------------------------------------------------------------ */
/* images                                                               */
/* ------------------------------------------------------------------ */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 (RFC 4648 section 4), padding optional, no other bytes.
 * *out is malloc'd. */
static bool b64_decode(const char *s, size_t n, unsigned char **out, size_t *n_out) {
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return false;
    unsigned char *b = malloc(n / 4 * 3 + 3);
    if (!b) return false;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            free(b);
            return false;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            b[o++] = (unsigned char)(acc >> bits);
        }
    }
    *out = b;
    *n_out = o;
    return true;
}

void srv_images_free(struct srv_images *im) {
    for (int i = 0; i < im->n; i++) free(im->data[i]);
    im->n = 0;
}

bool srv_images_add_b64(const struct srv *srv, const char *b64, size_t len, struct srv_images *im, const char *param,
                        struct srv_error *e) {
    if (!srv->vision) return UNSUPPORTED(param, "this server has no vision tower: images need 'ekv serve --mmproj'");
    if (im->n == SRV_MAX_IMAGES) return BAD(param, "at most %d images per request", SRV_MAX_IMAGES);
    unsigned char *bytes;
    size_t n;
    if (!b64_decode(b64, len, &bytes, &n)) return BAD(param, "image %d: not valid base64", im->n);
    if (n == 0) {
        free(bytes);
        return BAD(param, "image %d: no bytes", im->n);
    }
    im->data[im->n] = bytes;
    im->size[im->n] = n;
    im->n++;
    return true;
}

/* An image_url part: {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}} */
static bool parse_image(const struct srv *srv, const cJSON *part, struct srv_images *im, struct srv_error *e) {
    if (!srv->vision)
        return UNSUPPORTED("messages", "this server has no vision tower: image_url parts need 'ekv serve --mmproj'");
    const cJSON *iu = field(part, "image_url"), *url = NULL;
    if (iu && cJSON_IsObject(iu)) url = field(iu, "url");
    else if (iu && cJSON_IsString(iu)) url = iu;
    if (!url || !cJSON_IsString(url)) return BAD("messages", "an image_url part needs image_url.url (a string)");
    const char *u = url->valuestring;
    if (strncmp(u, "data:", 5) != 0)
        return BAD("messages", "image URLs must be data: URIs with base64 content (the server fetches nothing)");
    const char *comma = strchr(u, ',');
    if (!comma || comma - u < 12 || strncmp(comma - 7, ";base64", 7) != 0)
        return BAD("messages", "image data: URI must be 'data:<type>;base64,<data>'");
    return srv_images_add_b64(srv, comma + 1, strlen(comma + 1), im, "messages", e);
}

/* ------------------------------------------------------------------ */
/* messages and prompts                                                 */
/* ------------------------------------------------------------------ */

struct chat {
    struct ekv_chat_msg *msgs;
    char **content; /* owned */
    int n;
};

static void chat_free(struct chat *c) {
    for (int i = 0; i < c->n; i++) free(c->content[i]);
    free(c->content);
    free(c->msgs);
}

static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *b = realloc(*buf, nc);
        if (!b) return false;
        *buf = b;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

/* A message's content: a string, or text and image_url parts (each image
 * becomes a marker where it stands). *out is malloc'd. */
static bool message_content_(const struct srv *srv, const cJSON *content, struct srv_images *im, char **out,
                             struct srv_error *e);

/* As message_content_, with *out freed (NULL) on failure. */
static bool message_content(const struct srv *srv, const cJSON *content, struct srv_images *im, char **out,
                            struct srv_error *e) {
    if (message_content_(srv, content, im, out, e)) return true;
    free(*out);
    *out = NULL;
    return false;
}

static bool message_content_(const struct srv *srv, const cJSON *content, struct srv_images *im, char **out,
                             struct srv_error *e) {
    size_t len = 0, cap = 0;
    *out = NULL;
    if (cJSON_IsString(content)) return (*out = strdup(content->valuestring)) ? true : srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (!cJSON_IsArray(content)) return BAD("messages", "message content must be a string or an array of parts");
    const cJSON *part;
    bool ok = append(out, &len, &cap, "", 0);
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_IsObject(part) ? field(part, "type") : NULL;
        if (!type || !cJSON_IsString(type)) return BAD("messages", "a content part needs a 'type'");
        if (!strcmp(type->valuestring, "text")) {
            const cJSON *t = field(part, "text");
            if (!t || !cJSON_IsString(t)) return BAD("messages", "a text part needs 'text' (a string)");
            ok = ok && append(out, &len, &cap, t->valuestring, strlen(t->valuestring));
        } else if (!strcmp(type->valuestring, "image_url")) {
            if (!parse_image(srv, part, im, e)) return false;
            ok = ok && append(out, &len, &cap, EKV_IMAGE_MARKER "\n", strlen(EKV_IMAGE_MARKER "\n"));
        } else {
            return UNSUPPORTED("messages", "content parts of type '%.32s' are not supported", type->valuestring);
        }
    }
    return ok ? true : srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

static bool parse_messages(const struct srv *srv, const cJSON *msgs, struct chat *c, struct srv_images *im,
                           struct srv_error *e) {
    if (!msgs) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD("messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n < 1 || n > SRV_MAX_MESSAGES) return BAD("messages", "'messages' must hold 1 to %d messages", SRV_MAX_MESSAGES);
    c->msgs = calloc((size_t)n, sizeof *c->msgs);
    c->content = calloc((size_t)n, sizeof *c->content);
    if (!c->msgs || !c->content) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!cJSON_IsObject(m)) return BAD("messages", "message %d must be an object", c->n);
        const cJSON *role = field(m, "role"), *content = field(m, "content");
        if (!role || !cJSON_IsString(role)) return BAD("messages", "message %d needs a 'role' (a string)", c->n);
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
            return BAD("messages", "message %d: role '%.32s' is not one of system, developer, user, assistant", c->n, r);
        if (!content) return BAD("messages", "message %d needs 'content'", c->n);
        if (!message_content(srv, content, im, &c->content[c->n], e)) return false;
        c->msgs[c->n].role = r;
        c->msgs[c->n].content = c->content[c->n];
        c->n++;
    }
    return true;
}

/* Text with image markers -> the request's prompt (tokens and image slots). */
/* Where the text text[0, split) ends among the prompt's positions, when
 * the prompt's tokens begin with exactly its tokens (no token straddles
 * the split; the prefix's image markers come first): prefix reuse then
 * reads those positions first and the rest after, the same tokens as the
 * whole. 0 when not, or when nothing would be left after it. */
static int32_t prefix_positions(const struct srv *srv, const struct ekv_prompt *whole, const char *text, size_t split) {
    struct ekv_prompt *pre = NULL;
    int32_t at = 0;
    if (ekv_prompt_new(srv->model, text, split, true, &pre) != EKV_OK) return 0;
    const int32_t nt = ekv_prompt_n_tokens(pre), ni = ekv_prompt_n_images(pre);
    int32_t *pt = malloc((size_t)(nt ? nt : 1) * sizeof *pt);
    const struct ekv_segment *sg = NULL;
    int32_t ns = 0;
    if (pt && nt > 0 && ekv_prompt_segments(whole, &sg, &ns) == EKV_OK) {
        ekv_prompt_tokens(pre, pt);
        int32_t t = 0, i = 0, pos = 0; /* text tokens and images of the prefix matched, positions */
        for (int32_t s = 0; s < ns && (t < nt || i < ni); s++) {
            if (!sg[s].tokens) { /* an image: the prefix's own while it has images left */
                if (i == ni) break;
                i++;
                pos += sg[s].n;
                continue;
            }
            const int32_t m = sg[s].n < nt - t ? sg[s].n : nt - t;
            if (memcmp(sg[s].tokens, pt + t, (size_t)m * sizeof *pt) != 0) break;
            t += m;
            pos += m;
        }
        if (t == nt && i == ni && pos < ekv_prompt_n_positions(whole)) at = pos;
    }
    free(pt);
    ekv_prompt_free(pre);
    return at;
}

bool srv_prompt_from_text(const struct srv *srv, const char *text, size_t len, struct srv_images *im,
                        struct srv_request *r, const char *param, struct srv_error *e) {
    enum ekv_status s = ekv_prompt_new(srv->model, text, len, true, &r->prompt);
    if (s != EKV_OK) return BAD(param, "cannot tokenize the prompt: %s", ekv_last_error());
    if (ekv_prompt_n_images(r->prompt) != im->n)
        return BAD(param, "the prompt has %d %s marker(s) for %d image(s)", ekv_prompt_n_images(r->prompt),
                   EKV_IMAGE_MARKER, im->n);
    if (im->n) {
        struct ekv_image_input in[SRV_MAX_IMAGES];
        for (int i = 0; i < im->n; i++) in[i] = (struct ekv_image_input){.data = im->data[i], .size = im->size[i]};
        if ((s = ekv_prompt_set_images(r->prompt, srv->vision, NULL, in, im->n)) != EKV_OK)
            return BAD(param, "%s", ekv_last_error());
    }
    int64_t n = ekv_prompt_n_positions(r->prompt);
    if (n == 0) return BAD(param, "the prompt is empty");
    if (n > INT32_MAX) return BAD(param, "the prompt is too long");
    r->n_tokens = (int32_t)n;
    return true;
}

/* Prefix reuse: where messages 2..n of the conversation start among the
 * prompt's positions (r->bounds), at each message boundary that the
 * template renders as the start of the whole and that no token straddles;
 * none without --prefix-cache or with "cache_prompt": false. */
static void message_bounds(const struct srv *srv, const struct chat *c, const char *text, size_t len,
                           struct srv_request *r) {
    if (!srv->cfg.prefix_cache || !r->cache_prompt || c->n < 2) return;
    if (!(r->bounds = malloc((size_t)(c->n - 1) * sizeof *r->bounds))) return;
    for (int k = 1; k < c->n; k++) {
        size_t plen = 0;
        char *pre = NULL;
        if (ekv_chat_apply(srv->cfg.chat_template, c->msgs, (size_t)k, false, NULL, 0, &plen) == EKV_OK &&
            plen > 0 && plen < len && (pre = malloc(plen + 1)) &&
            ekv_chat_apply(srv->cfg.chat_template, c->msgs, (size_t)k, false, pre, plen + 1, &plen) == EKV_OK &&
            !memcmp(pre, text, plen)) {
            const int32_t at = prefix_positions(srv, r->prompt, text, plen);
            if (at > 0 && (r->n_bounds == 0 || at > r->bounds[r->n_bounds - 1])) r->bounds[r->n_bounds++] = at;
        }
        free(pre);
    }
    if (r->n_bounds == 0) {
        free(r->bounds);
        r->bounds = NULL;
    }
}

static bool parse_chat(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e) {
    struct chat c = {0};
    struct srv_images im = {0};
    char *text = NULL;
    bool ok = parse_messages(srv, field(root, "messages"), &c, &im, e);
    size_t len = 0;
    if (ok) {
        enum ekv_status s = ekv_chat_apply(srv->cfg.chat_template, c.msgs, (size_t)c.n, true, NULL, 0, &len);
        if (s == EKV_OK && !(text = malloc(len + 1))) s = EKV_ERR_NOMEM;
        if (s == EKV_OK) s = ekv_chat_apply(srv->cfg.chat_template, c.msgs, (size_t)c.n, true, text, len + 1, &len);
        if (s != EKV_OK) ok = BAD("messages", "chat template %s: %s", srv->cfg.chat_template, ekv_last_error());
    }
    if (ok) ok = srv_prompt_from_text(srv, text, len, &im, r, "messages", e);
    if (ok) message_bounds(srv, &c, text, len, r);
    free(text);
    srv_images_free(&im);
    chat_free(&c);
    return ok;
}

/* A token array [1, 2, 3] -> the request's tokens. */
static bool prompt_tokens(const struct srv *srv, const cJSON *arr, struct srv_request *r, struct srv_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (n < 1) return BAD("prompt", "'prompt' is empty");
    r->tokens = malloc((size_t)n * sizeof *r->tokens);
    if (!r->tokens) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble >= srv->mi.n_vocab)
            return BAD("prompt", "token ids must be integers in [0, %d)", srv->mi.n_vocab);
        r->tokens[r->n_tokens++] = (int32_t)it->valuedouble;
    }
    return true;
}

static bool parse_completion(const struct srv *srv, const cJSON *root, struct srv_request *r, struct srv_error *e) {
    const cJSON *p = field(root, "prompt");
    if (!p && field(root, "messages"))
        return BAD("messages", "'messages' belongs to /v1/chat/completions; /v1/completions takes 'prompt'");
    if (!p) return BAD("prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && p->child && !cJSON_IsNumber(p->child)) { /* a batch: ["a", [1, 2], ...], one job each */
        const int k = cJSON_GetArraySize(p);
        const cJSON *it;
        cJSON_ArrayForEach(it, p) if (!cJSON_IsString(it) && !cJSON_IsArray(it))
            return BAD("prompt", "a batch of prompts holds strings and token-id arrays");
        if ((long)k * r->n_choices > SRV_MAX_JOBS)
            return UNSUPPORTED("prompt", "%d prompts x n = %d choices: at most %d per request", k, r->n_choices,
                               SRV_MAX_JOBS);
        if (r->prompt_at >= k) return BAD("prompt", "the batch has %d prompts", k);
        r->n_prompts = k;
        p = cJSON_GetArrayItem(p, r->prompt_at);
    }
    struct srv_images none = {0};
    if (cJSON_IsString(p)) return srv_prompt_from_text(srv, p->valuestring, strlen(p->valuestring), &none, r, "prompt", e);
    if (cJSON_IsArray(p) && (!p->child || cJSON_IsNumber(p->child))) return prompt_tokens(srv, p, r, e);
    if (cJSON_IsArray(p)) return BAD("prompt", "a token-id array holds integers only");
    return BAD("prompt", "'prompt' must be a string, an array of token ids, or an array of those");
}

bool srv_config_init(struct srv *srv, const struct cli_params *p) {
    struct srv_config *c = &srv->cfg;
    c->cli = p;
    c->model_path = p->model ? p->model : cli_default_model();
    if (p->alias) c->model_id = p->alias;
    else {
        const char *slash = strrchr(c->model_path, '/');
        c->model_id = slash ? slash + 1 : c->model_path;
    }
    c->n_predict = p->n_predict;
    c->ignore_eos = p->ignore_eos;
    c->sampling = p->sampling;
    for (int i = 0; i < p->logit_bias.n; i++) {
        c->lb_tok[i] = (int32_t)p->logit_bias.i[i];
        c->lb_val[i] = (float)p->logit_bias.d[i];
    }
    c->n_lb = p->logit_bias.n;
    c->seed_fixed = p->sampling.seed != UINT64_MAX;
    c->kv = p->kv;
    snprintf(c->kv_policy, sizeof c->kv_policy, "%s", p->kv.policy ? p->kv.policy : "full");
    c->kv.policy = c->kv_policy;
    c->parallel = (int32_t)p->parallel;
    c->kv_mem = (uint64_t)(p->kv_mem_mib * 1048576.0);
    c->prefix_cache = (uint64_t)(p->prefix_cache_mib * 1048576.0);
    c->slot_save_path = p->slot_save_path && p->slot_save_path[0] ? p->slot_save_path : NULL;
    if (c->slot_save_path) {
        struct stat st;
        if (stat(c->slot_save_path, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "ekv serve: error: --slot-save-path %s is not a folder\n", c->slot_save_path);
            return false;
        }
    }
    c->queue = p->queue;
    c->api_key = p->api_key && p->api_key[0] ? p->api_key : NULL;
    c->cors = p->cors && p->cors[0] ? p->cors : NULL;
    c->max_body = (size_t)p->max_body;
    c->timeout = (unsigned)p->timeout;
    c->prefill_chunk = (int32_t)p->prefill_chunk;
    return true;
}

/* RFC 8259 syntax, and no more values than cJSON may parse within a few
 * times the body (serve_json.c); false with e set. */
static bool body_json_ok(const char *body, size_t len, struct srv_error *e) {
    size_t at = 0, values = 0;
    const char *why = NULL;
    if (!srv_json_strict(body, len, &at, &why, &values))
        return BAD(NULL, "the body is not valid JSON: %s at byte %zu", why, at);
    if (values > srv_json_max_values(len))
        return srv_fail(e, 400, "invalid_request_error", NULL, "too_many_json_values",
                        "the body has %zu JSON values and keys; a body of %zu bytes may have at most %zu", values, len,
                        srv_json_max_values(len));
    return true;
}

bool srv_request_parse(const struct srv *srv, enum srv_kind kind, const char *body, size_t len, struct srv_request *r,
                       struct srv_error *e) {
    return srv_request_parse_nth(srv, kind, body, len, 0, r, e);
}

bool srv_request_parse_nth(const struct srv *srv, enum srv_kind kind, const char *body, size_t len, int32_t nth,
                           struct srv_request *r, struct srv_error *e) {
    memset(r, 0, sizeof *r);
    r->prompt_at = nth;
    r->n_prompts = 1;
    r->kind = kind;
    r->logprobs = -1;
    r->n_choices = 1;
    r->max_tokens = srv->cfg.n_predict;
    r->sampling = srv->cfg.sampling;
    r->ignore_eos = srv->cfg.ignore_eos;
    r->kv = srv->cfg.kv;
    if (len == 0) return BAD(NULL, "the request has no body (a JSON object is expected)");
    if (!srv_utf8_valid(body, len)) return BAD(NULL, "the body is not valid UTF-8");
    if (!body_json_ok(body, len, e)) return false;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return BAD(NULL, "the body is not valid JSON (error near byte %zu of %zu)", at, len);
    }
    bool ok = true;
    if (!cJSON_IsObject(root)) ok = BAD(NULL, "the body must be a JSON object");
    if (ok && end && (size_t)(end - body) < len) { /* trailing bytes other than white space */
        for (const char *c = end; c < body + len && ok; c++)
            if (!isspace((unsigned char)*c)) ok = BAD(NULL, "the body has bytes after its JSON object (at byte %zu)", (size_t)(c - body));
    }
    r->cache_prompt = true;
    ok = ok && refuse_unsupported(root, r, e) && parse_sampling(srv, root, r, e) && parse_logit_bias(srv, root, r, e) &&
         parse_logprobs(root, r, e) &&
         parse_kv(srv, root, r, e) &&
         get_bool(e, root, "cache_prompt", &r->cache_prompt);
    if (ok) ok = kind == SRV_CHAT     ? parse_chat(srv, root, r, e)
                 : kind == SRV_NATIVE ? srv_native_parse(srv, root, r, e)
                                      : parse_completion(srv, root, r, e);
    cJSON_Delete(root);
    return ok;
}

/* The body of a small endpoint: valid UTF-8 JSON, an object; NULL with e set. */
static cJSON *small_body(const char *body, size_t len, struct srv_error *e) {
    if (len == 0 || !srv_utf8_valid(body, len)) return BAD(NULL, "the body must be a JSON object in UTF-8"), NULL;
    if (!body_json_ok(body, len, e)) return NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return BAD(NULL, "the body must be a JSON object"), NULL;
    }
    return root;
}

char *srv_tokenize_json(const struct srv *srv, const char *body, size_t len, struct srv_error *e) {
    cJSON *root = small_body(body, len, e);
    if (!root) return NULL;
    const cJSON *content = field(root, "content");
    bool add_special = true;
    char *out = NULL;
    int32_t *tok = NULL;
    if (!content || !cJSON_IsString(content)) BAD("content", "'content' (a string) is required");
    else if (get_bool(e, root, "add_special", &add_special)) {
        size_t n = strlen(content->valuestring), got = 0, cap = 3 * n + 16;
        tok = malloc(cap * sizeof *tok);
        enum ekv_status s = tok ? ekv_tokenize(srv->model, content->valuestring, n, add_special, true, tok, cap, &got)
                                : EKV_ERR_NOMEM;
        if (s != EKV_OK) {
            BAD("content", "cannot tokenize: %s", ekv_last_error());
        } else {
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
            for (size_t i = 0; a && i < got; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(tok[i]));
            out = o ? cJSON_PrintUnformatted(o) : NULL;
            cJSON_Delete(o);
            if (!out) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    free(tok);
    cJSON_Delete(root);
    return out;
}

/* {"key": "<text>"} malloc'd, or NULL with e set (out of memory). */
static char *one_string_json(const char *key, const char *text, struct srv_error *e) {
    cJSON *o = cJSON_CreateObject();
    char *out = o && cJSON_AddStringToObject(o, key, text) ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!out) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return out;
}

char *srv_detokenize_json(const struct srv *srv, const char *body, size_t len, struct srv_error *e) {
    cJSON *root = small_body(body, len, e);
    if (!root) return NULL;
    const cJSON *a = field(root, "tokens"), *it;
    char *out = NULL, *text = NULL;
    int32_t *tok = NULL;
    size_t n = 0, cap = 256, got = 0;
    if (!a || !cJSON_IsArray(a)) {
        BAD("tokens", "'tokens' (an array of token ids) is required");
        goto done;
    }
    if (!(tok = malloc(((size_t)cJSON_GetArraySize(a) + 1) * sizeof *tok))) goto oom;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble >= srv->mi.n_vocab) {
            BAD("tokens", "token ids must be integers in [0, %d)", srv->mi.n_vocab);
            goto done;
        }
        tok[n++] = (int32_t)it->valuedouble;
    }
    for (;;) { /* pieces as llama-server joins them: control tokens as their text */
        if (!(text = malloc(cap))) goto oom;
        enum ekv_status s = ekv_detokenize(srv->model, tok, n, true, false, text, cap, &got);
        if (s == EKV_OK && got < cap) break;
        free(text);
        text = NULL;
        if (s == EKV_ERR_NOMEM) goto oom;
        if (got < cap) { /* not a matter of room */
            BAD("tokens", "cannot detokenize: %s", ekv_last_error());
            goto done;
        }
        cap = got + 1;
    }
    text[got] = 0;
    if (!srv_utf8_valid(text, got)) { /* a byte token alone is not UTF-8: JSON strings must be */
        BAD("tokens", "the tokens do not make valid UTF-8 text");
        goto done;
    }
    out = one_string_json("content", text, e);
    goto done;
oom:
    srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
done:
    free(text);
    free(tok);
    cJSON_Delete(root);
    return out;
}

char *srv_apply_template_json(const struct srv *srv, const char *body, size_t len, struct srv_error *e) {
    cJSON *root = small_body(body, len, e);
    if (!root) return NULL;
    struct chat c = {0};
    struct srv_images im = {0};
    char *text = NULL, *out = NULL;
    size_t n = 0;
    if (parse_messages(srv, field(root, "messages"), &c, &im, e)) {
        enum ekv_status s = ekv_chat_apply(srv->cfg.chat_template, c.msgs, (size_t)c.n, true, NULL, 0, &n);
        if (s == EKV_OK && !(text = malloc(n + 1))) s = EKV_ERR_NOMEM;
        if (s == EKV_OK) s = ekv_chat_apply(srv->cfg.chat_template, c.msgs, (size_t)c.n, true, text, n + 1, &n);
        if (s == EKV_ERR_NOMEM) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        else if (s != EKV_OK) BAD("messages", "chat template %s: %s", srv->cfg.chat_template, ekv_last_error());
        else out = one_string_json("prompt", text, e);
    }
    free(text);
    srv_images_free(&im);
    chat_free(&c);
    cJSON_Delete(root);
    return out;
}
