/*
 * util.h — small internal helpers shared by every layer of libekv: setting
 * the thread's error message, checked size arithmetic, half-precision
 * conversions. Nothing here allocates or prints.
 */
#ifndef EKV_UTIL_H
#define EKV_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ekv.h"

#define EKV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define EKV_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EKV_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Records a printf-style detail message for ekv_last_error() and returns s,
 * so that failures read `return ekv_err(EKV_ERR_FORMAT, "%s: ...", path);`. */
enum ekv_status ekv_err(enum ekv_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with "context: " (for adding the file name
 * to an error raised deeper down). Returns s. */
enum ekv_status ekv_err_prefix(enum ekv_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears the thread's message. */
void ekv_err_clear(void);

/* a * b into *out; false on overflow. */
static inline bool ekv_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ekv_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* IEEE half <-> float (round to nearest even). */
static inline float ekv_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; mant <<= 1; } while ((mant & 0x400) == 0);
            mant &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t ekv_f32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or 0 */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t mant = (absx & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(absx >> 23); /* 14..24 */
        uint32_t half = mant >> (shift);
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((absx >> 13) - ((127 - 15) << 10));
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (uint16_t)(sign | half);
}

static inline float ekv_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t ekv_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
