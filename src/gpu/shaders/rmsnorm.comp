#version 450
// rmsnorm.comp — y = x / sqrt(mean(x^2) + eps) * w, one workgroup per row
// (ekv_rmsnorm_ref is the reference). Rows are read 16 bytes at a time
// (n, x_stride and y_stride multiples of 4; the host checks widths % 8).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    F32 x; F32 w; F32 y;
    uint n; uint rows; uint x_stride; uint y_stride; float eps;
} pc;
void main() {
    const uint n4 = pc.n / 4u;
    for (uint r = gl_WorkGroupID.x; r < pc.rows; r += gl_NumWorkGroups.x) {
        const uint xo = r * pc.x_stride / 4u, yo = r * pc.y_stride / 4u;
        float ss = 0.0;
        for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
            const vec4 v = V4(pc.x).d[xo + i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = wg_sum(ss);
        const float scale = 1.0 / sqrt(ss / float(pc.n) + pc.eps);
        for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x)
            V4(pc.y).d[yo + i] = (V4(pc.x).d[xo + i] * scale) * V4(pc.w).d[i];
    }
}
