/*
 * serve_http.c — the HTTP side of `ekv serve`, on libmicrohttpd with one
 * thread per connection: routes, the API key (Bearer, compared in constant
 * time), the body limit (413: a body somewhat over --max-body is read and
 * dropped so that the client sees the answer rather than a reset
 * connection; one far over it is refused at its headers), JSON errors for
 * everything that is wrong, and the wait for a
 * job: a non-streamed request blocks its connection thread until the job is
 * done; a streamed one sends Server-Sent Events from a content reader that
 * blocks until the job has new text. Both watch the socket while they wait:
 * a client that hangs up gets its job cancelled at once (the engine then
 * frees its cache), not when the next token would have been written. A
 * stream's client that takes no bytes for --timeout seconds while the
 * stream has bytes to give it (its socket's send queue neither empties nor
 * moves, and the stream is not waiting for tokens) is dropped by a watch
 * thread: what waits for a client is never more than its own request's text
 * (events are made from the job's text only when the socket has room), and
 * it is not held forever by a client that stopped reading.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "serve.h"

/* Bytes beyond --max-body that are read and dropped before answering 413. */
#define SRV_DRAIN_MAX (16u << 20)

struct stream;

struct srv_http {
    struct MHD_Daemon *d;
    struct srv *srv;
    struct srv_door *door; /* accepts, screens every request, relays between the clients and d */
    pthread_mutex_t mu;    /* streams, stop; taken after srv->mu, never before it (TSan: lock order) */
    pthread_cond_t cv;
    struct stream *streams; /* open streams (the stall watch's list) */
    pthread_t watch;
    bool watching, stop;
};

enum route {
    R_NONE, R_CHAT, R_COMPLETIONS, R_NATIVE, R_TOKENIZE, R_DETOKENIZE, R_TEMPLATE, R_PROPS, R_MODELS, R_MODEL, R_HEALTH,
    R_METRICS, R_SLOTS, R_SLOT
};

/* Per-request state of a connection (MHD's con_cls). */
struct conn {
    enum route route;
    char *body;
    size_t len, cap;
    bool too_big;
    bool oom;         /* no memory for the body: the rest dropped, then a 500 */
    bool timeout_off; /* the idle timeout is suspended while the request runs */
    bool http11;      /* HTTP/1.1 or later: an interim 1xx response may be sent (peer_wait) */
};

/* The {id} of /v1/models/{id} or /models/{id}, NULL for other paths. */
static const char *model_in_url(const char *url) {
    static const char *k_pre[2] = {"/v1/models/", "/models/"};
    for (int i = 0; i < 2; i++) {
        const size_t n = strlen(k_pre[i]);
        if (!strncmp(url, k_pre[i], n) && url[n]) return url + n;
    }
    return NULL;
}

static enum route find_route(const char *url) {
    static const struct { const char *path; enum route r; } k_routes[] = {
        {"/v1/chat/completions", R_CHAT}, {"/chat/completions", R_CHAT},
        {"/v1/completions", R_COMPLETIONS}, {"/completions", R_COMPLETIONS},
        {"/completion", R_NATIVE}, /* llama-server's own (serve_native.c) */
        {"/v1/models", R_MODELS}, {"/models", R_MODELS},
        {"/health", R_HEALTH}, {"/v1/health", R_HEALTH},
        {"/metrics", R_METRICS}, {"/tokenize", R_TOKENIZE}, {"/slots", R_SLOTS},
        {"/detokenize", R_DETOKENIZE}, {"/apply-template", R_TEMPLATE}, {"/props", R_PROPS},
    };
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
        if (!strcmp(url, k_routes[i].path)) return k_routes[i].r;
    if (model_in_url(url)) return R_MODEL; /* /v1/models/{id} (the OpenAI SDK's models.retrieve) */
    if (!strncmp(url, "/slots/", 7) && url[7]) return R_SLOT; /* /slots/{id}?action=... (llama-server's) */
    return R_NONE;
}

static void count_status(struct srv *srv, int status) {
    pthread_mutex_lock(&srv->mu);
    srv->st.requests[status / 100 < 6 ? status / 100 : 0]++;
    pthread_mutex_unlock(&srv->mu);
}

/* Out of memory: the API's error object from static storage (nothing of
 * ekv's to allocate), as a 500 answer or as the last events of a stream. */
