/*
 * alloc_fail_http.c — allocation-failure injection through the whole
 * server (issue 23): `ekv serve`'s pieces (the door, libmicrohttpd's
 * handlers, request parsing, the engine thread, prefix reuse, responses,
 * streams) started in this process on a loopback port, and a client on a
 * plain socket sending what OpenAI clients send (a second server has a
 * vision tower and gets images as data: URIs). Every allocation ekv's
 * code makes on any of the server's threads is failed in turn
 * (alloc_walk.c); libmicrohttpd's, cJSON's and libc's own are not.
 *
 * What each run must give: the server starts, or its start fails with a
 * message on stderr (as `ekv serve` prints it); then every request gets
 * one whole HTTP answer: the same text as without failures, or an error
 * status with the API's JSON error object (a stream: an error event), never
 * a connection closed without an answer, a cut stream or a hang; the
 * server then stops, and (ASan build) nothing leaked. The checksum covers
 * the generated texts (temperature 0) and statuses, not ids or times.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "alloc_walk.h"
#include "ekv.h"
#include "serve.h"
#include "testutil.h"

/* ---- a minimal HTTP/1.1 client ---- */

#define RESP_MAX (1u << 20)
static char g_resp[RESP_MAX + 1];  /* the raw answer */
static char g_body[RESP_MAX + 1];  /* its body, de-chunked */
static char g_text[RESP_MAX + 1];  /* the generated text of a stream (its choices in index order) */
#define CHOICES_MAX 4
static char g_part[CHOICES_MAX][RESP_MAX / CHOICES_MAX]; /* a stream's text by choice (events interleave) */

/* Sends one request and reads the answer until the server closes; the
 * status (0: no status line), the body in g_body; -1 on a socket error or
 * after 30 s without a byte (a hang). */
static int http_call(int port, const char *method, const char *path, const char *body, size_t *body_len) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char head[512];
    const size_t bl = body ? strlen(body) : 0;
    const int hl = body ? snprintf(head, sizeof head,
                                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                                   "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                                   method, path, bl)
                        : snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                                   method, path);
    if (write(fd, head, (size_t)hl) != hl || (body && write(fd, body, bl) != (ssize_t)bl)) {
        close(fd);
        return -1;
    }
    size_t n = 0;
    for (;;) {
        const ssize_t r = read(fd, g_resp + n, RESP_MAX - n);
        if (r == 0) break;
        if (r < 0) { /* a reset after a whole answer still counts; a timeout does not */
            n = (size_t)-1;
            break;
        }
        n += (size_t)r;
        if (n == RESP_MAX) break;
    }
    close(fd);
    if (n == (size_t)-1) return -1;
    g_resp[n] = 0;
    int status = 0;
    if (n < 12 || strncmp(g_resp, "HTTP/1.", 7) != 0 || sscanf(g_resp + 9, "%3d", &status) != 1) return 0;
    const char *eoh = strstr(g_resp, "\r\n\r\n");
    if (!eoh) return 0;
    const char *p = eoh + 4, *end = g_resp + n;
    /* chunked? (a header line "Transfer-Encoding: chunked") */
    bool chunked = false;
    for (const char *h = strstr(g_resp, "\r\n"); h && h < eoh; h = strstr(h + 2, "\r\n"))
        if (!strncasecmp(h + 2, "transfer-encoding:", 18) && strstr(h + 2, "chunked") &&
            strstr(h + 2, "chunked") < strstr(h + 2, "\r\n"))
            chunked = true;
    size_t bn = 0;
    if (!chunked) {
        bn = (size_t)(end - p);
        memcpy(g_body, p, bn);
    } else {
        for (;;) { /* size line, data, CRLF; a missing last chunk = a cut answer */
            char *e = NULL;
            const unsigned long sz = strtoul(p, &e, 16);
            if (e == p || !(e = strstr(e, "\r\n"))) return 0;
            p = e + 2;
            if (sz == 0) break;
            if (sz > (size_t)(end - p)) return 0;
            memcpy(g_body + bn, p, sz);
            bn += sz;
            p += sz + 2;
            if (p > end) return 0;
        }
    }
    g_body[bn] = 0;
    *body_len = bn;
    return status;
}

