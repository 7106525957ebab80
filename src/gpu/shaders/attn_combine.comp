#version 450
// attn_combine.comp — merges attn.comp's splits of each (row, head):
// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s.
// With ml != 0 it also writes each (row, head)'s M and L = sum_s l_s e^(m_s - M)
// to ml[row][head][2] (attn_stats.comp turns scores into probabilities with them).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    F32 part; F32 out_; F32 ml;
    uint n_head; uint head_dim; uint rows; uint n_split; uint out_stride;
} pc;
void main() {
    const uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y;
    const uint D = pc.head_dim;
    const uint base = (row * pc.n_head + h) * pc.n_split * (D + 2u);
    float M = -1.0 / 0.0;
    for (uint s = 0; s < pc.n_split; s++) M = max(M, pc.part.d[base + s * (D + 2u) + D]);
    float L = 0.0;
    for (uint s = 0; s < pc.n_split; s++) {
        float l = pc.part.d[base + s * (D + 2u) + D + 1u];
        if (l > 0.0) L += l * exp(pc.part.d[base + s * (D + 2u) + D] - M);
    }
    if (uint64_t(pc.ml) != 0ul && gl_LocalInvocationID.x == 0u) {
        pc.ml.d[(row * pc.n_head + h) * 2u] = M;
        pc.ml.d[(row * pc.n_head + h) * 2u + 1u] = L;
    }
    for (uint d = gl_LocalInvocationID.x; d < D; d += gl_WorkGroupSize.x) {
        float a = 0.0;
        for (uint s = 0; s < pc.n_split; s++) {
            uint o = base + s * (D + 2u);
            if (pc.part.d[o + D + 1u] > 0.0) a += pc.part.d[o + d] * exp(pc.part.d[o + D] - M);
        }
        pc.out_.d[row * pc.out_stride + h * D + d] = L > 0.0 ? a / L : 0.0;
    }
}
