/*
 * dtype.c — block geometry of the GGML tensor types (facts of the GGUF
 * format), used for validation and for describing files.
 */
#include <strings.h>

#include "core/dtype.h"
#include "core/util.h"

static const struct ekv_dtype_info k_types[EKV_DTYPE_COUNT] = {
    [EKV_F32] = {"f32", 1, 4},         [EKV_F16] = {"f16", 1, 2},
    [EKV_Q4_0] = {"q4_0", 32, 18},     [EKV_Q4_1] = {"q4_1", 32, 20},
    [EKV_Q5_0] = {"q5_0", 32, 22},     [EKV_Q5_1] = {"q5_1", 32, 24},
    [EKV_Q8_0] = {"q8_0", 32, 34},     [EKV_Q8_1] = {"q8_1", 32, 36},
    [EKV_Q2_K] = {"q2_K", 256, 84},    [EKV_Q3_K] = {"q3_K", 256, 110},
    [EKV_Q4_K] = {"q4_K", 256, 144},   [EKV_Q5_K] = {"q5_K", 256, 176},
    [EKV_Q6_K] = {"q6_K", 256, 210},   [EKV_Q8_K] = {"q8_K", 256, 292},
    [EKV_IQ2_XXS] = {"iq2_xxs", 256, 66}, [EKV_IQ2_XS] = {"iq2_xs", 256, 74},
    [EKV_IQ3_XXS] = {"iq3_xxs", 256, 98}, [EKV_IQ1_S] = {"iq1_s", 256, 50},
    [EKV_IQ4_NL] = {"iq4_nl", 32, 18},  [EKV_IQ3_S] = {"iq3_s", 256, 110},
    [EKV_IQ2_S] = {"iq2_s", 256, 82},   [EKV_IQ4_XS] = {"iq4_xs", 256, 136},
    [EKV_I8] = {"i8", 1, 1},   [EKV_I16] = {"i16", 1, 2}, [EKV_I32] = {"i32", 1, 4},
    [EKV_I64] = {"i64", 1, 8}, [EKV_F64] = {"f64", 1, 8},
    [EKV_IQ1_M] = {"iq1_m", 256, 56},  [EKV_BF16] = {"bf16", 1, 2},
    [EKV_TQ1_0] = {"tq1_0", 256, 54},  [EKV_TQ2_0] = {"tq2_0", 256, 66},
};

const struct ekv_dtype_info *ekv_dtype_get(uint32_t id) {
    static const struct ekv_dtype_info none = {NULL, 0, 0};
    if (id >= EKV_DTYPE_COUNT || !k_types[id].name) return &none;
    return &k_types[id];
}

bool ekv_dtype_valid(uint32_t id) { return ekv_dtype_get(id)->name != NULL; }

const char *ekv_dtype_name(uint32_t id) {
    const char *n = ekv_dtype_get(id)->name;
    return n ? n : "unknown";
}

bool ekv_dtype_from_name(const char *name, enum ekv_dtype *out) {
    for (uint32_t i = 0; i < EKV_DTYPE_COUNT; i++) {
        if (k_types[i].name && strcasecmp(k_types[i].name, name) == 0) {
            *out = (enum ekv_dtype)i;
            return true;
        }
    }
    return false;
}

bool ekv_dtype_row_bytes(enum ekv_dtype t, int64_t n, size_t *out) {
    const struct ekv_dtype_info *ti = ekv_dtype_get((uint32_t)t);
    if (!ti->name || n < 0 || (uint64_t)n % ti->block_size) return false;
    return ekv_mul_ok((size_t)((uint64_t)n / ti->block_size), ti->type_size, out);
}