/* ---- one run ---- */

enum req_kind { RK_JSON_CHAT, RK_JSON_COMPLETION, RK_JSON_NATIVE, RK_STREAM_CHAT, RK_STREAM_COMPLETION, RK_STREAM_NATIVE,
                RK_JSON, RK_TEXT };

struct req {
    const char *method, *path, *body;
    enum req_kind kind;
    int want; /* the status without failures */
};

static const struct req k_reqs[] = {
    {"POST", "/v1/chat/completions",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Once upon a time there was a dog.\"}, "
     "{\"role\": \"user\", \"content\": \"Who?\"}], \"max_tokens\": 3, \"temperature\": 0, "
     "\"kv\": {\"policy\": \"snapkv\", \"budget\": 0.5}}",
     RK_JSON_CHAT, 200},
    {"POST", "/v1/completions",
     "{\"prompt\": \"Once upon a time\", \"max_tokens\": 3, \"temperature\": 0, \"stream\": true, \"n\": 2, "
     "\"stream_options\": {\"include_usage\": true}, \"kv_policy\": \"elastic-v2\", \"kv_budget\": 0.5}",
     RK_STREAM_COMPLETION, 200},
    /* the same conversation again: its prefix from the prefix cache */
    {"POST", "/v1/chat/completions",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"Once upon a time there was a dog.\"}, "
     "{\"role\": \"user\", \"content\": \"Who?\"}], \"max_tokens\": 3, \"temperature\": 0, "
     "\"kv\": {\"policy\": \"snapkv\", \"budget\": 0.5}}",
     RK_JSON_CHAT, 200},
    {"POST", "/v1/chat/completions",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me.\"}], \"max_tokens\": 4, \"temperature\": 0, "
     "\"stream\": true, \"frequency_penalty\": 0.5, \"repeat_penalty\": 1.2, \"logprobs\": true, "
     "\"top_logprobs\": 2}",
     RK_STREAM_CHAT, 200},
    /* a logit_bias list that grows past its first 16 entries, with a text; logprobs, a stop string */
    {"POST", "/v1/completions",
     "{\"prompt\": [1, 2, 3], \"max_tokens\": 3, \"temperature\": 0, \"presence_penalty\": 1, "
     "\"logit_bias\": [[\"there was\", false], [317, 2], [5, 1], [6, 1], [7, 1], [8, 1], [9, 1], [10, 1], "
     "[11, 1], [12, 1], [13, 1], [14, 1], [15, 1], [16, 1], [17, 1], [18, 1], [19, 1]], \"logprobs\": 2, "
     "\"stop\": \"re\"}",
     RK_JSON_COMPLETION, 200},
    /* llama-server's native /completion: a prompt of ids and text, n_probs and ids in each event */
    {"POST", "/completion",
     "{\"prompt\": [1, 403, \" upon a time\"], \"n_predict\": 3, \"temperature\": 0, \"stream\": true, "
     "\"n_probs\": 2, \"stop\": [\"x\"]}",
     RK_STREAM_NATIVE, 200},
    {"GET", "/v1/models", NULL, RK_JSON, 200},
    {"GET", "/v1/models/stories260K.gguf", NULL, RK_JSON, 200},
    {"POST", "/tokenize", "{\"content\": \"Once upon a time\"}", RK_JSON, 200},
    {"POST", "/detokenize", "{\"tokens\": [1, 403, 407, 261, 378]}", RK_JSON, 200},
    {"POST", "/apply-template", "{\"messages\": [{\"role\": \"user\", \"content\": \"Once\"}]}", RK_JSON, 200},
    {"GET", "/props", NULL, RK_JSON, 200},
    {"POST", "/v1/chat/completions", "{\"messages\": [}", RK_JSON, 400},
    {"GET", "/nowhere", NULL, RK_JSON, 404},
    {"GET", "/metrics", NULL, RK_TEXT, 200},
    {"GET", "/health", NULL, RK_JSON, 200},
    {"GET", "/slots", NULL, RK_JSON, 200},
};

