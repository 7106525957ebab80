#version 450
// clip_attn.comp — the vision tower's attention: a row sees every row (or,
// with win != 0, the rows of its own window: Qwen2.5-VL's windowed blocks),
// n_head heads of dh channels over q, k, v [n][E] (E = n_head * dh, the
// heads side by side as the projections write them), out [n][E].
// Workgroup (row t0 + x, head h): the keys in chunks of CHUNK, each chunk's
// scores q_t . k_s * scale in shared memory, an online softmax over the
// chunks (running max and sum, the partial outputs rescaled when the max
// grows), each output channel the sum over s of e_s v_s[c] in order of s,
// divided by the sum at the end. The CPU's attn_rows (src/vision/clip.c) is
// the reference: the same formula, other orders of summation. dh <= 256.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define CHUNK 1024
layout(local_size_x = 64) in;
layout(push_constant) uniform P { F32 q; F32 k; F32 v; F32 o; U32 win; uint n; uint E; uint dh; float scale; uint t0; } pc;
shared float sp[CHUNK];
void main() {
    const uint t = pc.t0 + gl_WorkGroupID.x, h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint qo = t * pc.E + h * pc.dh;
    const bool masked = uint64_t(pc.win) != 0ul;
    const uint wt = masked ? pc.win.d[t] : 0u;
    float m = -1.0 / 0.0, l = 0.0, acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint c0 = 0u; c0 < pc.n; c0 += CHUNK) {
        const uint c1 = min(pc.n, c0 + CHUNK);
        float mx = -1.0 / 0.0;
        for (uint s = c0 + tid; s < c1; s += gl_WorkGroupSize.x) {
            float d = -1.0 / 0.0;
            if (!masked || pc.win.d[s] == wt) {
                const uint ko = s * pc.E + h * pc.dh;
                d = 0.0;
                for (uint c = 0u; c < pc.dh; c++) d += pc.q.d[qo + c] * pc.k.d[ko + c];
                d *= pc.scale;
            }
            sp[s - c0] = d;
            mx = max(mx, d);
        }
        mx = wg_max(mx);
        const float nm = max(m, mx); // -inf while every key so far was masked
        float sum = 0.0;
        for (uint s = c0 + tid; s < c1; s += gl_WorkGroupSize.x) {
            const float e = sp[s - c0] == -1.0 / 0.0 ? 0.0 : exp(sp[s - c0] - nm);
            sp[s - c0] = e;
            sum += e;
        }
        sum = wg_sum(sum); // its barriers publish sp
        const float corr = l > 0.0 ? exp(m - nm) : 0.0;
        l = l * corr + sum;
        m = nm;
        for (uint j = 0u; j < 4u; j++) {
            const uint c = tid + j * gl_WorkGroupSize.x;
            if (c >= pc.dh) break;
            float a = 0.0;
            for (uint s = c0; s < c1; s++) a += sp[s - c0] * pc.v.d[s * pc.E + h * pc.dh + c];
            acc[j] = acc[j] * corr + a;
        }
        barrier(); // sp is rewritten by the next chunk
    }
    for (uint j = 0u; j < 4u; j++) {
        const uint c = tid + j * gl_WorkGroupSize.x;
        if (c < pc.dh) pc.o.d[qo + c] = acc[j] / l;
    }
}
