/*
 * serve_frame.c — the front door's screen of the bytes a client sends
 * (issue 23, defects 6 and 7): every request head and every chunked body
 * of a connection, the kept-alive ones after the first included, is
 * checked here before libmicrohttpd reads a byte of it. Why: libmicrohttpd
 * 0.9.75 (Debian 12's) answers what it cannot parse itself, with an HTML
 * page instead of the API's JSON error object, and for a Content-Length
 * that is not a number it sends its status line twice. What passes here
 * is what it parses without complaint; what does not gets one JSON answer
 * from the door (serve_door.c).
 *
 * Pure functions on bytes (no sockets), so the fuzzer (tests/fuzz/
 * fuzz_request.c) drives them with arbitrary splits of a connection's
 * bytes. The rules: a request line `METHOD TARGET HTTP/1.x` (505 for
 * another version), header lines with a name (a token: no space before the
 * colon, RFC 9112 5.1) and a colon, at most one
 * Content-Length and it all digits (413 past 2^63 - 1), Transfer-Encoding
 * only one `chunked` and never beside a Content-Length (400: request
 * smuggling), a head of at most 16 KiB (431); a chunked body as RFC 9112
 * 7.1 writes it: a size in hex digits (413 past 2^64 - 1), an optional extension after
 * ';', CRLF, the data, CRLF; after the last (0) chunk trailer lines with a
 * name and a colon (16 KiB in all) and an empty line. Lines of the head may
 * end in a bare LF (libmicrohttpd takes them); chunk lines must end in CRLF,
 * the one ending on which the door and libmicrohttpd agree byte for byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve.h"

#define FRAME_HEAD_MAX 16384    /* bytes of a request head, its empty line included */
#define FRAME_CHUNK_LINE_MAX 4096 /* a chunk size line with its extension */
#define FRAME_TRAILER_MAX 16384 /* the trailer section of a chunked body */

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

/* A field name [s, colon) is a token (RFC 9112 5.1: no whitespace before the colon); the
 * callers have refused an empty name already. */
