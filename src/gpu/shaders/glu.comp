#version 450
// glu.comp — g = act(g) * u over n values: SiLU (SwiGLU) or the tanh GELU
// (GeGLU, Gemma), as ekv_swiglu_ref / ekv_gelu.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P { F32 g; F32 u; uint n; uint gelu; } pc;
void main() {
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
        float v = pc.g.d[i];
        float a;
        if (pc.gelu != 0u) a = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        else a = v / (1.0 + exp(-v));
        pc.g.d[i] = a * pc.u.d[i];
    }
}
