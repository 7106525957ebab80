/*
 * dtype.h — tensor element types, numbered as GGML/GGUF numbers them, with
 * their block geometry. The GGUF reader needs the geometry of every type (to
 * validate extents and to describe files it cannot compute with); the
 * kernels say which types they can multiply (ekv_dtype_can_compute).
 */
#ifndef EKV_DTYPE_H
#define EKV_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ekv_dtype {
    EKV_F32 = 0, EKV_F16 = 1, EKV_Q4_0 = 2, EKV_Q4_1 = 3,
    EKV_Q5_0 = 6, EKV_Q5_1 = 7, EKV_Q8_0 = 8, EKV_Q8_1 = 9,
    EKV_Q2_K = 10, EKV_Q3_K = 11, EKV_Q4_K = 12, EKV_Q5_K = 13, EKV_Q6_K = 14, EKV_Q8_K = 15,
    EKV_IQ2_XXS = 16, EKV_IQ2_XS = 17, EKV_IQ3_XXS = 18, EKV_IQ1_S = 19, EKV_IQ4_NL = 20,
    EKV_IQ3_S = 21, EKV_IQ2_S = 22, EKV_IQ4_XS = 23,
    EKV_I8 = 24, EKV_I16 = 25, EKV_I32 = 26, EKV_I64 = 27, EKV_F64 = 28,
    EKV_IQ1_M = 29, EKV_BF16 = 30, EKV_TQ1_0 = 34, EKV_TQ2_0 = 35,
    EKV_DTYPE_COUNT = 36
};

struct ekv_dtype_info {
    const char *name;      /* "f32", "q4_K", ... (NULL for unknown ids) */
    uint32_t block_size;   /* elements per block */
    uint32_t type_size;    /* bytes per block */
};

/* NULL-named entry for ids that are not types. */
const struct ekv_dtype_info *ekv_dtype_get(uint32_t id);
bool ekv_dtype_valid(uint32_t id);
const char *ekv_dtype_name(uint32_t id); /* "unknown" for invalid ids */
/* Parses "f32", "q8_0", "Q4_K", ... (case-insensitive); false if unknown. */
bool ekv_dtype_from_name(const char *name, enum ekv_dtype *out);

/* Bytes of a row of n elements; false when n is not a multiple of the block
 * size or the size overflows. */
bool ekv_dtype_row_bytes(enum ekv_dtype t, int64_t n, size_t *out);

#endif
