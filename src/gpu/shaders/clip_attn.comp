#version 450
// clip_attn.comp — the vision tower's attention: every row sees every row
// (no mask), n_head heads of dh channels over q, k, v [n][E] (E = n_head *
// dh, the heads side by side as the projections write them), out [n][E].
// Workgroup (row t, head h): the n scores q_t . k_s * scale into shared
// memory, softmax (max, exponentials, their sum), then each output channel
// as the sum over s of p_s v_s[c] in order of s. The CPU's attn_rows
// (src/vision/clip.c) is the reference: the same formula, other orders of
// summation. n <= MAXN (the host checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define MAXN 1024
layout(local_size_x = 64) in;
layout(push_constant) uniform P { F32 q; F32 k; F32 v; F32 o; uint n; uint E; uint dh; float scale; } pc;
shared float sp[MAXN];
void main() {
    const uint t = gl_WorkGroupID.x, h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint qo = t * pc.E + h * pc.dh;
    float mx = -1.0 / 0.0;
    for (uint s = tid; s < pc.n; s += gl_WorkGroupSize.x) {
        const uint ko = s * pc.E + h * pc.dh;
        float d = 0.0;
        for (uint c = 0u; c < pc.dh; c++) d += pc.q.d[qo + c] * pc.k.d[ko + c];
        d *= pc.scale;
        sp[s] = d;
        mx = max(mx, d);
    }
    mx = wg_max(mx);
    float sum = 0.0;
    for (uint s = tid; s < pc.n; s += gl_WorkGroupSize.x) {
        const float e = exp(sp[s] - mx);
        sp[s] = e;
        sum += e;
    }
    const float inv = 1.0 / wg_sum(sum); // its barriers publish sp
    for (uint c = tid; c < pc.dh; c += gl_WorkGroupSize.x) {
        float a = 0.0;
        for (uint s = 0u; s < pc.n; s++) a += (sp[s] * inv) * pc.v.d[s * pc.E + h * pc.dh + c];
        pc.o.d[qo + c] = a;
    }
}
