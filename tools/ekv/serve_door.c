/*
 * serve_door.c — the front door of `ekv serve`: it accepts the connections
 * itself and relays each one's bytes to libmicrohttpd through a socket pair
 * (and libmicrohttpd's answers back), passing on only what serve_frame.c's
 * screen let through. Why: libmicrohttpd 0.9.75 (Debian 12's) answers
 * requests it cannot parse itself, with an HTML page instead of the API's
 * JSON error object (issue 23, defect 7), and for a Content-Length that is
 * not a number it sends its status line and headers twice (defect 6). A
 * door that only looked at a connection's first head (this file's first
 * version) left two cases to it: a later request on a kept-alive
 * connection, and chunked bodies; relaying every byte covers both.
 *
 * One request at a time goes to libmicrohttpd: the next one's head waits
 * in the door until libmicrohttpd reported the last one complete
 * (srv_door_completed, from its completion callback), so that when a later
 * request is refused, the answers before it go out first, then the door's
 * JSON error, in order, and the connection closes. A refusal inside a
 * chunked body ends that request in libmicrohttpd (its end of the pair
 * sees the end of input) and the door answers for it. The client's state
 * is mirrored onto the pair: its half-close shuts down the pair's direction
 * to libmicrohttpd (which still answers), a reset or an error closes the
 * pair (which libmicrohttpd sees as a hang-up: the job is cancelled).
 *
 * Bounded: each connection holds at most DOOR_IN_CAP + DOOR_OUT_CAP bytes
 * in the door, the pair's buffers are capped (DOOR_PAIR_BUF) and the
 * client's kernel send buffer too (DOOR_SNDBUF), so a client that stops
 * reading stalls its own stream only (serve_http.c's stall watch sees it on
 * the pair). One thread, epoll, edge-triggered; a first head not complete
 * within --timeout is dropped, and an answer not taken within --timeout
 * too. After an answer the rest of the request is read and dropped for a
 * moment, so that the client sees the answer, not a reset.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

#define DOOR_CONN_MAX 1024           /* connections at once (libmicrohttpd's limit is 1000) */
#define DOOR_IN_CAP (20 * 1024)      /* client bytes held: a whole head (16 KiB) must fit */
#define DOOR_OUT_CAP (16 * 1024)     /* libmicrohttpd's bytes held on their way to the client */
#define DOOR_PAIR_BUF (64 * 1024)    /* each end of a pair's kernel send buffer */
#define DOOR_LINGER_S 2.0            /* a closing connection's rest is read for at most this long... */
#define DOOR_LINGER_BYTES (1u << 20) /* ...or this many bytes */
#define DOOR_STOP_S 2.0              /* srv_door_stop relays what is left for at most this long */
#define DOOR_FD_TRACK 65536          /* completions are counted for libmicrohttpd's fds below this */
/* Each connection's kernel send buffer (Linux doubles it): what a client that stops reading can
 * make the kernel hold for it. Autotuning would let it grow to tcp_wmem's maximum (4 MiB). */
#define DOOR_SNDBUF (256 * 1024)

#define ID_LISTEN UINT64_MAX
#define ID_WAKE (UINT64_MAX - 1)

enum door_phase {
    PH_OPEN,   /* the client's requests go to libmicrohttpd (none yet while ifd < 0) */
    PH_DRAIN,  /* nothing more goes in; libmicrohttpd's bytes (and the door's answer) go out */
    PH_LINGER, /* all sent; the client's rest is read and dropped, then the close */
};

struct door_buf {
    size_t in_len;           /* client bytes held, in[0, in_len) */
    size_t in_pass;          /* of them, in[0, in_pass) passed the screen (not yet sent on) */
    size_t out_off, out_len; /* out[out_off, out_len): bytes not yet sent to the client */
    char in[DOOR_IN_CAP];
    char out[DOOR_OUT_CAP];
};

