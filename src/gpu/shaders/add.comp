#version 450
// add.comp — y[i] += x[i] (y and x of n values).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = 256) in;
layout(push_constant) uniform P { F32 y; F32 x; uint n; } pc;
void main() {
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += gl_NumWorkGroups.x * gl_WorkGroupSize.x)
        pc.y.d[i] += pc.x.d[i];
}