static const char k_oom_json[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                 "\"param\":null,\"code\":null}}";
static const char k_oom_sse[] = "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                "\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n";

static void add_cors(const struct srv *srv, struct MHD_Response *r);

/* A 500 with k_oom_json; the connection closes after it. */
static enum MHD_Result send_oom(struct srv *srv, struct MHD_Connection *c) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof k_oom_json - 1, (void *)k_oom_json, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    add_cors(srv, r);
    enum MHD_Result ret = MHD_queue_response(c, 500, r);
    MHD_destroy_response(r);
    count_status(srv, 500);
    return ret;
}

/* Queues body (taken) with status and content type; NULL body = 500. */
static enum MHD_Result send_body_h(struct srv *srv, struct MHD_Connection *c, int status, char *body,
                                   const char *type, int retry_after, const char *hname, const char *hvalue);

/* --cors ORIGIN: the header that lets a browser page from ORIGIN read the answer. */
static void add_cors(const struct srv *srv, struct MHD_Response *r) {
    if (!srv->cfg.cors) return;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, srv->cfg.cors);
    if (strcmp(srv->cfg.cors, "*") != 0) MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
}

/* A CORS preflight (OPTIONS with --cors): 204 saying what may be sent. */
static enum MHD_Result send_preflight(struct srv *srv, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    add_cors(srv, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    count_status(srv, 204);
    return ret;
}

static enum MHD_Result send_body(struct srv *srv, struct MHD_Connection *c, int status, char *body, const char *type,
                                 int retry_after) {
    return send_body_h(srv, c, status, body, type, retry_after, NULL, NULL);
}

/* The same with one more header (hname NULL: none). */
static enum MHD_Result send_body_h(struct srv *srv, struct MHD_Connection *c, int status, char *body,
                                   const char *type, int retry_after, const char *hname, const char *hvalue) {
    if (!body) return send_oom(srv, c);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (hname) MHD_add_response_header(r, hname, hvalue);
    add_cors(srv, r);
    pthread_mutex_lock(&srv->mu);
    const bool down = srv->stop || srv->draining;
    pthread_mutex_unlock(&srv->mu);
    if (down) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close"); /* the shut-down waits for idle */
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(srv, status);
    return ret;
}

static enum MHD_Result send_error(struct srv *srv, struct MHD_Connection *c, const struct srv_error *e) {
    int retry = e->status == 503 ? 1 : 0;
    return send_body(srv, c, e->status, srv_error_json(e), "application/json", retry);
}

static enum MHD_Result fail(struct srv *srv, struct MHD_Connection *c, int status, const char *type,
                            const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result fail(struct srv *srv, struct MHD_Connection *c, int status, const char *type,
                            const char *code, const char *fmt, ...) {
    struct srv_error e = {0};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    e.status = status;
    e.type = type;
    e.code = code;
    return send_error(srv, c, &e);
}

/* Counts the Content-Length headers (MHD keeps every one; it reads the first). */
static enum MHD_Result count_content_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind, (void)value;
    if (key && !strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) ++*(int *)cls;
    return MHD_YES;
}

/* Content types a JSON body may come with: application/json (any
 * parameters, e.g. charset), and curl's default for -d
 * (application/x-www-form-urlencoded), which people type by hand. */
static bool json_content_type(const char *ct) {
    while (*ct == ' ') ct++;
    static const char *k_ok[2] = {"application/json", "application/x-www-form-urlencoded"};
    for (int i = 0; i < 2; i++) {
        const size_t n = strlen(k_ok[i]);
        if (!strncasecmp(ct, k_ok[i], n) && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ')) return true;
    }
    return false;
}

/* Equal strings, in time that depends only on the length of the candidate. */
static bool key_equal(const char *want, const char *got) {
    const size_t nw = strlen(want), ng = strlen(got);
    unsigned char diff = (unsigned char)(nw != ng);
    for (size_t i = 0; i < ng; i++) diff |= (unsigned char)(got[i] ^ want[nw ? i % nw : 0]);
    return diff == 0;
}

static bool authorized(const struct srv *srv, struct MHD_Connection *c) {
    if (!srv->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    /* the scheme is case-insensitive (RFC 7235), then one or more spaces */
    if (!h || strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return false;
    h += 6;
    while (*h == ' ' || *h == '\t') h++;
    return key_equal(srv->cfg.api_key, h);
}

/* A client's socket, peeked at (never consumes a byte): open, its sending
 * side shut down (its FIN seen: it may still read, or may have closed
 * altogether), or gone (reset, error). */
enum peer { PEER_OPEN, PEER_EOF, PEER_GONE };

static enum peer peer_state(int fd) {
    if (fd < 0) return PEER_OPEN;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return PEER_OPEN;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return PEER_GONE;
    if (p.revents & POLLRDHUP) return PEER_EOF;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return PEER_EOF;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR ? PEER_GONE : PEER_OPEN;
}

/* A waiting request's view of its client. A client that shut down its
 * sending side after the body (a half-close) still gets its answer; one that
 * closed its socket must not keep a slot busy. Only a write tells them apart
 * (a closed socket answers data with a reset, which the next look sees as
 * gone): before any response byte (an HTTP/1.1 client, not streaming) an
 * interim "100 Continue" goes out, which clients skip (RFC 9110 15.2); in a
 * stream an SSE comment line. */
struct peer_watch {
    int fd;
    bool interim; /* may send the interim response */
    bool eof;     /* the half-close was seen (and probed) */
};

enum peer_wait { WAIT_READY, WAIT_GONE, WAIT_PROBE };

/* The interim response on the raw socket (nothing else writes it before the
 * final response); false if the client is gone or it went out in part. */
static bool interim_probe(int fd) {
    static const char k_msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
    const ssize_t n = send(fd, k_msg, sizeof k_msg - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)(sizeof k_msg - 1)) return true;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The CLOCK_REALTIME time ms milliseconds from now (pthread_cond_timedwait's). */
static struct timespec deadline_in_ms(long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    return ts;
}

/* Waits (locked) until the job is done or has more than `seen` bytes ready
 * (WAIT_READY), the client went away (WAIT_GONE), or a stream's client
 * half-closed and the stream must write something to tell (WAIT_PROBE). */
static enum peer_wait wait_job_locked(struct srv *srv, struct srv_job *j, size_t seen, struct peer_watch *w) {
    while (j->state != JOB_DONE && j->ready <= seen) {
        const struct timespec ts = deadline_in_ms(100);
        pthread_cond_timedwait(&j->cv, &srv->mu, &ts);
        const enum peer p = peer_state(w->fd);
        if (p == PEER_GONE) return WAIT_GONE;
        if (p == PEER_EOF && !w->eof) {
            w->eof = true;
            if (!w->interim) return WAIT_PROBE;
            if (!interim_probe(w->fd)) return WAIT_GONE;
        }
    }
    return WAIT_READY;
}

/* ---- streaming ---- */

struct stream {
    struct srv *srv;
    struct srv_http *h;
    struct stream *prev, *next; /* in h->streams */
    /* for the stall watch, under h->mu: */
    double progress_at;         /* when MHD last took bytes or the send queue moved */
    int outq;                   /* the socket's send queue then (bytes) */
    bool waiting;               /* blocked for the job's next tokens: not the client's fault */
    bool dropped;
    struct peer_watch watch;
    struct choice_out {   /* each choice of the request (OpenAI's n), events in its index */
        struct srv_job *job;
        size_t sent;      /* text bytes sent */
        size_t tok;       /* next token boundary to look at (job->tok_end) */
        size_t lp;        /* tokens whose logprobs (native: ids) were sent */
        bool first_sent;  /* the role chunk */
        bool final_sent;  /* its last chunk */
    } ch[SRV_MAX_JOBS];
    int n_ch;
    bool finished;    /* final chunk(s) and [DONE] queued */
    bool oom;         /* an event could not be made: k_oom_sse ends the stream */
    char *pending;    /* bytes of events not yet handed to MHD (whole events) */
    size_t pend_len, pend_off;
    bool pend_static; /* pending is k_oom_sse (not freed) */
};

/* Appends event ev (taken); false, s->oom set, when it or the room for it is missing. */
static bool pend_append(struct stream *s, char *ev) {
    if (!ev) return !(s->oom = true);
    size_t n = strlen(ev);
    char *p = realloc(s->pending, s->pend_len + n);
    if (!p) {
        free(ev);
        return !(s->oom = true);
    }
    memcpy(p + s->pend_len, ev, n);
    s->pending = p;
    s->pend_len += n;
    free(ev);
    return true;
}

/* The stall watch's view of s: waiting for tokens or not; either way progress now. */
static void stream_mark(struct stream *s, bool waiting) {
    pthread_mutex_lock(&s->h->mu);
    s->waiting = waiting;
    s->progress_at = cli_now();
    pthread_mutex_unlock(&s->h->mu);
}

/* One choice's events for the text it has ready (one per token), and its last chunk once its
 * job is done (locked); false on out of memory. */
static bool choice_events(struct stream *s, struct choice_out *c) {
    struct srv *srv = s->srv;
    struct srv_job *j = c->job;
    const size_t upto = j->state == JOB_DONE ? j->text_len : j->ready;
    const bool native = j->req.kind == SRV_NATIVE; /* llama-server's events: no role, no usage, no [DONE] */
    bool ok = true;
    if (native) c->first_sent = true;
    if (!c->first_sent && upto == c->sent) { /* the role, before any text */
        ok = pend_append(s, srv_chunk_sse(srv, j, "", 0, true, false, c->lp, c->lp));
        c->first_sent = true;
    }
    while (ok && c->sent < upto) { /* one event per token (a character cut by a token waits for the next) */
        size_t b = upto;
        for (; c->tok < j->n_tok_end; c->tok++) {
            size_t e = j->tok_end[c->tok];
            if (e <= c->sent) continue;
            if (e < upto && srv_utf8_whole(j->text, e) != e) continue;
            if (e < upto) b = e;
            break;
        }
        const size_t lp = srv_lp_upto(j, c->lp, b); /* the tokens (and logprobs) of this text */
        ok = pend_append(s, native ? srv_native_chunk_sse(srv, j, j->text + c->sent, b - c->sent, false, c->lp, lp)
                                   : srv_chunk_sse(srv, j, j->text + c->sent, b - c->sent, !c->first_sent, false,
                                                   c->lp, lp));
        c->first_sent = true;
        c->sent = b;
        c->lp = lp;
    }
    if (ok && j->state == JOB_DONE) {
        ok = pend_append(s, native ? srv_native_chunk_sse(srv, j, "", 0, true, c->lp, c->lp)
                                   : srv_chunk_sse(srv, j, "", 0, false, true, c->lp, c->lp));
        c->final_sent = true;
    }
    return ok;
}

/* Produces the next events into s->pending; false on error or hang-up. With
 * several choices it waits on the first one not finished while none has
 * anything new: the engine decodes them in the same steps, so the others'
 * tokens come with its own. */
static bool stream_next(struct stream *s) {
    struct srv *srv = s->srv;
    stream_mark(s, true);
    pthread_mutex_lock(&srv->mu);
    struct choice_out *wait_on = NULL;
    for (int i = 0; i < s->n_ch; i++) {
        const struct choice_out *c = &s->ch[i];
        if (c->final_sent) continue;
        if (c->job->state == JOB_DONE || c->job->ready > c->sent) { /* something to send now */
            wait_on = NULL;
            break;
        }
        if (!wait_on) wait_on = &s->ch[i];
    }
    const enum peer_wait wr = wait_on ? wait_job_locked(srv, wait_on->job, wait_on->sent, &s->watch) : WAIT_READY;
    stream_mark(s, false);
    if (wr != WAIT_READY) {
        pthread_mutex_unlock(&srv->mu);
        /* a half-closed client: a comment line, which a closed socket answers with a reset */
        return wr == WAIT_PROBE && pend_append(s, strdup(": ping\n\n"));
    }
    bool ok = true, all_final = true;
    struct srv_job *j0 = s->ch[0].job;
    for (int i = 0; ok && i < s->n_ch && !s->finished; i++) {
        struct srv_job *j = s->ch[i].job;
        if (j->err.status) { /* OpenAI streams errors as an event with an error object; the stream ends */
            char *json = srv_error_json(&j->err), *ev = NULL;
            const size_t n = json ? strlen(json) + 9 : 0;
            if (json && (ev = malloc(n))) snprintf(ev, n, "data: %s\n\n", json);
            free(json);
            ok = pend_append(s, ev);
            s->finished = true;
            break;
        }
        if (!s->ch[i].final_sent) ok = choice_events(s, &s->ch[i]);
        all_final &= s->ch[i].final_sent;
    }
    if (ok && !s->finished && all_final) {
        struct srv_job *jobs[SRV_MAX_JOBS];
        for (int i = 0; i < s->n_ch; i++) jobs[i] = s->ch[i].job;
        if (j0->req.include_usage && j0->req.kind != SRV_NATIVE) ok = pend_append(s, srv_usage_chunk_sse(srv, jobs, s->n_ch));
        s->finished = true;
    }
    const bool done_mark = j0->req.kind != SRV_NATIVE;
    pthread_mutex_unlock(&srv->mu);
    if (ok && s->finished && done_mark) ok = pend_append(s, strdup("data: [DONE]\n\n"));
    if (!ok && s->oom) s->finished = true; /* stream_read ends it with k_oom_sse */
    return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream *s = cls;
    stream_mark(s, false); /* MHD has room: the client takes bytes */
    while (s->pend_off == s->pend_len) {
        if (!s->pend_static) free(s->pending);
        s->pending = NULL;
        s->pend_len = s->pend_off = 0;
        if (s->pend_static) return MHD_CONTENT_READER_END_OF_STREAM; /* k_oom_sse was the end */
        if (s->oom) { /* out of memory for an event: the error event and [DONE] end the stream */
            s->pending = (char *)k_oom_sse;
            s->pend_len = sizeof k_oom_sse - 1;
            s->pend_static = true;
            continue;
        }
        if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_next(s) && !s->oom) return MHD_CONTENT_READER_END_WITH_ERROR; /* the client went away */
    }
    size_t n = s->pend_len - s->pend_off;
    if (n > max) n = max;
    memcpy(buf, s->pending + s->pend_off, n);
    s->pend_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    struct stream *s = cls;
    pthread_mutex_lock(&s->h->mu); /* before libmicrohttpd closes the socket: the watch never sees its fd reused */
    if (s->prev) s->prev->next = s->next;
    else s->h->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&s->h->mu);
    for (int i = 0; i < s->n_ch; i++) srv_release(s->srv, s->ch[i].job); /* cancels jobs when the stream ended early */
    if (!s->pend_static) free(s->pending);
    free(s);
}

/* Streams the n jobs of a request (taking the caller's references). */
static enum MHD_Result start_stream(struct srv_http *h, struct MHD_Connection *c, struct srv_job **jobs, int n) {
    struct srv *srv = h->srv;
    struct stream *s = calloc(1, sizeof *s);
    if (!s) {
        for (int i = 0; i < n; i++) srv_release(srv, jobs[i]);
        return fail(srv, c, 500, "server_error", NULL, "out of memory");
    }
    s->srv = srv;
    s->h = h;
    for (int i = 0; i < n; i++) s->ch[i].job = jobs[i];
    s->n_ch = n;
    s->watch.fd = conn_fd(c); /* response bytes, not an interim response: an SSE comment probes */
    s->progress_at = cli_now();
    s->outq = -1;
    pthread_mutex_lock(&h->mu);
    s->next = h->streams;
    if (h->streams) h->streams->prev = s;
    h->streams = s;
    pthread_mutex_unlock(&h->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(srv, r);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    count_status(srv, 200);
    return ret;
}

/* ---- completions ---- */

static enum MHD_Result completions(struct srv_http *h, struct MHD_Connection *c, struct conn *cs) {
    struct srv *srv = h->srv;
    /* --timeout is for idle clients, not for one waiting in the queue or for its text:
     * none until the request is done (on_completed sets it again, which restarts it) */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    cs->timeout_off = true;
    struct srv_request req;
    struct srv_error e = {0};
    enum srv_kind kind = cs->route == R_CHAT ? SRV_CHAT : cs->route == R_NATIVE ? SRV_NATIVE : SRV_COMPLETION;
    struct srv_job *jobs[SRV_MAX_JOBS];
    int n = 0, want = 1, per = 1;
    uint64_t seed = 0;
    /* OpenAI's n and a batch of prompts: one job per prompt and choice, each from its own
     * parse of the body (its own prompt and cache); choice c of a prompt samples with the
     * first one's seed + c, as the prompt sent alone would */
    while (n < want) {
        if (!srv_request_parse_nth(srv, kind, cs->body ? cs->body : "", cs->len, n / per, &req, &e)) break;
        if (n == 0) per = req.n_choices, want = req.n_prompts * req.n_choices, seed = req.sampling.seed;
        req.choice = n;
        req.sampling.seed = seed + (uint64_t)(n % per);
        struct srv_job *job = srv_submit(srv, &req, &e);
        if (!job) break;
        job->lead = n ? jobs[0] : NULL;
        jobs[n++] = job;
    }
    if (n < want) { /* refused: the choices already taken are cancelled */
        srv_request_free(&req);
        for (int i = 0; i < n; i++) srv_release(srv, jobs[i]);
        return send_error(srv, c, &e);
    }
    if (jobs[0]->req.stream) return start_stream(h, c, jobs, n);
    struct peer_watch w = {.fd = conn_fd(c), .interim = cs->http11};
    pthread_mutex_lock(&srv->mu);
    /* gone, or (WAIT_PROBE) an HTTP/1.0 client's half-close, which cannot be probed: a hang-up, as before */
    bool done = true;
    for (int i = 0; i < n && done; i++) {
        while (jobs[i]->state != JOB_DONE)
            if (wait_job_locked(srv, jobs[i], (size_t)-1, &w) != WAIT_READY) break;
        done = jobs[i]->state == JOB_DONE;
    }
    pthread_mutex_unlock(&srv->mu);
    const struct srv_error *err = NULL;
    for (int i = 0; i < n && done && !err; i++)
        if (jobs[i]->err.status) err = &jobs[i]->err;
    enum MHD_Result ret = MHD_NO; /* the client left: cancel, and close the connection */
    if (done && err) ret = send_error(srv, c, err);
    else if (done)
        ret = send_body(srv, c, 200, kind == SRV_NATIVE ? srv_native_json(srv, jobs[0]) : srv_response_json(srv, jobs, n),
                        "application/json", 0);
    for (int i = 0; i < n; i++) srv_release(srv, jobs[i]);
    return ret;
}

/* ---- the access handler ---- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    struct srv_http *h = cls;
    struct srv *srv = h->srv;
    struct conn *cs = *con_cls;
    if (!cs) { /* headers only: route, method, key, declared size */
        cs = calloc(1, sizeof *cs);
        if (!cs) return send_oom(srv, c);
        *con_cls = cs;
        cs->route = find_route(url);
        cs->http11 = version && strcmp(version, MHD_HTTP_VERSION_1_0) != 0 && strcmp(version, "HTTP/0.9") != 0;
        const bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        if (cs->route == R_NONE)
            return fail(srv, c, 404, "invalid_request_error", "not_found", "no endpoint %.200s", url);
        if (srv->cfg.cors && !strcmp(method, "OPTIONS")) return send_preflight(srv, c); /* before the key: no credentials */
        if (cs->route != R_HEALTH && !authorized(srv, c)) {
            struct srv_error e = {.status = 401, .type = "invalid_request_error", .code = "invalid_api_key"};
            snprintf(e.message, sizeof e.message, "missing or incorrect API key (send 'Authorization: Bearer KEY')");
            return send_body_h(srv, c, 401, srv_error_json(&e), "application/json", 0, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                               "Bearer");
        }
        const bool wants_post =
            cs->route == R_CHAT || cs->route == R_COMPLETIONS || cs->route == R_NATIVE || cs->route == R_TOKENIZE ||
            cs->route == R_SLOT ||
            cs->route == R_DETOKENIZE || cs->route == R_TEMPLATE;
        if ((wants_post && !post) || (!wants_post && !get))
            return fail(srv, c, 405, "invalid_request_error", "method_not_allowed", "%.200s does not take %.16s",
                        url, method);
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if (wants_post && ct && !json_content_type(ct))
            return fail(srv, c, 415, "invalid_request_error", "unsupported_media_type",
                        "the body must be JSON (Content-Type: application/json), not %.100s", ct);
        int n_cl = 0;
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_content_length, &n_cl);
        if (n_cl > 1) /* which one a proxy in front believed is unknown: request smuggling */
            return fail(srv, c, 400, "invalid_request_error", "duplicate_content_length",
                        "the request has %d Content-Length headers", n_cl);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body + SRV_DRAIN_MAX)
            return fail(srv, c, 413, "invalid_request_error", "request_too_large",
                        "the body of %.32s bytes is larger than the server's --max-body of %zu", cl,
                        srv->cfg.max_body);
        return MHD_YES;
    }
    if (cs->oom) { /* no memory for the body: the rest dropped, then a 500 */
        if (*upload_size == 0) return send_oom(srv, c);
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size > 0) { /* a piece of the body */
        if (!cs->too_big && cs->len + *upload_size > srv->cfg.max_body) {
            cs->too_big = true;
            free(cs->body);
            cs->body = NULL;
        }
        if (cs->too_big) {
            cs->len += *upload_size; /* counted, dropped */
            *upload_size = 0;
            if (cs->len > srv->cfg.max_body + SRV_DRAIN_MAX)
                return fail(srv, c, 413, "invalid_request_error", "request_too_large",
                            "the body is larger than the server's --max-body of %zu bytes", srv->cfg.max_body);
            return MHD_YES;
        }
        if (cs->len + *upload_size + 1 > cs->cap) {
            size_t cap = (cs->len + *upload_size + 1) * 2;
            if (cap > srv->cfg.max_body + 1) cap = srv->cfg.max_body + 1;
            char *b = realloc(cs->body, cap);
            if (!b) { /* the rest is dropped; a 500 once it is in (not before: libmicrohttpd would not send it) */
                free(cs->body);
                cs->body = NULL;
                cs->len = cs->cap = 0;
                cs->oom = true;
                *upload_size = 0;
                return MHD_YES;
            }
            cs->body = b;
            cs->cap = cap;
        }
        memcpy(cs->body + cs->len, upload_data, *upload_size);
        cs->len += *upload_size;
        cs->body[cs->len] = 0;
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->too_big)
        return fail(srv, c, 413, "invalid_request_error", "request_too_large",
                    "the body is larger than the server's --max-body of %zu bytes", srv->cfg.max_body);
    switch (cs->route) {
    case R_CHAT:
    case R_COMPLETIONS:
    case R_NATIVE: return completions(h, c, cs);
    case R_MODELS: return send_body(srv, c, 200, srv_models_json(srv), "application/json", 0);
    case R_MODEL: {
        const char *id = model_in_url(url);
        if (strcmp(id, srv->cfg.model_id) != 0)
            return fail(srv, c, 404, "invalid_request_error", "model_not_found", "the model '%.200s' does not exist",
                        id);
        return send_body(srv, c, 200, srv_model_json(srv), "application/json", 0);
    }
    case R_HEALTH: { /* 503 while shutting down, so that a load balancer's checks take the replica out */
        pthread_mutex_lock(&srv->mu);
        const bool down = srv->stop || srv->draining;
        pthread_mutex_unlock(&srv->mu);
        return send_body(srv, c, down ? 503 : 200, srv_health_json(srv), "application/json", down ? 1 : 0);
    }
    case R_METRICS: return send_body(srv, c, 200, srv_metrics_text(srv), "text/plain; version=0.0.4", 0);
    case R_SLOTS: return send_body(srv, c, 200, srv_slots_json(srv), "application/json", 0);
    case R_SLOT: {
        struct srv_error e = {0};
        const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
        char *body = srv_slot_action(srv, url + 7, action, cs->body ? cs->body : "", cs->len, &e);
        return body ? send_body(srv, c, 200, body, "application/json", 0) : send_error(srv, c, &e);
    }
    case R_TOKENIZE:
    case R_DETOKENIZE:
    case R_TEMPLATE: {
        struct srv_error e = {0};
        char *(*fn)(const struct srv *, const char *, size_t, struct srv_error *) =
            cs->route == R_TOKENIZE ? srv_tokenize_json : cs->route == R_DETOKENIZE ? srv_detokenize_json
                                                                                   : srv_apply_template_json;
        char *body = fn(srv, cs->body ? cs->body : "", cs->len, &e);
        return body ? send_body(srv, c, 200, body, "application/json", 0) : send_error(srv, c, &e);
    }
    case R_PROPS: return send_body(srv, c, 200, srv_props_json(srv), "application/json", 0);
    default: return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct srv_http *h = cls;
    const struct srv *srv = h->srv;
    srv_door_completed(h->door, conn_fd(c)); /* the connection's next request may come in */
    struct conn *cs = *con_cls;
    if (cs && cs->timeout_off && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, srv->cfg.timeout);
    if (cs) {
        free(cs->body);
        free(cs);
    }
    *con_cls = NULL;
}

/* libmicrohttpd's own messages (malformed requests it answers itself) go nowhere:
 * a server must not log what any client can make it print. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    (void)fmt;
    (void)ap;
}

/* The stall watch: twice a second, each stream whose client has taken no bytes for --timeout
 * seconds while it has some to take (not waiting for tokens, its send queue not empty and not
 * moving) has its socket shut down; libmicrohttpd then ends the connection and the stream. */
static void *watch_main(void *arg) {
    struct srv_http *h = arg;
    const double limit = h->srv->cfg.timeout > 0 ? (double)h->srv->cfg.timeout : 60.0;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        const struct timespec ts = deadline_in_ms(500);
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        const double now = cli_now();
        uint64_t stalled = 0;
        for (struct stream *s = h->streams; s && !h->stop; s = s->next) {
            int q = 0;
            if (s->dropped || s->watch.fd < 0 || ioctl(s->watch.fd, TIOCOUTQ, &q) != 0) continue;
            if (q != s->outq || q == 0 || s->waiting) { /* moving, empty, or the job's turn */
                s->outq = q;
                s->progress_at = now;
                continue;
            }
            if (now - s->progress_at < limit) continue;
            s->dropped = true;
            shutdown(s->watch.fd, SHUT_RDWR);
            stalled++;
        }
        if (stalled) { /* the counter is under srv->mu, which is taken before h->mu (stream_next): not inside it */
            pthread_mutex_unlock(&h->mu);
            pthread_mutex_lock(&h->srv->mu);
            h->srv->st.streams_stalled += stalled;
            pthread_mutex_unlock(&h->srv->mu);
            pthread_mutex_lock(&h->mu);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static bool door_pass(void *cls, int fd, const struct sockaddr *addr, socklen_t alen) {
    struct srv_http *h = cls;
    return MHD_add_connection(h->d, fd, addr, alen) == MHD_YES; /* on failure it closes fd */
}

static void door_answered(void *cls, int status) {
    struct srv_http *h = cls;
    count_status(h->srv, status);
}

enum ekv_status srv_http_start(struct srv *srv, const char *host, int port, struct srv_http **out, int *port_out) {
    *out = NULL;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "ekv serve: error: --host '%s' is not an IPv4 address\n", host);
        return EKV_ERR_INVALID_ARG;
    }
    struct srv_http *h = calloc(1, sizeof *h);
    if (!h) {
        fprintf(stderr, "ekv serve: error: out of memory\n");
        return EKV_ERR_NOMEM;
    }
    h->srv = srv;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (pthread_create(&h->watch, NULL, watch_main, h) != 0) {
        fprintf(stderr, "ekv serve: error: cannot start a thread\n");
        srv_http_stop(h);
        return EKV_ERR_NOMEM;
    }
    h->watching = true;
    /* the door (serve_door.c) listens and accepts; libmicrohttpd gets one end of a socket pair per connection */
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                                MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC,
                            0, NULL, NULL, on_request, h, MHD_OPTION_CONNECTION_TIMEOUT, srv->cfg.timeout,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_LIMIT, 1000u,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv, MHD_OPTION_END);
    if (!h->d) {
        fprintf(stderr, "ekv serve: error: libmicrohttpd failed to start: %s\n", errno ? strerror(errno) : "?");
        srv_http_stop(h);
        return EKV_ERR_IO;
    }
    const struct srv_door_params dp = {.timeout = srv->cfg.timeout, .pass = door_pass, .answered = door_answered,
                                       .cls = h, .cors = srv->cfg.cors};
    errno = 0;
    const enum ekv_status st = srv_door_start(&addr, &dp, &h->door, port_out);
    if (st != EKV_OK) {
        fprintf(stderr, "ekv serve: error: cannot listen on %s:%d: %s\n", host, port,
                errno ? strerror(errno) : "out of memory");
        srv_http_stop(h);
        return st;
    }
    *out = h;
    return EKV_OK;
}

void srv_http_wait_idle(struct srv_http *h, double seconds) {
    if (!h) return;
    const double until = cli_now() + seconds;
    for (;;) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!info || info->num_connections == 0 || cli_now() >= until) return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void srv_http_stop(struct srv_http *h) {
    if (!h) return;
    srv_door_quiesce(h->door); /* no new connections: nothing more is passed to libmicrohttpd */
    if (h->d) MHD_stop_daemon(h->d);
    srv_door_stop(h->door); /* what libmicrohttpd sent last goes out, then the connections close */
    if (h->watching) {
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->watch, NULL);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

void srv_shutdown(struct srv *srv, struct srv_http *http) {
    srv_engine_stop(srv); /* every job ends, so no connection thread waits on one */
    if (srv->locks) srv_engine_wait_released(srv, 10.0); /* their answers are queued... */
    srv_http_wait_idle(http, 5.0);       /* ...and sent before the daemon stops */
    srv_http_stop(http);
    if (srv->locks) {
        pthread_mutex_destroy(&srv->mu);
        pthread_cond_destroy(&srv->engine_cv);
        srv->locks = false;
    }
}
