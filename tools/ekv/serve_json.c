/*
 * serve_json.c — RFC 8259 syntax of a request body, checked before cJSON
 * parses it: cJSON is lenient (it takes numbers like 01 and 1., invalid
 * \u escapes, raw control characters in strings, and cuts a string at
 * \u0000), and the server answers such bodies with a 400 naming the byte.
 * Syntax only: cJSON still builds the tree. It also counts the values:
 * cJSON spends ~100 bytes on each (a node, a copy of each key), so a body
 * of small values ("[0,0,0,...]": 2 bytes each) would cost ~50x its size
 * to parse; srv_json_max_values bounds them so that parsing a body costs at
 * most a few times its size.
 */
#include <stdbool.h>
#include <stddef.h>

#include "serve.h"

#define SRV_JSON_DEPTH 64 /* arrays and objects nested deeper are refused */
#define SRV_JSON_VALUES_FREE 65536   /* values any body may have (~6.5 MB of cJSON nodes) */
#define SRV_JSON_BYTES_PER_VALUE 32  /* and one more per 32 bytes of body (~3x the body in nodes) */

struct jp {
    const unsigned char *s;
    size_t n, i;
    const char *why;
    size_t values; /* values seen (object keys count too: cJSON keeps a copy of each) */
};

static bool fail_at(struct jp *p, const char *why) {
    p->why = why;
    return false;
}

static void ws(struct jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static bool string(struct jp *p) {
    p->i++; /* the opening quote */
    while (p->i < p->n) {
        const unsigned char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return true;
        }
        if (c < 0x20) return fail_at(p, "a raw control character in a string");
        if (c != '\\') {
            p->i++;
            continue;
        }
        if (p->i + 1 >= p->n) break;
        const unsigned char e = p->s[p->i + 1];
        if (e == 'u') {
            if (p->i + 6 > p->n) break;
            bool zero = true;
            for (size_t k = 2; k < 6; k++) {
                if (!is_hex(p->s[p->i + k])) return fail_at(p, "an invalid \\u escape");
                zero = zero && p->s[p->i + k] == '0';
            }
            if (zero) return fail_at(p, "a \\u0000 in a string (ekv's strings end at a NUL)");
            p->i += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            p->i += 2;
        } else {
            return fail_at(p, "an invalid escape in a string");
        }
    }
    return fail_at(p, "a string that does not end");
}

static bool number(struct jp *p) {
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n || !is_digit(p->s[p->i])) return fail_at(p, "a number without digits");
    if (p->s[p->i] == '0') {
        p->i++;
        if (p->i < p->n && is_digit(p->s[p->i])) return fail_at(p, "a number with a leading zero");
    } else {
        while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (p->i >= p->n || !is_digit(p->s[p->i])) return fail_at(p, "a number with no digit after its point");
        while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || !is_digit(p->s[p->i])) return fail_at(p, "a number with no digit in its exponent");
        while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
    }
    return true;
}

static bool literal(struct jp *p, const char *word) {
    for (size_t k = 0; word[k]; k++)
        if (p->i + k >= p->n || p->s[p->i + k] != (unsigned char)word[k]) return fail_at(p, "an unknown word");
    while (*word++) p->i++;
    return true;
}

static bool value(struct jp *p, int depth);

/* An array or an object (closing bracket `close`), members by `member`. */
static bool container(struct jp *p, int depth, bool object) {
    if (depth >= SRV_JSON_DEPTH) return fail_at(p, "arrays or objects nested too deep");
    const unsigned char close = object ? '}' : ']';
    p->i++;
    ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return true;
    }
    for (;;) {
        if (object) {
            ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') return fail_at(p, "an object key that is not a string");
            p->values++;
            if (!string(p)) return false;
            ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return fail_at(p, "a missing ':' after an object key");
            p->i++;
        }
        if (!value(p, depth + 1)) return false;
        ws(p);
        if (p->i >= p->n) return fail_at(p, object ? "an object that does not end" : "an array that does not end");
        if (p->s[p->i] == close) {
            p->i++;
            return true;
        }
        if (p->s[p->i] != ',') return fail_at(p, "a missing ',' between members");
        p->i++;
        ws(p);
        if (p->i < p->n && p->s[p->i] == close) return fail_at(p, "a ',' before the closing bracket");
    }
}

static bool value(struct jp *p, int depth) {
    p->values++;
    ws(p);
    if (p->i >= p->n) return fail_at(p, "a missing value");
    const unsigned char c = p->s[p->i];
    if (c == '{' || c == '[') return container(p, depth, c == '{');
    if (c == '"') return string(p);
    if (c == '-' || is_digit(c)) return number(p);
    if (c == 't') return literal(p, "true");
    if (c == 'f') return literal(p, "false");
    if (c == 'n') return literal(p, "null");
    return fail_at(p, "an unexpected character");
}

bool srv_json_strict(const char *s, size_t n, size_t *at, const char **why, size_t *values) {
    struct jp p = {.s = (const unsigned char *)s, .n = n, .i = 0, .why = NULL, .values = 0};
    bool ok = value(&p, 0);
    if (ok) {
        ws(&p);
        if (p.i < n) ok = fail_at(&p, "bytes after the JSON value");
    }
    *at = p.i;
    *why = ok ? NULL : p.why;
    if (values) *values = p.values;
    return ok;
}

size_t srv_json_max_values(size_t n) { return SRV_JSON_VALUES_FREE + n / SRV_JSON_BYTES_PER_VALUE; }
