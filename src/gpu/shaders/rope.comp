#version 450
// rope.comp — rotary embedding of the query and key rows of a forward with
// per-row {cos, sin} tables computed on the host by ekv_rope_sincos_ext
// (so every scaling the CPU knows — linear, YaRN, Llama-3 factors, Phi-3
// long/short — is the same numbers here). Pairs (2i, 2i+1), or halves
// (i, i + rope_dim/2) for NeoX; like ekv_rope_apply.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    F32 q; F32 k; F32 cs;
    uint n_head; uint n_head_kv; uint head_dim; uint rope_dim; uint neox; uint rows;
    uint q_stride; uint k_stride;
} pc;
void main() {
    const uint row = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    if (row >= pc.rows) return;
    const bool isq = h < pc.n_head;
    const uint half_ = pc.rope_dim / 2;
    F32 x = isq ? pc.q : pc.k;
    const uint base = isq ? row * pc.q_stride + h * pc.head_dim : row * pc.k_stride + (h - pc.n_head) * pc.head_dim;
    for (uint i = gl_LocalInvocationID.x; i < half_; i += gl_WorkGroupSize.x) {
        uint i0 = pc.neox != 0u ? i : 2 * i;
        uint i1 = pc.neox != 0u ? i + half_ : 2 * i + 1;
        float c = pc.cs.d[row * pc.rope_dim + 2 * i], s = pc.cs.d[row * pc.rope_dim + 2 * i + 1];
        float a = x.d[base + i0], b = x.d[base + i1];
        x.d[base + i0] = a * c - b * s;
        x.d[base + i1] = a * s + b * c;
    }
}
