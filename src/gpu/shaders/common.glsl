// common.glsl — what every ekv compute shader shares: buffers reached by
// device address (push constants carry the pointers, so there are no
// descriptor sets), and a workgroup sum that works for any subgroup size.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 { float d[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 d[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer F16 { float16_t d[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32 { uint d[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 d[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer U16 { uint16_t d[]; };

// One slot per subgroup of the workgroup (at most 64 subgroups).
shared float ekv_red[64];

// Sum of v over the workgroup, returned to every invocation. Deterministic
// for a given device (fixed subgroup size and order).
float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) ekv_red[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) t += ekv_red[i];
    barrier();
    return t;
}

float wg_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) ekv_red[gl_SubgroupID] = v;
    barrier();
    float t = ekv_red[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) t = max(t, ekv_red[i]);
    barrier();
    return t;
}
