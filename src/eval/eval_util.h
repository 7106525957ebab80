/*
 * eval_util.h — the few helpers libekv_eval needs beyond include/ekv.h
 * (the evaluation library is built on the public API only, like the other
 * front ends): array length, min, and size arithmetic that reports
 * overflow instead of wrapping.
 */
#ifndef EKV_EVAL_UTIL_H
#define EKV_EVAL_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define EV_MIN(a, b) ((a) < (b) ? (a) : (b))

/* a * b into *out; false on overflow. */
static inline bool ev_mul_ok(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
/* a + b into *out; false on overflow. */
static inline bool ev_add_ok(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

#endif
