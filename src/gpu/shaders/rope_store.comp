#version 450
// rope_store.comp — one part (sequence) of a forward, one dispatch per
// layer: rotates its query and key rows (RoPE: pairs (2i, 2i+1), or halves
// (i, i + rope_dim/2) for NeoX, like ekv_rope_apply, with per-row {cos, sin}
// rows computed on the host by ekv_rope_sincos_ext, so every scaling the CPU
// knows — linear, YaRN, Llama-3 factors, Phi-3 long/short — is the same
// numbers here) and writes the rotated keys and the values into the
// layer's cache in their storage types (-DSK=, -DSV= KV_F32, KV_F16,
// KV_Q8_0, KV_Q4_0; kvq.glsl has the layout): entry e0 + row of head h,
// heads hstride entries apart. A KIVI side is written as fp16 into the
// forward's scratch (KV_F16, hstride = the scratch's rows, e0 = the part's
// first row); kivi.comp quantises it after the attention. A compressed
// cache (meta != 0) appends after each head's own entries: e0 = meta[h]
// (a KIVI side: into its residual, after the head's quantised entries:
// kvq.glsl), and with posb != 0 records each new entry's position (pos0 +
// row) there.
// Workgroup (row, head): heads below n_head are query heads (rotated in
// place), the others key heads (rotated in shared memory, stored with
// their values). The keys of the activation rows stay unrotated: nothing
// reads them after this. With qdst != 0 the rotated query rows are also
// written there (same layout as q): a compressed cache keeps the decode
// rows' queries of a re-selection window for its statistics
// (backend_vk_policy.c, deferred statistics).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "kvq.glsl"
#if (SK == KV_F32 || SK == KV_F16) && (SV == KV_F32 || SV == KV_F16)
#define KVQ_NO_F64 // no doubles in these variants: they run without shaderFloat64
#endif
#include "kvq_quant.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    F32 q; F32 k; F32 v; F32 cs; U32 kdst; U32 vdst; U32 meta; U32 posb; F32 qdst;
    uint n_head; uint H; uint D; uint rope_dim; uint neox; uint rows; uint q_stride; uint kv_stride;
    uint k_hstride; uint k_e0; uint v_hstride; uint v_e0; uint pos0;
} pc;
shared float sx[256]; // a key head, rotated

// rotates the head at x[base ..] in place (pairs owned by one invocation each)
void rope(F32 x, uint base, uint row) {
    const uint half_ = pc.rope_dim / 2u;
    for (uint i = gl_LocalInvocationID.x; i < half_; i += gl_WorkGroupSize.x) {
        const uint i0 = pc.neox != 0u ? i : 2u * i, i1 = pc.neox != 0u ? i + half_ : 2u * i + 1u;
        const float c = pc.cs.d[row * pc.rope_dim + 2u * i], s = pc.cs.d[row * pc.rope_dim + 2u * i + 1u];
        const float a = x.d[base + i0], b = x.d[base + i1];
        const float r0 = a * c - b * s, r1 = a * s + b * c;
        x.d[base + i0] = r0;
        x.d[base + i1] = r1;
        if (uint64_t(pc.qdst) != 0ul) {
            pc.qdst.d[base + i0] = r0;
            pc.qdst.d[base + i1] = r1;
        }
    }
    if (uint64_t(pc.qdst) != 0ul) // the channels past rope_dim, unrotated
        for (uint c = pc.rope_dim + gl_LocalInvocationID.x; c < pc.D; c += gl_WorkGroupSize.x) pc.qdst.d[base + c] = x.d[base + c];
}

void rope_shared(uint row) {
    const uint half_ = pc.rope_dim / 2u;
    for (uint i = gl_LocalInvocationID.x; i < half_; i += gl_WorkGroupSize.x) {
        const uint i0 = pc.neox != 0u ? i : 2u * i, i1 = pc.neox != 0u ? i + half_ : 2u * i + 1u;
        const float c = pc.cs.d[row * pc.rope_dim + 2u * i], s = pc.cs.d[row * pc.rope_dim + 2u * i + 1u];
        const float a = sx[i0], b = sx[i1];
        sx[i0] = a * c - b * s;
        sx[i1] = a * s + b * c;
    }
}

// the head's D values (sx) into entry `ent` of a side of type t at dst
void store(const uint t, U32 dst, uint ent, uint hstride) {
    const uint D = pc.D, tid = gl_LocalInvocationID.x;
    if (t == KV_F32) {
        for (uint c = tid; c < D; c += 64u) F32(dst).d[ent * D + c] = sx[c];
    } else if (t == KV_F16) {
        for (uint c = 2u * tid; c < D; c += 128u) dst.d[(ent * D + c) / 2u] = f16_bits(sx[c]) | (f16_bits(sx[c + 1u]) << 16);
    }
#ifndef KVQ_NO_F64
    else {
        const uint p0 = pc.H * hstride * (t == KV_Q8_0 ? D / 4u : D / 8u); // kv_p0
        for (uint b = tid; b < D / 32u; b += 64u) {
            float x[32];
            [[unroll]] for (uint i = 0; i < 32u; i++) x[i] = sx[32u * b + i];
            uint sc;
            if (t == KV_Q8_0) {
                uint w[8];
                sc = quant_q8_0(x, w);
                [[unroll]] for (uint k = 0; k < 8u; k++) dst.d[ent * (D / 4u) + 8u * b + k] = w[k];
            } else {
                uint w[4];
                sc = quant_q4_0(x, w);
                [[unroll]] for (uint k = 0; k < 4u; k++) dst.d[ent * (D / 8u) + 4u * b + k] = w[k];
            }
            U16(dst).d[2u * p0 + ent * (D / 32u) + b] = uint16_t(sc);
        }
    }
#endif
}

void main() {
    const uint row = gl_WorkGroupID.x, h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (row >= pc.rows) return;
    const uint D = pc.D;
    if (h < pc.n_head) { // a query head
        rope(pc.q, row * pc.q_stride + h * D, row);
        return;
    }
    const uint hk = h - pc.n_head, src = row * pc.kv_stride + hk * D;
    for (uint c = tid; c < D; c += 64u) sx[c] = pc.k.d[src + c];
    barrier();
    rope_shared(row);
    barrier();
    const bool managed = uint64_t(pc.meta) != 0ul;
    // a compressed cache: after each head's entries, or (a KIVI side, whose
    // destination is then its residual, hstride TC) after its quantised ones
    const uint ke0 = managed ? pc.meta.d[hk] - pc.meta.d[pc.H + 5u + hk] : pc.k_e0;
    const uint ve0 = managed ? pc.meta.d[hk] - pc.meta.d[2u * pc.H + 5u + hk] : pc.v_e0;
    store(SK, pc.kdst, hk * pc.k_hstride + ke0 + row, pc.k_hstride);
    if (managed && uint64_t(pc.posb) != 0ul && tid == 0u)
        pc.posb.d[hk * pc.meta.d[3u * pc.H + 9u] + pc.meta.d[hk] + row] = pc.pos0 + row;
    barrier();
    for (uint c = tid; c < D; c += 64u) sx[c] = pc.v.d[src + c];
    barrier();
    store(SV, pc.vdst, hk * pc.v_hstride + ve0 + row, pc.v_hstride);
}
