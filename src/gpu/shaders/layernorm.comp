#version 450
// layernorm.comp — the vision tower's norms, one workgroup per row: LayerNorm
// y = (x - mean) / sqrt(var + eps) * w + b (ekv_layernorm), or with rms set
// RMSNorm y = x / sqrt(mean(x^2) + eps) * w + b (ekv_rmsnorm_ref, then the
// bias: Qwen2.5-VL's tower); w and b may be absent (address 0). The
// references sum in double, this in float: agreement to rounding, not bits.
// y may be x: each invocation writes only the elements it read. Rows of n
// floats, n a multiple of 4 (the host checks the width % 8).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    F32 x; F32 w; F32 b; F32 y;
    uint n; uint rows; float eps; uint rms;
} pc;
void main() {
    const uint n4 = pc.n / 4u;
    const bool hw = uint64_t(pc.w) != 0ul, hb = uint64_t(pc.b) != 0ul;
    for (uint r = gl_WorkGroupID.x; r < pc.rows; r += gl_NumWorkGroups.x) {
        const uint o = r * n4;
        float mean = 0.0, inv;
        if (pc.rms != 0u) {
            float ss = 0.0;
            for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
                const vec4 v = V4(pc.x).d[o + i];
                ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
            }
            inv = 1.0 / sqrt(wg_sum(ss) / float(pc.n) + pc.eps);
        } else {
            float s = 0.0;
            for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
                const vec4 v = V4(pc.x).d[o + i];
                s += (v.x + v.y) + (v.z + v.w);
            }
            mean = wg_sum(s) / float(pc.n);
            float ss = 0.0;
            for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
                const vec4 v = V4(pc.x).d[o + i] - vec4(mean);
                ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
            }
            inv = 1.0 / sqrt(wg_sum(ss) / float(pc.n) + pc.eps);
        }
        for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
            vec4 v = (V4(pc.x).d[o + i] - vec4(mean)) * inv;
            if (hw) v *= V4(pc.w).d[i];
            if (hb) v += V4(pc.b).d[i];
            V4(pc.y).d[o + i] = v;
        }
    }
}
