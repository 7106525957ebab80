#version 450
// kv_store.comp — writes the keys or the values of a forward's rows into
// one side of a layer's cache in its storage type (compiled per type,
// -DST=KV_F32 ...; kvq.glsl has the layout): entry e0 + row of head h,
// heads hstride entries apart. KIVI rows go as fp16 into the forward's
// scratch (ST=KV_F16, hstride = the scratch's rows, e0 = the part's first
// row): kivi.comp quantises them when the forward's attention is done.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "kvq.glsl"
#if ST == KV_F32 || ST == KV_F16
#define KVQ_NO_F64 // no doubles in these variants: they run without shaderFloat64
#endif
#include "kvq_quant.glsl"
layout(local_size_x = 32) in;
layout(push_constant) uniform P {
    F32 src; U32 dst;
    uint H; uint D; uint hstride; uint e0; uint rows; uint src_stride;
} pc;
void main() {
    const uint row = gl_WorkGroupID.x, h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (row >= pc.rows) return;
    const uint D = pc.D, si = row * pc.src_stride + h * D, ent = h * pc.hstride + pc.e0 + row;
#if ST == KV_F32
    for (uint c = tid; c < D; c += 32u) F32(pc.dst).d[ent * D + c] = pc.src.d[si + c];
#elif ST == KV_F16
    for (uint c = 2u * tid; c < D; c += 64u)
        pc.dst.d[(ent * D + c) / 2u] = f16_bits(pc.src.d[si + c]) | (f16_bits(pc.src.d[si + c + 1u]) << 16);
#else
    const uint p0 = pc.H * pc.hstride * (ST == KV_Q8_0 ? D / 4u : D / 8u); // kv_p0
    for (uint b = tid; b < D / 32u; b += 32u) {
        float x[32];
        [[unroll]] for (uint i = 0; i < 32u; i++) x[i] = pc.src.d[si + 32u * b + i];
#if ST == KV_Q8_0
        uint w[8];
        const uint sc = quant_q8_0(x, w);
        [[unroll]] for (uint k = 0; k < 8u; k++) pc.dst.d[ent * (D / 4u) + 8u * b + k] = w[k];
#else
        uint w[4];
        const uint sc = quant_q4_0(x, w);
        [[unroll]] for (uint k = 0; k < 4u; k++) pc.dst.d[ent * (D / 8u) + 4u * b + k] = w[k];
#endif
        U16(pc.dst).d[2u * p0 + ent * (D / 32u) + b] = uint16_t(sc);
    }
#endif
}
