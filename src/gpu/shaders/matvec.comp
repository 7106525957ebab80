#version 450
// matvec.comp — Y[t][r] = (acc ? Y[t][r] : 0) + sum_c W[r][c] X[t][c] (+ b[r]),
// for up to 8 rows t of X per workgroup, one output row r per subgroup
// (grid-stride over rows, whatever the subgroup size: the host's grid
// size is only a hint). One pass over the weight row serves all 8
// activation rows; the sum is a subgroup reduction, no barrier. Compiled once per weight type (-DTYPE_*):
//   F32, F16, BF16: rows of ne0 values (vector loads when ne0 % 8 == 0);
//   Q8_0: repacked at upload, fp16 scales [ne1][ne0/32] at `s`, int8
//         quants [ne1][ne0] at `w`;
//   Q4_0: scales likewise, the blocks' 16 quant bytes [ne1][ne0/32][16] at `w`
//         (low nibbles elements 0-15, high nibbles 16-31, minus 8).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
layout(local_size_x = 128) in;
layout(push_constant) uniform P {
    U4 w; F16 s; F32 x; F32 y; F32 b;
    uint ne0; uint ne1; uint n; uint x_stride; uint y_stride; uint flags; // 1: accumulate, 2: bias
} pc;
#define NT 8

float xv(uint t, uint c) { return pc.x.d[t * pc.x_stride + c]; }

void main() {
    const uint t0 = gl_WorkGroupID.y * NT;
    const uint nt = min(uint(NT), pc.n - t0);
    const uint tid = gl_SubgroupInvocationID, nth = gl_SubgroupSize;
    for (uint r = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; r < pc.ne1;
         r += gl_NumWorkGroups.x * gl_NumSubgroups) {
        float acc[NT];
        for (uint t = 0; t < NT; t++) acc[t] = 0.0;
#if defined(TYPE_F32)
        F32 wf = F32(pc.w);
        const uint base = r * pc.ne0;
        if ((pc.ne0 & 3u) == 0u && (pc.x_stride & 3u) == 0u) {
            V4 w4 = V4(pc.w);
            V4 x4 = V4(pc.x);
            for (uint c = tid; c < pc.ne0 / 4; c += nth) {
                vec4 wv = w4.d[base / 4 + c];
                [[unroll]] for (uint t = 0; t < NT; t++) if (t < nt) acc[t] += dot(wv, x4.d[((t0 + t) * pc.x_stride) / 4 + c]);
            }
        } else {
            for (uint c = tid; c < pc.ne0; c += nth) {
                float wv = wf.d[base + c];
                [[unroll]] for (uint t = 0; t < NT; t++) if (t < nt) acc[t] += wv * xv(t0 + t, c);
            }
        }
#elif defined(TYPE_F16) || defined(TYPE_BF16)
        if ((pc.ne0 & 7u) == 0u && (pc.x_stride & 3u) == 0u) {
            const uint base = r * (pc.ne0 / 8), nv = pc.ne0 / 8;
            for (uint c0 = tid; c0 < nv; c0 += 2 * nth) {
                // two 16-byte loads in flight per lane before any arithmetic
                uvec4 uu[2];
                uu[0] = pc.w.d[base + c0];
                uu[1] = c0 + nth < nv ? pc.w.d[base + c0 + nth] : uvec4(0);
                [[unroll]] for (uint k = 0; k < 2; k++) {
                    const uint c = c0 + k * nth;
                    if (c >= nv) break;
                    uvec4 u = uu[k];
#if defined(TYPE_F16)
                    vec4 w0 = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)), w1 = vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w));
#else
                    vec4 w0 = vec4(uintBitsToFloat(u.x << 16), uintBitsToFloat(u.x & 0xffff0000u),
                                   uintBitsToFloat(u.y << 16), uintBitsToFloat(u.y & 0xffff0000u));
                    vec4 w1 = vec4(uintBitsToFloat(u.z << 16), uintBitsToFloat(u.z & 0xffff0000u),
                                   uintBitsToFloat(u.w << 16), uintBitsToFloat(u.w & 0xffff0000u));
#endif
                    [[unroll]] for (uint t = 0; t < NT; t++) if (t < nt) {
                        uint xo = ((t0 + t) * pc.x_stride) / 4 + 2 * c;
                        acc[t] += dot(w0, V4(pc.x).d[xo]) + dot(w1, V4(pc.x).d[xo + 1]);
                    }
                }
            }
        } else {
            U16 w16 = U16(pc.w);
            const uint base = r * pc.ne0;
            for (uint c = tid; c < pc.ne0; c += nth) {
                uint h = uint(w16.d[base + c]);
#if defined(TYPE_F16)
                float wv = unpackHalf2x16(h).x;
#else
                float wv = uintBitsToFloat(h << 16);
#endif
                [[unroll]] for (uint t = 0; t < NT; t++) if (t < nt) acc[t] += wv * xv(t0 + t, c);
            }
        }