static double hash_of(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return (double)(h % 1000000007ull);
}

/* An error object's message, or NULL when o is not {"error": {"message": "..."}}. */
static const char *error_message(const cJSON *o) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "message");
    return cJSON_IsString(m) && m->valuestring[0] ? m->valuestring : NULL;
}

/* The text of a completion object or of a stream's event (chat: message or
 * delta content; completions: choices[0].text; native: content), NULL if it has none. */
static const char *completion_text(const cJSON *o, enum req_kind k) {
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0), *t;
    if (k == RK_JSON_NATIVE || k == RK_STREAM_NATIVE) t = cJSON_GetObjectItemCaseSensitive(o, "content");
    else if (k == RK_JSON_CHAT || k == RK_STREAM_CHAT)
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c0, k == RK_JSON_CHAT ? "message" : "delta"),
                                             "content");
    else t = cJSON_GetObjectItemCaseSensitive(c0, "text");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* A stream's events into g_text; 1: whole ([DONE] after the final chunk;
 * native: an event with "stop": true), 0: an error event (message in
 * aw_msg), -1: malformed or cut. */
static int read_stream(enum req_kind k, char *why, size_t why_n) {
    size_t tn = 0, pn[CHOICES_MAX] = {0};
    bool done = false;
    g_text[0] = 0;
    for (char *ev = g_body; *ev;) {
        char *next = strstr(ev, "\n\n");
        if (!next) return snprintf(why, why_n, "an event without its blank line"), -1;
        *next = 0;
        if (ev[0] == ':') { /* a comment (keep-alive) */
            ev = next + 2;
            continue;
        }
        if (strncmp(ev, "data: ", 6) != 0) return snprintf(why, why_n, "a line that is not data: %.60s", ev), -1;
        ev += 6;
        if (!strcmp(ev, "[DONE]")) {
            done = true;
            ev = next + 2;
            continue;
        }
        cJSON *o = cJSON_Parse(ev);
        if (!o) return snprintf(why, why_n, "an event that is not JSON: %.60s", ev), -1;
        const char *msg = error_message(o);
        if (!msg && cJSON_GetObjectItemCaseSensitive(o, "error")) {
            snprintf(why, why_n, "an error event without a message: %.80s", ev);
            cJSON_Delete(o);
            return -1;
        }
        if (msg) {
            if (!aw_msg[0]) snprintf(aw_msg, sizeof aw_msg, "stream error event: %s", msg);
            cJSON_Delete(o);
            return 0;
        }
        const char *t = completion_text(o, k);
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0),
                                                           "index");
        const int c = cJSON_IsNumber(ix) && ix->valueint >= 0 && ix->valueint < CHOICES_MAX ? ix->valueint : 0;
        if (t) {
            const size_t l = strlen(t);
            if (pn[c] + l < sizeof g_part[c]) memcpy(g_part[c] + pn[c], t, l), pn[c] += l;
        }
        if (k == RK_STREAM_NATIVE && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "stop"))) done = true;
        cJSON_Delete(o);
        ev = next + 2;
    }
    for (int c = 0; c < CHOICES_MAX; c++) {
        memcpy(g_text + tn, g_part[c], pn[c]);
        tn += pn[c];
        g_text[tn++] = '|';
    }
    g_text[tn] = 0;
    if (!done) return snprintf(why, why_n, "the stream ended without [DONE] (native: \"stop\": true)"), -1;
    return 1;
}

/* What each request added to the checksum and the text it hashed, in the
 * run without failures (aw_failing() == 0) and in the run now going on: a
 * run that succeeds with other results names the request that differs. */
#define REQS_MAX 32
#define SHOWN_MAX 200
static double g_ref_sum[REQS_MAX];
static char g_ref_text[REQS_MAX][SHOWN_MAX];
static char g_last_text[SHOWN_MAX];

