#version 450
// kivi.comp — KIVI's residual rule on the device (docs/policies.md "KIVI storage", the
// CPU's ekv_store_flush), run after a forward's attention of a layer:
//  KEYS:   quantise groups of G entries from j0 on, per channel (workgroup:
//          group gi of n, head h);
//  VALUES: quantise entries j0 .. j0 + n - 1, each in groups of G channels
//          (workgroup: entry, head);
//  COPY:   move entries j0 .. j0 + n - 1 of the forward's scratch into the
//          ring (they stay in full precision).
// An entry below pos0 is read from the ring, from pos0 on from the scratch
// (kvq.glsl's layout). -DBITS=2|4 with KEYS and VALUES; the codes equal the
// CPU's (kvq_quant.glsl).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "kvq.glsl"
#include "kvq_quant.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    U32 base; F16 scr;
    uint H; uint C; uint D; uint G; uint TC; uint pos0; uint j0; uint n; uint scr_stride;
} pc;
#if defined(KEYS) || defined(VALUES)
#if BITS == 2
#define T KV_KIVI2
#else
#define T KV_KIVI4
#endif
shared uint codes[4096]; // KEYS: [G][RW], VALUES: [RW] (the host checks the size)
#endif
#ifdef VALUES
#define IS_V true
#else
#define IS_V false
#endif

KvSide side() {
    return KvSide(pc.base, pc.scr, pc.H, pc.C, pc.D, pc.G, pc.TC, 0u, pc.pos0, pc.scr_stride, U32(0ul), 0u);
}

void main() {
    const uint h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x, nth = gl_WorkGroupSize.x;
    KvSide s = side();
    const uint D = pc.D;
#if defined(COPY)
    const uint j = pc.j0 + gl_WorkGroupID.x;
    // here base is the ring itself ([H][TC][D] fp16; the host adds R0)
    for (uint c = tid; c < D; c += nth)
        F16(pc.base).d[(h * pc.TC + j % pc.TC) * D + c] = pc.scr.d[(h * pc.scr_stride + (j - pc.pos0)) * D + c];
#elif defined(KEYS)
    const uint RW = D * BITS / 32u, G = pc.G, gi = pc.j0 / G + gl_WorkGroupID.x, e0 = gi * G;
    for (uint i = tid; i < G * RW; i += nth) codes[i] = 0u;
    barrier();
    const uint p0 = kv_p0(T, s);
    for (uint c = tid; c < D; c += nth) {
        float mn = kv_resid(T, false, s, h, e0, c), mx = mn;
        for (uint r = 1u; r < G; r++) {
            const float v = kv_resid(T, false, s, h, e0 + r, c);
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        float sh, mnh;
        s.base.d[p0 + (h * ((pc.C + G - 1u) / G) + gi) * D + c] = kivi_params(mn, mx, BITS, sh, mnh);
        for (uint r = 0u; r < G; r++) {
            const uint q = kivi_code(kv_resid(T, false, s, h, e0 + r, c), sh, mnh, BITS);
            atomicOr(codes[r * RW + (c * BITS) / 32u], q << ((c * BITS) % 32u));
        }
    }
    barrier();
    for (uint i = tid; i < G * RW; i += nth) s.base.d[(h * pc.C + e0 + i / RW) * RW + i % RW] = codes[i];
#else // VALUES
    const uint RW = D * BITS / 32u, G = pc.G, j = pc.j0 + gl_WorkGroupID.x;
    for (uint i = tid; i < RW; i += nth) codes[i] = 0u;
    barrier();
    const uint p0 = kv_p0(T, s);
    for (uint cg = tid; cg < D / G; cg += nth) {
        float mn = kv_resid(T, true, s, h, j, cg * G), mx = mn;
        for (uint c = 1u; c < G; c++) {
            const float v = kv_resid(T, true, s, h, j, cg * G + c);
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        float sh, mnh;
        s.base.d[p0 + (h * pc.C + j) * (D / G) + cg] = kivi_params(mn, mx, BITS, sh, mnh);
        for (uint c = 0u; c < G; c++) {
            const uint ch = cg * G + c;
            const uint q = kivi_code(kv_resid(T, true, s, h, j, ch), sh, mnh, BITS);
            atomicOr(codes[(ch * BITS) / 32u], q << ((ch * BITS) % 32u));
        }
    }
    barrier();
    for (uint i = tid; i < RW; i += nth) s.base.d[(h * pc.C + j) * RW + i] = codes[i];
#endif
}
