#version 450
// argmax.comp — index of the largest of n values per row (the lowest index
// on ties, like the CPU's greedy sampler), written as a uint per row.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P { F32 x; U32 out_; uint n; uint rows; uint stride; } pc;
shared float bv[256];
shared uint bi[256];
void main() {
    const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (row >= pc.rows) return;
    float best = -1.0 / 0.0;
    uint idx = 0xffffffffu;
    for (uint i = tid; i < pc.n; i += 256u) {
        float v = pc.x.d[row * pc.stride + i];
        if (v > best || idx == 0xffffffffu) { best = v; idx = i; }
    }
    bv[tid] = best; bi[tid] = idx;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) {
            float ov = bv[tid + s]; uint oi = bi[tid + s];
            if (oi != 0xffffffffu && (bi[tid] == 0xffffffffu || ov > bv[tid] || (ov == bv[tid] && oi < bi[tid]))) {
                bv[tid] = ov; bi[tid] = oi;
            }
        }
        barrier();
    }
    if (tid == 0u) pc.out_.d[row] = bi[0];
}
