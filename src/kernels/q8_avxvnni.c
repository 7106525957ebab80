/*
 * q8_avxvnni.c — AVX-VNNI copy of the Q8_0/Q4_0 kernels of q8_256.h: the
 * int8 dots are vpdpbusd (VEX, 256 bits), for CPUs with AVX-VNNI but no
 * AVX-512. Same results as the AVX2 copy and the reference, bit for bit.
 */
#define Q8_VNNI 1
#define Q8_FN(name) name##_avxvnni
#include "kernels/q8_256.h"

void ekv_kernels_avxvnni_fill(enum ekv_dtype t, struct ekv_type_kernels *k) { fill_avxvnni(t, k); }
