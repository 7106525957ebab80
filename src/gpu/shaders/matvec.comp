#version 450
// matvec.comp — Y[t][r] = (acc ? Y[t][r] : 0) + (sum_c W[r][c] X[t][c] + b[r]),
// the weight products of decode and of prompts. A workgroup is groups of
// L = 32 lanes (see the modes below); each group owns RM weight rows, the
// workgroup NT activation rows (grid y). Compiled per weight type (-DTYPE_*) in three
// shapes: decode (RM 1, NT 8: one pass over the weights serves up to 8
// rows) and prompt (-DPROMPT: RM 4, NT 8: each weight chunk loaded serves
// 8 activation rows, each activation chunk 4 weight rows; where M > 1, the
// decode shape again, to keep CPU-type devices' compiles small), and the
// decode shape for one activation row (-DONE: NT 1).
//
// All shapes add every output up in one fixed order, so a row's result
// does not depend on the shape that computed it nor on the rows that shared
// the dispatch (batch invariance: alone == batched, a prompt in pieces ==
// one piece, prompt == decode), and nothing depends on the subgroup size:
//  - the columns are cut into chunks of 8; chunk k belongs to lane k % 32;
//    a lane's partial is one fma chain over its chunks in order, elements
//    in order (`precise`: no reassociation, no contraction left to choice);
//  - the 32 partials are summed by a fixed tree (j + 16, then + 8, 4, 2, 1);
//    then + bias, then + the old Y.
// 32 / M invocations of a subgroup serve a row, M lanes each, the tree
// partly inside invocations and partly by shuffles; M = 32 / subgroup size
// (1 on GPUs whose subgroups hold 32 or more, 2 for 16, 4 for lavapipe's 8),
// compiled in (-DM=): arrays sized by specialization constants end up in
// memory on some compilers. No barriers, no shared memory, and no runtime
// branches in the loops (CPU-type devices run both sides of a branch).
// Rows are read 16 bytes at a time: ne0 % 8 == 0, x_stride % 4 == 0.
//
// Weight layouts (the host repacks at upload, backend_vk.c):
//   F32, F16, BF16: rows of ne0 values;
//   Q8_0: fp16 scales [ne1][ne0/32] at `s`, int8 quants [ne1][ne0] at `w`;
//   Q4_0: scales likewise, each block's 16 quant bytes [ne1][ne0/32][16] at
//         `w` (low nibbles elements 0-15, high nibbles 16-31, minus 8);
//   Q4_K, Q5_K: the GGUF blocks as stored (144, 176 bytes) at `w`;
//   Q6_K: the GGUF blocks padded to 212 bytes (53 words) at `w`.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle_relative : require

#define L 32
// M: lanes per invocation, 32 / subgroup size (1, 2 or 4; -DM=; the host
// picks the variant by the device's subgroup size)
#ifndef M
#define M 1
#endif
#if defined(PROMPT) && M == 1
#define RM 4 // weight rows per group (small subgroups: as decode)
#else
#define RM 1
#endif
#if defined(ONE)
#define NT 1 // one activation row (decode of one sequence): fewer registers, 6-13% faster on the H200
#else
#define NT 8
#endif
#if RM == 1 && M == 1
#define U 4 // steps of 32 chunks loaded at once (8 measured no faster on the H200)
#else
#define U 1
#endif

layout(local_size_x = 128) in; // 128 / (32 / M) groups
layout(push_constant) uniform P {
    U4 w; F16 s; F32 x; F32 y; F32 b;
    uint ne0; uint ne1; uint n; uint x_stride; uint y_stride;
    uint flags; // 1: accumulate, 2: bias
} pc;
layout(buffer_reference, std430, buffer_reference_align = 8) buffer U2 { uvec2 d[]; };


// the 8 bytes of a uvec2, in memory order
void bytes8(uvec2 u, out uint q[8]) {
    [[unroll]] for (uint e = 0; e < 4; e++) {
        q[e] = (u.x >> (8 * e)) & 0xffu;
        q[e + 4] = (u.y >> (8 * e)) & 0xffu;
    }
}

uint kbyte(uint base, uint i) { return (U32(pc.w).d[base + i / 4] >> (8 * (i % 4))) & 0xffu; }

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (ekv_k_scale_min)
void k_scale_min(uint base, uint j, out uint sc, out uint m) {
    if (j < 4) {
        sc = kbyte(base, 4 + j) & 63u;
        m = kbyte(base, 4 + j + 4) & 63u;
    } else {
        sc = (kbyte(base, 4 + j + 4) & 0xfu) | ((kbyte(base, 4 + j - 4) >> 6) << 4);
        m = (kbyte(base, 4 + j + 4) >> 4) | ((kbyte(base, 4 + j) >> 6) << 4);
    }
}

