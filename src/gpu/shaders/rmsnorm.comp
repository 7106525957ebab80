#version 450
// rmsnorm.comp — y = x / sqrt(mean(x^2) + eps) * w, one workgroup per row
// (ekv_rmsnorm_ref is the reference).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    F32 x; F32 w; F32 y;
    uint n; uint rows; uint x_stride; uint y_stride; float eps;
} pc;
void main() {
    for (uint r = gl_WorkGroupID.x; r < pc.rows; r += gl_NumWorkGroups.x) {
        uint xo = r * pc.x_stride, yo = r * pc.y_stride;
        float ss = 0.0;
        for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
            float v = pc.x.d[xo + i];
            ss += v * v;
        }
        ss = wg_sum(ss);
        float scale = 1.0 / sqrt(ss / float(pc.n) + pc.eps);
        for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x)
            pc.y.d[yo + i] = (pc.x.d[xo + i] * scale) * pc.w.d[i];
    }
}
