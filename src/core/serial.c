/*
 * serial.c — the little-endian buffers, CRC-32C and FNV-1a of serial.h.
 * Written for saved KV caches (src/engine/seqfile.c, src/kv/persist.c):
 * one place where bytes from a file are bounds-checked.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/serial.h"

void ekv_wbuf_free(struct ekv_wbuf *w) {
    free(w->p);
    memset(w, 0, sizeof *w);
}

void ekv_wbuf_put(struct ekv_wbuf *w, const void *src, size_t n) {
    if (w->oom || n == 0) return;
    if (n > SIZE_MAX - w->n) {
        w->oom = true;
        return;
    }
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap : 4096;
        while (nc < w->n + n) {
            if (nc > SIZE_MAX / 2) {
                nc = w->n + n;
                break;
            }
            nc *= 2;
        }
        uint8_t *np = realloc(w->p, nc);
        if (!np) {
            w->oom = true;
            return;
        }
        w->p = np;
        w->cap = nc;
    }
    if (src) memcpy(w->p + w->n, src, n);
    else memset(w->p + w->n, 0, n);
    w->n += n;
}

static void le32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void le64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t rd32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t rd64(const uint8_t *b) { return (uint64_t)rd32(b) | (uint64_t)rd32(b + 4) << 32; }

void ekv_wbuf_u8(struct ekv_wbuf *w, uint8_t v) { ekv_wbuf_put(w, &v, 1); }
void ekv_wbuf_u32(struct ekv_wbuf *w, uint32_t v) {
    uint8_t b[4];
    le32(b, v);
    ekv_wbuf_put(w, b, 4);
}
void ekv_wbuf_u64(struct ekv_wbuf *w, uint64_t v) {
    uint8_t b[8];
    le64(b, v);
    ekv_wbuf_put(w, b, 8);
}
void ekv_wbuf_f64(struct ekv_wbuf *w, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    ekv_wbuf_u64(w, u);
}
void ekv_wbuf_i32s(struct ekv_wbuf *w, const int32_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) ekv_wbuf_u32(w, (uint32_t)v[i]);
}
void ekv_wbuf_f32s(struct ekv_wbuf *w, const float *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        ekv_wbuf_u32(w, u);
    }
}
void ekv_wbuf_f64s(struct ekv_wbuf *w, const double *v, size_t n) {
    for (size_t i = 0; i < n; i++) ekv_wbuf_f64(w, v[i]);
}
void ekv_wbuf_u16s(struct ekv_wbuf *w, const uint16_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t b[2] = {(uint8_t)v[i], (uint8_t)(v[i] >> 8)};
        ekv_wbuf_put(w, b, 2);
    }
}
void ekv_wbuf_varint(struct ekv_wbuf *w, uint64_t v) {
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) b[n] |= 0x80;
        n++;
    } while (v);
    ekv_wbuf_put(w, b, n);
}
void ekv_wbuf_set_u32(struct ekv_wbuf *w, size_t at, uint32_t v) {
    if (!w->oom && at <= w->n && w->n - at >= 4) le32(w->p + at, v);
}
void ekv_wbuf_set_u64(struct ekv_wbuf *w, size_t at, uint64_t v) {
    if (!w->oom && at <= w->n && w->n - at >= 8) le64(w->p + at, v);
}

bool ekv_rbuf_has(struct ekv_rbuf *r, size_t n) {
    if (r->bad || r->at > r->n || n > r->n - r->at) {
        r->bad = true;
        return false;
    }
    return true;
}
bool ekv_rbuf_has_n(struct ekv_rbuf *r, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) {
        r->bad = true;
        return false;
    }
    return ekv_rbuf_has(r, n * size);
}
void ekv_rbuf_get(struct ekv_rbuf *r, void *dst, size_t n) {
    if (!ekv_rbuf_has(r, n)) {
        if (dst && n) memset(dst, 0, n);
        return;
    }
    if (dst && n) memcpy(dst, r->p + r->at, n);
    r->at += n;
}
uint8_t ekv_rbuf_u8(struct ekv_rbuf *r) {
    uint8_t v = 0;
    ekv_rbuf_get(r, &v, 1);
    return v;
}
uint32_t ekv_rbuf_u32(struct ekv_rbuf *r) {
    if (!ekv_rbuf_has(r, 4)) return 0;
    uint32_t v = rd32(r->p + r->at);
    r->at += 4;
    return v;
}
uint64_t ekv_rbuf_u64(struct ekv_rbuf *r) {
    if (!ekv_rbuf_has(r, 8)) return 0;
    uint64_t v = rd64(r->p + r->at);
    r->at += 8;
    return v;
}
uint64_t ekv_rbuf_varint(struct ekv_rbuf *r) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        const uint8_t b = ekv_rbuf_u8(r);
        if (r->bad) return 0;
        if (i == 9 && b > 1) break; /* past 64 bits */
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) return v;
    }
    r->bad = true;
    return 0;
}
int32_t ekv_rbuf_i32(struct ekv_rbuf *r) { return (int32_t)ekv_rbuf_u32(r); }
int64_t ekv_rbuf_i64(struct ekv_rbuf *r) { return (int64_t)ekv_rbuf_u64(r); }
double ekv_rbuf_f64(struct ekv_rbuf *r) {
    uint64_t u = ekv_rbuf_u64(r);
    double d;
    memcpy(&d, &u, 8);
    return d;
}
void ekv_rbuf_i32s(struct ekv_rbuf *r, int32_t *v, size_t n) {
    if (!ekv_rbuf_has_n(r, n, 4)) return;
    for (size_t i = 0; i < n; i++) v[i] = ekv_rbuf_i32(r);
}
void ekv_rbuf_f32s(struct ekv_rbuf *r, float *v, size_t n) {
    if (!ekv_rbuf_has_n(r, n, 4)) return;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = ekv_rbuf_u32(r);
        memcpy(&v[i], &u, 4);
    }
}
void ekv_rbuf_f64s(struct ekv_rbuf *r, double *v, size_t n) {
    if (!ekv_rbuf_has_n(r, n, 8)) return;
    for (size_t i = 0; i < n; i++) v[i] = ekv_rbuf_f64(r);
}
void ekv_rbuf_u16s(struct ekv_rbuf *r, uint16_t *v, size_t n) {
    if (!ekv_rbuf_has_n(r, n, 2)) return;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = r->p + r->at;
        v[i] = (uint16_t)(b[0] | b[1] << 8);
        r->at += 2;
    }
}

/* Reflected polynomial 0x82F63B78, one table of 256 built once. */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t ekv_crc32c(uint32_t crc, const void *p, size_t n) {
    pthread_once(&crc_once, crc_init);
    const uint8_t *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ b[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint64_t ekv_fnv64(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