/* Adds text t to the checksum and keeps its start for the message above. */
static void count_text(double *sum, const char *t) {
    const size_t n = strlen(t);
    *sum += hash_of(t, n);
    snprintf(g_last_text, sizeof g_last_text, "%.*s", (int)(n < SHOWN_MAX - 1 ? n : SHOWN_MAX - 1), t);
}

/* One request: adds to *sum; 1 as expected, 0 a clean error (aw_msg set),
 * -1 a defect (printed). */
static int one_request(int port, const struct req *q, int i, double *sum) {
    size_t bl = 0;
    g_resp[0] = 0;
    const int st = http_call(port, q->method, q->path, q->body, &bl);
    char why[160] = "";
    if (st <= 0) {
        char got[121];
        size_t k = 0;
        for (const char *c = g_resp; *c && k + 1 < sizeof got && st == 0; c++) got[k++] = *c >= ' ' ? *c : '.';
        got[k] = 0;
        fprintf(stderr, "  request %d (%s %s): %s: \"%s\"\n", i, q->method, q->path,
                st < 0 ? "no answer (socket error or 30 s without a byte)" : "no whole HTTP answer", got);
        return -1;
    }
    *sum += st * (i + 1);
    g_last_text[0] = 0;
    if (q->kind == RK_TEXT && st == q->want) return bl > 0 ? 1 : -1;
    const bool stream =
        (q->kind == RK_STREAM_CHAT || q->kind == RK_STREAM_COMPLETION || q->kind == RK_STREAM_NATIVE) && st == 200;
    if (stream) {
        const int r = read_stream(q->kind, why, sizeof why);
        if (r > 0) count_text(sum, g_text);
        if (r < 0) fprintf(stderr, "  request %d (%s %s): 200 stream: %s\n", i, q->method, q->path, why);
        return r;
    }
    cJSON *o = cJSON_ParseWithLength(g_body, bl);
    int r = -1;
    if (!o) {
        snprintf(why, sizeof why, "status %d, the body is not JSON: %.60s", st, g_body);
    } else if (st == q->want && st == 200) {
        const char *t = q->kind == RK_JSON ? g_body : completion_text(o, q->kind);
        if (t) {
            /* JSON bodies other than completions: only their shape counts (ids, times, counters vary) */
            if (q->kind != RK_JSON) count_text(sum, t);
            r = 1;
        } else {
            snprintf(why, sizeof why, "200 without a completion's text: %.60s", g_body);
        }
    } else if (!error_message(o)) {
        snprintf(why, sizeof why, "status %d without the API's error object: %.60s", st, g_body);
    } else if (st == q->want) {
        r = 1; /* the expected error */
    } else {
        if (!aw_msg[0]) snprintf(aw_msg, sizeof aw_msg, "%s %s: %d %s", q->method, q->path, st, error_message(o));
        r = 0;
    }
    cJSON_Delete(o);
    if (r < 0) fprintf(stderr, "  request %d (%s %s): %s\n", i, q->method, q->path, why);
    return r;
}

/* ---- the scenario ---- */

struct http_arg {
    struct ekv_model *model;
    const char *model_path;
    const char *mmproj;      /* a vision tower the server loads, or NULL */
    const struct req *reqs;  /* what the client sends */
    int n_reqs;
};

/* stderr into a temporary file while the server starts (capture_stderr),
 * then back (restore_stderr: whether anything was printed, its first line
 * into msg). */
static int g_saved_err = -1;
static FILE *g_err_file;
static void capture_stderr(void) {
    fflush(stderr);
    g_err_file = tmpfile();
    g_saved_err = dup(2);
    if (g_err_file) dup2(fileno(g_err_file), 2);
}
static bool restore_stderr(char *msg, size_t n) {
    fflush(stderr);
    if (g_saved_err >= 0) dup2(g_saved_err, 2), close(g_saved_err);
    g_saved_err = -1;
    bool printed = false;
    if (g_err_file) {
        rewind(g_err_file);
        if (fgets(msg, (int)n, g_err_file)) printed = msg[0] != 0;
        fclose(g_err_file);
        g_err_file = NULL;
    }
    return printed;
}

