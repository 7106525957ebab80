#version 450
// ew.comp — elementwise steps of the vision tower over n items of y:
// op 0: y += a (the position embeddings), 1: the tanh GELU (ekv_gelu),
// 2: quick GELU, y / (1 + exp(-1.702 y)), 3: SiLU, y / (1 + exp(-y));
// op 4: RoPE on rows of E = heads x dh (Qwen2-VL's 2D RoPE, as
// ekv_rope_apply with NeoX halves): item i is (row, head, pair k < dh/2),
// elements k and k + dh/2 of the head turned by a[row][k] = {cos, sin}
// (a: [rows][dh/2][2]); n = rows x heads x dh/2;
// op 5: Idefics3's pixel shuffle (ekv_clip_pixel_shuffle) from a, a grid of
// g x g rows of E, into y, (g/s)^2 rows of s*s*E: row (Y, X) holds the rows
// (Y s + dy, X s + dx), dy then dx, side by side (s in dh); n = g*g*E.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P { F32 y; F32 a; uint n; uint op; uint dh; uint E; uint g; } pc;
void main() {
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        if (pc.op == 4u) {
            const uint half_ = pc.dh / 2u, k = i % half_, hr = i / half_, H = pc.E / pc.dh;
            const uint row = hr / H, h = hr % H, o = row * pc.E + h * pc.dh;
            const float c = pc.a.d[(row * half_ + k) * 2u], s = pc.a.d[(row * half_ + k) * 2u + 1u];
            const float x0 = pc.y.d[o + k], x1 = pc.y.d[o + k + half_];
            precise float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
            pc.y.d[o + k] = r0;
            pc.y.d[o + k + half_] = r1;
            continue;
        }
        if (pc.op == 5u) {
            const uint s = pc.dh, W = s * s * pc.E, G = pc.g / s, t = i / W, k = i % W, b = k / pc.E;
            const uint row = ((t / G) * s + b / s) * pc.g + (t % G) * s + b % s;
            pc.y.d[i] = pc.a.d[row * pc.E + k % pc.E];
            continue;
        }
        const float v = pc.y.d[i];
        float r;
        if (pc.op == 0u) r = v + pc.a.d[i];
        else if (pc.op == 1u) r = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        else if (pc.op == 2u) r = v / (1.0 + exp(-1.702 * v));
        else r = v / (1.0 + exp(-v));
        pc.y.d[i] = r;
    }
}