#elif defined(TYPE_Q8_0)
        // 16 quants (one uvec4) per step; a block of 32 is two steps
        const uint nb = pc.ne0 / 32;
        const uint base = r * (pc.ne0 / 16), nv = pc.ne0 / 16;
        for (uint c0 = tid; c0 < nv; c0 += 2 * nth) {
            // two 16-byte loads (and their scales) in flight per lane
            uvec4 uu[2];
            float dd[2];
            uu[0] = pc.w.d[base + c0];
            dd[0] = float(pc.s.d[r * nb + c0 / 2]);
            const bool two = c0 + nth < nv;
            uu[1] = two ? pc.w.d[base + c0 + nth] : uvec4(0);
            dd[1] = two ? float(pc.s.d[r * nb + (c0 + nth) / 2]) : 0.0;
            [[unroll]] for (uint h = 0; h < 2; h++) {
                const uint c = c0 + h * nth;
                if (c >= nv) break;
                vec4 q[4];
                [[unroll]] for (uint k = 0; k < 4; k++) {
                    uint v = uu[h][k];
                    q[k] = vec4(float(bitfieldExtract(int(v), 0, 8)), float(bitfieldExtract(int(v), 8, 8)),
                                float(bitfieldExtract(int(v), 16, 8)), float(bitfieldExtract(int(v), 24, 8)));
                }
                [[unroll]] for (uint t = 0; t < NT; t++) if (t < nt) {
                    uint xo = ((t0 + t) * pc.x_stride) / 4 + 4 * c;
                    V4 x4 = V4(pc.x);
                    acc[t] += dd[h] * (dot(q[0], x4.d[xo]) + dot(q[1], x4.d[xo + 1]) + dot(q[2], x4.d[xo + 2]) +
                                       dot(q[3], x4.d[xo + 3]));
                }
            }
        }
#elif defined(TYPE_Q4_0)
        const uint nb = pc.ne0 / 32;
        for (uint c = tid; c < nb; c += nth) {
            uvec4 u = pc.w.d[r * nb + c];
            float d = float(pc.s.d[r * nb + c]);
            vec4 lo[4], hi[4];
            for (uint k = 0; k < 4; k++) {
                uint v = u[k];
                lo[k] = vec4(float(v & 15u), float((v >> 8) & 15u), float((v >> 16) & 15u), float((v >> 24) & 15u)) - 8.0;
                hi[k] = vec4(float((v >> 4) & 15u), float((v >> 12) & 15u), float((v >> 20) & 15u), float(v >> 28)) - 8.0;
            }
            [[unroll]] for (uint t = 0; t < NT; t++) if (t < nt) {
                uint xo = ((t0 + t) * pc.x_stride) / 4 + 8 * c;
                V4 x4 = V4(pc.x);
                float sum = 0.0;
                for (uint k = 0; k < 4; k++) sum += dot(lo[k], x4.d[xo + k]) + dot(hi[k], x4.d[xo + 4 + k]);
                acc[t] += d * sum;
            }
        }
#else
#error "define TYPE_F32, TYPE_F16, TYPE_BF16, TYPE_Q8_0 or TYPE_Q4_0"
#endif
        [[unroll]] for (uint t = 0; t < NT; t++) if (t < nt) {
            float v = subgroupAdd(acc[t]);
            if (subgroupElect()) {
                uint yo = (t0 + t) * pc.y_stride + r;
                if ((pc.flags & 2u) != 0u) v += pc.b.d[r];
                if ((pc.flags & 1u) != 0u) v += pc.y.d[yo];
                pc.y.d[yo] = v;
            }
        }
    }
}
