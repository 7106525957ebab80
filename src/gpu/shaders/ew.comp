#version 450
// ew.comp — elementwise steps of the vision tower over n floats of y:
// op 0: y += a (the position embeddings), 1: the tanh GELU (ekv_gelu),
// 2: quick GELU, y / (1 + exp(-1.702 y)), 3: SiLU, y / (1 + exp(-y)).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P { F32 y; F32 a; uint n; uint op; } pc;
void main() {
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        const float v = pc.y.d[i];
        float r;
        if (pc.op == 0u) r = v + pc.a.d[i];
        else if (pc.op == 1u) r = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        else if (pc.op == 2u) r = v / (1.0 + exp(-1.702 * v));
        else r = v / (1.0 + exp(-v));
        pc.y.d[i] = r;
    }
}
