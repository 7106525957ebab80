/*
 * serve_door.c — the front door of `ekv serve`: it accepts the connections
 * itself and looks at each one's first request head (peeked, not read)
 * before handing the socket to libmicrohttpd. Why: libmicrohttpd 0.9.75
 * (Debian 12's) answers requests it cannot parse itself, with an HTML page
 * instead of the API's JSON error object (issue 23, defect 7), and for a
 * Content-Length that is not a number it sends its status line and headers
 * twice (defect 6). The door refuses exactly those heads, with one JSON
 * answer: a request line that is not `METHOD TARGET HTTP/x.y` (400; 505 for
 * a version other than 1.x), a header line without a colon (400), a
 * Content-Length that is not digits (400) or too large to be a number (413),
 * two of them (400), a Transfer-Encoding other than chunked (501) or one
 * beside a Content-Length (400: request smuggling), a head over 16 KiB (431).
 * Everything else goes to libmicrohttpd unchanged, with its kernel send
 * buffer capped (DOOR_SNDBUF). After an answer the
 * connection is closed gracefully (the rest of the request is read and
 * dropped for a moment), so that the client sees the answer, not a reset.
 * One thread, epoll, edge-triggered: a peek does not consume bytes, so only
 * new bytes wake it; a head not complete within --timeout is dropped.
 * Not covered: the later requests of a kept-alive connection (libmicrohttpd
 * reads them) and chunked bodies whose chunk syntax is wrong.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

#define DOOR_HEAD_MAX 16384 /* bytes of a request head, its empty line included */
#define DOOR_PENDING_MAX 512
#define DOOR_LINGER_S 2.0          /* a refused connection's rest is read for at most this long... */
#define DOOR_LINGER_BYTES (1u << 20) /* ...or this many bytes */
/* Each connection's kernel send buffer (Linux doubles it): what a client that stops reading can
 * make the kernel hold for it. Autotuning would let it grow to tcp_wmem's maximum (4 MiB). */
#define DOOR_SNDBUF (256 * 1024)

struct door_conn {
    int fd; /* -1: a free slot */
    bool closing; /* answered: reading what is left before closing */
    size_t drained;
    double deadline;
    struct sockaddr_storage addr;
    socklen_t alen;
};

struct srv_door {
    int lfd, ep, wake;
    pthread_t th;
    bool started;
    double timeout;
    srv_door_pass_fn pass;
    srv_door_answered_fn answered;
    void *cls;
    const char *cors;
    struct door_conn conns[DOOR_PENDING_MAX];
};

/* ---- the screen: pure, on the bytes peeked so far ---- */

static bool is_tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || strchr("!#$%&'*+-.^_`|~", c);
}

static int refuse(struct srv_error *e, int status, const char *code, const char *msg) {
    e->status = status;
    e->type = "invalid_request_error";
    e->param = NULL;
    e->code = code;
    snprintf(e->message, sizeof e->message, "%s", msg);
    return -1;
}

/* One line [s, s + n) without its line end; trims spaces and tabs around a value. */
static void trim(const char **s, size_t *n) {
    while (*n && (**s == ' ' || **s == '\t')) ++*s, --*n;
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t')) --*n;
}

