#version 450
// kv_compact.comp — executes the keep / merge plans of a compressing
// policy on a cache side of one layer (backend_vk_policy.c records them
// after the policy ran on the host): for each planned head (workgroup x of
// the table: {first row of the head = h * C, pairs, first pair}), entry
// dst of the head gets the row of source src, where src is an entry of the
// same head (src >= dst for every pair of a compaction, so copying in
// chunks in order — all reads of a chunk before its writes — never
// overwrites a row still to be read) or, with the high bit set, a row the
// host quantised into the stage (a merged entry's new key or value), or
// (all bits set) zero. The logit biases of a compressed cache are planned
// the same way as a side of rows of one word.
// Rows are the words of a row type plus, for q8_0 / q4_0, the fp16 scales
// (kvq.glsl's layout), copied as bits: nothing is re-quantised here.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define HI 0x80000000u
#define SW 4096 // staged words
layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    U32 base; U32 plan; U32 stage; U32 table;
    uint rw; uint sph; uint p0h; uint srw;
} pc;
shared uint sw[SW];

#define ZERO 0xffffffffu // a planned 0 (the logit biases past a head's entries)

uint src_word(uint src, uint hrow0, uint w) {
    if (src == ZERO) return 0u;
    if (w < pc.rw)
        return (src & HI) != 0u ? pc.stage.d[(src & ~HI) * pc.srw + w] : pc.base.d[(hrow0 + src) * pc.rw + w];
    const uint k = w - pc.rw;
    return (src & HI) != 0u ? uint(U16(pc.stage).d[2u * ((src & ~HI) * pc.srw + pc.rw) + k])
                            : uint(U16(pc.base).d[pc.p0h + (hrow0 + src) * pc.sph + k]);
}

void main() {
    const uint t = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint hrow0 = pc.table.d[3u * t], n = pc.table.d[3u * t + 1u], first = pc.table.d[3u * t + 2u];
    const uint ew = pc.rw + pc.sph; // staged words per entry
    const uint CH = max(1u, SW / ew);
    for (uint c0 = 0u; c0 < n; c0 += CH) {
        const uint cn = min(CH, n - c0);
        for (uint x = tid; x < cn * ew; x += 64u) {
            const uint e = x / ew, w = x % ew;
            sw[x] = src_word(pc.plan.d[2u * (first + c0 + e) + 1u], hrow0, w);
        }
        barrier();
        for (uint x = tid; x < cn * ew; x += 64u) {
            const uint e = x / ew, w = x % ew, dst = pc.plan.d[2u * (first + c0 + e)];
            if (w < pc.rw) pc.base.d[(hrow0 + dst) * pc.rw + w] = sw[x];
            else U16(pc.base).d[pc.p0h + (hrow0 + dst) * pc.sph + (w - pc.rw)] = uint16_t(sw[x]);
        }
        barrier();
    }
}
