/*
 * matmul_avx512.c — the AVX-512 table (F/BW/VL/DQ + VNNI): what this level
 * adds over the AVX2 entries it starts from.
 */
#include "kernels/quant.h"

void ekv_q8_fill_avx512(enum ekv_dtype t, struct ekv_type_kernels *k);
void ekv_float_fill_avx512(enum ekv_dtype t, struct ekv_type_kernels *k);

void ekv_kernels_avx512_fill(enum ekv_dtype t, struct ekv_type_kernels *k) {
    switch (t) {
    case EKV_Q8_0: case EKV_Q4_0: ekv_q8_fill_avx512(t, k); break;
    case EKV_F32: case EKV_F16: case EKV_BF16: ekv_float_fill_avx512(t, k); break;
    default: break;
    }
}