// The 8 weights of chunk k of row r.
void wchunk(uint r, uint k, out float w[8]) {
#if defined(TYPE_F32)
    vec4 a = V4(pc.w).d[(r * pc.ne0) / 4 + 2 * k], b = V4(pc.w).d[(r * pc.ne0) / 4 + 2 * k + 1];
    w = float[8](a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
#elif defined(TYPE_F16) || defined(TYPE_BF16)
    uint h[8];
    uvec4 u = pc.w.d[(r * pc.ne0) / 8 + k];
    [[unroll]] for (uint e = 0; e < 4; e++) {
        h[2 * e] = u[e] & 0xffffu;
        h[2 * e + 1] = u[e] >> 16;
    }
    [[unroll]] for (uint e = 0; e < 8; e++)
#if defined(TYPE_F16)
        w[e] = unpackHalf2x16(h[e]).x;
#else
        w[e] = uintBitsToFloat(h[e] << 16);
#endif
#elif defined(TYPE_Q8_0)
    const float d = float(pc.s.d[r * (pc.ne0 / 32) + k / 4]);
    uvec2 u = U2(pc.w).d[(r * pc.ne0) / 8 + k];
    uint q[8];
    bytes8(u, q);
    [[unroll]] for (uint e = 0; e < 8; e++) w[e] = d * float(bitfieldExtract(int(q[e]), 0, 8));
#elif defined(TYPE_Q4_0)
    const uint nb = pc.ne0 / 32, blk = r * nb + k / 4;
    const float d = float(pc.s.d[blk]);
    uvec2 u = U2(pc.w).d[blk * 2 + (k & 1u)];
    uint q[8];
    bytes8(u, q);
    const uint sh = ((k & 3u) >> 1) * 4; // chunks 2, 3 of a block: the high nibbles
    [[unroll]] for (uint e = 0; e < 8; e++) w[e] = d * (float((q[e] >> sh) & 15u) - 8.0);
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
#if defined(TYPE_Q4_K)
    const uint words = 36, qs_off = 16;
#else
    const uint words = 44, qs_off = 48;
#endif
    const uint base = (r * (pc.ne0 / 256) + k / 32) * words;
    const uint e0 = (k % 32) * 8, j = e0 / 32, l = e0 % 32;
    const vec2 dm = unpackHalf2x16(U32(pc.w).d[base]);
    uint sc, m;
    k_scale_min(base, j, sc, m);
    const float d1 = dm.x * float(sc), m1 = dm.y * float(m);
    const uint qo = base + (qs_off + (j / 2) * 32 + l) / 4;
    uint q[8];
    bytes8(uvec2(U32(pc.w).d[qo], U32(pc.w).d[qo + 1]), q);
    const uint sh = (j & 1u) * 4;
#if defined(TYPE_Q5_K)
    const uint ho = base + (16 + l) / 4;
    uint qh[8];
    bytes8(uvec2(U32(pc.w).d[ho], U32(pc.w).d[ho + 1]), qh);
#endif
    [[unroll]] for (uint e = 0; e < 8; e++) {
        uint v = (q[e] >> sh) & 15u;
#if defined(TYPE_Q5_K)
        v |= ((qh[e] >> j) & 1u) << 4;
#endif
        w[e] = d1 * float(v) - m1;
    }
#elif defined(TYPE_Q6_K)
    const uint base = (r * (pc.ne0 / 256) + k / 32) * 53;
    const uint e0 = (k % 32) * 8, h = e0 / 128, g = (e0 % 128) / 32, l = e0 % 32;
    const float d = unpackHalf2x16(U32(pc.w).d[base + 52]).x;
    const int sc = bitfieldExtract(int(kbyte(base, 192 + h * 8 + g * 2 + l / 16)), 0, 8);
    const float ds = d * float(sc);
    const uint lo = base + (h * 64 + l + (g & 1u) * 32) / 4, hi = base + (128 + h * 32 + l) / 4;
    uint ql[8], qh[8];
    bytes8(uvec2(U32(pc.w).d[lo], U32(pc.w).d[lo + 1]), ql);
    bytes8(uvec2(U32(pc.w).d[hi], U32(pc.w).d[hi + 1]), qh);
    [[unroll]] for (uint e = 0; e < 8; e++) {
        int v = int(((ql[e] >> ((g >> 1) * 4)) & 15u) | (((qh[e] >> (2 * g)) & 3u) << 4)) - 32;
        w[e] = ds * float(v);
    }
#else
#error "define TYPE_F32, TYPE_F16, TYPE_BF16, TYPE_Q8_0, TYPE_Q4_0, TYPE_Q4_K, TYPE_Q5_K or TYPE_Q6_K"
#endif
}

// 8 values of row t of a [n][x_stride] array at `a`, from column 8k
void load8(F32 a, uint t, uint k, out float x[8]) {
    const uint o = (t * pc.x_stride) / 4 + 2 * k;
    vec4 p = V4(a).d[o], q = V4(a).d[o + 1];
    x = float[8](p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w);
}

// Y[t][r] from the row's sum: + bias, then + the old value
void store(uint r, uint t, float sum) {
    precise float v = sum;
    const uint yo = t * pc.y_stride + r;
    if ((pc.flags & 2u) != 0u) v = v + pc.b.d[r];
    if ((pc.flags & 1u) != 0u) v = v + pc.y.d[yo];
    pc.y.d[yo] = v;
}

// ---- a group of 32 / M invocations of one subgroup serves the 32 lanes of
// a weight row, M lanes each: invocation q holds lanes q + m * (32 / M). The
// tree's levels of stride 32 / M and more are added up inside an
// invocation, the smaller ones by shuffles: the same additions as the tree
// over the 32 lanes.
#define SE (L / M) // invocations per group

// The tree over a group's lanes, each invocation holding M of them; the sum is in invocation q == 0.
float tree32(float v[M]) {
    precise float a[M];
    [[unroll]] for (uint m = 0; m < M; m++) a[m] = v[m];
    [[unroll]] for (uint s = M / 2; s > 0; s >>= 1) // strides s * SE: inside the invocation
        [[unroll]] for (uint m = 0; m < s; m++) a[m] = a[m] + a[m + s];
    precise float r = a[0];
    [[unroll]] for (uint s = SE / 2; s > 0; s >>= 1) r = r + subgroupShuffleDown(r, s);
    return r;
}

void main() {
    const uint q = gl_LocalInvocationID.x % SE, grp = gl_LocalInvocationID.x / SE;
    const uint n_grp = gl_WorkGroupSize.x / SE;
    const uint t0 = gl_WorkGroupID.y * NT, nt = min(uint(NT), pc.n - t0);
    const uint nk = (pc.ne0 + 7) / 8;
    for (uint rb = gl_WorkGroupID.x * (n_grp * RM); rb < pc.ne1; rb += gl_NumWorkGroups.x * (n_grp * RM)) {
        const uint r0 = rb + grp * RM;
        precise float acc[M][RM][NT];
        [[unroll]] for (uint m = 0; m < M; m++)
            [[unroll]] for (uint i = 0; i < RM; i++)
                [[unroll]] for (uint t = 0; t < NT; t++) acc[m][i][t] = 0.0;
        // U steps of 32 chunks each, the weights loaded before any
        // arithmetic (loads in flight); each lane's chunks in order
        for (uint k0 = q; k0 < nk; k0 += L * U) {
            float w[U][M][RM][8];
            [[unroll]] for (uint u = 0; u < U; u++)
                [[unroll]] for (uint m = 0; m < M; m++)
                    [[unroll]] for (uint i = 0; i < RM; i++) {
                        const uint k = k0 + u * L + m * SE;
                        if (r0 + i < pc.ne1 && k < nk) wchunk(r0 + i, k, w[u][m][i]);
                        else w[u][m][i] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
                    }
            [[unroll]] for (uint u = 0; u < U; u++)
                [[unroll]] for (uint m = 0; m < M; m++) {
                    const uint k = k0 + u * L + m * SE;
                    if (k < nk) {
                        [[unroll]] for (uint t = 0; t < NT; t++) {
                            if (t < nt) {
                                float xv[8];
                                load8(pc.x, t0 + t, k, xv);
                                [[unroll]] for (uint i = 0; i < RM; i++)
                                    [[unroll]] for (uint e = 0; e < 8; e++)
                                        acc[m][i][t] = fma(w[u][m][i][e], xv[e], acc[m][i][t]);
                            }
                        }
                    }
                }
        }
        [[unroll]] for (uint i = 0; i < RM; i++)
            [[unroll]] for (uint t = 0; t < NT; t++) {
                if (t < nt) { // uniform
                    float v[M];
                    [[unroll]] for (uint m = 0; m < M; m++) v[m] = acc[m][i][t];
                    const float sum = tree32(v);
                    if (q == 0u && r0 + i < pc.ne1) store(r0 + i, t0 + t, sum);
                }
            }
    }
}
