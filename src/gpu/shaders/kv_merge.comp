#version 450
// kv_merge.comp — a compressing policy's weighted merges on the device
// (backend_vk_policy.c, ekv_kv_head_merge's rule): workgroup t of the table
// {KV head, stage row, first member, members} averages the rows of its
// members — the surviving entry first, then the entries that join it in
// index order, each weighted by the tokens it stood for — and writes the
// mean, quantised as the side's type (-DST=; the quantisers are the CPU's,
// kvq_quant.glsl), into a stage row, from which kv_compact.comp then puts
// it in place. Run before the compaction of the same plans, so every
// member is read where it was. A member (entry, weight, rotation row) with
// a rotation row (key=rotate) has its key turned first: pair (i0, i1) of
// the first rd channels (NeoX halves or adjacent pairs, as the model's
// RoPE) by the {cos, sin} of rots[row][2 i], the CPU's
// ekv_rope_shift_ext / _multi angles (ekv_rope_shift_cs on the host).
// A compressed KIVI side (-DST=KV_KIVI2|4, -DIS_V for values; hq != 0:
// each head's quantised entries, kvq.glsl's compressed layout) reads its
// members where they are and writes the mean as floats to row `row` of
// frows (which kivi_pack.comp then quantises into the survivor's key group
// or value row) and, when the table's fifth word is not ~0, as fp16 into
// that stage row of the side's residual (a survivor in the residual).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "kvq.glsl"
#if ST == KV_F32 || ST == KV_F16 || ST == KV_KIVI2 || ST == KV_KIVI4
#define KVQ_NO_F64
#endif
#ifndef IS_V
#define IS_V false
#endif
#include "kvq_quant.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    U32 base; U32 stage; U32 table; U32 members; F32 rots; U32 hq; F32 frows;
    uint H; uint C; uint D; uint rw; uint srw; uint rd; uint neox; uint G; uint TC; uint NGC;
} pc;

// channel c of entry j's key turned by rotation row r (c < rd)
float turned(const KvSide s, uint hk, uint j, uint c, uint r) {
    const uint half_ = pc.rd / 2u;
    uint i, i0, i1;
    if (pc.neox != 0u) {
        i = c < half_ ? c : c - half_;
        i0 = i, i1 = i + half_;
    } else {
        i = c / 2u;
        i0 = 2u * i, i1 = 2u * i + 1u;
    }
    const float cs = pc.rots.d[r * pc.rd + 2u * i], sn = pc.rots.d[r * pc.rd + 2u * i + 1u];
    const float a = kv_elem(ST, IS_V, s, hk, j, i0), b = kv_elem(ST, IS_V, s, hk, j, i1);
    precise float x;
    if (c == i0) x = a * cs - b * sn;
    else x = a * sn + b * cs;
    return x;
}
shared float sx[256];

void main() {
    const uint t = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x, D = pc.D;
    const uint hk = pc.table.d[5u * t], row = pc.table.d[5u * t + 1u];
    const uint first = pc.table.d[5u * t + 2u], n = pc.table.d[5u * t + 3u];
    KvSide s = KvSide(pc.base, F16(pc.base), pc.H, pc.C, D, pc.G, pc.TC, 0u, 0xffffffffu, 0u, pc.hq, pc.NGC);
    for (uint c = tid; c < D; c += 64u) {
        float acc = 0.0, ws = 0.0;
        for (uint i = 0u; i < n; i++) {
            const uint j = pc.members.d[3u * (first + i)];
            const float w = uintBitsToFloat(pc.members.d[3u * (first + i) + 1u]);
            const uint r = pc.members.d[3u * (first + i) + 2u];
            acc += w * (r != 0xffffffffu && c < pc.rd ? turned(s, hk, j, c, r) : kv_elem(ST, IS_V, s, hk, j, c));
            ws += w;
        }
        sx[c] = acc / ws;
    }
    barrier();
    const uint o = row * pc.srw;
    if (ST == KV_KIVI2 || ST == KV_KIVI4) {
        for (uint c = tid; c < D; c += 64u) pc.frows.d[row * D + c] = sx[c];
        const uint r16 = pc.table.d[5u * t + 4u];
        if (r16 != 0xffffffffu)
            for (uint c = 2u * tid; c < D; c += 128u)
                pc.stage.d[r16 * pc.srw + c / 2u] = f16_bits(sx[c]) | (f16_bits(sx[c + 1u]) << 16);
    } else if (ST == KV_F32) {
        for (uint c = tid; c < D; c += 64u) pc.stage.d[o + c] = floatBitsToUint(sx[c]);
    } else if (ST == KV_F16) {
        for (uint c = 2u * tid; c < D; c += 128u) pc.stage.d[o + c / 2u] = f16_bits(sx[c]) | (f16_bits(sx[c + 1u]) << 16);
    }
#ifndef KVQ_NO_F64
    else {
        for (uint b = tid; b < D / 32u; b += 64u) {
            float x[32];
            [[unroll]] for (uint i = 0; i < 32u; i++) x[i] = sx[32u * b + i];
            uint sc;
            if (ST == KV_Q8_0) {
                uint w[8];
                sc = quant_q8_0(x, w);
                [[unroll]] for (uint k = 0; k < 8u; k++) pc.stage.d[o + 8u * b + k] = w[k];
            } else {
                uint w[4];
                sc = quant_q4_0(x, w);
                [[unroll]] for (uint k = 0; k < 4u; k++) pc.stage.d[o + 4u * b + k] = w[k];
            }
            U16(pc.stage).d[2u * (o + pc.rw) + b] = uint16_t(sc);
        }
    }
#endif
}