static int screen_request_line(const char *s, size_t n, struct srv_error *e) {
    const char *sp = memchr(s, ' ', n);
    if (!sp || sp == s) return refuse(e, 400, "malformed_request", "the request line is not 'METHOD TARGET HTTP/1.1'");
    for (const char *p = s; p < sp; p++)
        if (!is_tchar((unsigned char)*p)) return refuse(e, 400, "malformed_request", "the request method is not a token");
    size_t m = n;
    while (m && s[m - 1] == ' ') m--;
    const char *v = s + m;
    while (v > sp && v[-1] != ' ') v--;
    if (v <= sp + 1 || m - (size_t)(v - s) != 8 || memcmp(v, "HTTP/", 5) || v[6] != '.' || v[5] < '0' || v[5] > '9' ||
        v[7] < '0' || v[7] > '9')
        return refuse(e, 400, "malformed_request", "the request line is not 'METHOD TARGET HTTP/1.1'");
    if (v[5] != '1') return refuse(e, 505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served");
    return 1;
}

/* 1: pass on; 0: the head is not complete yet; -1: refuse (e says how). */
int srv_door_screen(const char *buf, size_t n, struct srv_error *e) {
    size_t at = 0;
    while (at < n && (buf[at] == '\r' || buf[at] == '\n')) at++; /* empty lines before the request (RFC 9112 2.2) */
    int n_cl = 0, n_te = 0, lines = 0;
    bool cl_bad = false, cl_huge = false, te_bad = false;
    for (;;) {
        const char *nl = memchr(buf + at, '\n', n - at);
        if (!nl) {
            if (n >= DOOR_HEAD_MAX)
                return refuse(e, 431, "request_header_fields_too_large", "the request head is larger than 16 KiB");
            return 0;
        }
        const char *s = buf + at;
        size_t len = (size_t)(nl - s);
        if (len && s[len - 1] == '\r') len--;
        at = (size_t)(nl - buf) + 1;
        if (at > DOOR_HEAD_MAX)
            return refuse(e, 431, "request_header_fields_too_large", "the request head is larger than 16 KiB");
        if (lines++ == 0) {
            if (screen_request_line(s, len, e) < 0) return -1;
            continue;
        }
        if (len == 0) break; /* the end of the head */
        if (s[0] == ' ' || s[0] == '\t') continue; /* a folded line (libmicrohttpd joins it) */
        const char *colon = memchr(s, ':', len);
        if (!colon || colon == s) return refuse(e, 400, "malformed_request", "a header line has no name and colon");
        const size_t kn = (size_t)(colon - s);
        const char *val = colon + 1;
        size_t vn = len - kn - 1;
        trim(&val, &vn);
        if (kn == 14 && !strncasecmp(s, "Content-Length", 14)) {
            n_cl++;
            size_t d = 0;
            while (d < vn && val[d] >= '0' && val[d] <= '9') d++;
            if (d == 0 || d != vn) cl_bad = true;
            else {
                while (d > 1 && *val == '0') val++, d--;
                if (d > 19 || (d == 19 && memcmp(val, "9223372036854775807", 19) > 0)) cl_huge = true;
            }
        } else if (kn == 17 && !strncasecmp(s, "Transfer-Encoding", 17)) {
            n_te++;
            if (vn != 7 || strncasecmp(val, "chunked", 7)) te_bad = true;
        }
    }
    if (n_te && n_cl) return refuse(e, 400, "malformed_request", "the request has both Transfer-Encoding and Content-Length");
    if (n_te > 1 || te_bad)
        return refuse(e, 501, "unsupported_transfer_encoding", "the only Transfer-Encoding served is one 'chunked'");
    if (n_cl > 1) return refuse(e, 400, "duplicate_content_length", "the request has more than one Content-Length header");
    if (cl_bad) return refuse(e, 400, "invalid_content_length", "the Content-Length header is not a number of bytes");
    if (cl_huge) return refuse(e, 413, "request_too_large", "the Content-Length header is too large");
    return 1;
}

/* ---- the thread ---- */

static void conn_close(struct srv_door *d, struct door_conn *c) {
    epoll_ctl(d->ep, EPOLL_CTL_DEL, c->fd, NULL);
    char sink[4096];
    for (int i = 0; i < 16 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
    } /* bytes left unread would make the close a reset */
    close(c->fd);
    c->fd = -1;
}

static const char *reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* Answers e on c (small: one send fits the socket's buffer), then reads what is left for a moment. */
static void answer(struct srv_door *d, struct door_conn *c, const struct srv_error *e) {
    char *body = srv_error_json(e);
    char date[64] = "";
    const time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    char head[600];
    const int hn = snprintf(head, sizeof head,
                            "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                            "Connection: close\r\n%s%.200s%s\r\n",
                            e->status, reason(e->status), date, body ? strlen(body) : 0,
                            d->cors ? "Access-Control-Allow-Origin: " : "", d->cors ? d->cors : "", d->cors ? "\r\n" : "");
    if (hn > 0 && (size_t)hn < sizeof head && send(c->fd, head, (size_t)hn, MSG_NOSIGNAL | MSG_MORE) == hn && body)
        (void)!send(c->fd, body, strlen(body), MSG_NOSIGNAL);
    free(body);
    if (d->answered) d->answered(d->cls, e->status);
    shutdown(c->fd, SHUT_WR);
    c->closing = true;
    c->drained = 0;
    c->deadline = cli_now() + DOOR_LINGER_S;
}

/* New bytes on c: screen its head (or drain a refused one). */
static void on_bytes(struct srv_door *d, struct door_conn *c) {
    static char buf[DOOR_HEAD_MAX + 1];
    if (c->closing) {
        for (;;) {
            const ssize_t r = recv(c->fd, buf, sizeof buf, 0);
            if (r > 0 && (c->drained += (size_t)r) < DOOR_LINGER_BYTES) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
            conn_close(d, c); /* the peer's end, an error, or enough */
            return;
        }
    }
    const ssize_t r = recv(c->fd, buf, sizeof buf, MSG_PEEK);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (r <= 0) { /* gone before a whole head */
        conn_close(d, c);
        return;
    }
    struct srv_error e = {0};
    const int v = srv_door_screen(buf, (size_t)r, &e);
    if (v == 0) return;
    if (v < 0) {
        answer(d, c, &e);
        return;
    }
    epoll_ctl(d->ep, EPOLL_CTL_DEL, c->fd, NULL);
    const int fd = c->fd;
    c->fd = -1;
    d->pass(d->cls, fd, (const struct sockaddr *)&c->addr, c->alen); /* it owns the socket now */
}

static void on_listen(struct srv_door *d) {
    for (;;) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        const int fd = accept4(d->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or a connection that went away; EMFILE: the next wake retries */
        struct door_conn *c = NULL;
        for (int i = 0; i < DOOR_PENDING_MAX && !c; i++)
            if (d->conns[i].fd < 0) c = &d->conns[i];
        if (!c) { /* too many heads waiting: the oldest keep their places */
            close(fd);
            continue;
        }
        const int sndbuf = DOOR_SNDBUF;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        *c = (struct door_conn){.fd = fd, .deadline = cli_now() + d->timeout, .addr = a, .alen = al};
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u32 = (uint32_t)(c - d->conns)};
        if (epoll_ctl(d->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            c->fd = -1;
        }
    }
}

static void *door_main(void *arg) {
    struct srv_door *d = arg;
    for (;;) {
        struct epoll_event ev[64];
        const int n = epoll_wait(d->ep, ev, 64, 500);
        for (int i = 0; i < n; i++) {
            const uint32_t k = ev[i].data.u32;
            if (k == UINT32_MAX - 1) return NULL; /* stop */
            if (k == UINT32_MAX) on_listen(d);
            else if (k < DOOR_PENDING_MAX && d->conns[k].fd >= 0) on_bytes(d, &d->conns[k]);
        }
        const double now = cli_now();
        for (int i = 0; i < DOOR_PENDING_MAX; i++)
            if (d->conns[i].fd >= 0 && now >= d->conns[i].deadline) conn_close(d, &d->conns[i]);
    }
}

enum ekv_status srv_door_start(const struct sockaddr_in *addr, const struct srv_door_params *p, struct srv_door **out,
                               int *port_out) {
    *out = NULL;
    struct srv_door *d = calloc(1, sizeof *d);
    if (!d) return EKV_ERR_NOMEM;
    d->timeout = p->timeout > 0 ? p->timeout : 60;
    d->pass = p->pass;
    d->answered = p->answered;
    d->cls = p->cls;
    d->cors = p->cors;
    for (int i = 0; i < DOOR_PENDING_MAX; i++) d->conns[i].fd = -1;
    d->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    d->ep = epoll_create1(EPOLL_CLOEXEC);
    d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    struct epoll_event lev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    struct epoll_event wev = {.events = EPOLLIN, .data.u32 = UINT32_MAX - 1};
    if (d->wake < 0 || d->ep < 0 || d->lfd < 0 || setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(d->lfd, (const struct sockaddr *)addr, sizeof *addr) != 0 || listen(d->lfd, 128) != 0 ||
        getsockname(d->lfd, (struct sockaddr *)&bound, &bl) != 0 || epoll_ctl(d->ep, EPOLL_CTL_ADD, d->lfd, &lev) != 0 ||
        epoll_ctl(d->ep, EPOLL_CTL_ADD, d->wake, &wev) != 0) {
        const int err = errno;
        srv_door_stop(d);
        errno = err;
        return EKV_ERR_IO;
    }
    if (pthread_create(&d->th, NULL, door_main, d) != 0) {
        srv_door_stop(d);
        errno = EAGAIN;
        return EKV_ERR_NOMEM;
    }
    d->started = true;
    *port_out = ntohs(bound.sin_port);
    *out = d;
    return EKV_OK;
}

void srv_door_stop(struct srv_door *d) {
    if (!d) return;
    if (d->started) {
        const uint64_t one = 1;
        (void)!write(d->wake, &one, sizeof one);
        pthread_join(d->th, NULL);
    }
    for (int i = 0; i < DOOR_PENDING_MAX; i++)
        if (d->conns[i].fd >= 0) close(d->conns[i].fd);
    if (d->lfd >= 0) close(d->lfd);
    if (d->ep >= 0) close(d->ep);
    if (d->wake >= 0) close(d->wake);
    free(d);
}
