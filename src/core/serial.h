/*
 * serial.h — little-endian serialisation for files ekv writes and reads
 * back (saved KV caches, issue 22): a growing write buffer, a bounds-checked
 * read cursor that fails closed (every read past the end, or of a size the
 * rest cannot hold, sets `bad` and yields zeros), CRC-32C (Castagnoli, the
 * checksum of iSCSI/ext4/LevelDB) and 64-bit FNV-1a for fingerprints.
 * Nothing here prints; allocation failure sets the write buffer's `oom`.
 */
#ifndef EKV_SERIAL_H
#define EKV_SERIAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ekv_wbuf {
    uint8_t *p;
    size_t n;     /* bytes written */
    size_t cap;
    bool oom;     /* an allocation failed: the content is incomplete */
};

struct ekv_rbuf {
    const uint8_t *p;
    size_t n;     /* bytes in p */
    size_t at;    /* read position */
    bool bad;     /* a read went past the end */
};

void ekv_wbuf_free(struct ekv_wbuf *w);
/* Appends n bytes (src NULL: zeros). */
void ekv_wbuf_put(struct ekv_wbuf *w, const void *src, size_t n);
void ekv_wbuf_u8(struct ekv_wbuf *w, uint8_t v);
void ekv_wbuf_u32(struct ekv_wbuf *w, uint32_t v);
void ekv_wbuf_u64(struct ekv_wbuf *w, uint64_t v);
void ekv_wbuf_f64(struct ekv_wbuf *w, double v);
/* Arrays of n elements, each little-endian. */
void ekv_wbuf_i32s(struct ekv_wbuf *w, const int32_t *v, size_t n);
void ekv_wbuf_f32s(struct ekv_wbuf *w, const float *v, size_t n);
void ekv_wbuf_f64s(struct ekv_wbuf *w, const double *v, size_t n);
void ekv_wbuf_u16s(struct ekv_wbuf *w, const uint16_t *v, size_t n);
/* LEB128: 7 bits per byte, low first, high bit = more follow (1-10 bytes). */
void ekv_wbuf_varint(struct ekv_wbuf *w, uint64_t v);
/* Overwrites 4 / 8 bytes at offset at (inside what was written) with v. */
void ekv_wbuf_set_u32(struct ekv_wbuf *w, size_t at, uint32_t v);
void ekv_wbuf_set_u64(struct ekv_wbuf *w, size_t at, uint64_t v);

/* Whether n more bytes remain (sets bad when not). */
bool ekv_rbuf_has(struct ekv_rbuf *r, size_t n);
/* Whether n elements of `size` bytes remain (overflow-checked). */
bool ekv_rbuf_has_n(struct ekv_rbuf *r, size_t n, size_t size);
/* Copies n bytes (dst may be NULL: skipped); zeros and bad past the end. */
void ekv_rbuf_get(struct ekv_rbuf *r, void *dst, size_t n);
uint8_t ekv_rbuf_u8(struct ekv_rbuf *r);
uint32_t ekv_rbuf_u32(struct ekv_rbuf *r);
uint64_t ekv_rbuf_u64(struct ekv_rbuf *r);
int32_t ekv_rbuf_i32(struct ekv_rbuf *r);
int64_t ekv_rbuf_i64(struct ekv_rbuf *r);
double ekv_rbuf_f64(struct ekv_rbuf *r);
/* A LEB128 value (bad when cut short or longer than 64 bits). */
uint64_t ekv_rbuf_varint(struct ekv_rbuf *r);
/* Arrays of n elements; nothing is written to v when they do not all remain. */
void ekv_rbuf_i32s(struct ekv_rbuf *r, int32_t *v, size_t n);
void ekv_rbuf_f32s(struct ekv_rbuf *r, float *v, size_t n);
void ekv_rbuf_f64s(struct ekv_rbuf *r, double *v, size_t n);
void ekv_rbuf_u16s(struct ekv_rbuf *r, uint16_t *v, size_t n);

/* CRC-32C of n bytes, continuing crc (start with 0). */
uint32_t ekv_crc32c(uint32_t crc, const void *p, size_t n);
/* 64-bit FNV-1a of n bytes, continuing h (start with EKV_FNV64_INIT). */
#define EKV_FNV64_INIT 0xcbf29ce484222325ull
uint64_t ekv_fnv64(uint64_t h, const void *p, size_t n);

#endif