struct door_conn {
    int fd;  /* the client's socket; -1: a free slot */
    int ifd; /* the door's end of the pair; -1: no head passed yet, or closed */
    int mfd; /* libmicrohttpd's end (its number: completions name it) */
    uint32_t gen; /* the slot's generation: epoll events of an earlier connection in it are ignored */
    enum door_phase phase;
    struct srv_frame fr;
    bool cl_eof;     /* the client's FIN was read */
    bool in_shut;    /* the pair's direction to libmicrohttpd is shut down */
    bool in_eof;     /* libmicrohttpd's end said end of input (or there is none) */
    bool answer_due; /* the door answers err once libmicrohttpd's bytes are out */
    struct srv_error err;
    size_t drained;
    double deadline; /* the first head's (ifd < 0), or PH_DRAIN's / PH_LINGER's */
    struct sockaddr_storage addr;
    socklen_t alen;
    struct door_buf *b;
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
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int cmd;        /* under mu: 1 quiesce, 2 stop */
    bool quiesced;  /* under mu */
    _Atomic uint64_t *completed; /* [DOOR_FD_TRACK]: requests completed, by libmicrohttpd's fd */
    _Atomic uint64_t *ino;       /* [DOOR_FD_TRACK]: the inode of the pair end that fd is (a completion
                                  * reported for an fd number already reused is not counted) */
    struct door_conn conns[DOOR_CONN_MAX];
};

static bool again(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

/* An epoll event's tag: the slot's generation, the slot, which socket (0 the client's, 1 the pair's). */
static uint64_t event_id(const struct srv_door *d, const struct door_conn *c, int side) {
    return (uint64_t)c->gen << 32 | ((uint64_t)(c - d->conns) * 2 + (uint64_t)side);
}

static void conn_close(struct srv_door *d, struct door_conn *c) {
    epoll_ctl(d->ep, EPOLL_CTL_DEL, c->fd, NULL);
    char sink[4096];
    for (int i = 0; i < 16 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
    } /* bytes left unread would make the close a reset */
    close(c->fd);
    if (c->ifd >= 0) {
        epoll_ctl(d->ep, EPOLL_CTL_DEL, c->ifd, NULL);
        close(c->ifd); /* libmicrohttpd sees a hang-up */
    }
    free(c->b);
    *c = (struct door_conn){.fd = -1, .ifd = -1, .gen = c->gen};
}

static const char *reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* The door's own answer (head and JSON body) into buf; its length, 0 if it does not fit. */
static size_t compose(const struct srv_door *d, const struct srv_error *e, char *buf, size_t cap) {
    char *body = srv_error_json(e);
    char date[64] = "";
    const time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    const size_t bn = body ? strlen(body) : 0;
    const int hn = snprintf(buf, cap,
                            "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                            "Connection: close\r\n%s%.200s%s\r\n",
                            e->status, reason(e->status), date, bn, d->cors ? "Access-Control-Allow-Origin: " : "",
                            d->cors ? d->cors : "", d->cors ? "\r\n" : "");
    size_t n = 0;
    if (hn > 0 && (size_t)hn + bn <= cap) {
        if (bn) memcpy(buf + hn, body, bn);
        n = (size_t)hn + bn;
    }
    free(body);
    return n;
}

static void start_linger(struct door_conn *c) {
    shutdown(c->fd, SHUT_WR);
    c->phase = PH_LINGER;
    c->drained = 0;
    c->deadline = cli_now() + DOOR_LINGER_S;
}

/* The client is gone: pump() closes c at once (PH_LINGER with deadline 0). True, for pump_in/out. */
static bool close_now(struct door_conn *c) {
    c->phase = PH_LINGER;
    c->deadline = 0;
    return true;
}

/* The door's 503 when it cannot take a connection on. */
static struct srv_error busy_error(const char *why) {
    struct srv_error e = {.status = 503, .type = "server_error", .code = "server_busy"};
    snprintf(e.message, sizeof e.message, "%s; retry later", why);
    return e;
}

/* Refuses with e: what libmicrohttpd still sends goes out first, then the answer. */
static void refuse_conn(struct srv_door *d, struct door_conn *c, const struct srv_error *e, bool answer) {
    c->err = *e;
    c->answer_due = answer;
    c->phase = PH_DRAIN;
    c->deadline = cli_now() + d->timeout;
    if (c->ifd < 0) c->in_eof = true;
    else if (!c->in_shut) {
        shutdown(c->ifd, SHUT_WR); /* libmicrohttpd ends a request it is reading, or its idle connection */
        c->in_shut = true;
    }
}

static uint64_t completed(const struct srv_door *d, const struct door_conn *c) {
    return c->mfd >= 0 && c->mfd < DOOR_FD_TRACK ? atomic_load(&d->completed[c->mfd]) : UINT64_MAX;
}

/* The first head passed: a pair, libmicrohttpd gets its end. False: refused (c answers 503). */
static bool open_pair(struct srv_door *d, struct door_conn *c) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return false;
    const int buf = DOOR_PAIR_BUF;
    (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.u64 = event_id(d, c, 1)};
    if (epoll_ctl(d->ep, EPOLL_CTL_ADD, sv[0], &ev) != 0) {
        close(sv[0]);
        close(sv[1]);
        return false;
    }
    c->ifd = sv[0];
    c->mfd = sv[1];
    struct stat st;
    if (c->mfd < DOOR_FD_TRACK) {
        atomic_store(&d->completed[c->mfd], 0);
        atomic_store(&d->ino[c->mfd], fstat(c->mfd, &st) == 0 ? (uint64_t)st.st_ino : 0);
    }
    if (!d->pass(d->cls, sv[1], (const struct sockaddr *)&c->addr, c->alen)) { /* it closed sv[1] */
        c->mfd = -1;
        epoll_ctl(d->ep, EPOLL_CTL_DEL, c->ifd, NULL);
        close(c->ifd);
        c->ifd = -1;
        return false;
    }
    return true;
}

