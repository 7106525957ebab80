/*
 * quant.h — internal to src/kernels: the GGML block layouts ekv computes
 * with, the reference (plain C) block codecs and dot products, and the
 * table through which matmul.c dispatches to a reference or SIMD path.
 * Layouts are facts of the GGUF/GGML format; the code is ekv's own.
 */
#ifndef EKV_QUANT_H
#define EKV_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "kernels/kernels.h"

#define EKV_QK8_0 32
#define EKV_QK4_0 32
#define EKV_QK_K 256
#define EKV_K_SCALE_SIZE 12

/* Q8_0: 32 values, value = qs[i] * d. 34 bytes. */
struct ekv_block_q8_0 {
    uint16_t d;                 /* fp16 scale */
    int8_t qs[EKV_QK8_0];
};

/* Q4_0: 32 values, value = (q - 8) * d; qs[j] low nibble = element j,
 * high nibble = element j + 16. 18 bytes. */
struct ekv_block_q4_0 {
    uint16_t d;                 /* fp16 scale */
    uint8_t qs[EKV_QK4_0 / 2];
};

/* Q4_K: super-block of 256 = 8 sub-blocks of 32; value =
 * d*sc[j]*q - dmin*m[j], with 6-bit sc/m packed in scales[12]; qs holds
 * 4-bit quants, 32 bytes per pair of sub-blocks (low nibbles = first 32,
 * high nibbles = second 32). 144 bytes. */
struct ekv_block_q4_K {
    uint16_t d;                 /* fp16 super-block scale for the scales */
    uint16_t dmin;              /* fp16 super-block scale for the mins */
    uint8_t scales[EKV_K_SCALE_SIZE];
    uint8_t qs[EKV_QK_K / 2];
};

/* Q5_K: as Q4_K plus a fifth bit per value in qh[32] (bit 2k / 2k+1 of
 * qh[l] for the l-th value of the k-th pair of sub-blocks). 176 bytes. */
struct ekv_block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[EKV_K_SCALE_SIZE];
    uint8_t qh[EKV_QK_K / 8];
    uint8_t qs[EKV_QK_K / 2];
};

/* Q6_K: 16 sub-blocks of 16, value = d * scales[j] * (q - 32) with q a
 * 6-bit value: 4 low bits in ql[128], 2 high bits in qh[64]. 210 bytes. */
struct ekv_block_q6_K {
    uint8_t ql[EKV_QK_K / 2];
    uint8_t qh[EKV_QK_K / 4];
    int8_t scales[EKV_QK_K / 16];
    uint16_t d;                 /* fp16 */
};

/* Q8_K: activation format for the K-quant dots: value = qs[i] * d;
 * bsums[j] = sum of qs[16j .. 16j+15]. 292 bytes. */
struct ekv_block_q8_K {
    float d;
    int8_t qs[EKV_QK_K];
    int16_t bsums[EKV_QK_K / 16];
};

/* Q8_0 activation block of the SIMD kernels: the values ekv_quant_q8_0
 * writes, with the scale already widened (d = the fp16 scale as a float,
 * the same number) and s = sum(qs), from which the kernels form the
 * correction an unsigned x signed int8 dot needs when the weights are
 * stored biased by +bias: -bias * s (128 for X16 Q8_0, 8 for Q4_0
 * nibbles). One format for both weight types. 40 bytes. */
struct ekv_block_q8_0x {
    float d;
    int32_t s;
    int8_t qs[EKV_QK8_0];
};

/* Bytes of one block column of one group of 16 rows in EKV_LAYOUT_X16:
 * 16 fp16 scales, then the quants. */
#define EKV_X16_Q8_0_BYTES (32 + 16 * 32)
#define EKV_X16_Q4_0_BYTES (32 + 16 * 16)

_Static_assert(sizeof(struct ekv_block_q8_0x) == 40, "q8_0x size");
_Static_assert(sizeof(struct ekv_block_q8_0) == 34, "q8_0 size");
_Static_assert(sizeof(struct ekv_block_q4_0) == 18, "q4_0 size");
_Static_assert(sizeof(struct ekv_block_q4_K) == 144, "q4_K size");
_Static_assert(sizeof(struct ekv_block_q5_K) == 176, "q5_K size");
_Static_assert(sizeof(struct ekv_block_q6_K) == 210, "q6_K size");
_Static_assert(sizeof(struct ekv_block_q8_K) == 292, "q8_K size");

/* ---- reference codecs (quant.c); n is a multiple of the block size ---- */
void ekv_dequant_f16(const void *src, float *dst, int64_t n);
void ekv_dequant_bf16(const void *src, float *dst, int64_t n);
void ekv_dequant_q8_0(const void *src, float *dst, int64_t n);
void ekv_dequant_q4_0(const void *src, float *dst, int64_t n);
void ekv_dequant_q4_K(const void *src, float *dst, int64_t n);
void ekv_dequant_q5_K(const void *src, float *dst, int64_t n);
void ekv_dequant_q6_K(const void *src, float *dst, int64_t n);
void ekv_dequant_q8_K(const void *src, float *dst, int64_t n);

void ekv_quant_f16(const float *src, void *dst, int64_t n);
void ekv_quant_bf16(const float *src, void *dst, int64_t n);
void ekv_quant_q8_0(const float *src, void *dst, int64_t n);
void ekv_quant_q4_0(const float *src, void *dst, int64_t n);
void ekv_quant_q4_K(const float *src, void *dst, int64_t n);
void ekv_quant_q5_K(const float *src, void *dst, int64_t n);
void ekv_quant_q6_K(const float *src, void *dst, int64_t n);
void ekv_quant_q8_K(const float *src, void *dst, int64_t n);

/* Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K. */
static inline void ekv_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- dot products: s = dot(weight row, activation row) over n elements.
 * The activation is in the weight type's activation format (see
 * ekv_act_type). ---- */
typedef void (*ekv_vec_dot_fn)(int64_t n, float *s, const void *w, const void *xa);

void ekv_dot_f32_f32_ref(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_f16_f32_ref(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_bf16_f32_ref(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_q8_0_q8_0_ref(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_q4_0_q8_0_ref(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_q4_K_q8_K_ref(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_q5_K_q8_K_ref(int64_t n, float *s, const void *w, const void *xa);
void ekv_dot_q6_K_q8_K_ref(int64_t n, float *s, const void *w, const void *xa);

/* ---- row-range drivers (what a thread runs) ----
 * gemm: y[t*ldy + r] = W[r] . xa_t for r in [r0, r1), t < n, where
 *       activation row t starts at (const char *)xa + t * xa_stride;
 *       for EKV_LAYOUT_X16 weights r0 and r1 are multiples of 16 (or r1 = ne1).
 * gemv: the same for n = 1 (optional; gemm serves otherwise). */
typedef void (*ekv_gemv_fn)(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa, float *y);
typedef void (*ekv_gemm_fn)(const struct ekv_weight *w, int64_t r0, int64_t r1, const void *xa,
                            size_t xa_stride, int64_t n, float *y, int64_t ldy);

/* One weight type's kernels on one ISA. NULL gemv/gemm: matmul.c loops
 * over vec_dot; NULL gemm_x16: matmul.c unpacks X16 rows and uses vec_dot. */
struct ekv_type_kernels {
    ekv_vec_dot_fn vec_dot;
    ekv_gemv_fn gemv;
    ekv_gemm_fn gemm;       /* EKV_LAYOUT_ROWS */
    ekv_gemm_fn gemm_x16;   /* EKV_LAYOUT_X16 */
    /* converts n floats to the activation format (NULL for F32 activations) */
    void (*quantize_act)(const float *src, void *dst, int64_t n);
    /* activation format: bytes per block of act_block elements (0: floats) */
    size_t act_block_bytes;
    int act_block;
};

/* Activation format of weight type t in the reference kernels: EKV_F32,
 * EKV_Q8_0 or EKV_Q8_K. */
enum ekv_dtype ekv_act_type(enum ekv_dtype t);

/* Reference table entry (quant.c); zeroed for types ekv cannot compute. */
const struct ekv_type_kernels *ekv_kernels_ref(enum ekv_dtype t);

/* SIMD levels, each a superset of the one before. */
enum ekv_isa { EKV_ISA_REF = 0, EKV_ISA_AVX2 = 1, EKV_ISA_AVXVNNI = 2, EKV_ISA_AVX512 = 3, EKV_ISA_COUNT };
/* The best level this CPU (and OS) runs. */
enum ekv_isa ekv_cpu_isa(void);
/* The level the kernels use now (EKV_ISA cap, ekv_kernels_set_isa,
 * ekv_kernels_use_reference applied). */
enum ekv_isa ekv_kernels_level(void);
/* Table entries per level, each filled over the level below (NULL members
 * fall back); called only when the CPU runs the level.
 * AVX2 = AVX2+FMA+F16C; AVX-VNNI adds vpdpbusd on 256 bits; AVX-512 =
 * F/BW/VL/DQ + VNNI. */
void ekv_kernels_avx2_fill(enum ekv_dtype t, struct ekv_type_kernels *k);
void ekv_kernels_avxvnni_fill(enum ekv_dtype t, struct ekv_type_kernels *k);
void ekv_kernels_avx512_fill(enum ekv_dtype t, struct ekv_type_kernels *k);
/* true when the AVX2 sources were compiled in and the CPU runs them */
bool ekv_cpu_has_avx2(void);

/* X16 layout (repack.c): row r of w (any layout) in GGUF row form, written
 * to dst (w->row_bytes bytes). */
void ekv_x16_unpack_row(const struct ekv_weight *w, int64_t r, void *dst);

/* Q8_0x activation quantiser (q8_avx2.c): the same values as
 * ekv_quant_q8_0, and the sums. */
void ekv_quant_q8_0x_avx2(const float *src, void *dst, int64_t n);
/* Reference of the same (quant.c). */
void ekv_quant_q8_0x_ref(const float *src, void *dst, int64_t n);

/* Element-wise ops with SIMD variants (ops.c holds the references). */
float ekv_dot_f32_ref(const float *a, const float *b, int64_t n);
void ekv_axpy_f32_ref(float *y, float a, const float *x, int64_t n);
void ekv_rmsnorm_ref(float *out, const float *x, const float *w, int64_t n, float eps);
void ekv_softmax_ref(float *x, int64_t n);
void ekv_swiglu_ref(float *out, const float *gate, const float *up, int64_t n);

float ekv_dot_f32_avx2(const float *a, const float *b, int64_t n);
void ekv_axpy_f32_avx2(float *y, float a, const float *x, int64_t n);
void ekv_rmsnorm_avx2(float *out, const float *x, const float *w, int64_t n, float eps);
void ekv_softmax_avx2(float *x, int64_t n);
void ekv_swiglu_avx2(float *out, const float *gate, const float *up, int64_t n);

/* True when the SIMD paths are in use (CPU support and not forced off). */
bool ekv_kernels_simd(void);

#endif