static enum ekv_status sc_http(void *argp, double *sum) {
    struct http_arg *a = argp;
    static struct srv srv_s;
    struct srv *srv = &srv_s;
    memset(srv, 0, sizeof *srv);
    struct cli_params cli;
    cli_params_init(&cli, CLI_SERVE);
    cli.model = a->model_path;
    cli.n_ctx = 256;
    cli.prefix_cache_mib = 1.0;
    struct srv_http *http = NULL;
    int port = 0;
    enum ekv_status s = EKV_OK;
    char msg[AW_MSG_MAX - 16] = "";
    /* set-up as `ekv serve` does it (cmd_serve.c's serve_setup), its messages on stderr */
    capture_stderr();
    bool up = srv_config_init(srv, &cli);
    srv->model = a->model;
    ekv_model_get_info(srv->model, &srv->mi);
    srv->cfg.n_ctx = 256;
    srv->cfg.n_threads = 1;
    srv->cfg.chat_template = "chatml";
    struct ekv_context_params cp = ekv_context_default_params();
    cp.device = "cpu";
    cp.n_threads = 1;
    cp.n_ctx = 256;
    if (up && (s = ekv_context_new(srv->model, &cp, &srv->ctx)) != EKV_OK) {
        fprintf(stderr, "ekv serve: error: %s\n", ekv_last_error());
        up = false;
    }
    if (up && a->mmproj && (s = ekv_vision_load(a->mmproj, &srv->vision)) != EKV_OK) {
        fprintf(stderr, "ekv serve: error: %s\n", ekv_last_error());
        up = false;
    }
    if (up && !pthread_mutex_init(&srv->mu, NULL) && !pthread_cond_init(&srv->engine_cv, NULL)) srv->locks = true;
    if (up && (s = srv_engine_start(srv)) != EKV_OK) {
        fprintf(stderr, "ekv serve: error: cannot start the engine thread\n");
        up = false;
    }
    if (up && (s = srv_http_start(srv, "127.0.0.1", 0, &http, &port)) != EKV_OK) up = false;
    const bool printed = restore_stderr(msg, sizeof msg);
    if (!up) {
        if (s == EKV_OK) s = EKV_ERR_NOMEM;
        if (printed) snprintf(aw_msg, sizeof aw_msg, "start: %s", msg);
        else fprintf(stderr, "  the server did not start and printed nothing\n");
    }
    bool defect = false;
    for (int i = 0; up && i < a->n_reqs; i++) {
        const double before = *sum;
        const int r = one_request(port, &a->reqs[i], i, sum);
        if (r > 0 && i < REQS_MAX && !aw_failing()) {
            g_ref_sum[i] = *sum - before;
            memcpy(g_ref_text[i], g_last_text, SHOWN_MAX);
        } else if (r > 0 && i < REQS_MAX && *sum - before != g_ref_sum[i]) {
            fprintf(stderr, "  allocation %ld failed: request %d (%s %s) answered \"%s\", without failures \"%s\"; "
                            "the answer: \"",
                    aw_failing(), i, a->reqs[i].method, a->reqs[i].path, g_last_text, g_ref_text[i]);
            for (const char *c = g_resp; *c && c < g_resp + 2000; c++) fputc(*c >= ' ' ? *c : '.', stderr);
            fputs("\"\n", stderr);
        }
        if (r < 0) defect = true;
        if (r <= 0 && s == EKV_OK) s = EKV_ERR_NOMEM;
    }
    if (defect) aw_defect = true; /* the walk fails */
    srv_shutdown(srv, http); /* as `ekv serve` does it */
    ekv_vision_free(srv->vision);
    ekv_context_free(srv->ctx);
    cli_params_free(&cli);
    return s;
}

/* ---- a server with a vision tower: images as data: URIs ---- */