/* PH_OPEN: the client's bytes in, screened, the passed ones on to libmicrohttpd. True if anything moved. */
static bool pump_in(struct srv_door *d, struct door_conn *c) {
    struct door_buf *b = c->b;
    bool moved = false;
    if (!c->cl_eof && b->in_len < DOOR_IN_CAP) {
        const ssize_t r = recv(c->fd, b->in + b->in_len, DOOR_IN_CAP - b->in_len, 0);
        if (r > 0) b->in_len += (size_t)r, moved = true;
        else if (r == 0) c->cl_eof = moved = true;
        else if (!again()) return close_now(c); /* a reset */
    }
    if (b->in_pass < b->in_len) {
        const bool may_open = c->ifd < 0 ? c->fr.heads == 0 : completed(d, c) >= c->fr.heads;
        struct srv_error e = {0};
        const long v = srv_frame_screen(&c->fr, b->in + b->in_pass, b->in_len - b->in_pass, may_open, &e);
        if (v < 0) {
            /* a head is screened only when libmicrohttpd is through with the requests before it; inside
             * a body libmicrohttpd may have answered already (early, e.g. 413): no second answer then */
            refuse_conn(d, c, &e, srv_frame_at_head(&c->fr) || c->ifd < 0 || completed(d, c) < c->fr.heads);
            return true;
        }
        if (v > 0) b->in_pass += (size_t)v, moved = true;
    }
    if (c->ifd < 0 && c->fr.heads > 0 && !open_pair(d, c)) {
        const struct srv_error busy = busy_error("the server has too many connections open");
        refuse_conn(d, c, &busy, true);
        return true;
    }
    if (c->ifd >= 0 && b->in_pass > 0 && !c->in_shut) {
        const ssize_t w = send(c->ifd, b->in, b->in_pass, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            memmove(b->in, b->in + w, b->in_len - (size_t)w);
            b->in_len -= (size_t)w;
            b->in_pass -= (size_t)w;
            moved = true;
        } else if (w < 0 && !again()) c->in_shut = true; /* libmicrohttpd's end is gone: its EOF follows */
    }
    if (c->cl_eof && b->in_pass == 0 && !c->in_shut) {
        if (c->ifd < 0) return close_now(c); /* gone before a whole head */
        shutdown(c->ifd, SHUT_WR); /* a half-close: libmicrohttpd still answers */
        c->in_shut = moved = true;
    }
    return moved;
}

/* libmicrohttpd's bytes out to the client (every phase but PH_LINGER). True if anything moved. */
static bool pump_out(struct srv_door *d, struct door_conn *c) {
    struct door_buf *b = c->b;
    bool moved = false;
    if (b->out_off == b->out_len) b->out_off = b->out_len = 0;
    if (c->ifd >= 0 && !c->in_eof && b->out_len < DOOR_OUT_CAP) {
        const ssize_t r = recv(c->ifd, b->out + b->out_len, DOOR_OUT_CAP - b->out_len, 0);
        if (r > 0) b->out_len += (size_t)r, moved = true;
        else if (r == 0 || !again()) {
            c->in_eof = moved = true; /* libmicrohttpd closed: it said all it will */
            if (c->phase == PH_OPEN) c->phase = PH_DRAIN, c->deadline = cli_now() + d->timeout;
        }
    }
    if (b->out_off < b->out_len) {
        const ssize_t w = send(c->fd, b->out + b->out_off, b->out_len - b->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) b->out_off += (size_t)w, moved = true;
        else if (w < 0 && !again()) return close_now(c); /* the client is gone */
    }
    if (c->phase == PH_DRAIN && c->in_eof && b->out_off == b->out_len) {
        if (c->answer_due) {
            c->answer_due = false;
            b->out_off = 0;
            b->out_len = compose(d, &c->err, b->out, DOOR_OUT_CAP);
            if (d->answered) d->answered(d->cls, c->err.status);
        } else start_linger(c);
        moved = true;
    }
    return moved;
}

