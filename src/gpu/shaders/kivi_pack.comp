#version 450
// kivi_pack.comp — KIVI quantisation in a compressing policy's GPU cache
// (backend_vk_plan.c; kvq.glsl's compressed KIVI layout): the key groups a
// compaction re-quantises (groups that join, or that take a new row:
// ekv_store_kgroups_plan) and the entries the residual rule quantises after
// a forward (ekv_store_flush). Workgroup u is unit u of the table {KV head,
// members, first member, stage row of the codes, stage row of the
// parameters}: KEYS, one group, its members its entries in order; VALUES,
// one entry (one member). A member says where the entry's floats are now:
// a quantised key (entry j of the head: its codes and its group's
// parameters, dequantised as ekv_kivi_dequant_kgroup does), a slot of the
// head's residual (bit 30: fp16), or a float row the host gave (bit 31:
// row of frows). The codes (and a value's parameters after them) go to
// stage rows of srw words, a key group's parameters to a stage row of
// psrw words; kv_compact.comp then puts them in place. -DBITS=2|4; the
// quantiser is the CPU's (kvq_quant.glsl), so the codes are the CPU
// store's bit for bit.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "kvq.glsl"
#include "kvq_quant.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    U32 base; U32 stage; U32 pstage; U32 units; U32 members; F32 frows;
    uint H; uint C; uint D; uint G; uint TC; uint NGC; uint srw; uint psrw;
} pc;
#if BITS == 2
#define T KV_KIVI2
#else
#define T KV_KIVI4
#endif
#ifdef VALUES
#define IS_V true
#else
#define IS_V false
#endif
shared uint codes[4096]; // KEYS: [G][RW], VALUES: [RW] (the host checks the size)

KvSide side() { // the layout's offsets (NGC != 0: a compressed side; hq is not read here)
    return KvSide(pc.base, F16(pc.base), pc.H, pc.C, pc.D, pc.G, pc.TC, 0u, 0u, 0u, U32(0ul), pc.NGC);
}

// word of the residual (the parameters' words, even, after p0)
uint resid0(const KvSide s) {
    const uint params = IS_V ? pc.H * pc.C * (pc.D / pc.G) : pc.H * pc.NGC * pc.D;
    return kv_p0(T, s) + ((params + 1u) & ~1u);
}

// channel c of member code m of head h
float member(const KvSide s, uint h, uint m, uint c) {
    const uint D = pc.D;
    if ((m & 0x80000000u) != 0u) return pc.frows.d[(m & 0x7fffffffu) * D + c];
    if ((m & 0x40000000u) != 0u) return float(F16(pc.base).d[2u * resid0(s) + (h * pc.TC + (m & 0x3fffffffu)) * D + c]);
    const uint RW = D * BITS / 32u, bit = c * BITS, p0 = kv_p0(T, s);
    const uint q = (pc.base.d[(h * pc.C + m) * RW + bit / 32u] >> (bit % 32u)) & ((1u << BITS) - 1u);
    const uint g = pc.base.d[resid0(s) + pc.H * pc.TC * D / 2u + h * pc.C + m];
    const vec2 sm = unpackHalf2x16(pc.base.d[p0 + (h * pc.NGC + g) * D + c]);
    precise float v = float(q) * sm.x + sm.y;
    return v;
}

void main() {
    const uint u = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x, D = pc.D, G = pc.G;
    const uint h = pc.units.d[5u * u], n = pc.units.d[5u * u + 1u], first = pc.units.d[5u * u + 2u];
    const uint crow = pc.units.d[5u * u + 3u], prow = pc.units.d[5u * u + 4u];
    const uint RW = D * BITS / 32u;
    KvSide s = side();
#ifdef KEYS
    for (uint i = tid; i < n * RW; i += 64u) codes[i] = 0u;
    barrier();
    for (uint c = tid; c < D; c += 64u) {
        float mn = member(s, h, pc.members.d[first], c), mx = mn;
        for (uint r = 1u; r < n; r++) {
            const float v = member(s, h, pc.members.d[first + r], c);
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        float sh, mnh;
        pc.pstage.d[prow * pc.psrw + c] = kivi_params(mn, mx, BITS, sh, mnh);
        for (uint r = 0u; r < n; r++) {
            const uint q = kivi_code(member(s, h, pc.members.d[first + r], c), sh, mnh, BITS);
            atomicOr(codes[r * RW + (c * BITS) / 32u], q << ((c * BITS) % 32u));
        }
    }
    barrier();
    for (uint i = tid; i < n * RW; i += 64u) pc.stage.d[(crow + i / RW) * pc.srw + i % RW] = codes[i];
#else // VALUES: one entry, channel groups of G
    for (uint i = tid; i < RW; i += 64u) codes[i] = 0u;
    barrier();
    const uint m = pc.members.d[first];
    for (uint cg = tid; cg < D / G; cg += 64u) {
        float mn = member(s, h, m, cg * G), mx = mn;
        for (uint c = 1u; c < G; c++) {
            const float v = member(s, h, m, cg * G + c);
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        float sh, mnh;
        pc.stage.d[crow * pc.srw + RW + cg] = kivi_params(mn, mx, BITS, sh, mnh);
        for (uint c = 0u; c < G; c++) {
            const uint ch = cg * G + c;
            const uint q = kivi_code(member(s, h, m, ch), sh, mnh, BITS);
            atomicOr(codes[(ch * BITS) / 32u], q << ((ch * BITS) % 32u));
        }
    }
    barrier();
    for (uint i = tid; i < RW; i += 64u) pc.stage.d[crow * pc.srw + i] = codes[i];
#endif
}