static char *base64_of(const unsigned char *b, size_t n) {
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = __real_malloc(4 * ((n + 2) / 3) + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *p++ = k[v >> 18 & 63];
        *p++ = k[v >> 12 & 63];
        *p++ = i + 1 < n ? k[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? k[v & 63] : '=';
    }
    *p = 0;
    return o;
}

/* tiny-vlm (`ekv mkmodel`: stories260K-sized decoder, 56-px tower) serving a
 * JPEG in a chat, streamed and not, and a data: URI that is no image. */
static void walk_vision(void) {
    char path[96], mm[112], args[160];
    snprintf(path, sizeof path, "/tmp/ekv-alloc-fail-http-%ld.gguf", (long)getpid());
    snprintf(mm, sizeof mm, "/tmp/ekv-alloc-fail-http-%ld.mmproj.gguf", (long)getpid());
    snprintf(args, sizeof args, "--preset tiny-vlm --type f16 --seed 5 -o '%s'", path);
    CHECK_MSG(tu_mkmodel(args) == 0, "ekv mkmodel %s failed", args);
    size_t jn = 0;
    char *jpg = tu_read_file(tu_src("data/images/astronaut_crop.jpg"), &jn);
    char *b64 = jpg ? base64_of((const unsigned char *)jpg, jn) : NULL;
    const size_t cap = (b64 ? strlen(b64) : 0) + 512;
    char *chat = __real_malloc(cap), *stream = __real_malloc(cap);
    struct http_arg a = {.model_path = path, .mmproj = mm};
    CHECK(b64 && chat && stream);
    if (b64 && chat && stream) {
        snprintf(chat, cap,
                 "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Describe\"}, "
                 "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/jpeg;base64,%s\"}}]}], "
                 "\"max_tokens\": 4, \"temperature\": 0, \"kv\": {\"policy\": \"vlcache\", \"budget\": 0.5}}",
                 b64);
        snprintf(stream, cap,
                 "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": "
                 "{\"url\": \"data:image/jpeg;base64,%s\"}}, {\"type\": \"text\", \"text\": \"What?\"}]}], "
                 "\"max_tokens\": 3, \"temperature\": 0, \"stream\": true, \"kv_policy\": \"elastic-v2\", "
                 "\"kv_budget\": 0.5}",
                 b64);
        const struct req reqs[] = {
            {"POST", "/v1/chat/completions", chat, RK_JSON_CHAT, 200},
            {"POST", "/v1/chat/completions", stream, RK_STREAM_CHAT, 200},
            {"POST", "/v1/chat/completions",
             "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": "
             "{\"url\": \"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==\"}}]}]}",
             RK_JSON, 400},
        };
        a.reqs = reqs;
        a.n_reqs = (int)(sizeof reqs / sizeof reqs[0]);
        CHECK_OK(ekv_model_load(path, NULL, &a.model));
        double sum = 0;
        if (a.model) CHECK_OK(sc_http(&a, &sum));
        if (a.model) aw_walk("server over HTTP with images (3 requests)", sc_http, &a);
        ekv_model_free(a.model);
    }
    free(chat);
    free(stream);
    free(b64);
    free(jpg);
    remove(path);
    remove(mm);
}

int main(void) {
    struct http_arg a = {.model_path = tu_src("models/stories260K.gguf"), .reqs = k_reqs,
                         .n_reqs = (int)(sizeof k_reqs / sizeof k_reqs[0])};
    CHECK_OK(ekv_model_load(a.model_path, NULL, &a.model));
    if (a.model) {
        double sum = 0;
        /* the answers themselves first: a run without failures gives every expected status */
        CHECK_OK(sc_http(&a, &sum));
        aw_walk("server over HTTP (17 requests)", sc_http, &a);
    }
    ekv_model_free(a.model);
    walk_vision();
    printf("alloc_fail_http: %ld allocations failed one at a time: %ld clean errors, %ld absorbed (same results)\n",
           aw_sites, aw_clean, aw_absorbed);
    return test_finish("alloc_fail_http");
}