/* Everything that can move on c moves (edge-triggered: until nothing does). */
static void pump(struct srv_door *d, struct door_conn *c) {
    for (;;) {
        if (c->phase == PH_LINGER) {
            char sink[4096];
            for (;;) {
                if (c->deadline == 0) break;
                const ssize_t r = recv(c->fd, sink, sizeof sink, 0);
                if (r > 0 && (c->drained += (size_t)r) < DOOR_LINGER_BYTES) continue;
                if (r < 0 && again()) return;
                break; /* the peer's end, an error, or enough */
            }
            conn_close(d, c);
            return;
        }
        bool moved = c->phase == PH_OPEN && pump_in(d, c);
        if (c->phase != PH_LINGER) moved |= pump_out(d, c);
        if (!moved) return;
    }
}

/* A connection whose buffers cannot be had: the 503 goes out directly (small: one send fits), then
 * the rest of its request is read and dropped for a moment like after any answer of the door. */
static void refuse_unbuffered(struct srv_door *d, struct door_conn *c) {
    const struct srv_error busy = busy_error("the server is out of memory for a connection");
    char buf[2048];
    const size_t n = compose(d, &busy, buf, sizeof buf);
    if (n) (void)!send(c->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (d->answered) d->answered(d->cls, 503);
    start_linger(c);
}

static void on_listen(struct srv_door *d) {
    for (;;) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        const int fd = accept4(d->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or a connection that went away; EMFILE: the next wake retries */
        struct door_conn *c = NULL;
        for (int i = 0; i < DOOR_CONN_MAX && !c; i++)
            if (d->conns[i].fd < 0) c = &d->conns[i];
        if (!c) { /* full: the open ones keep their places */
            close(fd);
            continue;
        }
        struct door_buf *b = malloc(sizeof *b); /* NULL: answered 503 (refuse_unbuffered) */
        if (b) b->in_len = b->in_pass = b->out_off = b->out_len = 0;
        const int sndbuf = DOOR_SNDBUF, one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        /* the door sends what libmicrohttpd wrote as soon as it has it (a stream's events one by one):
         * Nagle's algorithm would hold a small piece back until the last one is acknowledged */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        *c = (struct door_conn){.fd = fd, .ifd = -1, .mfd = -1, .gen = c->gen + 1, .deadline = cli_now() + d->timeout,
                                .addr = a, .alen = al, .b = b};
        srv_frame_init(&c->fr);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.u64 = event_id(d, c, 0)};
        if (epoll_ctl(d->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(b);
            *c = (struct door_conn){.fd = -1, .ifd = -1, .gen = c->gen};
        } else if (!b) refuse_unbuffered(d, c);
    }
}

/* A command from srv_door_quiesce / srv_door_stop (under d->mu). */
static void on_command(struct srv_door *d, int cmd) {
    if (cmd >= 1 && d->lfd >= 0) {
        epoll_ctl(d->ep, EPOLL_CTL_DEL, d->lfd, NULL);
        close(d->lfd);
        d->lfd = -1;
        for (int i = 0; i < DOOR_CONN_MAX; i++) /* not passed to libmicrohttpd yet: never will be */
            if (d->conns[i].fd >= 0 && d->conns[i].ifd < 0 && d->conns[i].phase == PH_OPEN) conn_close(d, &d->conns[i]);
        d->quiesced = true;
        pthread_cond_broadcast(&d->cv);
    }
}

static void *door_main(void *arg) {
    struct srv_door *d = arg;
    double stop_at = 0;
    for (;;) {
        struct epoll_event ev[64];
        const int n = epoll_wait(d->ep, ev, 64, stop_at > 0 ? 50 : 500);
        for (int i = 0; i < n; i++) {
            const uint64_t k = ev[i].data.u64;
            if (k == ID_LISTEN) {
                if (d->lfd >= 0) on_listen(d);
            } else if (k == ID_WAKE) {
                uint64_t v;
                (void)!read(d->wake, &v, sizeof v);
                pthread_mutex_lock(&d->mu);
                const int cmd = d->cmd;
                on_command(d, cmd);
                pthread_mutex_unlock(&d->mu);
                if (cmd == 2 && stop_at == 0) stop_at = cli_now() + DOOR_STOP_S;
                for (int j = 0; j < DOOR_CONN_MAX; j++) /* a completion may let a held head go on */
                    if (d->conns[j].fd >= 0 && d->conns[j].phase == PH_OPEN && d->conns[j].b->in_pass < d->conns[j].b->in_len)
                        pump(d, &d->conns[j]);
            } else if ((k & 0xffffffffu) / 2 < DOOR_CONN_MAX) {
                struct door_conn *c = &d->conns[(k & 0xffffffffu) / 2];
                /* an event of a connection closed earlier in this batch: its slot may hold a new one */
                if (c->fd < 0 || (uint32_t)(k >> 32) != c->gen) continue;
                /* the client reset (or errored): libmicrohttpd must see it gone (its job is cancelled);
                 * a hang-up without an error comes only after the door's own shutdown (PH_LINGER) */
                if ((k & 1) == 0 && (ev[i].events & (EPOLLERR | EPOLLHUP)) && c->phase != PH_LINGER) conn_close(d, c);
                else pump(d, c);
            }
        }
        const double now = cli_now();
        bool any = false;
        for (int i = 0; i < DOOR_CONN_MAX; i++) {
            struct door_conn *c = &d->conns[i];
            if (c->fd < 0) continue;
            if ((c->ifd < 0 || c->phase != PH_OPEN) && now >= c->deadline) conn_close(d, c);
            else any = true;
        }
        if (stop_at > 0 && (!any || now >= stop_at)) return NULL;
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
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    for (int i = 0; i < DOOR_CONN_MAX; i++) d->conns[i] = (struct door_conn){.fd = -1, .ifd = -1};
    d->completed = calloc(DOOR_FD_TRACK, sizeof *d->completed);
    d->ino = calloc(DOOR_FD_TRACK, sizeof *d->ino);
    d->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    d->ep = epoll_create1(EPOLL_CLOEXEC);
    d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (!d->completed || !d->ino) {
        srv_door_stop(d);
        return EKV_ERR_NOMEM;
    }
    const int one = 1;
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    struct epoll_event lev = {.events = EPOLLIN, .data.u64 = ID_LISTEN};
    struct epoll_event wev = {.events = EPOLLIN, .data.u64 = ID_WAKE};
    if (d->wake < 0 || d->ep < 0 || d->lfd < 0 || setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(d->lfd, (const struct sockaddr *)addr, sizeof *addr) != 0 || listen(d->lfd, 128) != 0 ||
        getsockname(d->lfd, (struct sockaddr *)&bound, &bl) != 0 || epoll_ctl(d->ep, EPOLL_CTL_ADD, d->lfd, &lev) != 0 ||
        epoll_ctl(d->ep, EPOLL_CTL_ADD, d->wake, &wev) != 0) {
        const int err = errno;
        srv_door_stop(d);
        errno = err;
        return EKV_ERR_IO;
    }
    *out = d; /* before the thread runs: completions of its first connections may name it */
    if (pthread_create(&d->th, NULL, door_main, d) != 0) {
        *out = NULL;
        srv_door_stop(d);
        errno = EAGAIN;
        return EKV_ERR_NOMEM;
    }
    d->started = true;
    *port_out = ntohs(bound.sin_port);
    return EKV_OK;
}

void srv_door_completed(struct srv_door *d, int fd) {
    if (!d || fd < 0 || fd >= DOOR_FD_TRACK) return;
    struct stat st; /* still the pair end the door made for this number? */
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != atomic_load(&d->ino[fd])) return;
    atomic_fetch_add(&d->completed[fd], 1);
    const uint64_t one = 1;
    (void)!write(d->wake, &one, sizeof one);
}

static void command(struct srv_door *d, int cmd) {
    pthread_mutex_lock(&d->mu);
    if (d->cmd < cmd) d->cmd = cmd;
    pthread_mutex_unlock(&d->mu);
    const uint64_t one = 1;
    (void)!write(d->wake, &one, sizeof one);
}

void srv_door_quiesce(struct srv_door *d) {
    if (!d || !d->started) return;
    command(d, 1);
    pthread_mutex_lock(&d->mu);
    while (!d->quiesced) pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void srv_door_stop(struct srv_door *d) {
    if (!d) return;
    if (d->started) {
        command(d, 2);
        pthread_join(d->th, NULL);
    }
    for (int i = 0; i < DOOR_CONN_MAX; i++)
        if (d->conns[i].fd >= 0) conn_close(d, &d->conns[i]);
    if (d->lfd >= 0) close(d->lfd);
    if (d->ep >= 0) close(d->ep);
    if (d->wake >= 0) close(d->wake);
    free(d->completed);
    free(d->ino);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}
