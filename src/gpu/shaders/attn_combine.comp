#version 450
// attn_combine.comp — merges attn.comp's splits of each (row, head):
// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s.
// With ml != 0 it also writes each (row, head)'s M and L = sum_s l_s e^(m_s - M)
// to ml[row][head][2] (attn_stats.comp turns scores into probabilities with them).
// One workgroup of 256 per (head, row), the splits shared out so that no
// invocation walks them all (at depth 32K a row has 256 splits): M and L by
// invocation over splits tid, tid + 256, ... then workgroup reductions; the
// output channel d by Q = 256 / D invocation groups, group q summing splits
// q, q + Q, ... in order, the groups' sums added in group order. Empty
// splits (l = 0: past the row's causal end) weigh 0 and add exact zeros, so
// a row's result does not depend on how many splits the dispatch has
// (prefill == decode).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define NT 256
#define SW 2048 // splits whose weights are kept in shared memory (more: recomputed)
layout(local_size_x = NT) in;
layout(push_constant) uniform P {
    F32 part; F32 out_; F32 ml;
    uint n_head; uint head_dim; uint rows; uint n_split; uint out_stride;
} pc;
shared float sw[SW];       // e^(m_s - M), 0 for an empty split
shared float sacc[NT];     // the groups' channel sums [Q][D]

void main() {
    const uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint D = pc.head_dim, S = pc.n_split, E = D + 2u;
    const uint base = (row * pc.n_head + h) * S * E;
    float mx = -1.0 / 0.0;
    for (uint s = tid; s < S; s += NT) mx = max(mx, pc.part.d[base + s * E + D]);
    const float M = wg_max(mx);
    float lp = 0.0;
    for (uint s = tid; s < S; s += NT) {
        const float l = pc.part.d[base + s * E + D + 1u];
        const float w = l > 0.0 ? exp(pc.part.d[base + s * E + D] - M) : 0.0;
        if (s < SW) sw[s] = w;
        lp += l * w;
    }
    const float L = wg_sum(lp); // its barriers publish sw
    if (uint64_t(pc.ml) != 0ul && tid == 0u) {
        pc.ml.d[(row * pc.n_head + h) * 2u] = M;
        pc.ml.d[(row * pc.n_head + h) * 2u + 1u] = L;
    }
    const uint Q = NT / D, d = tid % D, q = tid / D;
    float a = 0.0;
    if (q < Q)
        for (uint s = q; s < S; s += Q) {
            float w;
            if (s < SW) {
                w = sw[s];
            } else {
                const float l = pc.part.d[base + s * E + D + 1u];
                w = l > 0.0 ? exp(pc.part.d[base + s * E + D] - M) : 0.0;
            }
            a += pc.part.d[base + s * E + d] * w;
        }
    if (q < Q) sacc[q * D + d] = a;
    barrier();
    if (tid < D) {
        float t = sacc[tid];
        for (uint k = 1u; k < Q; k++) t += sacc[k * D + tid];
        pc.out_.d[row * pc.out_stride + h * D + tid] = L > 0.0 ? t / L : 0.0;
    }
}
