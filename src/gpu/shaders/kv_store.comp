#version 450
// kv_store.comp — appends the keys and values of a forward's rows to a
// layer's full cache: K and V [n_head_kv][n_ctx][head_dim], f16 (F16) or
// f32 (F32 defined), entry index = position.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    F32 k; F32 v; F32 kc; F32 vc;
    uint n_head_kv; uint head_dim; uint n_ctx; uint pos0; uint rows; uint kv_stride; uint f32;
} pc;
void main() {
    const uint row = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    if (row >= pc.rows) return;
    const uint src = row * pc.kv_stride + h * pc.head_dim;
    const uint dst = (h * pc.n_ctx + pc.pos0 + row) * pc.head_dim;
    for (uint i = gl_LocalInvocationID.x; i < pc.head_dim; i += gl_WorkGroupSize.x) {
        if (pc.f32 != 0u) {
            pc.kc.d[dst + i] = pc.k.d[src + i];
            pc.vc.d[dst + i] = pc.v.d[src + i];
        } else {
            F16(pc.kc).d[dst + i] = float16_t(pc.k.d[src + i]);
            F16(pc.vc).d[dst + i] = float16_t(pc.v.d[src + i]);
        }
    }
}