static bool field_name_ok(const char *s, const char *colon) {
    for (const char *p = s; p < colon; p++)
        if (!is_tchar((unsigned char)*p)) return false;
    return true;
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

/* A Content-Length value: digits only (else *bad), at most 2^63 - 1 (else *huge). */
static uint64_t content_length(const char *val, size_t vn, bool *bad, bool *huge) {
    size_t d = 0;
    while (d < vn && val[d] >= '0' && val[d] <= '9') d++;
    if (d == 0 || d != vn) {
        *bad = true;
        return 0;
    }
    while (d > 1 && *val == '0') val++, d--;
    if (d > 19 || (d == 19 && memcmp(val, "9223372036854775807", 19) > 0)) {
        *huge = true;
        return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < d; i++) v = v * 10 + (uint64_t)(val[i] - '0');
    return v;
}

int srv_door_screen(const char *buf, size_t n, struct srv_head *h, struct srv_error *e) {
    size_t at = 0;
    while (at < n && (buf[at] == '\r' || buf[at] == '\n')) at++; /* empty lines before the request (RFC 9112 2.2) */
    int n_cl = 0, n_te = 0, lines = 0;
    bool cl_bad = false, cl_huge = false, te_bad = false;
    uint64_t cl = 0;
    for (;;) {
        const char *nl = memchr(buf + at, '\n', n - at);
        if (!nl) {
            if (n >= FRAME_HEAD_MAX)
                return refuse(e, 431, "request_header_fields_too_large", "the request head is larger than 16 KiB");
            return 0;
        }
        const char *s = buf + at;
        size_t len = (size_t)(nl - s);
        if (len && s[len - 1] == '\r') len--;
        at = (size_t)(nl - buf) + 1;
        if (at > FRAME_HEAD_MAX)
            return refuse(e, 431, "request_header_fields_too_large", "the request head is larger than 16 KiB");
        if (lines++ == 0) {
            if (screen_request_line(s, len, e) < 0) return -1;
            continue;
        }
        if (len == 0) break; /* the end of the head */
        if (s[0] == ' ' || s[0] == '\t') continue; /* a folded line (libmicrohttpd joins it) */
        const char *colon = memchr(s, ':', len);
        if (!colon || colon == s) return refuse(e, 400, "malformed_request", "a header line has no name and colon");
        if (!field_name_ok(s, colon))
            return refuse(e, 400, "malformed_request", "a header field name is not a token (no space before ':')");
        const size_t kn = (size_t)(colon - s);
        const char *val = colon + 1;
        size_t vn = len - kn - 1;
        trim(&val, &vn);
        if (kn == 14 && !strncasecmp(s, "Content-Length", 14)) {
            n_cl++;
            cl = content_length(val, vn, &cl_bad, &cl_huge);
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
    if (h) *h = (struct srv_head){.len = at, .content_length = cl, .chunked = n_te == 1};
    return 1;
}

/* ---- a connection's bytes, request after request ---- */

enum { FR_HEAD, FR_BODY, FR_CHUNK_SIZE, FR_CHUNK_DATA, FR_CHUNK_END, FR_TRAILER };

void srv_frame_init(struct srv_frame *f) { memset(f, 0, sizeof *f); }

bool srv_frame_at_head(const struct srv_frame *f) { return f->state == FR_HEAD; }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int bad_chunk(struct srv_error *e, const char *msg) { return refuse(e, 400, "malformed_chunked_body", msg); }

/* A chunk size line [s, s + n), its CRLF excluded: the size, or -1. */
static int chunk_size_line(const char *s, size_t n, uint64_t *size, struct srv_error *e) {
    size_t d = 0, sig = 0;
    uint64_t v = 0;
    int x;
    while (d < n && (x = hexval(s[d])) >= 0) {
        d++;
        if (sig == 0 && x == 0) continue; /* leading zeros, any number (libmicrohttpd takes them) */
        if (++sig > 16) return refuse(e, 413, "request_too_large", "a chunk size is larger than 2^64 - 1 bytes");
        v = v << 4 | (uint64_t)x;
    }
    if (d == 0) return bad_chunk(e, "a chunk does not start with its size in hex digits");
    if (d < n && s[d] != ';') return bad_chunk(e, "a chunk size is followed by something other than ';' or CRLF");
    for (size_t i = d; i < n; i++)
        if (s[i] == '\r' || s[i] == '\0') return bad_chunk(e, "a chunk extension holds a CR or NUL byte");
    *size = v;
    return 1;
}

/* A trailer line [s, s + n), its CRLF excluded, not empty. */
static int trailer_line(const char *s, size_t n, struct srv_error *e) {
    const char *colon = memchr(s, ':', n);
    if (!colon || colon == s) return bad_chunk(e, "a trailer line of a chunked body has no name and colon");
    if (!field_name_ok(s, colon)) return bad_chunk(e, "a trailer field name of a chunked body is not a token");
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\r' || s[i] == '\0') return bad_chunk(e, "a trailer line holds a CR or NUL byte");
    return 1;
}

/* The next CRLF-ended line at buf[0, n): its length without the CRLF, or
 * (size_t)-1 when not complete yet; refused (-2) past `max` bytes or for a
 * bare LF. */
static size_t crlf_line(const char *buf, size_t n, size_t max, int *bad) {
    const char *nl = memchr(buf, '\n', n < max ? n : max);
    if (!nl) {
        if (n >= max) *bad = 1;
        return (size_t)-1;
    }
    const size_t len = (size_t)(nl - buf);
    if (len == 0 || buf[len - 1] != '\r') {
        *bad = 2;
        return (size_t)-1;
    }
    return len - 1;
}

long srv_frame_screen(struct srv_frame *f, const char *buf, size_t n, bool may_open, struct srv_error *e) {
    size_t at = 0;
    while (at < n) {
        const char *s = buf + at;
        const size_t rest = n - at;
        int bad = 0;
        switch (f->state) {
        case FR_HEAD: {
            if (!may_open) return (long)at;
            struct srv_head h;
            const int v = srv_door_screen(s, rest, &h, e);
            if (v < 0) return -1;
            if (v == 0) return (long)at;
            at += h.len;
            f->heads++;
            may_open = false; /* one head per call: the next waits for this request's completion */
            f->state = h.chunked ? FR_CHUNK_SIZE : h.content_length ? FR_BODY : FR_HEAD;
            f->left = h.content_length;
            if (f->state == FR_HEAD) f->ends++;
            break;
        }
        case FR_BODY:
        case FR_CHUNK_DATA: {
            const size_t k = f->left < rest ? (size_t)f->left : rest;
            at += k;
            f->left -= k;
            if (f->left == 0) {
                if (f->state == FR_BODY) f->ends++;
                f->state = f->state == FR_BODY ? FR_HEAD : FR_CHUNK_END;
            }
            break;
        }
        case FR_CHUNK_END:
            if (rest < 2) return (long)at;
            if (s[0] != '\r' || s[1] != '\n') return bad_chunk(e, "a chunk's data is not followed by CRLF");
            at += 2;
            f->state = FR_CHUNK_SIZE;
            break;
        case FR_CHUNK_SIZE: {
            const size_t len = crlf_line(s, rest, FRAME_CHUNK_LINE_MAX, &bad);
            if (bad == 1) return bad_chunk(e, "a chunk size line is longer than 4 KiB");
            if (bad) return bad_chunk(e, "a chunk size line does not end in CRLF");
            if (len == (size_t)-1) return (long)at;
            uint64_t size = 0;
            if (chunk_size_line(s, len, &size, e) < 0) return -1;
            at += len + 2;
            f->left = size;
            f->trailer = 0;
            f->state = size ? FR_CHUNK_DATA : FR_TRAILER;
            break;
        }
        case FR_TRAILER: {
            const size_t room = FRAME_TRAILER_MAX - f->trailer;
            const size_t len = crlf_line(s, rest, room, &bad);
            if (bad == 1) return bad_chunk(e, "the trailer section of a chunked body is larger than 16 KiB");
            if (bad) return bad_chunk(e, "a trailer line of a chunked body does not end in CRLF");
            if (len == (size_t)-1) return (long)at;
            if (len && trailer_line(s, len, e) < 0) return -1;
            at += len + 2;
            f->trailer += len + 2;
            if (len == 0) {
                f->ends++;
                f->state = FR_HEAD;
            }
            break;
        }
        }
    }
    return (long)at;
}
